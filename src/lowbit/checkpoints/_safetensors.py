"""The one checked parser of safetensors file headers; reads no tensor data, needs no numpy.

Layout (huggingface/safetensors README): an 8-byte little-endian header length N, N bytes of
UTF-8 JSON ``{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {str:
str}}``, then the data section, which the offsets index from its start.

Why our own parser: the ``safetensors`` package's numpy loader refuses bfloat16 and float8, the
types lowbit deals in, and every length, dtype, shape and offset has to be checked against the
file before a byte of data is trusted. Both the reader (:mod:`lowbit.checkpoints.readers`) and
the planner (:mod:`lowbit.planning.headers`) build on :func:`parse`.
"""

from __future__ import annotations

import itertools
import json
import math
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lowbit.errors import LowbitError

#: Bits per element of each safetensors dtype (sub-byte types must fill whole bytes).
SAFETENSORS_DTYPE_BITS = {
    "F64": 64, "I64": 64, "U64": 64, "F32": 32, "I32": 32, "U32": 32, "F16": 16, "BF16": 16,
    "I16": 16, "U16": 16, "I8": 8, "U8": 8, "BOOL": 8, "F8_E4M3": 8, "F8_E5M2": 8,
    "F8_E8M0": 8, "F6_E2M3": 6, "F6_E3M2": 6, "F4": 4,
}  # fmt: skip
_MAX_HEADER = 100_000_000  # the safetensors package refuses larger headers too


@dataclass(frozen=True)
class SafetensorsTensor:
    """One tensor's entry in a safetensors header, already checked against the file."""

    name: str
    dtype: str  # as the file names it: "F32", "BF16", "F8_E4M3", ...
    shape: tuple[int, ...]
    offset: int  # absolute byte offset in the file
    nbytes: int


@dataclass(frozen=True)
class SafetensorsHeader:
    """The parsed header of a safetensors file."""

    tensors: dict[str, SafetensorsTensor]  # in offset order
    metadata: dict[str, str]
    data_offset: int  # 8 + the header length


def parse(path: Path) -> SafetensorsHeader:
    """Parse and check a safetensors header against the file.

    Raises:
        LowbitError: a missing or truncated file, a header length that does not fit the file, a
            header that is not a JSON object, an unknown dtype, a shape or offsets that are not
            non-negative integers, sub-byte tensors that do not fill whole bytes, or a tensor
            whose shape, dtype and offsets disagree, leave the file or overlap another.
    """
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise LowbitError(f"{path}: file not found") from None
    if size < 8:
        raise LowbitError(
            f"{path}: truncated safetensors file ({size} bytes; the header length alone needs 8)"
        )
    with open(path, "rb") as fh:
        (hlen,) = struct.unpack("<Q", fh.read(8))
        if hlen > _MAX_HEADER or 8 + hlen > size:
            raise LowbitError(
                f"{path}: safetensors header claims {hlen} bytes, more than the file's {size} "
                f"or the {_MAX_HEADER:,}-byte limit (a wrong header length: truncated file, or "
                f"not a safetensors file)"
            )
        raw = fh.read(hlen)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise LowbitError(
            f"{path}: safetensors header is not valid JSON: not JSON or not UTF-8 ({exc})"
        ) from None
    if not isinstance(header, dict):
        raise LowbitError(f"{path}: safetensors header is not a JSON object")
    meta = header.pop("__metadata__", None) or {}
    if not isinstance(meta, dict):
        raise LowbitError(f"{path}: safetensors __metadata__ is not a JSON object")
    data_offset = 8 + hlen
    tensors = [_tensor(path, n, e, data_offset, size - data_offset) for n, e in header.items()]
    check_overlaps(path, tensors)
    tensors.sort(key=lambda t: t.offset)
    return SafetensorsHeader(
        {t.name: t for t in tensors}, {str(k): str(v) for k, v in meta.items()}, data_offset
    )


def _tensor(
    path: Path, name: str, entry: Any, data_offset: int, data_len: int
) -> SafetensorsTensor:
    bad = f"{path}: bad entry for tensor {name!r}"
    try:
        dtype, shape, (begin, end) = entry["dtype"], entry["shape"], entry["data_offsets"]
    except (TypeError, KeyError, ValueError):
        raise LowbitError(f"{bad}: needs dtype, shape and data_offsets [begin, end]") from None
    if not isinstance(dtype, str) or dtype not in SAFETENSORS_DTYPE_BITS:
        raise LowbitError(
            f"{bad}: dtype {dtype!r} is not a safetensors dtype; known: "
            f"{', '.join(SAFETENSORS_DTYPE_BITS)}"
        )
    ints = (*shape, begin, end) if isinstance(shape, list) else None
    if ints is None or not all(
        isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in ints
    ):
        raise LowbitError(f"{bad}: malformed shape {shape!r} or offsets (non-negative integers)")
    bits = math.prod(shape) * SAFETENSORS_DTYPE_BITS[dtype]
    if bits % 8:  # as the safetensors package: a sub-byte tensor fills whole bytes
        raise LowbitError(f"{bad}: {dtype} of shape {tuple(shape)} is {bits} bits, not whole bytes")
    if end - begin != bits // 8:
        raise LowbitError(
            f"{bad}: {dtype} of shape {tuple(shape)} spans {end - begin} bytes, expected "
            f"{bits // 8} (the header lies about sizes)"
        )
    if end > data_len:
        raise LowbitError(
            f"{bad}: it ends at data byte {end} but the file holds only {data_len} bytes of data "
            f"(truncated file, or the header lies about offsets)"
        )
    return SafetensorsTensor(name, dtype, tuple(shape), data_offset + begin, end - begin)


def check_overlaps(path: Path, tensors: Iterable[Any]) -> None:
    """Refuse tensors (with ``name``, ``offset``, ``nbytes``) whose bytes overlap in the file.

    Shared by the safetensors and GGUF parsers.
    """
    spans = sorted((t.offset, t.offset + t.nbytes, t.name) for t in tensors if t.nbytes)
    for (_, end, a), (start, _, b) in itertools.pairwise(spans):
        if start < end:
            raise LowbitError(
                f"{path}: tensors {a!r} and {b!r} overlap in the file (the header lies about "
                f"offsets)"
            )
