"""The schema of ``lowbit.json``, checked field by field: what each entry must hold, and the arrays it promises."""

from __future__ import annotations

import math
import reprlib
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from lowbit.checkpoints.io.safetensors import SAFETENSORS_DTYPE_BITS
from lowbit.checkpoints.io.safetensors_write import dtype_code
from lowbit.errors import LowbitError
from lowbit.plans.plan import PrecisionPlan
from lowbit.plans.rules import activation_format
from lowbit.quant.layout import make_layout, quantized_arrays
from lowbit.quant.quantized_tensor import FORMAT_VERSION as TENSOR_VERSION
from lowbit.quant.quantized_tensor import TENSOR_SCALE_DIRECTION
from lowbit.quant.scheme import Scheme

MANIFEST = (
    "lowbit.json"  # the manifest's file name (lowbit.checkpoints.lowbit_format.manifest.MANIFEST)
)

_TYPE_WORDS: dict[Any, str] = {
    str: "a string",
    dict: "an object",
    list: "a list",
    int: "an integer",
    bool: "true or false",
    (dict, type(None)): "an object or null",
}

# Field types of Scheme.to_dict(), checked before Scheme.from_dict sees them.
_SCHEME_TYPES: dict[str, tuple[type, ...]] = {
    "format": (str,),
    "granularity": (str, type(None)),
    "axis": (int, type(None)),
    "group_size": (int, type(None)),
    "scale_method": (str, type(None)),
    "percentile": (int, float),
    "k_std": (int, float),
    "symmetric": (bool,),
    "restricted_range": (bool,),
    "scale_format": (str,),
    "double_quant": (bool,),
    "rounding": (str,),
    "pad": (bool,),
    "tensor_scale": (bool,),
    "scale_rule": (str, type(None)),
    "block_shape": (list, type(None)),
    "version": (int,),
}
MAX_RANK = 32  # numpy's own limit before 2.0
MAX_DIM = 2**62
KINDS = ("quantized", "kept", "cast")
SOURCE_FORMATS = ("compressed-tensors", "gguf", "huggingface", "safetensors")
CAST_DTYPES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16"}
_HEX = frozenset("0123456789abcdef")


@dataclass(frozen=True)
class ExpectedArray:
    """One array a manifest entry says its shard holds: safetensors key, dtype code, shape."""

    key: str
    dtype: str
    shape: tuple[int, ...]


def show(value: Any) -> str:
    """A bounded repr for error messages (no 4,300-digit integers, no megabyte strings)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 128:
        return f"<an integer of {value.bit_length()} bits>"
    r = reprlib.Repr()
    r.maxstring = r.maxother = 80
    r.maxlist = r.maxdict = 8
    r.maxlevel = 3
    return r.repr(value)


def _fail(where: str, field: str, msg: str) -> LowbitError:
    return LowbitError(f"{where}: {field}: {msg}")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _sha(v: Any, where: str, field: str) -> str:
    if not isinstance(v, str) or len(v) != 64 or not set(v) <= _HEX:
        raise _fail(where, field, f"{show(v)} is not a sha256 hex digest (64 lowercase hex digits)")
    return v


def _get(d: dict[str, Any], key: str, types: Any, where: str, field: str) -> Any:
    if key not in d:
        raise _fail(where, field, "missing")
    v = d[key]
    allowed = types if isinstance(types, tuple) else (types,)
    if not isinstance(v, allowed) or (isinstance(v, bool) and bool not in allowed):
        raise _fail(where, field, f"{show(v)} is not {_TYPE_WORDS.get(types, types)}")
    return v


def _shape(v: Any, where: str, field: str) -> tuple[int, ...]:
    if not isinstance(v, list) or len(v) > MAX_RANK:
        raise _fail(where, field, f"{show(v)} is not a shape (a list of at most {MAX_RANK} dims)")
    if not all(_is_int(d) and 0 <= d <= MAX_DIM for d in v):
        raise _fail(where, field, f"{show(v)} is not a shape (dims are integers 0..2^62)")
    return tuple(v)


# What a parser of the library may raise on malformed (rather than mistyped) input it was not
# written to expect; at this boundary every one becomes a LowbitError naming the field.
_PARSE_ERRORS = (TypeError, ValueError, KeyError, AttributeError, IndexError, OverflowError)


def _scheme(v: Any, where: str, field: str) -> Any:
    if not isinstance(v, dict):
        raise _fail(where, field, f"{show(v)} is not an object")
    for k, val in v.items():
        types = _SCHEME_TYPES.get(k)
        if types is None:
            raise _fail(
                where, f"{field}.{k}", f"unknown scheme key; known: {sorted(_SCHEME_TYPES)}"
            )
        if not isinstance(val, types) or (isinstance(val, bool) and bool not in types):
            raise _fail(where, f"{field}.{k}", f"{show(val)} has the wrong type")
    try:
        return Scheme.from_dict(v)
    except LowbitError as exc:
        raise _fail(where, field, str(exc)) from None
    except _PARSE_ERRORS as exc:
        raise _fail(where, field, f"not a valid scheme ({type(exc).__name__})") from None


def check_schema(doc: dict[str, Any], where: str) -> dict[str, list[ExpectedArray]]:
    """Check a manifest's keys, types and internal consistency.

    Returns:
        For every tensor, the arrays its shard must hold (checked by :func:`check_arrays`).

    Raises:
        LowbitError: naming the field: a missing key or one of the wrong type, an unknown
            kind, source format, encoding or cast dtype, an invalid plan or scheme, a shape
            the scheme cannot take, a scale shape or array list other than the scheme makes,
            an empty tensor list, a tensor in no listed shard, a shard name that leaves the
            folder.
    """
    _get(doc, "lowbit_version", str, where, "lowbit_version")
    source = _get(doc, "source", dict, where, "source")
    sfmt = _get(source, "format", str, where, "source.format")
    if sfmt not in SOURCE_FORMATS:
        raise _fail(
            where, "source.format", f"{show(sfmt)} is not one of {', '.join(SOURCE_FORMATS)}"
        )
    _get(source, "path", str, where, "source.path")
    _get(doc, "config", (dict, type(None)), where, "config")
    if "totals" in doc:
        _get(doc, "totals", dict, where, "totals")
    plan = _get(doc, "plan", dict, where, "plan")
    try:
        PrecisionPlan.from_dict(plan, where="plan")
    except LowbitError as exc:
        raise LowbitError(f"{where}: {exc}") from None
    except _PARSE_ERRORS as exc:
        raise _fail(where, "plan", f"not a valid plan ({type(exc).__name__})") from None
    files = _get(doc, "files", list, where, "files")
    if not files:
        raise _fail(where, "files", "empty: a checkpoint has at least one shard")
    for i, f in enumerate(files):
        if not isinstance(f, str) or not f.endswith(".safetensors"):
            raise _fail(where, f"files[{i}]", f"{show(f)} is not a .safetensors file name")
        if files.index(f) != i:
            raise _fail(where, f"files[{i}]", f"{show(f)} is listed twice")
        if f == MANIFEST or f.startswith("/") or ".." in PurePosixPath(f).parts or "\\" in f:
            raise _fail(where, f"files[{i}]", f"{show(f)} is not a relative path inside the folder")
    tensors = _get(doc, "tensors", dict, where, "tensors")
    if not tensors:
        raise _fail(where, "tensors", "empty: the checkpoint holds no tensor")
    shard_set = set(files)
    return {
        name: _entry(name, e, shard_set, where, f"tensors[{show(name)}]")
        for name, e in tensors.items()
    }


def _entry(name: str, e: Any, files: set[str], where: str, field: str) -> list[ExpectedArray]:
    if not isinstance(e, dict):
        raise _fail(where, field, f"{show(e)} is not an object")
    kind = _get(e, "kind", str, where, f"{field}.kind")
    if kind not in KINDS:
        raise _fail(where, f"{field}.kind", f"{show(kind)} is not one of {', '.join(KINDS)}")
    fname = _get(e, "file", str, where, f"{field}.file")
    if fname not in files:
        raise _fail(where, f"{field}.file", f"{show(fname)} is not one of the listed files")
    shape = _shape(_get(e, "shape", list, where, f"{field}.shape"), where, f"{field}.shape")
    _get(e, "source_dtype", str, where, f"{field}.source_dtype")
    if "label" in e:
        _get(e, "label", str, where, f"{field}.label")
    if kind == "quantized":
        return _quantized(name, e, shape, where, field)
    dtype = _get(e, "dtype", str, where, f"{field}.dtype")
    if kind == "cast":
        if dtype not in CAST_DTYPES:
            raise _fail(
                where, f"{field}.dtype", f"{show(dtype)} is not one of {', '.join(CAST_DTYPES)}"
            )
        return [ExpectedArray(name, CAST_DTYPES[dtype], shape)]
    encoding = _get(e, "encoding", str, where, f"{field}.encoding")
    if encoding == "array":
        if dtype not in SAFETENSORS_DTYPE_BITS:
            raise _fail(where, f"{field}.dtype", f"{show(dtype)} is not a safetensors dtype")
        return [ExpectedArray(name, dtype, shape)]
    if not encoding.startswith("gguf:"):
        raise _fail(where, f"{field}.encoding", f"{show(encoding)} is not 'array' or 'gguf:TYPE'")
    return [ExpectedArray(name, "U8", _gguf_raw_shape(encoding[5:], shape, where, field))]


def _gguf_raw_shape(
    type_name: str, shape: tuple[int, ...], where: str, field: str
) -> tuple[int, ...]:
    """``[rows, bytes per row]`` (``[bytes]`` for 1-D) of a tensor kept as GGUF blocks."""
    try:
        from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType
    except ImportError:  # pragma: no cover - gguf is in the models extra
        raise ImportError("reading GGUF blocks needs gguf: pip install 'lowbit[models]'") from None
    qtype = GGMLQuantizationType.__members__.get(type_name)
    if qtype is None or type_name in ("F32", "F16", "BF16", "F64", "I8", "I16", "I32", "I64"):
        raise _fail(where, f"{field}.encoding", f"{show(type_name)} is not a GGUF block type")
    block, type_size = GGML_QUANT_SIZES[qtype]
    if not shape or shape[-1] % block:
        raise _fail(
            where, f"{field}.shape", f"{list(shape)} is not whole {type_name} blocks of {block}"
        )
    nbytes = math.prod(shape) // block * type_size
    if len(shape) <= 1:
        return (nbytes,)
    rows = math.prod(shape[:-1])
    return (rows, nbytes // rows) if rows else (0, 0)


def _quantized(
    name: str, e: dict[str, Any], shape: tuple[int, ...], where: str, field: str
) -> list[ExpectedArray]:
    meta = _get(e, "tensor", dict, where, f"{field}.tensor")
    v = meta.get("version")
    if not _is_int(v) or v != TENSOR_VERSION:
        raise _fail(
            where, f"{field}.tensor.version", f"{show(v)}; this lowbit reads {TENSOR_VERSION}"
        )
    mshape = _get(meta, "shape", list, where, f"{field}.tensor.shape")
    if tuple(mshape) != shape or not all(_is_int(d) for d in mshape):
        raise _fail(
            where, f"{field}.tensor.shape", f"{show(mshape)} is not the entry's {list(shape)}"
        )
    scheme = _scheme(
        _get(meta, "scheme", dict, where, f"{field}.tensor.scheme"), where, f"{field}.tensor.scheme"
    )
    try:
        layout = make_layout(shape, scheme)
        specs = quantized_arrays(shape, scheme)
    except LowbitError as exc:
        raise _fail(
            where, f"{field}.tensor.scheme", f"does not fit shape {list(shape)}: {exc}"
        ) from None
    sshape = _get(meta, "scale_shape", list, where, f"{field}.tensor.scale_shape")
    if sshape != list(layout.scale_shape):
        raise _fail(
            where,
            f"{field}.tensor.scale_shape",
            f"{show(sshape)}, but {scheme.describe()} on shape {list(shape)} makes "
            f"{list(layout.scale_shape)}",
        )
    if scheme.tensor_scale and meta.get("tensor_scale") != TENSOR_SCALE_DIRECTION:
        raise _fail(
            where,
            f"{field}.tensor.tensor_scale",
            f"{show(meta.get('tensor_scale'))} is not {show(TENSOR_SCALE_DIRECTION)}: the tensor "
            "scale's direction must be stated (lowbit writes compressed-tensors' encode factor)",
        )
    keys = [f"{name}:{s.suffix}" for s in specs]
    arrays = _get(e, "arrays", list, where, f"{field}.arrays")
    if arrays != keys:
        raise _fail(
            where, f"{field}.arrays", f"{show(arrays)}, but {scheme.describe()} stores {keys}"
        )
    act = e.get("activations")
    if act is not None:
        if not isinstance(act, str):
            raise _fail(where, f"{field}.activations", f"{show(act)} is not a format name or null")
        try:
            canonical = activation_format(act)
        except LowbitError as exc:
            raise _fail(where, f"{field}.activations", str(exc)) from None
        if canonical == "nvfp4":  # its static input scale has no place in a lowbit manifest
            raise _fail(
                where, f"{field}.activations",
                "nvfp4 (W4A4) is written as compressed-tensors' input_global_scale; a lowbit "
                "manifest records per-token activations (int8, fp8) only",
            )  # fmt: skip
    return [
        ExpectedArray(k, dtype_code(s.dtype), s.shape) for k, s in zip(keys, specs, strict=True)
    ]
