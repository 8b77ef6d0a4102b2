"""Checkpoint headers without the data: safetensors (8-byte length + JSON) and GGUF.

Both readers parse only the header and validate every length against the file size, so a
truncated or corrupt file is a clear :class:`~lowbit.errors.LowbitError`, and a 100 GB
checkpoint is counted in milliseconds. GGUF's GGML block sizes come from the ``gguf``
package (``GGML_QUANT_SIZES``); the header itself is parsed here (``gguf.GGUFReader`` builds
numpy views of every metadata item, about 4 s for a 49k-token vocabulary).
"""

from __future__ import annotations

import json
import math
import mmap
import struct
from pathlib import Path
from typing import Any

from lowbit.errors import LowbitError
from lowbit.modelspec import TensorInfo, classify

#: Bytes per element of the safetensors dtypes (sub-byte types use their data offsets).
SAFETENSORS_DTYPE_BITS = {
    "F64": 64, "I64": 64, "U64": 64, "F32": 32, "I32": 32, "U32": 32, "F16": 16, "BF16": 16,
    "I16": 16, "U16": 16, "I8": 8, "U8": 8, "BOOL": 8, "F8_E4M3": 8, "F8_E5M2": 8,
    "F8_E8M0": 8, "F6_E2M3": 6, "F6_E3M2": 6, "F4": 4,
}  # fmt: skip
_MAX_HEADER = 100 * 2**20


def read_safetensors_header(path: str | Path) -> tuple[list[TensorInfo], dict[str, str]]:
    """Parse a safetensors file's header (8-byte little-endian length + JSON); read no data.

    Returns:
        The tensors (names, shapes, dtypes, stored bytes, components) in offset order, and
        the ``__metadata__`` dict.

    Raises:
        LowbitError: the header is malformed (bad length, not JSON, offsets that do not
            match the shapes or the file size).
    """
    p = Path(path)
    size = p.stat().st_size
    with open(p, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise LowbitError(f"malformed safetensors {p}: shorter than the 8-byte header length")
        (n,) = struct.unpack("<Q", head)
        if n == 0 or n > min(size - 8, _MAX_HEADER):
            raise LowbitError(
                f"malformed safetensors {p}: header length {n} does not fit the file ({size} bytes)"
            )
        raw = f.read(n)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise LowbitError(f"malformed safetensors {p}: header is not JSON ({exc})") from None
    if not isinstance(header, dict):
        raise LowbitError(f"malformed safetensors {p}: header is not a JSON object")
    meta = header.pop("__metadata__", None) or {}
    data_size = size - 8 - n
    tensors = []
    for name, entry in header.items():
        try:
            dtype, shape, (begin, end) = entry["dtype"], entry["shape"], entry["data_offsets"]
            shape = tuple(int(s) for s in shape)
            ok = (
                dtype in SAFETENSORS_DTYPE_BITS
                and all(s >= 0 for s in shape)
                and 0 <= begin <= end <= data_size
            )
        except (KeyError, TypeError, ValueError):
            ok = False
        if not ok:
            raise LowbitError(
                f"malformed safetensors {p}: bad entry for tensor {name!r}: {entry!r}"
            )
        expect = math.ceil(math.prod(shape) * SAFETENSORS_DTYPE_BITS[dtype] / 8)
        if end - begin != expect:
            raise LowbitError(
                f"malformed safetensors {p}: tensor {name!r} ({dtype}{list(shape)}) spans "
                f"{end - begin} bytes, expected {expect}"
            )
        tensors.append(
            (
                begin,
                TensorInfo(
                    name, shape, classify(name, len(shape)), dtype, end - begin, offset=begin
                ),
            )
        )
    tensors.sort(key=lambda bt: bt[0])
    return [t for _, t in tensors], {str(k): str(v) for k, v in dict(meta).items()}


_GGUF_SCALAR = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q",
                12: "d"}  # fmt: skip
_GGUF_STRING, _GGUF_ARRAY = 8, 9


class _GGUFParser:
    """Reads a GGUF header from a memory map; validates every length against the file."""

    def __init__(self, buf: mmap.mmap | bytes, path: Path) -> None:
        self.buf, self.pos, self.path, self.end = buf, 0, path, len(buf)
        self.e = "<"

    def fail(self, what: str) -> LowbitError:
        return LowbitError(f"malformed GGUF {self.path}: {what} (at byte {self.pos})")

    def take(self, fmt: str) -> Any:
        size = struct.calcsize(self.e + fmt)
        if self.pos + size > self.end:
            raise self.fail("header runs past the end of the file")
        (v,) = struct.unpack_from(self.e + fmt, self.buf, self.pos)
        self.pos += size
        return v

    def string(self) -> str:
        n = self.take("Q")
        if self.pos + n > self.end:
            raise self.fail(f"string of {n} bytes runs past the end of the file")
        s = bytes(self.buf[self.pos : self.pos + n])
        self.pos += n
        return s.decode("utf-8", errors="replace")

    def value(self, vtype: int, keep: bool = True) -> Any:
        if vtype in _GGUF_SCALAR:
            return self.take(_GGUF_SCALAR[vtype])
        if vtype == _GGUF_STRING:
            return self.string()
        if vtype == _GGUF_ARRAY:
            itype, count = self.take("I"), self.take("Q")
            if itype in _GGUF_SCALAR:
                size = struct.calcsize(_GGUF_SCALAR[itype]) * count
                if self.pos + size > self.end:
                    raise self.fail(f"array of {count} values runs past the end of the file")
                if keep and count <= 64:
                    return [self.value(itype) for _ in range(count)]
                self.pos += size
                return count
            if itype == _GGUF_STRING:
                items = [self.string() for _ in range(count)]
                return items if keep and count <= 64 else count
            if itype == _GGUF_ARRAY:
                return [self.value(_GGUF_ARRAY, keep=False) for _ in range(count)]
            raise self.fail(f"unknown array element type {itype}")
        raise self.fail(f"unknown value type {vtype}")


def read_gguf_header(path: str | Path) -> tuple[list[TensorInfo], dict[str, Any]]:
    """Parse a GGUF file's header (metadata and tensor infos); read no tensor data.

    Shapes are returned in row-major order (GGUF lists the fastest dimension first). Stored
    bytes come from GGML's block sizes (``gguf.GGML_QUANT_SIZES``); large metadata arrays
    (the vocabulary) are returned as their length. ``TensorInfo.offset`` is relative to the
    data section, which starts at ``meta["__data_offset__"]`` (aligned to
    ``meta["__alignment__"]``, ``general.alignment`` or 32).

    Raises:
        LowbitError: not a GGUF file, or a header that does not fit the file.
        ImportError: the ``gguf`` package (for the GGML type table) is missing.
    """
    try:
        from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
    except ImportError:  # pragma: no cover - gguf is in the models extra
        raise ImportError("reading GGUF needs gguf: pip install 'lowbit[models]'") from None
    p = Path(path)
    with open(p, "rb") as f:
        if p.stat().st_size < 24:
            raise LowbitError(f"malformed GGUF {p}: too short for a GGUF header")
        buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        r = _GGUFParser(buf, p)
        if bytes(buf[:4]) != b"GGUF":
            raise LowbitError(f"{p} is not a GGUF file (magic {bytes(buf[:4])!r})")
        r.pos = 4
        version = r.take("I")
        if version > 0xFFFF:
            r.e, r.pos = ">", 4
            version = r.take("I")
        if version not in (2, 3):
            raise r.fail(f"unsupported GGUF version {version} (2 and 3 are)")
        n_tensors, n_kv = r.take("Q"), r.take("Q")
        if n_tensors > 10**7 or n_kv > 10**6:
            raise r.fail(f"implausible counts: {n_tensors} tensors, {n_kv} metadata keys")
        meta: dict[str, Any] = {}
        for _ in range(n_kv):
            key = r.string()
            meta[key] = r.value(r.take("I"))
        raw = []
        for _ in range(n_tensors):
            name = r.string()
            ndim = r.take("I")
            if ndim > 8:
                raise r.fail(f"tensor {name!r} has {ndim} dimensions")
            dims = [r.take("Q") for _ in range(ndim)]
            raw.append((name, dims, r.take("I"), r.take("Q")))
        alignment = int(meta.get("general.alignment", 32)) or 32
        data_start = -(-r.pos // alignment) * alignment
        size = len(buf)
    finally:
        buf.close()
    tensors = []
    for name, dims, ttype, offset in raw:
        try:
            qtype = GGMLQuantizationType(ttype)
            block, type_size = GGML_QUANT_SIZES[qtype]
        except (ValueError, KeyError):
            raise LowbitError(
                f"malformed GGUF {p}: tensor {name!r} has unknown type {ttype}"
            ) from None
        numel = math.prod(dims)
        if dims and numel % block:
            raise LowbitError(
                f"malformed GGUF {p}: tensor {name!r} has {numel} elements, "
                f"not a multiple of the {qtype.name} block of {block}"
            )
        nbytes = numel // block * type_size
        if data_start + offset + nbytes > size:
            raise LowbitError(f"malformed GGUF {p}: tensor {name!r} runs past the end of the file")
        shape = tuple(reversed(dims))
        tensors.append(
            TensorInfo(name, shape, classify(name, len(shape)), qtype.name, nbytes, offset=offset)
        )
    meta["__data_offset__"] = data_start
    meta["__alignment__"] = alignment
    return tensors, meta
