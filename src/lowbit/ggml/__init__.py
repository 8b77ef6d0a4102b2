"""llama.cpp's block formats as arrays and bytes: quantize rows into GGML blocks and back.

This package knows nothing of schemes, checkpoints or models: it takes float32 rows (and an
optional importance vector) and returns the bytes llama.cpp's own quantizers write, and decodes
such bytes back. ``lowbit.quant`` adapts it to schemes; the GGUF writer stores its blocks.
"""
