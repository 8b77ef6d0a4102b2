"""Checkpoints: files on disk. Read safetensors files, Hugging Face folders and GGUF files,
quantize them tensor by tensor, and write lowbit, compressed-tensors and GGUF checkpoints.

``open_checkpoint`` reads one tensor at a time (memory-mapped); ``load`` reads them all into a
dict; ``load_model`` builds a runnable transformers model (``lowbit.models.build.load_model``,
loaded on first use);
``quantize_model`` streams a checkpoint through a precision plan into a new one.

Every name here loads its module on first use. Writers for checkpoints other tools load:

- :mod:`lowbit.ggml`: llama.cpp's block quantizers (Q8_0, Q4_0, ...), numpy only.
- :mod:`lowbit.checkpoints.gguf.writer`: :func:`write_gguf`, :class:`GGUFTensor`,
  :func:`gguf_from_quantized` (writing needs the ``gguf`` package).
- :mod:`lowbit.checkpoints.compressed_tensors.writer`: :func:`write_compressed_tensors`,
  :class:`CTTensor`, :func:`from_quantized`.
"""

from __future__ import annotations

import importlib
from typing import Any

from lowbit.checkpoints import _moved

_moved.install()

# Every name loads on first use: importing one submodule (``checkpoints.io.outputs`` for the
# CLI's file checks) then costs that submodule alone, not every reader and writer.
_LAZY = {
    "load": "lowbit.checkpoints.opener",
    "open_checkpoint": "lowbit.checkpoints.opener",
    "Checkpoint": "lowbit.checkpoints.readers",
    "TensorInfo": "lowbit.checkpoints.readers",
    # load_model builds a torch model: it lives in the evaluation layer above this one
    "load_model": "lowbit.models.build",
    "quantize_model": "lowbit.checkpoints.streaming",
    "write_gguf": "lowbit.checkpoints.gguf.writer",
    "GGUFTensor": "lowbit.checkpoints.gguf.writer",
    "gguf_from_quantized": "lowbit.checkpoints.gguf.writer",
    "write_compressed_tensors": "lowbit.checkpoints.compressed_tensors.writer",
    "CTTensor": "lowbit.checkpoints.compressed_tensors.writer",
    "from_quantized": "lowbit.checkpoints.compressed_tensors.writer",
}

__all__ = [
    "CTTensor",
    "Checkpoint",
    "GGUFTensor",
    "TensorInfo",
    "from_quantized",
    "gguf_from_quantized",
    "load",
    "load_model",
    "open_checkpoint",
    "quantize_model",
    "write_compressed_tensors",
    "write_gguf",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'lowbit.checkpoints' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
