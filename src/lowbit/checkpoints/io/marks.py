"""How lowbit recognises what it wrote, so ``overwrite`` replaces nothing else: the
``lowbit.writer`` mark in safetensors ``__metadata__`` and GGUF metadata, the ``lowbit.files``
list of a compressed-tensors folder, a lowbit checkpoint's manifest, a plot's image metadata.
"""

from __future__ import annotations

import json
import os
import re
import struct
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from lowbit import _json
from lowbit._version import __version__
from lowbit.checkpoints.io import gguf_file as _gguf
from lowbit.errors import LowbitError

WRITER_KEY = "lowbit.writer"  # safetensors __metadata__ / GGUF metadata: which lowbit wrote it
FILES_KEY = "lowbit.files"  # safetensors __metadata__ of a folder's shards: the folder's files
_LOWBIT_JSON = "lowbit.json"
_SHARD = re.compile(r"model(-\d{5}-of-\d{5})?\.safetensors")


def writer_tag() -> str:
    """The value of the ``lowbit.writer`` mark: ``lowbit <version>``."""
    return f"lowbit {__version__}"


def writer_metadata(files: Iterable[str] | None = None) -> dict[str, str]:
    """Safetensors ``__metadata__`` entries that mark a file as lowbit's (and, for the shards of a
    folder, list every file of that folder so a later ``overwrite`` can tell them from others)."""
    meta = {WRITER_KEY: writer_tag()}
    if files is not None:
        meta[FILES_KEY] = json.dumps(sorted(files))
    return meta


def lowbit_made(path: str | os.PathLike[str]) -> str | None:
    """Why an existing path may not be replaced: ``None`` when lowbit wrote it (and nothing else
    was added to it), otherwise a reason for the error message."""
    p = Path(path)
    if p.is_symlink():
        return "it is a symbolic link (lowbit replaces only what it wrote, never a link)"
    if p.is_dir():
        return _dir_problem(p)
    if not p.is_file():
        return "it is not a regular file or folder"
    if p.suffix == ".gguf":
        return None if _gguf_marked(p) else "its GGUF metadata has no lowbit.writer mark"
    if p.suffix.lower() in _FIGURE_MARKS:
        return None if _figure_marked(p) else "it is not a plot lowbit drew (no lowbit mark)"
    meta = _safetensors_metadata(p)
    if meta is not None and (WRITER_KEY in meta or "lowbit" in meta):
        return None
    return "it is not a .safetensors or .gguf file marked as written by lowbit"


def _dir_problem(p: Path) -> str | None:
    present = _files_under(p)
    if not present:
        return None  # an empty folder holds nothing to lose
    manifest = p / _LOWBIT_JSON
    if manifest.is_file() and not manifest.is_symlink():
        doc = _small_json(manifest)
        if isinstance(doc, dict) and doc.get("format") == "lowbit-checkpoint":
            checksums = doc.get("checksums")
            if "copied_files" not in doc and not isinstance(checksums, dict):
                return None  # written before lowbit recorded its files: the manifest suffices
            allowed = {_LOWBIT_JSON, "source_metadata.gguf"}
            allowed.update(str(f) for f in doc.get("copied_files") or [] if isinstance(f, str))
            allowed.update(str(f) for f in (checksums if isinstance(checksums, dict) else {}))
            for f in doc.get("files") or []:
                name = f if isinstance(f, str) else f.get("name") if isinstance(f, dict) else None
                if isinstance(name, str):
                    allowed.add(name)
            return _extras(present, allowed, shards=True)
    shards = sorted(f for f in present if "/" not in f and f.endswith(".safetensors"))
    meta = _safetensors_metadata(p / shards[0]) if shards else None
    if meta is not None and WRITER_KEY in meta:
        try:
            listed = json.loads(meta.get(FILES_KEY, "[]"))
        except (ValueError, RecursionError):
            listed = []
        return _extras(present, {str(f) for f in listed if isinstance(f, str)}, shards=False)
    return (
        "it is not a checkpoint lowbit wrote (no lowbit.json manifest, no lowbit.writer mark "
        "in its safetensors metadata)"
    )


def _extras(present: list[str], allowed: set[str], *, shards: bool) -> str | None:
    extra = [f for f in present if f not in allowed and not (shards and _SHARD.fullmatch(f))]
    if not extra:
        return None
    shown = ", ".join(extra[:5]) + (f" and {len(extra) - 5} more" if len(extra) > 5 else "")
    return f"it holds files lowbit did not write there ({shown})"


def _files_under(p: Path) -> list[str]:
    """Relative names of everything under a folder (links and empty folders included)."""
    out = []
    for root, dirs, files in os.walk(p):
        rel = Path(root).relative_to(p)
        for name in files:
            out.append((rel / name).as_posix())
        for name in dirs:
            full = Path(root) / name
            if full.is_symlink() or not any(full.iterdir()):
                out.append((rel / name).as_posix())
    return sorted(out)


def _small_json(path: Path, limit: int = 64 * 2**20) -> Any:
    try:  # regular files only: a FIFO planted as an output's marker would hang the read
        return _json.load(path, max_bytes=limit)
    except (LowbitError, OSError, ValueError, RecursionError):
        return None


def _safetensors_metadata(path: Path, limit: int = 100 * 2**20) -> dict[str, Any] | None:
    """A safetensors file's ``__metadata__`` (None when it is not a readable safetensors file)."""
    try:
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) != 8:
                return None
            (n,) = struct.unpack("<Q", head)
            if n > limit:
                return None
            doc = json.loads(f.read(n))
    except (OSError, ValueError, RecursionError):
        return None
    meta = doc.get("__metadata__") if isinstance(doc, dict) else None
    return meta if isinstance(meta, dict) else {} if isinstance(doc, dict) else None


def _gguf_marked(path: Path) -> bool:
    try:
        metadata = _gguf.parse(path).metadata
    except Exception:
        return False
    return isinstance(metadata.get(WRITER_KEY), (str, bytes))


# the metadata key matplotlib writes per image format, and how the mark appears in the file
_FIGURE_MARKS = {
    ".png": ("Software", b"tEXtSoftware\x00lowbit "),
    ".pdf": ("Creator", b"/Creator (lowbit "),
    ".svg": ("Creator", b"<dc:title>lowbit "),
    ".html": ("generator", b'<meta name="generator" content="lowbit '),  # lowbit report
}


def _figure_marked(p: Path, limit: int = 256 * 2**20) -> bool:
    try:
        if p.stat().st_size > limit:
            return False
        return _FIGURE_MARKS[p.suffix.lower()][1] in p.read_bytes()
    except OSError:
        return False
