"""llama.cpp's importance-matrix files, both formats: read them into one vector per weight, write GGUF.

An importance matrix holds, per weight matrix and per input column, the sum of the squared
activations that column saw during calibration, and how many activation rows (tokens) were
summed; llama-quantize uses ``sums / counts`` as the importance vector of that weight
(``load_imatrix`` in tools/quantize/quantize.cpp). Two file formats (tools/imatrix/imatrix.cpp):

- **GGUF** (``general.type = "imatrix"``, keys ``imatrix.datasets``, ``imatrix.chunk_count``,
  ``imatrix.chunk_size``): per weight ``NAME``, an F32 tensor ``NAME.in_sum2`` of ggml shape
  ``[columns, matrices]`` (``matrices`` > 1 for stacked experts) and an F32 tensor
  ``NAME.counts`` of shape ``[1, matrices]``. Vector ``j`` is ``in_sum2[j] / counts[j]``, and
  all ones where ``counts[j]`` is 0 (that expert saw no token).
- **legacy ``.dat``** (little-endian): int32 entry count; per entry an int32 name length, the
  name's bytes, int32 ``ncall``, int32 value count, that many float32 values (already scaled so
  that dividing by ``ncall`` gives the mean); then optionally int32 last call and an int32-long
  dataset name. The vector is ``values / ncall`` (``values`` as stored when ``ncall`` is 0).

Anything else (a missing partner tensor, lengths that do not split into matrices, NaN or
infinite values, negative sums or counts, truncated files) is a :class:`LowbitError`.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from lowbit.checkpoints.gguf.writer import GGUFTensor, write_gguf
from lowbit.checkpoints.io import gguf_file as _gguf
from lowbit.errors import LowbitError

__all__ = ["read_imatrix", "write_imatrix"]

_SUMS, _COUNTS = ".in_sum2", ".counts"


def read_imatrix(path: str | os.PathLike[str]) -> dict[str, np.ndarray]:
    """Read an importance-matrix file (GGUF or legacy ``.dat``) as llama-quantize does.

    Returns:
        ``{weight name: float32 vector}`` (for stacked experts, the experts' vectors one after
        another), the vectors llama-quantize passes to its quantizers.

    Raises:
        LowbitError: an unreadable or malformed file (see the module docstring).
    """
    p = Path(path)
    if not p.is_file():
        raise LowbitError(f"{p}: no such importance-matrix file")
    try:
        with open(p, "rb") as fh:
            head = fh.read(4)
    except OSError as exc:
        raise LowbitError(f"{p}: cannot read the importance matrix: {exc.strerror}") from None
    out = _read_gguf(p) if head == b"GGUF" else _read_legacy(p)
    if not out:
        raise LowbitError(f"{p}: the importance matrix holds no entries")
    for name, v in out.items():
        if not np.isfinite(v).all():
            raise LowbitError(f"{p}: importance matrix entry {name!r} has NaN or infinite values")
    return out


def _read_gguf(p: Path) -> dict[str, np.ndarray]:
    header = _gguf.parse(p)
    missing = [
        k
        for k in ("imatrix.datasets", "imatrix.chunk_count", "imatrix.chunk_size")
        if k not in header.metadata
    ]
    if missing:
        raise LowbitError(f"{p}: not a llama.cpp importance matrix (no {', '.join(missing)} key)")
    pairs: dict[str, dict[str, Any]] = {}
    for t in header.tensors.values():
        for suffix in (_SUMS, _COUNTS):
            if t.name.endswith(suffix) and len(t.name) > len(suffix):
                pairs.setdefault(t.name[: -len(suffix)], {})[suffix] = t
    # a plain array over the mapping: slicing a memmap costs its subclass hook per tensor
    buf = np.memmap(p, dtype=np.uint8, mode="r").view(np.ndarray)
    out: dict[str, np.ndarray] = {}
    for name in sorted(pairs):
        sums_t, counts_t = pairs[name].get(_SUMS), pairs[name].get(_COUNTS)
        if sums_t is None or counts_t is None:
            raise LowbitError(f"{p}: entry {name!r} has {_SUMS} or {_COUNTS} but not both")
        for t in (sums_t, counts_t):
            if t.type_name != "F32":
                raise LowbitError(f"{p}: tensor {t.name!r} is {t.type_name}, not F32")
        sums = np.asarray(_gguf.dequantize(buf, sums_t, p), dtype=np.float32)
        counts = np.asarray(_gguf.dequantize(buf, counts_t, p), dtype=np.float32).reshape(-1)
        nmat = counts.size
        if nmat == 0 or sums.size == 0 or sums.size % nmat:
            raise LowbitError(
                f"{p}: entry {name!r}: {sums.size} sums do not split into {nmat} matrices"
            )
        _check_signs(p, name, sums, counts)
        sums = sums.reshape(nmat, -1)
        with np.errstate(divide="ignore", invalid="ignore"):
            vals = np.where(counts[:, None] > 0, sums / counts[:, None], np.float32(1))
        out[name] = vals.astype(np.float32).reshape(-1)
    return out


def _check_signs(p: Path, name: str, sums: np.ndarray, counts: np.ndarray) -> None:
    if not (np.isfinite(sums).all() and np.isfinite(counts).all()):
        raise LowbitError(f"{p}: importance matrix entry {name!r} has NaN or infinite values")
    if (counts < 0).any():
        raise LowbitError(f"{p}: importance matrix entry {name!r} has negative counts")
    if (sums < 0).any():
        raise LowbitError(f"{p}: importance matrix entry {name!r} has negative sums of squares")


def _read_legacy(p: Path) -> dict[str, np.ndarray]:
    data = p.read_bytes()
    pos = 0

    def take(n: int, what: str) -> bytes:
        nonlocal pos
        if n < 0 or pos + n > len(data):
            raise LowbitError(f"{p}: not an importance matrix (truncated reading {what})")
        chunk = data[pos : pos + n]
        pos += n
        return chunk

    def i32(what: str) -> int:
        return struct.unpack("<i", take(4, what))[0]

    n_entries = i32("the entry count")
    if n_entries < 1 or n_entries > len(data) // 16:
        raise LowbitError(f"{p}: not an importance matrix ({n_entries} entries claimed)")
    out: dict[str, np.ndarray] = {}
    for i in range(n_entries):
        length = i32(f"the name length of entry {i}")
        if length < 1 or length > 4096:
            raise LowbitError(f"{p}: not an importance matrix (entry {i} name length {length})")
        try:
            name = take(length, f"the name of entry {i}").decode("utf-8")
        except UnicodeDecodeError:
            raise LowbitError(f"{p}: entry {i}'s name is not UTF-8") from None
        ncall = i32(f"ncall of {name!r}")
        nval = i32(f"the value count of {name!r}")
        if nval < 1:
            raise LowbitError(f"{p}: entry {name!r} has {nval} values")
        vals = np.frombuffer(take(4 * nval, f"the values of {name!r}"), dtype="<f4")
        vals = vals.astype(np.float32)
        if ncall < 0:
            raise LowbitError(f"{p}: importance matrix entry {name!r} has negative counts")
        _check_signs(p, name, vals, np.float32([ncall]))
        out[name] = (vals / np.float32(ncall)).astype(np.float32) if ncall > 0 else vals
    return out


def write_imatrix(
    path: str | os.PathLike[str],
    sums: Mapping[str, np.ndarray],
    counts: Mapping[str, np.ndarray],
    *,
    datasets: list[str],
    chunk_count: int,
    chunk_size: int,
    overwrite: bool = False,
    inputs: Sequence[str | os.PathLike[str]] = (),
) -> Path:
    """Write an importance matrix in llama.cpp's GGUF format (``NAME.in_sum2``/``NAME.counts``).

    Args:
        sums: weight name -> sums of squared activations, shape ``(matrices, columns)`` or
            ``(columns,)``.
        counts: weight name -> activation rows summed, one per matrix.
        datasets: names of the calibration texts (``imatrix.datasets``).
        chunk_count / chunk_size: chunks of ``chunk_size`` tokens seen.
        overwrite: replace an existing file lowbit wrote.
        inputs: what the matrix was computed from (the model, the calibration file): never
            written over, whatever ``overwrite`` says.

    Raises:
        LowbitError: mismatched names or shapes, negative/non-finite values, or ``path``
            that is one of ``inputs``.
    """
    if set(sums) != set(counts):
        raise LowbitError("importance matrix: sums and counts name different weights")
    tensors: dict[str, GGUFTensor] = {}
    for name in sorted(sums):
        s = np.asarray(sums[name], dtype=np.float32)
        s = s.reshape(1, -1) if s.ndim == 1 else s
        c = np.asarray(counts[name], dtype=np.float32).reshape(1, -1)
        if s.ndim != 2 or c.shape[1] != s.shape[0]:
            raise LowbitError(f"importance matrix entry {name!r}: one count per matrix needed")
        _check_signs(Path(path), name, s, c)
        tensors[name + _SUMS] = GGUFTensor(s, "F32")
        tensors[name + _COUNTS] = GGUFTensor(c.reshape(-1, 1), "F32")
    meta = {
        "general.type": "imatrix",
        "imatrix.datasets": list(datasets) or [""],
        "imatrix.chunk_count": int(chunk_count),
        "imatrix.chunk_size": int(chunk_size),
    }
    return write_gguf(
        path, tensors, metadata=meta, arch="imatrix", overwrite=overwrite, inputs=inputs
    )
