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
import os
import stat
import warnings
from pathlib import Path, PurePosixPath
from typing import Any

from lowbit import _json
from lowbit.checkpoints.lowbit_format.manifest_schema import (
    MANIFEST,
    ExpectedArray,
    _fail,
    _is_int,
    _sha,
    check_schema,
    show,
)
from lowbit.errors import LowbitError

GGUF_METADATA = "source_metadata.gguf"
MAX_MANIFEST_BYTES = 256 * 2**20
MAX_JSON_DEPTH = 64
DIGEST_KEY = "manifest_sha256"
CHECKSUMS_KEY = "checksums"
_CHUNK = 2**20


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
