"""Check a checkpoint on disk without building a model: ``lowbit verify``'s library side.

:func:`verify_checkpoint` recognises what it is given and checks:

- a **lowbit** checkpoint folder: everything :class:`~lowbit.checkpoints.lowbit_format.checkpoint.
  LowbitCheckpoint` checks on open (the manifest's schema and digest, every recorded file inside
  the folder with its size and sha256, every array's dtype and shape in the shard headers), then
  decodes every tensor;
- a **compressed-tensors** folder: ``config.json``'s ``quantization_config`` parses (method,
  groups, weight arguments), every safetensors header is valid, and every quantized weight has
  its packed/int8/fp8 values, scale and (asymmetric) zero point with the dtypes and shapes its
  group's scheme gives;
- an **MLX** folder (mlx-lm's): ``lowbit.checkpoints.mlx.reader.verify_mlx``;
- a **GGUF** file: the header parses and every tensor has a known type and lies inside the
  file (:func:`lowbit.checkpoints.io.gguf_file.parse`);
- any other **safetensors** file or Hugging Face folder: its headers are valid.

The first problem found is raised as one :class:`~lowbit.errors.LowbitError`; a checkpoint that
passes gives a report of what was found.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from lowbit._json import path_exists
from lowbit.checkpoints.compressed_tensors.verify import ct_config, verify_compressed_tensors
from lowbit.checkpoints.gguf.verify import verify_gguf
from lowbit.checkpoints.lowbit_format.checkpoint import is_lowbit_checkpoint
from lowbit.checkpoints.lowbit_format.verify import verify_lowbit
from lowbit.checkpoints.mlx.reader import is_mlx_folder, verify_mlx
from lowbit.checkpoints.opener import open_checkpoint
from lowbit.errors import LowbitError

__all__ = ["verify_checkpoint"]


def verify_checkpoint(path: str | os.PathLike[str], *, hashes: bool = True) -> dict[str, Any]:
    """Check a checkpoint and say what it holds.

    Args:
        path: a lowbit or compressed-tensors folder, a Hugging Face folder, a ``.gguf`` or
            ``.safetensors`` file.
        hashes: for a lowbit checkpoint, check the manifest's digest and every file's sha256
            (False: sizes only).

    Returns:
        ``{"path", "kind", "tensors", "checks": [what was checked], "files": [{"file",
        "bytes", "sha256"}], "summary": {...}}``; ``kind`` is ``lowbit``,
        ``compressed-tensors``, ``gguf``, ``safetensors`` or ``huggingface``.

    Raises:
        LowbitError: the first problem found, naming the file and what is wrong.
    """
    p = Path(path)
    if not path_exists(p):
        raise LowbitError(f"{p}: no such file or folder")
    if is_lowbit_checkpoint(p):
        return verify_lowbit(p, hashes)
    if p.is_dir() and ct_config(p) is not None:
        return verify_compressed_tensors(p)
    if is_mlx_folder(p):
        return verify_mlx(p)
    if p.is_file():
        with open(p, "rb") as fh:
            magic = fh.read(4)
        if magic == b"GGUF" or p.suffix == ".gguf":
            return verify_gguf(p)
    return _plain(p)


# ------------------------------------------------------------------------------- lowbit


# --------------------------------------------------------------------- compressed-tensors


# ---------------------------------------------------------------------------------- GGUF


# ----------------------------------------------------------------------------- the rest


def _plain(p: Path) -> dict[str, Any]:
    ckpt = open_checkpoint(p)
    if ckpt.format == "gguf":  # a folder holding one .gguf
        return verify_gguf(ckpt.path)
    names = ckpt.names()
    shard_files = sorted({ckpt.info(n).file for n in names})
    return {
        "path": str(p),
        "kind": ckpt.format,
        "tensors": len(names),
        "checks": ["safetensors headers"],
        "files": [
            {"file": f.name, "bytes": f.stat().st_size, "sha256": "not recorded"}
            for f in shard_files
        ],
        "summary": {"bytes of tensor data": sum(ckpt.info(n).nbytes for n in names)},
    }
