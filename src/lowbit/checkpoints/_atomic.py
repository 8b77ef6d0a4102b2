"""Write a file or a folder under a temporary name in its destination directory, then rename.

An exception (or Ctrl-C) while writing removes the temporary and leaves the destination as it
was: either absent or, with ``overwrite``, the previous complete version.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from lowbit.errors import LowbitError


def _umask_mode(base: int) -> int:
    """``base`` permissions filtered by the process umask (mkstemp/mkdtemp use 0o600/0o700)."""
    mask = os.umask(0)
    os.umask(mask)
    return base & ~mask


def _check_target(path: Path, overwrite: bool) -> None:
    if not path.parent.is_dir():
        raise LowbitError(f"cannot write {path}: directory {path.parent} does not exist")
    if path.exists() and not overwrite:
        raise LowbitError(f"{path} already exists (pass overwrite=True to replace it)")


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike[str], *, overwrite: bool = False) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; rename it to ``path`` when the block succeeds."""
    target = Path(path)
    _check_target(target, overwrite)
    if target.is_dir():
        raise LowbitError(f"{target} is a directory, expected a file name")
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.tmp-", dir=target.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        yield tmp
        os.chmod(tmp, _umask_mode(0o666))
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike[str], *, overwrite: bool = False) -> Iterator[Path]:
    """Yield an empty temporary folder ``DIR.tmp-XXXX``; rename it to ``DIR`` on success.

    With ``overwrite`` an existing ``DIR`` is moved aside first and deleted only after the new
    folder is in place.
    """
    target = Path(path)
    _check_target(target, overwrite)
    if target.exists() and not target.is_dir():
        raise LowbitError(f"{target} exists and is not a directory")
    tmp = Path(tempfile.mkdtemp(prefix=f"{target.name}.tmp-", dir=target.parent))
    try:
        yield tmp
        os.chmod(tmp, _umask_mode(0o777))
        if not target.exists():
            os.replace(tmp, target)
            return
        old = Path(tempfile.mkdtemp(prefix=f"{target.name}.old-", dir=target.parent))
        os.replace(target, old / target.name)
        try:
            os.replace(tmp, target)
        except BaseException:
            os.replace(old / target.name, target)
            shutil.rmtree(old, ignore_errors=True)
            raise
        shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
