"""GGUF files (llama.cpp's model format): the one checked header parser, and tensor decoding.

Why our own parser: the ``gguf`` package's ``GGUFReader`` takes seconds to walk a vocabulary of
50k strings and builds its tensor views without checking them against the file size, so a
truncated file or a header that lies surfaces as a numpy reshape error. This parser reads the
header with ``struct`` (fast), checks every length, count, type and offset against the file before
anything is trusted, and names the file and tensor in each error. The reader
(:class:`~lowbit.checkpoints.gguf.reader.GGUFFile`) and the planner (:mod:`lowbit.planning.headers`) both build
on :func:`parse`. Tensor data is then decoded with the ``gguf`` package's own dequantizers
(``gguf.quants.dequantize``).

Layout (GGUF v2/v3, little-endian; ggml/docs/gguf.md): magic ``GGUF``, u32 version, u64 tensor
count, u64 key/value count, the key/values (key: u64 length + UTF-8 bytes; u32 value type; value),
the tensor infos (name, u32 n_dims, u64 dims innermost first, u32 ggml type, u64 offset relative
to the data section), padding to ``general.alignment`` (default 32), then the data section.
Big-endian GGUF files are refused (their tensor data could not be decoded as stored).

Limits (docs/security.md): keys and tensor names must be UTF-8; metadata arrays nest at most
``MAX_ARRAY_DEPTH`` deep and hold at most ``MAX_METADATA_ELEMENTS`` elements in all; a
block-quantized tensor needs at least one dimension and no zero one; every metadata value lowbit
uses is type-checked (:func:`check_metadata`). Each key's value span is kept so a writer can copy
the metadata byte for byte (:func:`raw_metadata`) instead of through ``GGUFReader``.
"""

from __future__ import annotations

import math
import mmap
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from lowbit._arrays import bfloat16
from lowbit._json import check_regular_file, short_repr
from lowbit._parallel import map_chunks
from lowbit.checkpoints.io.gguf_metadata import check_metadata
from lowbit.checkpoints.io.safetensors import check_overlaps, check_shape
from lowbit.errors import LowbitError
from lowbit.ggml import _numba

_MAGIC = b"GGUF"
_VERSIONS = (2, 3)
_DEFAULT_ALIGNMENT = 32
_MAX_DIMS = 8
_MAX_TENSORS, _MAX_KEYS = 10**7, 10**6  # beyond any real model: a corrupt count
#: Most elements in all metadata arrays of one file together (a 256k-token vocabulary, its
#: scores, types and 500k merges hold about 1.3M): bounds the Python objects a file can make.
MAX_METADATA_ELEMENTS = 2**26
#: Deepest nesting of metadata arrays (llama.cpp refuses arrays of arrays; lowbit reads a few).
MAX_ARRAY_DEPTH = 4

# GGUF metadata value types (ggml/docs/gguf.md, gguf_metadata_value_type) -> struct code:
# UINT8, INT8, UINT16, INT16, UINT32, INT32, FLOAT32, BOOL, UINT64, INT64, FLOAT64.
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q",
            12: "d"}  # fmt: skip
_STRING = 8
_ARRAY = 9
_U64 = struct.Struct("<Q")


@dataclass(frozen=True)
class GGUFTensor:
    """One tensor's entry in a GGUF header, already checked against the file."""

    name: str
    shape: tuple[int, ...]  # numpy order (outermost first): ggml's dims reversed
    type_code: int
    type_name: str
    offset: int  # absolute byte offset in the file
    nbytes: int


@dataclass(frozen=True)
class GGUFHeader:
    """The parsed header of a GGUF file.

    ``spans`` gives each metadata key's value type and the byte range of its encoded value
    (after the type), so the metadata can be copied byte for byte (:func:`raw_metadata`).
    """

    version: int
    metadata: dict[str, Any]
    tensors: dict[str, GGUFTensor]
    alignment: int
    data_offset: int
    file_size: int
    spans: dict[str, tuple[int, int, int]] = field(default_factory=dict)


class _Cursor:
    """Bounds-checked little-endian reads from a buffer."""

    def __init__(self, buf: Any, path: Path | str, size: int) -> None:
        self.buf = buf
        self.pos = 0
        self.path = path
        self.size = size
        self.elements = 0  # metadata array elements read so far

    def need(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > self.size:
            raise LowbitError(
                f"{self.path}: GGUF header is truncated or corrupt: {what} needs {n} bytes at "
                f"offset {self.pos}, past the end of the file ({self.size} bytes)"
            )

    def scalars(self, code: str, count: int, what: str) -> tuple[Any, ...]:
        n = count * struct.calcsize("<" + code)
        self.need(n, what)
        values = struct.unpack_from(f"<{count}{code}", self.buf, self.pos)
        self.pos += n
        return values

    def u32(self, what: str) -> int:
        return int(self.scalars("I", 1, what)[0])

    def u64(self, what: str) -> int:
        return int(self.scalars("Q", 1, what)[0])

    def raw(self, what: str) -> bytes:
        n = self.u64(f"length of {what}")
        self.need(n, what)
        raw = bytes(self.buf[self.pos : self.pos + n])
        self.pos += n
        return raw

    def string(self, what: str) -> str:
        raw = self.raw(what)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            # vocabularies may hold byte tokens that are not valid UTF-8 on their own; the
            # values lowbit uses are checked strictly (check_metadata)
            return raw.decode("utf-8", errors="surrogateescape")

    def strings(self, count: int, key: str) -> list[str]:
        """``count`` strings, as ``string`` reads them one by one (the same checks and
        errors), in one loop: a 50k-token vocabulary is most of a header."""
        buf, pos, size = self.buf, self.pos, self.size
        length = _U64.unpack_from
        out: list[str] = []
        append = out.append
        for i in range(count):
            if pos + 8 > size:
                self.pos = pos
                self.need(8, f"length of string {i} of {key!r}")
            (n,) = length(buf, pos)
            pos += 8
            if pos + n > size:
                self.pos = pos
                self.need(n, f"string {i} of {key!r}")
            raw = buf[pos : pos + n]
            pos += n
            try:
                append(str(raw, "utf-8"))
            except UnicodeDecodeError:  # byte tokens: as ``string`` keeps them
                append(str(raw, "utf-8", "surrogateescape"))
        self.pos = pos
        return out

    def name(self, what: str) -> str:
        """A key or tensor name: strictly UTF-8."""
        raw = self.raw(what)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise LowbitError(
                f"{self.path}: {what} is not valid UTF-8 (byte {exc.start} of {short_repr(raw)})"
            ) from None

    def count(self, n: int, key: str) -> None:
        self.elements += n
        if self.elements > MAX_METADATA_ELEMENTS:
            raise LowbitError(
                f"{self.path}: GGUF metadata arrays hold more than {MAX_METADATA_ELEMENTS:,} "
                f"elements in all (at {short_repr(key)}); lowbit reads at most that many"
            )


def _value(cur: _Cursor, vtype: int, key: str, depth: int = 0) -> Any:
    if vtype in _SCALARS:
        return cur.scalars(_SCALARS[vtype], 1, f"value of {key!r}")[0]
    if vtype == _STRING:
        return cur.string(f"value of {key!r}")
    if vtype == _ARRAY:
        if depth >= MAX_ARRAY_DEPTH:
            raise LowbitError(
                f"{cur.path}: metadata {key!r} nests arrays more than {MAX_ARRAY_DEPTH} deep"
            )
        etype = cur.u32(f"array type of {key!r}")
        count = cur.u64(f"array length of {key!r}")
        if etype in _SCALARS:
            cur.need(count * struct.calcsize("<" + _SCALARS[etype]), f"array {key!r}")
            cur.count(count, key)
            return list(cur.scalars(_SCALARS[etype], count, f"array {key!r} of {count} values"))
        if etype == _STRING:
            cur.need(count * 8, f"array {key!r} of {count} strings")  # each has a u64 length
            cur.count(count, key)
            return cur.strings(count, key)
        if etype == _ARRAY:
            cur.need(count * 12, f"array {key!r} of {count} arrays")
            cur.count(count, key)
            return [_value(cur, _ARRAY, key, depth + 1) for _ in range(count)]
        raise LowbitError(f"{cur.path}: metadata {key!r} has unknown array element type {etype}")
    raise LowbitError(f"{cur.path}: metadata {key!r} has unknown value type {vtype}")


def _ggml_type(code: int, name: str, path: Path | str) -> tuple[str, int, int]:
    """(type name, block size, bytes per block) of a ggml tensor type code."""
    try:
        from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType
    except ImportError:  # pragma: no cover - gguf is in the models extra
        raise ImportError("reading GGUF needs gguf: pip install 'lowbit[models]'") from None

    try:
        qtype = GGMLQuantizationType(code)
    except ValueError:
        raise LowbitError(
            f"{path}: tensor {name!r} has GGUF type {code}, which this gguf package does not "
            f"know (removed or newer than gguf supports); known types: "
            f"{', '.join(t.name for t in GGMLQuantizationType)}"
        ) from None
    block, type_size = GGML_QUANT_SIZES[qtype]
    return qtype.name, block, type_size


def parse(path: Path) -> GGUFHeader:
    """Parse and check a GGUF header.

    Raises:
        LowbitError: not a regular file (a FIFO, a device), not a GGUF file, an unsupported
            version (or big-endian), implausible counts, a truncated header, a key or tensor
            name that is not UTF-8, an unknown value type, metadata arrays nested more than 4
            deep or holding more than 2**26 elements in all, a duplicate key or tensor, a
            tensor of more than 8 dimensions, of an unknown type, of 2**63 bytes or more, or
            block-quantized with no dimensions or a zero-sized one, rows that are not whole
            blocks, an alignment that is not a power of two, tensor extents that are
            unaligned, fall outside the file or overlap, or a metadata value lowbit uses of
            the wrong type (see :func:`check_metadata`).
        ImportError: the ``gguf`` package (for the GGML type table) is missing.
    """
    ident = _identity(path)
    size = check_regular_file(path)
    if size < 24:
        raise LowbitError(f"{path}: not a GGUF file ({size} bytes, shorter than a GGUF header)")
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        header = _parse_buffer(buf, size, path)
    if ident is not None and ident[3] == size:
        _remember(path, header.spans, ident)
    return header


def parse_bytes(data: bytes, path: Path | str = "<bytes>") -> GGUFHeader:
    """:func:`parse` on a whole file held in memory (for tests and fuzzing)."""
    if len(data) < 24:
        raise LowbitError(
            f"{path}: not a GGUF file ({len(data)} bytes, shorter than a GGUF header)"
        )
    return _parse_buffer(data, len(data), path)


def _parse_buffer(buf: Any, size: int, path: Path | str) -> GGUFHeader:
    if buf[:4] != _MAGIC:
        raise LowbitError(f"{path}: not a GGUF file (magic {bytes(buf[:4])!r}, want b'GGUF')")
    cur = _Cursor(buf, path, size)
    cur.pos = 4
    version = cur.u32("version")
    if version not in _VERSIONS:
        hint = " (a big-endian file?)" if version & 0xFFFF == 0 else ""
        raise LowbitError(f"{path}: unsupported GGUF version {version}{hint}; supported: 2, 3")
    n_tensors = cur.u64("tensor count")
    n_kv = cur.u64("metadata count")
    # every key/value needs at least 12 bytes and every tensor info at least 24
    if n_tensors > _MAX_TENSORS or n_kv > _MAX_KEYS or n_kv * 12 + n_tensors * 24 > size:
        raise LowbitError(
            f"{path}: GGUF header claims {n_tensors} tensors and {n_kv} metadata entries: "
            f"implausible, or past the end of the file ({size} bytes)"
        )
    metadata: dict[str, Any] = {}
    spans: dict[str, tuple[int, int, int]] = {}
    for _ in range(n_kv):
        key = cur.name("metadata key")
        vtype = cur.u32(f"type of {key!r}")
        if key in metadata:
            raise LowbitError(f"{path}: metadata key {key!r} appears twice")
        begin = cur.pos
        metadata[key] = _value(cur, vtype, key)
        spans[key] = (vtype, begin, cur.pos)
    infos = []
    for i in range(n_tensors):
        name = cur.name(f"name of tensor {i}")
        n_dims = cur.u32(f"dimension count of {name!r}")
        if n_dims > _MAX_DIMS:
            raise LowbitError(f"{path}: tensor {name!r} claims {n_dims} dimensions")
        dims = list(cur.scalars("Q", n_dims, f"dimensions of {name!r}"))
        code = cur.u32(f"type of {name!r}")
        rel = cur.u64(f"offset of {name!r}")
        infos.append((name, dims, code, rel))
    alignment = metadata.get("general.alignment", _DEFAULT_ALIGNMENT)
    if type(alignment) is not int or alignment <= 0 or alignment & (alignment - 1):
        raise LowbitError(
            f"{path}: general.alignment {short_repr(alignment)} is not a power of two"
        )
    data_offset = -(-cur.pos // alignment) * alignment

    tensors: dict[str, GGUFTensor] = {}
    for name, dims, code, rel in infos:
        if name in tensors:
            raise LowbitError(f"{path}: tensor {name!r} appears twice in the GGUF header")
        type_name, block, type_size = _ggml_type(code, name, path)
        shape = tuple(reversed(dims))
        if block > 1 and (not dims or 0 in dims):
            raise LowbitError(
                f"{path}: tensor {name!r} is {type_name} (blocks of {block}) with shape "
                f"{shape}: a block-quantized tensor needs at least one dimension, none zero"
            )
        # block types are read back as float32: 4 bytes per value
        check_shape(shape, 4 if block > 1 else type_size, f"{path}: tensor {name!r}")
        numel = math.prod(dims)  # exact: a lying header must not wrap around
        if dims and dims[0] % block:
            raise LowbitError(
                f"{path}: tensor {name!r} has rows of {dims[0]} values, not a multiple of "
                f"{type_name}'s block of {block}"
            )
        nbytes = numel // block * type_size
        start = data_offset + rel
        if rel % alignment:
            raise LowbitError(
                f"{path}: tensor {name!r} starts at data offset {rel}, not aligned to {alignment}"
            )
        if start + nbytes > size:
            raise LowbitError(
                f"{path}: tensor {name!r} ({type_name}, shape {shape}) needs bytes "
                f"{start}..{start + nbytes} but the file has {size} bytes (truncated, or the "
                f"header lies about sizes or offsets)"
            )
        tensors[name] = GGUFTensor(name, shape, code, type_name, start, nbytes)
    check_overlaps(path, tensors.values())
    check_metadata(metadata, path)
    return GGUFHeader(version, metadata, tensors, alignment, data_offset, size, spans)


def raw_metadata(path: Path) -> dict[str, tuple[int, bytes]]:
    """Every metadata key of a GGUF file as (value type, encoded value bytes), in file order.

    The bytes are the value exactly as stored after its u32 type (a string's u64 length and
    bytes; an array's element type, u64 count and elements), so a writer can copy the value
    byte for byte, whatever it holds, at the cost of one memory copy.

    Raises:
        LowbitError: a file :func:`parse` refuses.
    """
    spans = _SPANS.get(_identity(path))
    if spans is None:
        spans = parse(path).spans
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        return {key: (vtype, bytes(buf[a:b])) for key, (vtype, a, b) in spans.items()}


# The value spans of the files parsed last, by file identity, so that copying a source's
# metadata (``raw_metadata``, for a writer) does not parse its header a second time. A file
# changed since (another inode, size or modification time) is parsed again.
_SPANS: dict[tuple[Any, ...], dict[str, tuple[int, int, int]]] = {}


def _identity(path: Path | str) -> tuple[Any, ...] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (os.path.realpath(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def _remember(path: Path, spans: dict[str, tuple[int, int, int]], ident: Any) -> None:
    if ident is None:
        return
    while len(_SPANS) >= 4:
        _SPANS.pop(next(iter(_SPANS)))
    _SPANS[ident] = dict(spans)


def dequantize(buf: np.ndarray, tensor: GGUFTensor, path: Path) -> np.ndarray:
    """Decode one tensor's bytes (a uint8 view of the file) to a numpy array.

    F32/F16/F64 and integer tensors come back in their own dtype (memory-mapped where possible);
    BF16 as ``ml_dtypes.bfloat16``; block-quantized types as float32 via ``gguf.quants``.

    Raises:
        LowbitError: a type the gguf package cannot dequantize.
    """
    raw = buf[tensor.offset : tensor.offset + tensor.nbytes]
    plain = {
        "F32": "<f4",
        "F16": "<f2",
        "F64": "<f8",
        "I8": "<i1",
        "I16": "<i2",
        "I32": "<i4",
        "I64": "<i8",
    }
    if tensor.type_name in plain:
        return raw.view(plain[tensor.type_name]).reshape(tensor.shape)
    if tensor.type_name == "BF16":
        return raw.view(np.uint16).view(bfloat16()).reshape(tensor.shape)
    from gguf import quants
    from gguf.constants import GGMLQuantizationType

    qtype = GGMLQuantizationType(tensor.type_code)
    rows = raw.reshape(-1, tensor.nbytes // max(1, _rows(tensor.shape)))
    kind = getattr(quants, qtype.name, None)
    try:
        with np.errstate(all="ignore"):  # NaN/inf block scales are the file's data, not errors
            if kind is None or not hasattr(kind, "dequantize_rows") or not rows.shape[1]:
                out = quants.dequantize(rows, qtype)
            else:
                out = _dequantize_rows(kind, rows, math.prod(tensor.shape))
    except NotImplementedError:
        raise LowbitError(
            f"{path}: tensor {tensor.name!r} has GGUF type {tensor.type_name}, which the gguf "
            f"package cannot dequantize"
        ) from None
    return out.reshape(tensor.shape)


_DEQUANT_VALUES = 1 << 18  # values per call of gguf's block decoder

# Q4_0 and Q4_1 (ggml's block_q4_0 / block_q4_1: a float16 scale d, for Q4_1 a float16
# minimum m, then 16 bytes of nibbles: value j < 16 in the low nibble of byte j, value
# 16 + j in its high nibble) decode as gguf's own ``dequantize_blocks`` does them,
# d * (q - 8) and d * q + m in float32, in that operand order (so NaN and infinite
# scales give the same bits), the nibbles split in uint8 and converted in one pass (twice
# as fast as looking them up in a float32 table, four times gguf's own). Q4_0, Q4_1 and
# Q8_0 take a compiled kernel (``lowbit.ggml._numba.ggml_decode``, the same bits, ten
# times faster again) where numba is in use, and so do Q2_K..Q6_K
# (``lowbit.ggml._numba.kquant_decode``: gguf's bits on every finite float16 scale, tested
# against ``dequantize_rows``); a band with a non-finite scale, and other types, use gguf's
# decoder.


def _decode_q4(blocks: np.ndarray, out: np.ndarray, offset: bool) -> None:
    d = blocks[:, 0:2].view(np.float16).astype(np.float32)  # (n, 1)
    qs = blocks[:, 4:] if offset else blocks[:, 2:]
    codes = np.empty(out.shape, dtype=np.uint8)
    np.bitwise_and(qs, np.uint8(15), out=codes[:, :16])
    np.right_shift(qs, np.uint8(4), out=codes[:, 16:])
    if offset:
        out[...] = codes
        np.multiply(d, out, out=out)
        np.add(out, blocks[:, 2:4].view(np.float16).astype(np.float32), out=out)
    else:
        np.subtract(codes, np.uint8(8), out=codes)  # wraps: as int8, q - 8
        out[...] = codes.view(np.int8)
        np.multiply(d, out, out=out)


_DECODERS = {
    "Q4_0": lambda blocks, out: _decode_q4(blocks, out, offset=False),
    "Q4_1": lambda blocks, out: _decode_q4(blocks, out, offset=True),
}


def _dequantize_rows(kind: Any, rows: np.ndarray, numel: int) -> np.ndarray:
    """float32 values of block-quantized ``rows`` by gguf's own decoder for the type
    (``kind.dequantize_rows``), called on bands of rows of about ``_DEQUANT_VALUES``
    values, on ``lowbit._parallel``'s threads. ``gguf.quants.dequantize`` calls it on 16 rows
    at a time, which costs more in calls than in arithmetic; every block decodes alone, so
    the values are the same."""
    kind.init_grid()
    out = np.empty(numel, dtype=np.float32)
    per_row = numel // rows.shape[0]
    step = max(1, _DEQUANT_VALUES // max(1, per_row))

    name = kind.__name__
    decode = _DECODERS.get(name)
    compiled = name in _numba.GGML_DECODED
    kquant = name in _numba.KQUANT_DECODED

    def band(a: int) -> None:
        part = rows[a : a + step]
        dst = out[a * per_row : (a + part.shape[0]) * per_row]
        blocks, values = part.reshape(-1, kind.type_size), dst.reshape(-1, kind.block_size)
        if compiled and _numba.ggml_decode(blocks, values, name, numel):
            return
        if kquant and _numba.kquant_decode(blocks, values, name, numel):
            return
        if decode is not None:
            decode(blocks, values)
        else:
            dst[:] = kind.dequantize_rows(part).reshape(-1)

    map_chunks(band, range(0, rows.shape[0], step))  # numpy's loops run without the GIL
    return out


def _rows(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape[:-1]:
        n *= d
    return n
