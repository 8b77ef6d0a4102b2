"""Checkpoints: files on disk. Read safetensors files, Hugging Face folders and GGUF files,
quantize them tensor by tensor, and write lowbit, compressed-tensors and GGUF checkpoints.

``open_checkpoint`` reads one tensor at a time (memory-mapped); ``load`` reads them all into a
dict; ``load_model`` builds a runnable transformers model (see ``lowbit.evaluation.models``);
``quantize_model`` streams a checkpoint through a precision plan into a new one.

Writers for checkpoints other tools load (their names load on first use):

- :mod:`lowbit.checkpoints.gguf_q`: Q8_0 / Q4_0 block quantizers, numpy only.
- :mod:`lowbit.checkpoints.gguf_writer`: :func:`write_gguf`, :class:`GGUFTensor`,
  :func:`gguf_from_quantized` (writing needs the ``gguf`` package).
- :mod:`lowbit.checkpoints.compressed_tensors`: :func:`write_compressed_tensors`,
  :class:`CTTensor`, :func:`from_quantized`.
"""

from __future__ import annotations

import os
from typing import Any

from lowbit.checkpoints.readers import Checkpoint, TensorInfo, open_checkpoint
from lowbit.errors import LowbitError

_LAZY = {
    "quantize_model": "lowbit.checkpoints.quantize_model",
    "write_gguf": "lowbit.checkpoints.gguf_writer",
    "GGUFTensor": "lowbit.checkpoints.gguf_writer",
    "gguf_from_quantized": "lowbit.checkpoints.gguf_writer",
    "write_compressed_tensors": "lowbit.checkpoints.compressed_tensors",
    "CTTensor": "lowbit.checkpoints.compressed_tensors",
    "from_quantized": "lowbit.checkpoints.compressed_tensors",
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
    import importlib

    return getattr(importlib.import_module(module), name)


def load(
    path: str | os.PathLike[str],
    names: list[str] | None = None,
    *,
    dtype: Any = None,
    framework: str = "numpy",
    progress: bool | None = None,
    verify: bool = True,
) -> dict[str, Any]:
    """Read the tensors of a checkpoint into a dict.

    Args:
        path: a ``.safetensors`` or ``.gguf`` file or a model folder (see ``open_checkpoint``),
            or a lowbit quantized checkpoint (its tensors come back dequantized, exactly
            ``QuantizedTensor.dequantize()``).
        names: the tensors to read (default: all).
        dtype: convert every tensor to this numpy dtype (e.g. ``np.float32``); ``None`` keeps the
            stored type (GGUF block formats come back dequantized to float32).
        framework: "numpy" (arrays copied out of the file) or "torch" (CPU tensors).
        progress: tqdm progress bar: ``True``, ``False``, or ``None`` for "only on a terminal".
        verify: for a lowbit checkpoint, check its manifest's digest and every file's sha256
            (sizes, containment and the manifest's schema are checked either way).

    Returns:
        ``{name: array}`` in file order.

    Raises:
        LowbitError: an unreadable checkpoint (see ``open_checkpoint``), an unknown name or
            framework.
    """
    if framework not in ("numpy", "torch"):
        raise LowbitError(f"framework must be 'numpy' or 'torch', got {framework!r}")
    out: dict[str, Any] = {}
    with _open(path, verify) as ckpt:
        for name, arr in ckpt.items(names, dtype=dtype, progress=progress):
            out[name] = arr.copy() if framework == "numpy" else _to_torch(arr)
    return out


def _open(path: str | os.PathLike[str], verify: bool = True) -> Checkpoint:
    """``open_checkpoint``, or for a lowbit quantized checkpoint its dequantizing reader."""
    from lowbit.checkpoints.lowbit_format import LowbitCheckpoint, is_lowbit_checkpoint

    if is_lowbit_checkpoint(path):
        return LowbitCheckpoint(path, verify=verify)
    return open_checkpoint(path)


def _to_torch(arr: Any) -> Any:
    import numpy as np
    import torch

    name = arr.dtype.name
    if name in _NUMPY_NATIVE:
        return torch.from_numpy(np.array(arr))
    # ml_dtypes' bfloat16 / float8 types: same bits, same names in torch
    carrier = {1: np.uint8, 2: np.int16}.get(arr.dtype.itemsize)
    if carrier is None or not hasattr(torch, name):
        raise LowbitError(f"no torch dtype for {name}")
    bits = torch.from_numpy(np.array(arr).view(carrier))
    return bits.view(getattr(torch, name))


_NUMPY_NATIVE = {
    "float64", "float32", "float16", "int64", "int32", "int16", "int8",
    "uint64", "uint32", "uint16", "uint8", "bool",
}  # fmt: skip


def load_model(path: str | os.PathLike[str], *, verify: bool = True, **kwargs: Any) -> Any:
    """Build a runnable transformers model (eval mode, float32) from a checkpoint.

    A shortcut for ``lowbit.evaluation.models.build_model(open_checkpoint(path), **kwargs)``; see there for
    the arguments. A lowbit quantized checkpoint (``lowbit quantize``) gives its dequantized
    weights, with the activation quantization its plan asks for simulated
    (``lowbit.checkpoints.lowbit_format.load_model``), after checking its manifest and files;
    ``verify=False`` skips their sha256s.
    """
    from lowbit.checkpoints.lowbit_format import is_lowbit_checkpoint
    from lowbit.evaluation.models import build_model

    if is_lowbit_checkpoint(path):
        from lowbit.checkpoints.lowbit_format import load_model as load_lowbit

        return load_lowbit(path, verify=verify, **kwargs)

    return build_model(open_checkpoint(path), **kwargs)
