"""Scratch folders lowbit makes beside an output (a Hugging Face model converted to a
temporary GGUF before a GGUF mix or budget), marked as lowbit's and locked while in use, so
the next run removes what a killed run left.

A killed ``lowbit quantize HF --to q4_k_m --out-format gguf`` left ``.lowbit-hf-to-gguf-*``
(a converted copy of the model, as large as the model) that no later run removed or named
(issue 41). Now each scratch folder holds the mark file :data:`MARK`, on which the run holds
an exclusive ``fcntl.flock`` until the folder is gone; a later run that makes a scratch
folder in the same place first sweeps the others of the same prefix: one whose mark it can
lock belongs to no live run and is removed, with a warning naming it; one whose mark is held
is in use and left alone; one without the mark (older lowbit versions, or not lowbit's) is
never deleted, only named in a warning.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path

__all__ = ["MARK", "scratch_dir", "sweep"]

#: The file inside a scratch folder that says lowbit made it (and carries the run's lock).
MARK = ".lowbit-scratch"


def _lock(fd: int, *, wait: bool) -> bool:
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows: no advisory locks, nothing swept
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
    except OSError:
        return False
    return True


def sweep(where: Path, prefix: str) -> list[str]:
    """Remove the scratch folders named ``prefix*`` in ``where`` that no live run holds; one
    message per folder removed or left alone (also given as a ``UserWarning``)."""
    try:
        names = sorted(n for n in os.listdir(where) if n.startswith(prefix))
    except OSError:
        return []
    said = []
    for name in names:
        path = where / name
        if path.is_symlink() or not path.is_dir():
            said.append(f"left {path} alone: not a folder lowbit made")
            continue
        try:
            fd = os.open(path / MARK, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        except OSError:
            said.append(
                f"left {path} alone: it looks like an interrupted lowbit conversion but "
                f"carries no {MARK} mark; remove it yourself if no run is using it"
            )
            continue
        try:
            if not _lock(fd, wait=False):
                continue  # a live run's: not debris
            _remove(path)
            said.append(f"removed {path}, left by an interrupted lowbit run")
        finally:
            os.close(fd)
    for message in said:
        warnings.warn(message, UserWarning, stacklevel=3)
    return said


def _remove(path: Path) -> None:
    """Remove a scratch folder, its mark last (a sweep meanwhile still sees it is lowbit's)."""
    with contextlib.suppress(OSError):
        for entry in os.scandir(path):
            if entry.name == MARK:
                continue
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)
    with contextlib.suppress(OSError):
        os.unlink(path / MARK)
    with contextlib.suppress(OSError):
        os.rmdir(path)


@contextlib.contextmanager
def scratch_dir(prefix: str, where: Path | None) -> Iterator[Path]:
    """A new marked, locked scratch folder in ``where`` (the system's temporary folder when
    None), removed when the block ends; the debris of killed runs there is swept first."""
    if where is not None:
        sweep(where, prefix)
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=where))
    fd = -1
    try:
        fd = os.open(path / MARK, os.O_CREAT | os.O_WRONLY | os.O_EXCL, 0o644)
        os.write(fd, b"lowbit scratch folder: removed by the next lowbit run once unlocked\n")
        _lock(fd, wait=True)
        yield path
    finally:
        _remove(path)  # the mark last, its lock held until then
        if fd >= 0:
            os.close(fd)
