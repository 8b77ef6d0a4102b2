"""``lowbit.json``, the manifest of a lowbit checkpoint: read safely, checked, sealed.

A manifest is untrusted input: it says which files hold which arrays and how to decode them, so
a wrong word in it (a format, an axis, a shape, a file name) decodes the right bytes into wrong
values or reads bytes from elsewhere. Everything here turns a bad manifest into one
:class:`~lowbit.errors.LowbitError` naming the file and the field.

What the writer records beside the tensors (:func:`record_files`, :func:`seal`):

- ``"checksums"``: ``{relative path: {"size": bytes, "sha256": hex digest}}`` of every file lowbit
  wrote into the folder (the shards, copied config/tokenizer files, ``source_metadata.gguf``),
  the manifest itself excepted;
- ``"manifest_sha256"``: the sha256 of the manifest's canonical JSON without this key (sorted
  keys, no whitespace, ASCII escapes): an edit of the manifest that its schema cannot catch
  (``int4`` -> ``nf4``, an axis, a transposed shape) no longer matches.

What a load checks (:func:`load`), in order: the manifest is a regular file inside the folder
of at most 256 MiB, UTF-8 JSON without duplicate keys, nested at most 64 deep; its ``format``
and ``version``; ``manifest_sha256`` (with ``verify``); the schema (every key's type, known
kinds, formats, encodings and source formats, scheme and shape consistent, scale shapes those
of the scheme, array names those of the scheme, a non-empty tensor list, every tensor in a
listed shard); every recorded file inside the folder (relative path, no ``..``, no symlink out),
a regular file of the recorded size, and (with ``verify``) of the recorded sha256. After the
shards are opened, :func:`check_arrays` checks every array's dtype and shape in their headers
against what the entry's shape and scheme make.

These hashes protect against accidental corruption and against edits of single files: they are
not a signature. Whoever can rewrite the files can rewrite the manifest and its digest too.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import reprlib
import stat
import warnings
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from lowbit import _json
from lowbit.checkpoints._safetensors import SAFETENSORS_DTYPE_BITS
from lowbit.checkpoints._safetensors_write import dtype_code
from lowbit.errors import LowbitError
from lowbit.quant.layout import make_layout, quantized_arrays
from lowbit.quant.plan import PrecisionPlan
from lowbit.quant.rules import activation_format
from lowbit.quant.scheme import Scheme
from lowbit.quant.tensor import FORMAT_VERSION as TENSOR_VERSION
from lowbit.quant.tensor import TENSOR_SCALE_DIRECTION

MANIFEST = "lowbit.json"
GGUF_METADATA = "source_metadata.gguf"
MAX_MANIFEST_BYTES = 256 * 2**20
MAX_JSON_DEPTH = 64
MAX_RANK = 32  # numpy's own limit before 2.0
MAX_DIM = 2**62
KINDS = ("quantized", "kept", "cast")
SOURCE_FORMATS = ("gguf", "huggingface", "safetensors")
CAST_DTYPES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16"}
DIGEST_KEY = "manifest_sha256"
CHECKSUMS_KEY = "checksums"
_CHUNK = 2**20
_HEX = frozenset("0123456789abcdef")


@dataclass(frozen=True)
class ExpectedArray:
    """One array a manifest entry says its shard holds: safetensors key, dtype code, shape."""

    key: str
    dtype: str
    shape: tuple[int, ...]


# ---------------------------------------------------------------------------------------
# Writing: records and seal
# ---------------------------------------------------------------------------------------


def file_sha256(path: Path) -> str:
    """The sha256 hex digest of a file, read in 1 MiB chunks."""
    h = hashlib.sha256()
    buf = bytearray(_CHUNK)
    view = memoryview(buf)
    with open(path, "rb") as fh:
        while n := fh.readinto(buf):
            h.update(view[:n])
    return h.hexdigest()


def record_files(folder: Path, known: dict[str, str] | None = None) -> dict[str, dict[str, Any]]:
    """``{relative path: {"size", "sha256"}}`` of every regular file under ``folder`` but the
    manifest, sorted by path.

    Args:
        folder: the checkpoint folder being written.
        known: sha256 digests already computed while writing (the shards), by relative path;
            other files (copied ones, ``source_metadata.gguf``) are read and hashed here.
    """
    known = known or {}
    out: dict[str, dict[str, Any]] = {}
    for root, dirs, files in os.walk(folder):
        dirs.sort()
        for fname in sorted(files):
            p = Path(root) / fname
            rel = p.relative_to(folder).as_posix()
            st = os.lstat(p)
            if rel == MANIFEST or not stat.S_ISREG(st.st_mode):
                continue
            out[rel] = {"size": st.st_size, "sha256": known.get(rel) or file_sha256(p)}
    return dict(sorted(out.items()))


def canonical_json(doc: Any) -> bytes:
    """The bytes the manifest digest is taken over: sorted keys, no whitespace, ASCII."""
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def manifest_digest(doc: dict[str, Any]) -> str:
    """sha256 of the canonical JSON of ``doc`` without its ``manifest_sha256`` key."""
    return hashlib.sha256(
        canonical_json({k: v for k, v in doc.items() if k != DIGEST_KEY})
    ).hexdigest()


def seal(doc: dict[str, Any], default: Any = None) -> str:
    """The manifest's text with ``manifest_sha256`` added.

    The digest is taken over the document as it parses back from its own JSON (numpy scalars
    made plain by ``default``), so reading it gives the same canonical bytes.
    """
    parsed = json.loads(json.dumps(doc, default=default))
    parsed[DIGEST_KEY] = manifest_digest(parsed)
    return json.dumps(parsed, indent=1) + "\n"


# ---------------------------------------------------------------------------------------
# Reading
# ---------------------------------------------------------------------------------------


def show(value: Any) -> str:
    """A bounded repr for error messages (no 4,300-digit integers, no megabyte strings)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 128:
        return f"<an integer of {value.bit_length()} bits>"
    r = reprlib.Repr()
    r.maxstring = r.maxother = 80
    r.maxlist = r.maxdict = 8
    r.maxlevel = 3
    return r.repr(value)


def _depth(doc: Any) -> int:
    """Nesting depth of a parsed JSON value (iterative: no recursion on hostile input)."""
    deepest = 0
    stack = [(doc, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, dict):
            v = list(v.values())
        if isinstance(v, list):
            deepest = max(deepest, d)
            if d > MAX_JSON_DEPTH:
                return d
            stack.extend((x, d + 1) for x in v)
    return deepest


def _inside(folder_real: str, path: Path) -> str | None:
    """The real path of ``path`` if it lies inside ``folder_real``, else None."""
    real = os.path.realpath(path)
    try:
        ok = os.path.commonpath([folder_real, real]) == folder_real and real != folder_real
    except ValueError:  # different drives
        ok = False
    return real if ok else None


def member(folder: Path, rel: Any, where: str, field: str) -> Path:
    """The path of a file the manifest names, checked to lie inside the folder.

    Raises:
        LowbitError: not a string, an absolute path, a ``..``, ``.`` or empty part, a
            backslash, or a symlink (of it or a folder above it) that leads outside ``folder``.
    """
    if not isinstance(rel, str) or not rel:
        raise _fail(where, field, f"{show(rel)} is not a file name")
    parts = PurePosixPath(rel).parts
    if (
        rel.startswith("/")
        or "\\" in rel
        or "\0" in rel
        or ":" in parts[0]
        or any(p in ("..", ".") for p in parts)
        or "//" in rel
        or rel.endswith("/")
        or len(rel) > 4096
    ):
        raise _fail(
            where,
            field,
            f"{show(rel)} is not a plain relative path inside the checkpoint folder (absolute "
            f"paths, '..' and backslashes are refused)",
        )
    path = folder / rel
    if _inside(os.path.realpath(folder), path) is None:
        raise _fail(where, field, f"{show(rel)} is a symlink that leads outside the folder")
    return path


def read_manifest(folder: Path) -> tuple[Path, dict[str, Any]]:
    """Read ``folder/lowbit.json`` as a JSON object, safely.

    Raises:
        LowbitError: no manifest, a manifest that is not a regular file inside the folder,
            over 256 MiB, not UTF-8 JSON, with duplicate keys, nested over 64 deep, with
            integers of over 4,300 digits, or not an object.
    """
    mpath = folder / MANIFEST
    try:
        st = os.stat(mpath)
    except OSError:
        raise LowbitError(f"{folder}: not a lowbit checkpoint (no {MANIFEST})") from None
    if not stat.S_ISREG(st.st_mode) or _inside(os.path.realpath(folder), mpath) is None:
        raise LowbitError(f"{mpath}: not a regular file inside the checkpoint folder")
    if st.st_size > MAX_MANIFEST_BYTES:
        raise LowbitError(
            f"{mpath}: {st.st_size:,} bytes, over the {MAX_MANIFEST_BYTES:,}-byte manifest limit"
        )
    try:
        with open(mpath, "rb") as fh:
            raw = fh.read(MAX_MANIFEST_BYTES + 1)
    except OSError as exc:
        raise LowbitError(f"{mpath}: cannot read ({exc.strerror or exc})") from None
    # lowbit's one reader of a user's JSON: depth, integer size, duplicate keys (lowbit._json)
    doc = _json.loads(raw, mpath, max_depth=MAX_JSON_DEPTH, unique_keys=True)
    if _depth(doc) > MAX_JSON_DEPTH:
        raise LowbitError(f"{mpath}: JSON nested more than {MAX_JSON_DEPTH} deep")
    if not isinstance(doc, dict):
        raise LowbitError(f"{mpath}: not a lowbit checkpoint manifest (not a JSON object)")
    return mpath, doc


def load(
    folder: Path, *, format_name: str, version: int, verify: bool = True
) -> tuple[dict[str, Any], dict[str, list[ExpectedArray]]]:
    """Read and check a checkpoint's manifest and the files it records.

    Args:
        folder: the checkpoint folder.
        format_name: the manifest's ``format`` (``"lowbit-checkpoint"``).
        version: the manifest version this lowbit reads.
        verify: check ``manifest_sha256`` and every file's sha256 (sizes are always checked).

    Returns:
        The manifest, and for every tensor the arrays its shard must hold.

    Raises:
        LowbitError: see the module docstring; the message names the file and the field.

    Warns:
        UserWarning: with ``verify=False``, a manifest without checksums (written before lowbit
            recorded them): its files are read unchecked.
    """
    mpath, doc = read_manifest(folder)
    where = str(mpath)
    if doc.get("format") != format_name:
        raise LowbitError(
            f"{mpath}: not a lowbit checkpoint manifest (format is not {format_name!r})"
        )
    if doc.get("version") != version:
        raise LowbitError(
            f"{mpath}: lowbit checkpoint version {show(doc.get('version'))}; this lowbit reads "
            f"{version}"
        )
    if verify:
        digest = doc.get(DIGEST_KEY)
        if DIGEST_KEY not in doc or CHECKSUMS_KEY not in doc:
            raise LowbitError(
                f"{mpath}: no {DIGEST_KEY} or {CHECKSUMS_KEY}: written by a lowbit before "
                f"checkpoints recorded them, or stripped; nothing can be verified (load with "
                f"verify=False to read it unchecked)"
            )
        _sha(digest, where, DIGEST_KEY)
        if manifest_digest(doc) != digest:
            raise LowbitError(
                f"{mpath}: {DIGEST_KEY} does not match the manifest's content: {MANIFEST} was "
                f"changed after lowbit wrote it (verify=False reads it anyway)"
            )
    expected = check_schema(doc, where)
    if CHECKSUMS_KEY in doc:
        check_files(folder, doc, where, hashes=verify)
    else:
        warnings.warn(
            f"{mpath}: no {CHECKSUMS_KEY} (written before lowbit recorded them): its files "
            f"are read unchecked",
            UserWarning,
            stacklevel=3,
        )
    return doc, expected


def check_files(folder: Path, doc: dict[str, Any], where: str, *, hashes: bool) -> None:
    """Check every file the manifest records: inside the folder, regular, its size, its sha256.

    Raises:
        LowbitError: a malformed ``checksums`` record, a file outside the folder, missing,
            not a regular file, of another size or (``hashes``) another sha256, a shard the
            checksums do not cover, or a ``source_metadata.gguf`` they do not cover.
    """
    records = doc[CHECKSUMS_KEY]
    if not isinstance(records, dict):
        raise _fail(where, CHECKSUMS_KEY, f"{show(records)} is not an object")
    shards = set(doc["files"])
    todo = []
    for rel, rec in records.items():
        field = f"{CHECKSUMS_KEY}[{show(rel)}]"
        path = member(folder, rel, where, field)
        if rel == MANIFEST:
            raise _fail(where, field, "the manifest cannot record itself")
        if not isinstance(rec, dict):
            raise _fail(where, field, f"{show(rec)} is not an object with size and sha256")
        size = rec.get("size")
        if not _is_int(size) or size < 0:
            raise _fail(where, f"{field}.size", f"{show(size)} is not a non-negative integer")
        _sha(rec.get("sha256"), where, f"{field}.sha256")
        what = "shard" if rel in shards else "file"
        try:
            st = os.stat(path)
        except OSError:
            raise LowbitError(f"{folder}: {what} {rel} is missing") from None
        if not stat.S_ISREG(st.st_mode):
            raise LowbitError(f"{folder}: {what} {rel} is not a regular file")
        if st.st_size != size:
            raise LowbitError(
                f"{folder}: {what} {rel} is {st.st_size:,} bytes but the manifest records "
                f"{size:,} (a truncated, grown or replaced file)"
            )
        todo.append((rel, path, rec["sha256"], what))
    uncovered = sorted(shards - set(records))
    if uncovered:
        raise _fail(where, "files", f"shard {uncovered[0]} has no {CHECKSUMS_KEY} record")
    if (folder / GGUF_METADATA).exists() and GGUF_METADATA not in records:
        raise LowbitError(
            f"{folder}: {GGUF_METADATA} is read with the checkpoint but the manifest records no "
            f"checksum for it (added after lowbit wrote the folder?)"
        )
    if hashes:
        for rel, path, want, what in todo:
            got = file_sha256(path)
            if got != want:
                raise LowbitError(
                    f"{folder}: {what} {rel}: its sha256 {got[:16]}... is not the "
                    f"{want[:16]}... the manifest records (a corrupted or modified file; "
                    f"verify=False skips this check)"
                )


def check_arrays(
    expected: dict[str, list[ExpectedArray]],
    doc: dict[str, Any],
    shards: dict[str, Any],
    where: str,
) -> None:
    """Check that every array an entry needs is in its shard with the dtype and shape its
    shape and scheme make (``shards``: file name -> opened safetensors ``Checkpoint``).

    Raises:
        LowbitError: an array missing, of another dtype or shape, or claimed by two tensors.
    """
    present = {fname: set(s.names()) for fname, s in shards.items()}
    claimed: dict[str, str] = {}
    for name, arrays in expected.items():
        fname = doc["tensors"][name]["file"]
        shard = shards[fname]
        for a in arrays:
            field = f"tensors[{show(name)}]"
            if a.key in claimed:
                raise _fail(where, field, f"array {show(a.key)} is also {show(claimed[a.key])}'s")
            claimed[a.key] = name
            if a.key not in present[fname]:
                raise _fail(where, field, f"{fname} holds no array {show(a.key)}")
            info = shard.info(a.key)
            if info.dtype != a.dtype or tuple(info.shape) != a.shape:
                raise _fail(
                    where,
                    field,
                    f"{fname} stores {show(a.key)} as {info.dtype}{list(info.shape)} but the "
                    f"entry's shape and scheme make {a.dtype}{list(a.shape)}",
                )


# ---------------------------------------------------------------------------------------
# Schema
# ---------------------------------------------------------------------------------------


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


_TYPE_WORDS: dict[Any, str] = {
    str: "a string",
    dict: "an object",
    list: "a list",
    int: "an integer",
    bool: "true or false",
    (dict, type(None)): "an object or null",
}


def _shape(v: Any, where: str, field: str) -> tuple[int, ...]:
    if not isinstance(v, list) or len(v) > MAX_RANK:
        raise _fail(where, field, f"{show(v)} is not a shape (a list of at most {MAX_RANK} dims)")
    if not all(_is_int(d) and 0 <= d <= MAX_DIM for d in v):
        raise _fail(where, field, f"{show(v)} is not a shape (dims are integers 0..2^62)")
    return tuple(v)


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
            activation_format(act)
        except LowbitError as exc:
            raise _fail(where, f"{field}.activations", str(exc)) from None
    return [
        ExpectedArray(k, dtype_code(s.dtype), s.shape) for k, s in zip(keys, specs, strict=True)
    ]
