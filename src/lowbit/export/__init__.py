"""Writers for checkpoints other tools load: llama.cpp's GGUF and compressed-tensors (vLLM).

Submodules (import them directly; each loads its heavy dependency only when it writes):

- :mod:`lowbit.export.gguf_q`: Q8_0 / Q4_0 block quantizers, numpy only.
- :mod:`lowbit.export.gguf_writer`: :func:`~lowbit.export.gguf_writer.write_gguf` (needs ``gguf``).
- :mod:`lowbit.export.compressed_tensors`:
  :func:`~lowbit.export.compressed_tensors.write_compressed_tensors` (needs ``safetensors``).
"""
