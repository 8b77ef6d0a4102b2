"""GGUF files (llama.cpp's model format): the one checked header parser, and tensor decoding.

Why our own parser: the ``gguf`` package's ``GGUFReader`` takes seconds to walk a vocabulary of
50k strings and builds its tensor views without checking them against the file size, so a
truncated file or a header that lies surfaces as a numpy reshape error. This parser reads the
header with ``struct`` (fast), checks every length, count, type and offset against the file before
anything is trusted, and names the file and tensor in each error; it needs no numpy. The reader
(:class:`~lowbit.checkpoints.readers.GGUFFile`) and the planner (:mod:`lowbit.planning.headers`) both build
on :func:`parse`. Tensor data is then decoded with the ``gguf`` package's own dequantizers
(``gguf.quants.dequantize``).

Layout (GGUF v2/v3, little-endian; ggml/docs/gguf.md): magic ``GGUF``, u32 version, u64 tensor
count, u64 key/value count, the key/values (key: u64 length + UTF-8 bytes; u32 value type; value),
the tensor infos (name, u32 n_dims, u64 dims innermost first, u32 ggml type, u64 offset relative
to the data section), padding to ``general.alignment`` (default 32), then the data section.
Big-endian GGUF files are refused (their tensor data could not be decoded as stored).
"""

from __future__ import annotations

import math
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from lowbit.checkpoints._safetensors import check_overlaps
from lowbit.errors import LowbitError

_MAGIC = b"GGUF"
_VERSIONS = (2, 3)
_DEFAULT_ALIGNMENT = 32
_MAX_DIMS = 8
_MAX_TENSORS, _MAX_KEYS = 10**7, 10**6  # beyond any real model: a corrupt count

# GGUF metadata value types (ggml/docs/gguf.md, gguf_metadata_value_type) -> struct code:
# UINT8, INT8, UINT16, INT16, UINT32, INT32, FLOAT32, BOOL, UINT64, INT64, FLOAT64.
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q",
            12: "d"}  # fmt: skip
_STRING = 8
_ARRAY = 9


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
    """The parsed header of a GGUF file."""

    version: int
    metadata: dict[str, Any]
    tensors: dict[str, GGUFTensor]
    alignment: int
    data_offset: int
    file_size: int


class _Cursor:
    """Bounds-checked little-endian reads from a buffer."""

    def __init__(self, buf: Any, path: Path, size: int) -> None:
        self.buf = buf
        self.pos = 0
        self.path = path
        self.size = size

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

    def string(self, what: str) -> str:
        n = self.u64(f"length of {what}")
        self.need(n, what)
        raw = bytes(self.buf[self.pos : self.pos + n])
        self.pos += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            # vocabularies may hold byte tokens that are not valid UTF-8 on their own
            return raw.decode("utf-8", errors="surrogateescape")


def _value(cur: _Cursor, vtype: int, key: str) -> Any:
    if vtype in _SCALARS:
        return cur.scalars(_SCALARS[vtype], 1, f"value of {key!r}")[0]
    if vtype == _STRING:
        return cur.string(f"value of {key!r}")
    if vtype == _ARRAY:
        etype = cur.u32(f"array type of {key!r}")
        count = cur.u64(f"array length of {key!r}")
        if etype in _SCALARS:
            return list(cur.scalars(_SCALARS[etype], count, f"array {key!r} of {count} values"))
        if etype == _STRING:
            cur.need(count * 8, f"array {key!r} of {count} strings")  # each has a u64 length
            return [cur.string(f"string {i} of {key!r}") for i in range(count)]
        if etype == _ARRAY:
            cur.need(count * 12, f"array {key!r} of {count} arrays")
            return [_value(cur, _ARRAY, key) for _ in range(count)]
        raise LowbitError(f"{cur.path}: metadata {key!r} has unknown array element type {etype}")
    raise LowbitError(f"{cur.path}: metadata {key!r} has unknown value type {vtype}")


def _ggml_type(code: int, name: str, path: Path) -> tuple[str, int, int]:
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
        LowbitError: not a GGUF file, an unsupported version (or big-endian), implausible
            counts, a truncated header, an unknown value type, a duplicate key or tensor, a
            tensor of more than 8 dimensions or of an unknown type, rows that are not whole
            blocks, an alignment that is not a power of two, or tensor extents that are
            unaligned, fall outside the file or overlap.
        ImportError: the ``gguf`` package (for the GGML type table) is missing.
    """
    size = path.stat().st_size
    if size < 24:
        raise LowbitError(f"{path}: not a GGUF file ({size} bytes, shorter than a GGUF header)")
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
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
        for _ in range(n_kv):
            key = cur.string("metadata key")
            vtype = cur.u32(f"type of {key!r}")
            if key in metadata:
                raise LowbitError(f"{path}: metadata key {key!r} appears twice")
            metadata[key] = _value(cur, vtype, key)
        infos = []
        for i in range(n_tensors):
            name = cur.string(f"name of tensor {i}")
            n_dims = cur.u32(f"dimension count of {name!r}")
            if n_dims > _MAX_DIMS:
                raise LowbitError(f"{path}: tensor {name!r} claims {n_dims} dimensions")
            dims = [cur.u64(f"dimensions of {name!r}") for _ in range(n_dims)]
            code = cur.u32(f"type of {name!r}")
            rel = cur.u64(f"offset of {name!r}")
            infos.append((name, dims, code, rel))
        alignment = metadata.get("general.alignment", _DEFAULT_ALIGNMENT)
        if type(alignment) is not int or alignment <= 0 or alignment & (alignment - 1):
            raise LowbitError(f"{path}: general.alignment {alignment!r} is not a power of two")
        data_offset = -(-cur.pos // alignment) * alignment

    tensors: dict[str, GGUFTensor] = {}
    for name, dims, code, rel in infos:
        if name in tensors:
            raise LowbitError(f"{path}: tensor {name!r} appears twice in the GGUF header")
        type_name, block, type_size = _ggml_type(code, name, path)
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
                f"{path}: tensor {name!r} ({type_name}, shape {tuple(reversed(dims))}) needs bytes "
                f"{start}..{start + nbytes} but the file has {size} bytes (truncated, or the "
                f"header lies about sizes or offsets)"
            )
        tensors[name] = GGUFTensor(
            name, tuple(int(d) for d in reversed(dims)), code, type_name, start, nbytes
        )
    check_overlaps(path, tensors.values())
    return GGUFHeader(version, metadata, tensors, alignment, data_offset, size)


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
        import ml_dtypes

        return raw.view(np.uint16).view(ml_dtypes.bfloat16).reshape(tensor.shape)
    from gguf import quants
    from gguf.constants import GGMLQuantizationType

    qtype = GGMLQuantizationType(tensor.type_code)
    rows = raw.reshape(-1, tensor.nbytes // max(1, _rows(tensor.shape)))
    try:
        out = quants.dequantize(rows, qtype)
    except NotImplementedError:
        raise LowbitError(
            f"{path}: tensor {tensor.name!r} has GGUF type {tensor.type_name}, which the gguf "
            f"package cannot dequantize"
        ) from None
    return out.reshape(tensor.shape)


def _rows(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape[:-1]:
        n *= d
    return n


# GGUF metadata key (after the "<arch>." prefix) -> Hugging Face config key.
_CONFIG_KEYS = {
    "block_count": "num_hidden_layers",
    "context_length": "max_position_embeddings",
    "embedding_length": "hidden_size",
    "feed_forward_length": "intermediate_size",
    "attention.head_count": "num_attention_heads",
    "attention.head_count_kv": "num_key_value_heads",
    "attention.layer_norm_rms_epsilon": "rms_norm_eps",
    "attention.layer_norm_epsilon": "layer_norm_eps",
    "attention.key_length": "head_dim",
    "rope.freq_base": "rope_theta",
    "vocab_size": "vocab_size",
}


def derive_config(metadata: dict[str, Any], tensor_names: set[str]) -> dict[str, Any]:
    """A Hugging Face style config dict from GGUF metadata (llama.cpp's key names)."""
    arch = metadata.get("general.architecture", "")
    cfg: dict[str, Any] = {"model_type": arch}
    for gkey, hkey in _CONFIG_KEYS.items():
        value = metadata.get(f"{arch}.{gkey}")
        if value is not None:
            cfg[hkey] = value
    if "head_dim" not in cfg and f"{arch}.rope.dimension_count" in metadata:
        cfg["head_dim"] = metadata[f"{arch}.rope.dimension_count"]
    if "vocab_size" not in cfg and "tokenizer.ggml.tokens" in metadata:
        cfg["vocab_size"] = len(metadata["tokenizer.ggml.tokens"])
    if "rms_norm_eps" in cfg:  # stored as float32: give back the decimal it was written from
        cfg["rms_norm_eps"] = float(np.format_float_positional(np.float32(cfg["rms_norm_eps"])))
    for gkey, hkey in (
        ("bos_token_id", "bos_token_id"),
        ("eos_token_id", "eos_token_id"),
        ("padding_token_id", "pad_token_id"),
    ):
        if f"tokenizer.ggml.{gkey}" in metadata:
            cfg[hkey] = metadata[f"tokenizer.ggml.{gkey}"]
    cfg["tie_word_embeddings"] = "output.weight" not in tensor_names
    if arch == "llama":
        cfg["architectures"] = ["LlamaForCausalLM"]
    return cfg
