"""The one checked parser of safetensors file headers; reads no tensor data.

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
import math
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lowbit import _json
from lowbit._json import check_regular_file, short_repr
from lowbit.errors import LowbitError

#: Bits per element of each safetensors dtype (sub-byte types must fill whole bytes).
SAFETENSORS_DTYPE_BITS = {
    "F64": 64, "I64": 64, "U64": 64, "F32": 32, "I32": 32, "U32": 32, "F16": 16, "BF16": 16,
    "I16": 16, "U16": 16, "I8": 8, "U8": 8, "BOOL": 8, "F8_E4M3": 8, "F8_E5M2": 8,
    "F8_E8M0": 8, "F6_E2M3": 6, "F6_E3M2": 6, "F4": 4,
}  # fmt: skip
_MAX_HEADER = 100_000_000  # the safetensors package refuses larger headers too
#: Most tensors one file may list (real checkpoints hold under 100,000 per file).
MAX_TENSORS = 1_000_000
#: Most dimensions of one tensor (numpy 1.x's own limit; numpy 2 allows 64).
MAX_RANK = 32


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
        LowbitError: a missing file or one that is not a regular file (a FIFO, a device), a
            truncated file, a header length that does not fit the file or the 100 MB limit, a
            header that is not a JSON object (or nests deeper than 64, holds an integer past
            2**64, names a tensor twice), more than 1,000,000 tensors, an unknown dtype, a
            shape or offsets that are not non-negative integers, more than 32 dimensions or a
            shape of 2**63 bytes or more, sub-byte tensors that do not fill whole bytes, or a
            tensor whose shape, dtype and offsets disagree, leave the file or overlap another.
    """
    size = check_regular_file(path)
    with open(path, "rb") as fh:
        prefix = fh.read(8)
        hlen = _header_length(prefix, size, path)
        raw = fh.read(hlen)
    return _parse_header(raw, size, path)


def parse_bytes(data: bytes, path: Path | str = "<bytes>") -> SafetensorsHeader:
    """:func:`parse` on a whole file held in memory (for tests and fuzzing)."""
    hlen = _header_length(data[:8], len(data), path)
    return _parse_header(data[8 : 8 + hlen], len(data), path)


def _header_length(prefix: bytes, size: int, path: Path | str) -> int:
    if size < 8:
        raise LowbitError(
            f"{path}: truncated safetensors file ({size} bytes; the header length alone needs 8)"
        )
    (hlen,) = struct.unpack("<Q", prefix[:8])
    if hlen > _MAX_HEADER or 8 + hlen > size:
        raise LowbitError(
            f"{path}: safetensors header claims {hlen} bytes, more than the file's {size} "
            f"or the {_MAX_HEADER:,}-byte limit (a wrong header length: truncated file, or "
            f"not a safetensors file)"
        )
    return hlen


def _parse_header(raw: bytes, size: int, path: Path | str) -> SafetensorsHeader:
    """Check the header JSON (``raw``, the bytes after the length) against a file of ``size``."""
    if raw.count(b'"data_offsets"') > MAX_TENSORS:  # refuse before building a dict per entry
        raise LowbitError(
            f"{path}: safetensors header lists more than {MAX_TENSORS:,} tensors; lowbit reads "
            f"at most {MAX_TENSORS:,} per file"
        )
    header = _json.loads(raw, f"{path}: safetensors header", unique_keys=True)
    if not isinstance(header, dict):
        raise LowbitError(f"{path}: safetensors header is not a JSON object")
    meta = header.pop("__metadata__", None) or {}
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise LowbitError(f"{path}: safetensors __metadata__ is not an object of strings")
    if len(header) > MAX_TENSORS:
        raise LowbitError(
            f"{path}: safetensors header lists {len(header):,} tensors; lowbit reads at most "
            f"{MAX_TENSORS:,} per file"
        )
    data_offset = 8 + len(raw)
    tensors = [_tensor(path, n, e, data_offset, size - data_offset) for n, e in header.items()]
    check_overlaps(path, tensors)
    tensors.sort(key=lambda t: t.offset)
    return SafetensorsHeader({t.name: t for t in tensors}, meta, data_offset)


def _tensor(
    path: Path | str, name: str, entry: Any, data_offset: int, data_len: int
) -> SafetensorsTensor:
    try:
        dtype, shape, (begin, end) = entry["dtype"], entry["shape"], entry["data_offsets"]
        bits = SAFETENSORS_DTYPE_BITS[dtype]
    except (TypeError, KeyError, ValueError):
        return _refuse_entry(path, name, entry, data_len)
    if type(shape) is not list or type(begin) is not int or type(end) is not int or begin < 0:
        return _refuse_entry(path, name, entry, data_len)
    if len(shape) > MAX_RANK:
        return _refuse_entry(path, name, entry, data_len)
    extent = 1  # every dimension, zero-sized ones as 1: what numpy can hold
    numel = 1
    for d in shape:
        if type(d) is not int or d < 0:
            return _refuse_entry(path, name, entry, data_len)
        numel *= d
        extent *= d or 1
    if extent * -(-bits // 8) >= 2**63:
        return _refuse_entry(path, name, entry, data_len)
    bits *= numel
    if bits % 8 or end - begin != bits // 8 or end > data_len:
        return _refuse_entry(path, name, entry, data_len)
    return SafetensorsTensor(name, dtype, tuple(shape), data_offset + begin, end - begin)


def _refuse_entry(path: Path | str, name: str, entry: Any, data_len: int) -> Any:
    """Raise the LowbitError that says what is wrong with one tensor's header entry (the fast
    checks in :func:`_tensor` found something)."""
    bad = f"{path}: bad entry for tensor {short_repr(name)}"
    try:
        dtype, shape, (begin, end) = entry["dtype"], entry["shape"], entry["data_offsets"]
    except (TypeError, KeyError, ValueError):
        raise LowbitError(f"{bad}: needs dtype, shape and data_offsets [begin, end]") from None
    if not isinstance(dtype, str) or dtype not in SAFETENSORS_DTYPE_BITS:
        raise LowbitError(
            f"{bad}: dtype {short_repr(dtype)} is not a safetensors dtype; known: "
            f"{', '.join(SAFETENSORS_DTYPE_BITS)}"
        )
    ints = (*shape, begin, end) if isinstance(shape, list) else None
    if ints is None or not all(type(v) is int and v >= 0 for v in ints):
        raise LowbitError(
            f"{bad}: malformed shape {short_repr(shape)} or offsets {short_repr([begin, end])} "
            f"(non-negative integers)"
        )
    bits = SAFETENSORS_DTYPE_BITS[dtype]
    check_shape(shape, -(-bits // 8), f"{bad}: {dtype}")
    bits *= math.prod(shape)
    if bits % 8:  # as the safetensors package: a sub-byte tensor fills whole bytes
        raise LowbitError(f"{bad}: {dtype} of shape {tuple(shape)} is {bits} bits, not whole bytes")
    if end - begin != bits // 8:
        raise LowbitError(
            f"{bad}: {dtype} of shape {tuple(shape)} spans {short_repr(end - begin)} bytes, "
            f"expected {bits // 8} (the header lies about sizes)"
        )
    raise LowbitError(
        f"{bad}: it ends at data byte {end} but the file holds only {data_len} bytes of data "
        f"(truncated file, or the header lies about offsets)"
    )


def check_shape(shape: Any, item_bytes: int, what: str) -> None:
    """Refuse a shape numpy could not hold: more than 32 dimensions (numpy 1.x's limit), or
    ``2**63`` bytes or more counting every dimension, zero-sized ones as 1 (numpy refuses
    ``(0, 2**62, 4)`` too). Shared by the safetensors and GGUF parsers.

    Raises:
        LowbitError: naming ``what`` and the shape.
    """
    if len(shape) > MAX_RANK:
        raise LowbitError(f"{what} has {len(shape)} dimensions; at most {MAX_RANK} are allowed")
    extent = item_bytes
    for d in shape:
        extent *= max(d, 1)
        if extent >= 2**63:
            raise LowbitError(
                f"{what} of shape {short_repr(tuple(shape))} spans 2**63 bytes or more (the "
                f"header lies about sizes)"
            )


def check_overlaps(path: Path | str, tensors: Iterable[Any]) -> None:
    """Refuse tensors (with ``name``, ``offset``, ``nbytes``) whose bytes overlap in the file.

    Shared by the safetensors and GGUF parsers.
    """
    spans = sorted((t.offset, t.offset + t.nbytes, t.name) for t in tensors if t.nbytes)
    for (_, end, a), (start, _, b) in itertools.pairwise(spans):
        if start < end:
            raise LowbitError(
                f"{path}: tensors {short_repr(a)} and {short_repr(b)} overlap in the file (the header lies about "
                f"offsets)"
            )
