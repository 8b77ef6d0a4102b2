"""Open any checkpoint by its path (safetensors file, Hugging Face folder, GGUF file, lowbit
checkpoint folder), or read all its tensors at once.

The readers (``lowbit.checkpoints.readers``) and the lowbit checkpoint
(``lowbit.checkpoints.lowbit_format.checkpoint``) each know one kind; this module sits above both and
picks one.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from lowbit import _json
from lowbit.checkpoints.compressed_tensors.reader import CompressedTensorsFolder
from lowbit.checkpoints.experts_view import ExpertsView, has_fused
from lowbit.checkpoints.gguf.reader import GGUFFile
from lowbit.checkpoints.lowbit_format.checkpoint import LowbitCheckpoint, is_lowbit_checkpoint
from lowbit.checkpoints.mlx.params import is_mlx_config
from lowbit.checkpoints.mlx.reader import MLXFolder
from lowbit.checkpoints.readers import Checkpoint, HuggingFaceFolder, SafetensorsFile
from lowbit.checkpoints.shipped import shipped_or_path
from lowbit.errors import LowbitError

__all__ = ["load", "open_checkpoint"]


def open_checkpoint(path: str | os.PathLike[str]) -> Checkpoint:
    """Open a checkpoint for reading, one tensor at a time.

    Args:
        path: a shipped model's name (``"smollm2"``, ``"minilm"``; a file of that name wins),
            a ``.safetensors`` file, a ``.gguf`` file, a folder holding ``config.json`` and
            safetensors shards (with ``model.safetensors.index.json`` when sharded), a folder
            holding exactly one ``.gguf`` file, a lowbit checkpoint folder (``lowbit.json``),
            or a compressed-tensors folder (``quantization_config``); the last two read back
            dequantized, under the model's own tensor names. Fused mixture-of-experts tensors
            (``experts.gate_up_proj`` ``[E, 2I, H]``, gpt-oss's MXFP4 ``*_blocks`` /
            ``*_scales``) read as one 2-D tensor per expert
            (:class:`~lowbit.checkpoints.experts_view.ExpertsView`).

    Returns:
        A :class:`Checkpoint`.

    Raises:
        LowbitError: a missing path, a path that is neither a regular file nor a folder (a
            FIFO, a device), a file that is neither safetensors nor GGUF, a missing or
            truncated shard, a header that lies about sizes or offsets, an unknown GGUF type.
    """
    p = shipped_or_path(path)
    if not _json.path_exists(p):
        raise LowbitError(f"{p}: no such file or folder")
    if p.is_dir() and (p / "lowbit.json").is_file():
        return LowbitCheckpoint(p)
    if p.is_dir():
        has_st = any(p.glob("*.safetensors")) or any(p.glob("*.safetensors.index.json"))
        ggufs = sorted(p.glob("*.gguf"))
        if not has_st and len(ggufs) == 1:
            return GGUFFile(ggufs[0])
        if not has_st and len(ggufs) > 1:
            raise LowbitError(
                f"{p}: several GGUF files ({', '.join(g.name for g in ggufs)}); name one"
            )
        folder = _not_lowbit_shards(HuggingFaceFolder(p))
        cfg = folder.config or {}
        if is_mlx_config(cfg):
            return MLXFolder(p)  # mlx-lm's layout, weights read back dequantized
        if "quantization_config" not in cfg:
            return _per_expert(folder)
        qc = cfg["quantization_config"]
        where = f"{p / 'config.json'}: quantization_config"
        if not isinstance(qc, dict):
            raise LowbitError(f"{where} is {type(qc).__name__}, not an object")
        method = qc.get("quant_method")
        if method == "compressed-tensors":
            return CompressedTensorsFolder(p)  # weights read back dequantized
        if method == "mxfp4" and any(n.endswith("_blocks") for n in folder.names()):
            return ExpertsView(folder)  # gpt-oss's MXFP4 experts, read dequantized per expert
        # read as a plain model, its packed codes and scales would pass for weights
        shown = method if isinstance(method, str) and len(method) <= 40 else type(method).__name__
        raise LowbitError(
            f"{where}.quant_method {shown!r}: lowbit reads compressed-tensors quantized folders "
            f"and MXFP4 experts (gpt-oss's *_blocks / *_scales), and unquantized ones, not this "
            f"kind"
        )
    _json.check_regular_file(p)  # a FIFO or device would hang the read below
    with open(p, "rb") as fh:
        magic = fh.read(4)
    if magic == b"GGUF" or p.suffix == ".gguf":
        return GGUFFile(p)
    if p.suffix == ".safetensors":
        return _per_expert(_not_lowbit_shards(SafetensorsFile(p)))
    if p.name.endswith(".safetensors.index.json"):
        return _per_expert(_not_lowbit_shards(HuggingFaceFolder(p.parent)))
    if p.suffix in (".bin", ".pt", ".pth", ".ckpt", ".pkl"):
        raise LowbitError(f"{p}: a pickle file; lowbit never loads pickles (use safetensors)")
    raise LowbitError(f"{p}: not a .safetensors, .gguf or model folder")


def _per_expert(ckpt: Checkpoint) -> Checkpoint:
    """Fused 3-D experts tensors (transformers' layout) read as one 2-D weight per expert."""
    return ExpertsView(ckpt) if has_fused(ckpt.names()) else ckpt


def _not_lowbit_shards(ckpt: Checkpoint) -> Checkpoint:
    """Refuse safetensors that lowbit wrote as a checkpoint's shards: read without their
    ``lowbit.json`` they would be packed codes and scales, not the model's tensors."""
    if ckpt.metadata.get("format") == "lowbit" or "lowbit_format_version" in ckpt.metadata:
        folder = ckpt.path if ckpt.path.is_dir() else ckpt.path.parent
        if ckpt.path != folder and (folder / "lowbit.json").is_file():
            raise LowbitError(
                f"{ckpt.path}: a shard of the lowbit checkpoint {folder} (packed codes and "
                f"scales); open the folder, whose lowbit.json says how to decode them"
            )
        raise LowbitError(
            f"{ckpt.path}: safetensors written by lowbit as a quantized checkpoint's shards "
            f"(packed codes and scales), but {folder} has no lowbit.json to decode them; "
            f"restore the manifest or quantize the source model again"
        )
    return ckpt


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
    path = shipped_or_path(path)
    if is_lowbit_checkpoint(path):
        return LowbitCheckpoint(path, verify=verify)
    return open_checkpoint(path)


def _to_torch(arr: Any) -> Any:
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
