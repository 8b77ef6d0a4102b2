"""Write GGUF checkpoints that llama.cpp runs: any GGML block type lowbit.ggml writes, F32 / F16 / BF16.

The file is written with the ``gguf`` package's own ``GGUFWriter`` (so its header, metadata and
alignment follow the GGUF specification as llama.cpp reads it), one tensor at a time: the writer
plans every tensor from its shape first, then quantizes and writes each in turn, so peak memory
is about one tensor. The file appears under its final name only when complete.

Tensor names and layouts are written as given: a file llama.cpp can run needs llama.cpp's names
(``blk.0.attn_q.weight``) and row order, as in a GGUF read back from llama.cpp or the ``gguf``
package. Copy the metadata of such a source file (architecture, hyperparameters, tokenizer) with
``source=``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from lowbit._arrays import _is_ml_float, bfloat16
from lowbit._progress import progress_bar
from lowbit.checkpoints.gguf.ranges import check_value
from lowbit.checkpoints.io import gguf_file as _gguf
from lowbit.checkpoints.io.arrays import as_numpy
from lowbit.checkpoints.io.atomic import atomic_file
from lowbit.checkpoints.io.outputs import WRITER_KEY, writer_tag
from lowbit.errors import LowbitError
from lowbit.ggml import blocks as ggml_blocks
from lowbit.ggml import legacy

__all__ = ["GGUFTensor", "gguf_from_quantized", "write_gguf"]

# Reader-generated header fields, not metadata: the writer recomputes them.
_HEADER_KEYS = ("GGUF.version", "GGUF.tensor_count", "GGUF.kv_count")
# Keys the writer sets itself (architecture in GGUFWriter's constructor; data alignment is the
# writer's default 32, so a source's other alignment must not be copied).
_WRITER_KEYS = ("general.architecture", "general.alignment")

_MAX_NAME = 63  # GGML_MAX_NAME is 64 bytes including the terminating NUL

_PLAIN = {"F32": np.float32, "F16": np.float16}


@dataclass(frozen=True, eq=False)
class GGUFTensor:
    """A tensor and the GGUF type to store it as.

    Attributes:
        data: the values (any real array or torch tensor), or with ``raw=True`` the tensor's
            stored bytes (uint8, as ``gguf.GGUFReader`` gives them), copied unchanged.
        qtype: a block type of :data:`lowbit.ggml.blocks.TYPES` (``"Q4_K"``, ``"Q6_K"``,
            ``"IQ4_XS"``, ``"Q8_0"``, ...: quantized here, byte for byte as llama.cpp's
            ``ggml_quantize_chunk``), ``"F32"``, ``"F16"`` or ``"BF16"``; with ``raw=True``
            any GGML type name.
        raw: ``data`` already holds ``qtype``'s bytes.
        imatrix: an importance vector for the block quantizer, one weight per column (for a
            3-D tensor of experts, one vector per expert, concatenated), or None.
    """

    data: Any
    qtype: str = "F32"
    raw: bool = False
    imatrix: Any = None


@dataclass
class _Planned:
    shape: tuple[int, ...]
    ggml_type: Any  # gguf.GGMLQuantizationType
    nbytes: int
    produce: Callable[[], np.ndarray]


def _ggml_type(name: str) -> Any:
    from gguf import GGMLQuantizationType

    key = str(getattr(name, "name", name)).upper()
    try:
        return GGMLQuantizationType[key]
    except KeyError:
        raise LowbitError(f"unknown GGML tensor type {name!r}") from None


def _is_quantized_tensor(x: Any) -> bool:
    return all(hasattr(x, a) for a in ("unpack", "scale", "scheme", "shape"))


def gguf_from_quantized(qt: Any) -> GGUFTensor:
    """Map a lowbit ``QuantizedTensor`` onto GGUF Q4_0 / Q8_0 blocks without requantizing.

    Q4_0 is symmetric int4 and Q8_0 symmetric int8, both with one float16 scale per group of 32
    along the last axis: a ``QuantizedTensor`` of that scheme (``group_size=32``, ``axis=-1``,
    ``scale_format="float16"``, no zero point) is stored exactly, and llama.cpp dequantizes it
    to the same float32 values as ``qt.dequantize()``.

    Raises:
        LowbitError: any other scheme (named in the message, with the scheme it needs).
    """
    fmt = qt.format
    name = getattr(fmt, "name", str(fmt))
    kind = getattr(fmt, "kind", None)
    bits = getattr(fmt, "bits", None)
    shape = tuple(qt.shape)
    need = "int4 or int8, symmetric, group_size=32 along the last axis, float16 scales"
    if kind != "int" or not getattr(fmt, "signed", False) or bits not in (4, 8):
        raise LowbitError(f"GGUF Q4_0/Q8_0 hold {need}; got format {name}")
    if getattr(qt, "zero_point", None) is not None:
        raise LowbitError(f"GGUF Q4_0/Q8_0 hold {need}; got an asymmetric {name} (zero points)")
    scheme = qt.scheme
    granularity = str(getattr(qt.granularity, "value", qt.granularity))
    axis = scheme.axis if scheme.axis is not None else -1
    if (
        granularity != "group"
        or scheme.group_size != legacy.BLOCK
        or not shape
        or axis not in (-1, len(shape) - 1)
    ):
        raise LowbitError(
            f"GGUF Q4_0/Q8_0 hold {need}; got {name} with granularity {granularity}, "
            f"group_size {scheme.group_size}, axis {scheme.axis}"
        )
    qtype = "Q4_0" if bits == 4 else "Q8_0"

    codes = np.asarray(qt.unpack()).reshape(shape)
    build = legacy.q4_0_from_codes if bits == 4 else legacy.q8_0_from_codes
    return GGUFTensor(build(np.asarray(qt.scale), codes), qtype, raw=True)


def _plan(name: str, value: Any) -> _Planned:
    """Shape, type and size of one tensor, and a function making its bytes (run later)."""
    if not name or len(name.encode()) > _MAX_NAME:
        raise LowbitError(
            f"GGUF tensor names must be 1 to {_MAX_NAME} bytes (llama.cpp's limit), got {name!r}"
        )
    if _is_quantized_tensor(value):
        value = gguf_from_quantized(value)
    if not isinstance(value, GGUFTensor):
        arr = as_numpy(value)
        if arr.dtype == np.float16:
            qtype = "F16"
        elif arr.dtype.name == "bfloat16":
            qtype = "BF16"
        elif arr.dtype.kind in "fiub" and arr.dtype.kind != "f":
            return _plan_int(name, arr)
        else:
            qtype = "F32"
        value = GGUFTensor(arr, qtype)

    gtype = _ggml_type(value.qtype)
    qname = gtype.name
    if value.raw:
        from gguf import GGML_QUANT_SIZES

        raw = np.asarray(value.data)
        if raw.dtype != np.uint8 or raw.ndim == 0:
            raise LowbitError(f"tensor {name!r}: raw {qname} data must be a uint8 array")
        block, size = GGML_QUANT_SIZES[gtype]
        if raw.shape[-1] % size:
            raise LowbitError(
                f"tensor {name!r}: {raw.shape[-1]} bytes per row is not a whole number of "
                f"{qname} blocks ({size} bytes)"
            )
        shape = (*raw.shape[:-1], raw.shape[-1] // size * block)
        return _Planned(shape, gtype, raw.nbytes, lambda: np.ascontiguousarray(raw))

    arr = as_numpy(value.data)
    shape = tuple(arr.shape)
    if arr.dtype.kind not in "fiu" and not _is_ml_float(arr.dtype):
        raise LowbitError(f"tensor {name!r}: expected real numbers, got dtype {arr.dtype}")
    if qname in legacy.QTYPES and value.imatrix is None:
        if not shape or shape[-1] % legacy.BLOCK:
            raise LowbitError(
                f"tensor {name!r} of shape {shape}: {qname} needs a last axis that is a "
                f"multiple of {legacy.BLOCK}"
            )

        def make() -> np.ndarray:
            try:
                return legacy.quantize(arr, qname)
            except LowbitError as exc:
                raise LowbitError(f"tensor {name!r}: {exc}") from None

        return _Planned(shape, gtype, legacy.nbytes(shape, qname), make)
    if qname in ggml_blocks.TYPES:
        return _plan_blocks(name, arr, qname, gtype, value.imatrix)
    if qname in _PLAIN:
        dtype = _PLAIN[qname]
        nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        return _Planned(shape, gtype, nbytes, lambda: np.ascontiguousarray(arr, dtype=dtype))
    if qname == "BF16":
        nbytes = int(np.prod(shape, dtype=np.int64)) * 2

        def make_bf16() -> np.ndarray:
            if arr.dtype == bfloat16():  # stored as it is: no float32 copy of a bf16 source
                return np.ascontiguousarray(arr).view(np.uint16)
            # round to nearest even, as llama.cpp's converter does
            bf = np.ascontiguousarray(arr.astype(np.float32).astype(bfloat16()))
            return bf.view(np.uint16)

        return _Planned(shape, gtype, nbytes, make_bf16)
    raise LowbitError(
        f"tensor {name!r}: cannot quantize to {qname} here; choose one of "
        f"{[*ggml_blocks.TYPES, 'F32', 'F16', 'BF16']}, or pass the bytes with raw=True"
    )


def _plan_blocks(name: str, arr: np.ndarray, qname: str, gtype: Any, imatrix: Any) -> _Planned:
    """A block type quantized by :mod:`lowbit.ggml.blocks`; a 3-D tensor (experts) takes one
    importance vector per expert, as llama.cpp's quantizer does."""
    shape = tuple(arr.shape)
    try:
        nbytes = ggml_blocks.nbytes(shape, qname)
    except LowbitError as exc:
        raise LowbitError(f"tensor {name!r} of shape {shape}: {exc}") from None
    vectors: list[Any] = [None]
    if imatrix is not None:
        im = np.asarray(imatrix, dtype=np.float32).reshape(-1)
        experts = int(np.prod(shape[:-2], dtype=np.int64)) if len(shape) > 2 else 1
        if im.size != experts * shape[-1]:
            raise LowbitError(
                f"tensor {name!r} of shape {shape}: the importance vector has {im.size} values, "
                f"not {experts * shape[-1]} (one per column{' and expert' if experts > 1 else ''})"
            )
        vectors = list(im.reshape(experts, shape[-1]))

    def make() -> np.ndarray:
        try:
            if len(vectors) == 1:
                return ggml_blocks.quantize(arr, qname, imatrix=vectors[0])
            mats = np.asarray(arr).reshape(len(vectors), -1, shape[-1])
            out = [
                ggml_blocks.quantize(m, qname, imatrix=v)
                for m, v in zip(mats, vectors, strict=False)
            ]
            return np.stack(out).reshape(*shape[:-1], -1)
        except LowbitError as exc:
            raise LowbitError(f"tensor {name!r}: {exc}") from None

    return _Planned(shape, gtype, nbytes, make)


_INT_TYPES = {"int8": "I8", "int16": "I16", "int32": "I32", "int64": "I64"}


def _plan_int(name: str, arr: np.ndarray) -> _Planned:
    qname = _INT_TYPES.get(arr.dtype.name)
    if qname is None:
        raise LowbitError(
            f"tensor {name!r}: GGUF stores signed integers int8..int64, got dtype {arr.dtype}"
        )
    return _Planned(
        tuple(arr.shape), _ggml_type(qname), arr.nbytes, lambda: np.ascontiguousarray(arr)
    )


def _value_type(value: Any) -> tuple[Any, Any, Any]:
    """(value, GGUFValueType, sub_type) for a Python metadata value, or a typed GGUFValue."""
    from gguf import GGUFValueType
    from gguf.gguf_writer import GGUFValue

    if isinstance(value, GGUFValue):
        return value.value, value.type, value.sub_type
    if isinstance(value, (list, tuple)):
        return list(value), GGUFValueType.ARRAY, _array_type(value)
    if isinstance(value, (bool, np.bool_)):
        return bool(value), GGUFValueType.BOOL, None
    if isinstance(value, (int, np.integer)):
        v = int(value)
        if 0 <= v < 2**32:
            return v, GGUFValueType.UINT32, None
        if -(2**31) <= v < 0:
            return v, GGUFValueType.INT32, None
        return v, (GGUFValueType.UINT64 if v > 0 else GGUFValueType.INT64), None
    if isinstance(value, (float, np.floating)):
        return float(value), GGUFValueType.FLOAT32, None
    if isinstance(value, str):
        return value, GGUFValueType.STRING, None
    raise LowbitError(
        f"GGUF metadata value {value!r} of type {type(value).__name__} is not a bool, int, "
        "float, str or list of those (pass a gguf.GGUFValue for an explicit type)"
    )


def _array_type(values: list[Any] | tuple[Any, ...]) -> Any:
    """Element type of a metadata array: BOOL, INT32 (INT64 if large), FLOAT32 or STRING."""
    from gguf import GGUFValueType

    if not values:
        raise LowbitError("GGUF metadata arrays cannot be empty")
    if all(isinstance(v, (bool, np.bool_)) for v in values):
        return GGUFValueType.BOOL
    if all(isinstance(v, (str, bytes)) for v in values):
        return GGUFValueType.STRING
    if all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in values):
        fits = all(-(2**31) <= int(v) < 2**31 for v in values)
        return GGUFValueType.INT32 if fits else GGUFValueType.INT64
    if all(isinstance(v, (int, float, np.integer, np.floating)) for v in values):
        return GGUFValueType.FLOAT32
    raise LowbitError("GGUF metadata arrays need elements of one kind (bool, int, float or str)")


@dataclass(frozen=True)
class _Raw:
    """A metadata value copied from a source file as its stored bytes (after the u32 type)."""

    payload: bytes

    def text(self) -> str:
        """The value of a STRING (u64 length + UTF-8 bytes)."""
        return self.payload[8:].decode("utf-8")


def _source_fields(source: Any) -> dict[str, Any]:
    """Every metadata key of a GGUF file as ``(value, GGUFValueType, None)`` with a raw value.

    Read with lowbit's own parser (:func:`lowbit.checkpoints.io.gguf_file.raw_metadata`): each value
    is copied as its stored bytes, so a vocabulary of millions of entries costs one memory copy
    (the ``gguf`` package's ``GGUFReader`` builds a numpy view per element: minutes and
    gigabytes for a 5 MB file), and any value (nested or empty arrays, byte tokens that are not
    UTF-8) keeps its exact type and bytes.
    """
    from gguf import GGUFValueType

    if hasattr(source, "gguf_fields"):  # a view of a file not written (a converted folder)
        return {
            key: (_Raw(payload), GGUFValueType(vtype), None)
            for key, (vtype, payload) in source.gguf_fields().items()
        }
    data = getattr(source, "data", None)  # an open gguf.GGUFReader: its file
    path = Path(getattr(data, "filename", None) or source)
    try:
        fields = _gguf.raw_metadata(path)
    except LowbitError as exc:
        raise LowbitError(f"cannot read GGUF metadata: {exc}") from None
    return {
        key: (_Raw(payload), GGUFValueType(vtype), None) for key, (vtype, payload) in fields.items()
    }


def metadata_source(ckpt: Any) -> Any:
    """What ``write_gguf(source=...)`` takes to copy a GGUF checkpoint's metadata: its file, or
    the checkpoint itself when it has no file (a :class:`~lowbit.checkpoints.gguf.hf_view.ConvertedView`)."""
    return ckpt if hasattr(ckpt, "gguf_fields") else ckpt.path


def _writer_class() -> Any:
    """``gguf.GGUFWriter`` that also writes :class:`_Raw` values as their bytes."""
    import gguf

    class _Writer(gguf.GGUFWriter):  # type: ignore[misc]
        def _pack_val(self, val: Any, vtype: Any, add_vtype: bool, *args: Any, **kw: Any) -> bytes:
            if isinstance(val, _Raw):
                return (self._pack("I", vtype) if add_vtype else b"") + val.payload
            return super()._pack_val(val, vtype, add_vtype, *args, **kw)

    return _Writer


def _file_type(planned: Mapping[str, _Planned]) -> int:
    """llama.cpp's general.file_type: the type holding most elements of the 2-D+ tensors."""
    from gguf import LlamaFileType

    counts: dict[str, int] = {}
    for p in planned.values():
        if len(p.shape) >= 2:
            n = int(np.prod(p.shape, dtype=np.int64))
            counts[p.ggml_type.name] = counts.get(p.ggml_type.name, 0) + n
    if not counts:
        return int(LlamaFileType.ALL_F32)
    top = max(counts, key=lambda k: counts[k])
    if top == "F32":
        return int(LlamaFileType.ALL_F32)
    member = {"F16": "MOSTLY_F16", "BF16": "MOSTLY_BF16"}.get(top, f"MOSTLY_{top}")
    return int(getattr(LlamaFileType, member, LlamaFileType.GUESSED))


def _typed(metadata: Mapping[str, Any] | None, source: Any) -> dict[str, Any]:
    """The metadata to write, in order: the source's, then ``metadata``, then lowbit's tag."""
    typed: dict[str, Any] = {} if source is None else _source_fields(source)
    for key, value in (metadata or {}).items():
        if str(key) not in _HEADER_KEYS:
            typed[str(key)] = _value_type(value)
    typed[WRITER_KEY] = _value_type(writer_tag())  # lets a later overwrite know lowbit wrote it
    return typed


def _arch(typed: Mapping[str, Any], arch: str | None) -> str:
    if arch is None:
        found = typed.get("general.architecture")
        if found is None:
            raise LowbitError(
                "GGUF needs general.architecture: pass arch=, metadata={'general.architecture': "
                "...} or a source file"
            )
        value = found[0]
        arch = value.text() if isinstance(value, _Raw) else str(value)
    if not arch:  # GGUFWriter silently drops an empty string
        raise LowbitError("GGUF needs a non-empty general.architecture")
    return arch


def _derived(
    typed: dict[str, Any], metadata: Mapping[str, Any] | None, planned: Mapping[str, _Planned]
) -> None:
    """Add the keys the tensors decide: ``general.file_type``, the quantization version."""
    import gguf

    if "general.file_type" not in (metadata or {}):  # a source's file_type described its tensors
        typed["general.file_type"] = (_file_type(planned), gguf.GGUFValueType.UINT32, None)
    has_blocks = any(
        p.ggml_type.name not in ("F32", "F16", "BF16", "F64") for p in planned.values()
    )
    if has_blocks and "general.quantization_version" not in typed:
        typed["general.quantization_version"] = (
            gguf.GGML_QUANT_VERSION,
            gguf.GGUFValueType.UINT32,
            None,
        )


def header_fields(
    planned: Mapping[str, _Planned],
    *,
    metadata: Mapping[str, Any] | None = None,
    source: Any = None,
    arch: str | None = None,
) -> tuple[str, dict[str, Any]]:
    """The architecture and the other metadata, as ``(value, GGUFValueType, sub_type)`` in
    file order, that :func:`write_gguf` writes for tensors planned as ``planned``
    (name -> ``_plan(name, value)``) with these arguments."""
    typed = _typed(metadata, source)
    arch = _arch(typed, arch)
    _derived(typed, metadata, planned)
    return arch, typed


def encoded_fields(arch: str, typed: dict[str, Any]) -> dict[str, tuple[int, bytes]]:
    """The metadata as :func:`write_gguf` stores it (from :func:`header_fields`): the
    architecture first, then ``typed`` in order, each as (value type, its bytes after the u32
    type), as :func:`lowbit.checkpoints.io.gguf_file.raw_metadata` reads them back."""
    from gguf import GGUFValueType

    w = _writer_class()(path=None, arch=arch)
    out = {
        "general.architecture": (
            int(GGUFValueType.STRING),
            w._pack_val(arch, GGUFValueType.STRING, False),
        )
    }
    for key, (value, vtype, sub) in typed.items():
        if key not in _WRITER_KEYS:
            if not isinstance(value, _Raw):  # as write_gguf checks (a converted view's path)
                check_value(key, value, vtype, sub)
            out[key] = (int(vtype), w._pack_val(value, vtype, False, sub_type=sub))
    return out


def write_gguf(
    path: str | os.PathLike[str],
    tensors: Mapping[str, Any],
    *,
    metadata: Mapping[str, Any] | None = None,
    source: str | os.PathLike[str] | Any | None = None,
    arch: str | None = None,
    overwrite: bool = False,
    progress: bool | None = None,
    inputs: Sequence[str | os.PathLike[str]] = (),
) -> Path:
    """Write a GGUF file of the given tensors and metadata.

    Args:
        path: the ``.gguf`` file to create. It is written under a temporary name in the same
            directory and renamed when complete; on any error nothing is left behind.
        tensors: name -> value, in file order. A value is a :class:`GGUFTensor` (values and the
            type to store them as, or raw bytes), a lowbit ``QuantizedTensor`` of a scheme GGUF
            holds (see :func:`gguf_from_quantized`), or a plain array: float32/float64 become
            F32, float16 F16, bfloat16 BF16, signed integers I8..I64. Each value is looked
            up twice, for its shape when planning the header and for its data when written,
            and not kept in between: a Mapping that loads or computes on access keeps memory
            to about one tensor.
        metadata: GGUF key -> value, applied after ``source``'s. Python values get the types
            llama.cpp uses: bool BOOL, int UINT32 (INT32 if negative, 64-bit if large), float
            FLOAT32, str STRING, lists ARRAY (ints INT32). Pass a ``gguf.GGUFValue`` for another
            type. ``general.file_type`` is derived from the tensors unless given here.
        source: a GGUF file (path, or an open ``gguf.GGUFReader``, whose file is read,
            or an object with ``gguf_fields()`` and ``path``, such as
            :class:`~lowbit.checkpoints.gguf.hf_view.ConvertedView`)
            whose metadata (architecture, hyperparameters, tokenizer, chat template) is
            copied byte for byte, with its exact types, after lowbit's checks of the file.
        arch: ``general.architecture``; default: from ``metadata`` or ``source``.
        overwrite: replace an existing ``path``.
        inputs: files and folders ``path`` must not be (nor lie inside), whatever
            ``overwrite`` says; ``source`` is always one.
        progress: tqdm bar (``None``: only on a terminal; ``False``: never; see
            ``lowbit._progress``).

    Returns:
        The path written.

    Raises:
        LowbitError: no architecture, a tensor that cannot take its type (row length not a
            multiple of 32 for Q8_0/Q4_0, NaN, a block scale beyond float16), bad metadata, an
            unreadable source, or an existing ``path`` without ``overwrite``.
        ImportError: the ``gguf`` package is missing (``pip install 'lowbit[models]'``).
    """
    try:
        import gguf  # noqa: F401  (its absence is one clear error)
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(
            "writing GGUF needs the gguf package: pip install 'lowbit[models]'"
        ) from exc

    typed = _typed(metadata, source)
    for key, (value, vtype, sub) in typed.items():  # before a byte is written
        if not isinstance(value, _Raw):
            check_value(key, value, vtype, sub)
    arch = _arch(typed, arch)
    # Plan every tensor from a first look at its value and drop it; the value is fetched
    # again when written, so a lazy Mapping keeps about one tensor in memory.
    keys = {str(key): key for key in tensors}
    if len(keys) != len(tensors):
        raise LowbitError("tensor names must be distinct as strings")
    planned = {}
    for name, key in keys.items():
        planned[name] = _plan(name, tensors[key])
        planned[name].produce = _unplanned
    _derived(typed, metadata, planned)

    inputs = [*inputs, *([source] if isinstance(source, (str, os.PathLike)) else [])]
    if hasattr(source, "gguf_fields"):  # a Hugging Face folder's converted view
        inputs = [*inputs, source.path]
    with atomic_file(path, overwrite=overwrite, inputs=inputs) as tmp:
        writer = _writer_class()(tmp, arch)
        try:
            for key, (value, vtype, sub) in typed.items():
                if key not in _WRITER_KEYS:
                    writer.add_key_value(key, value, vtype, sub_type=sub)
            for name, p in planned.items():
                writer.add_tensor_info(
                    name, p.shape, np.dtype(np.float32), p.nbytes, raw_dtype=p.ggml_type
                )
            writer.write_header_to_file()
            writer.write_kv_data_to_file()
            writer.write_ti_data_to_file()
            bar = progress_bar(
                sum(p.nbytes for p in planned.values()),
                progress,
                f"writing {Path(path).name}",
                "B",
                unit_scale=True,
            )
            try:
                for name, p in planned.items():
                    again = _plan(name, tensors[keys[name]])
                    if (again.shape, again.ggml_type, again.nbytes) != (
                        p.shape,
                        p.ggml_type,
                        p.nbytes,
                    ):
                        raise LowbitError(f"tensor {name!r} changed while the file was written")
                    data = again.produce()
                    if data.nbytes != p.nbytes:  # internal invariant: plan and bytes agree
                        raise AssertionError(
                            f"{name}: planned {p.nbytes} bytes, made {data.nbytes}"
                        )
                    writer.write_tensor_data(data)
                    del again, data
                    bar.update(p.nbytes)
            finally:
                bar.close()
        finally:
            writer.close()
    return Path(path)


def _unplanned() -> np.ndarray:  # pragma: no cover - replaced before use
    raise AssertionError("tensor data is made from a fresh look at the value")
