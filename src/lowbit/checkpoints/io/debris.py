"""Debris of interrupted runs beside an output: completed, rolled back or removed, and said so.

A run writes inside ``OUT.tmp-XXXXXXXX`` (``lowbit.checkpoints.io.outputs``), marked by the file
``.lowbit-output`` inside it (``.lowbit-complete`` once the new output is whole). A run killed
with ``kill -9`` leaves that folder behind; the next run to ``OUT`` calls :func:`recover`.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from pathlib import Path

from lowbit.checkpoints.io.marks import (
    _LOWBIT_JSON,
    _safetensors_metadata,
    _small_json,
    lowbit_made,
)

MARKER = ".lowbit-output"
COMPLETE = ".lowbit-complete"


def _remove_work(work: Path) -> None:
    """Remove a temporary folder, its mark last (a kill midway leaves it recognisable)."""
    for name in ("new", "old"):
        p = work / name
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        elif os.path.lexists(p):
            with contextlib.suppress(OSError):
                p.unlink()
    for name in (COMPLETE, MARKER):
        with contextlib.suppress(OSError):
            (work / name).unlink()
    with contextlib.suppress(OSError):
        work.rmdir()


def recover(target: str | os.PathLike[str]) -> list[str]:
    """Complete or remove what interrupted runs left beside ``target``; say what was done.

    A marked ``TARGET.tmp-XXXXXXXX`` folder is removed; if ``TARGET`` is missing and the folder
    holds a complete new output (or the old one), that is moved to ``TARGET`` first. Call it
    while holding the output's lock (the writers do).

    Returns:
        One message per thing done or left alone.
    """
    target = Path(target)
    pattern = re.compile(r"\.?" + re.escape(target.name) + r"\.(tmp|old)-[A-Za-z0-9_]+")
    done = []
    try:
        siblings = sorted(os.listdir(target.parent))
    except OSError:
        return []
    for name in siblings:
        if not pattern.fullmatch(name):
            continue
        work = target.parent / name
        legacy = _legacy(work, target)
        if legacy is not None:
            done.append(legacy)
            continue
        if work.is_symlink() or not work.is_dir() or not _marked(work, target.name):
            done.append(
                f"{work} looks like an interrupted write of {target.name} but has no lowbit "
                f"mark; left alone (delete it if it is yours to delete)"
            )
            continue
        size = _size(work)
        restored = ""
        if not os.path.lexists(target):
            new, old = work / "new", work / "old"
            # never a symbolic link: one planted there would become the output (pointing
            # anywhere); lowbit's writers make only files and folders
            if (work / COMPLETE).exists() and _plain(new):
                os.rename(new, target)
                restored = f"; moved its complete new output to {target}"
            elif _plain(old):
                os.rename(old, target)
                restored = f"; restored the previous {target}"
        _remove_work(work)
        done.append(
            f"removed {work}, left by an interrupted lowbit run ({size / 1e6:.1f} MB){restored}"
        )
    return done


def _legacy(work: Path, target: Path) -> str | None:
    """Debris of lowbit 0.1's writers (no mark): ``TARGET.old-XXXXXXXX/TARGET`` holding the
    previous output (restored if ``TARGET`` is missing: a kill between its two renames), and a
    ``TARGET.tmp-XXXXXXXX`` folder that is a complete lowbit checkpoint or holds only
    safetensors shards lowbit's checkpoint writer began. None when ``work`` is neither."""
    if work.is_symlink() or not work.is_dir() or (work / MARKER).exists():
        return None
    try:
        entries = os.listdir(work)
    except OSError:
        return None
    if work.name.startswith(f"{target.name}.old-") and entries == [target.name]:
        inner = work / target.name
        if not _plain(inner) or lowbit_made(inner) is not None:
            return None
        if not os.path.lexists(target):
            os.rename(inner, target)
            work.rmdir()
            return f"restored {target} from {work}, left by an interrupted lowbit run"
        size = _size(work)
        shutil.rmtree(work)
        return f"removed {work}, left by an interrupted lowbit run ({size / 1e6:.1f} MB)"
    if work.name.startswith(f"{target.name}.tmp-") and entries:
        shards = all(
            e.endswith(".safetensors") and (_safetensors_metadata(work / e) or {}).get("format")
            == "lowbit" for e in entries
        )  # fmt: skip
        complete = (work / _LOWBIT_JSON).is_file() and lowbit_made(work) is None
        if complete and not os.path.lexists(target):  # killed just before its rename
            os.rename(work, target)
            return f"moved {work}, a complete checkpoint an interrupted run left, to {target}"
        if complete or shards:
            size = _size(work)
            shutil.rmtree(work)
            return f"removed {work}, left by an interrupted lowbit run ({size / 1e6:.1f} MB)"
    return None


def _plain(p: Path) -> bool:
    """Whether ``p`` is a file or folder itself, not a symbolic link (or nothing)."""
    return os.path.lexists(p) and not p.is_symlink() and (p.is_file() or p.is_dir())


def _marked(work: Path, target_name: str) -> bool:
    try:
        entries = set(os.listdir(work))
    except OSError:
        return False
    if entries <= {MARKER}:  # empty, or killed while writing the mark: nothing to lose
        return True
    doc = _small_json(work / MARKER, limit=4096)
    return isinstance(doc, dict) and doc.get("target") == target_name


def _size(p: Path) -> int:
    total = 0
    for root, _, files in os.walk(p):
        for f in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, f)).st_size
    return total
