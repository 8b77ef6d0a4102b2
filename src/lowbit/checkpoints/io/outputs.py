"""Where every command that writes puts its output: never over an input, never over a file or
folder lowbit did not write, never half-written, never two runs at once.

An output ``OUT`` (a folder or a file) is written in four steps:

1. **Checks.** ``OUT`` must not be, contain or lie inside any input (real paths, symlinks
   resolved: :func:`check_not_input`). An existing ``OUT`` is replaced only with ``overwrite``,
   and only when lowbit wrote it (:func:`lowbit_made`): a folder whose ``lowbit.json`` says
   ``lowbit-checkpoint``, a folder or ``.safetensors`` file whose safetensors ``__metadata__``
   holds ``lowbit.writer`` (or, for ``quantize-tensor`` outputs, ``lowbit``), a GGUF file
   whose metadata holds ``lowbit.writer``; a folder that also holds files its writer did not
   list is refused as well.
2. **Lock.** ``fcntl.flock`` on ``.OUT.lowbit-lock`` beside it, so a second run to the same
   ``OUT`` fails at once instead of both finishing and the later silently replacing the
   first. The lock file is removed when the run ends (a killed run's is removed by the next).
3. **Debris.** Temporary folders ``OUT.tmp-XXXXXXXX`` left by a killed run (marked by the
   ``.lowbit-output`` file inside them) are completed or rolled back and removed, with a
   ``UserWarning`` saying what was done; so is the debris of lowbit 0.1's writers
   (``OUT.old-X/OUT`` is restored when ``OUT`` is missing; a complete or lowbit-shard-only
   ``OUT.tmp-X`` is moved in or removed). Similar names without such marks are left alone and
   named in a warning.
4. **Write and swap.** The new output is written inside ``OUT.tmp-XXXXXXXX/new``; when it is
   complete the empty file ``.lowbit-complete`` is added, then ``new`` is swapped with ``OUT``
   by ``renameat2(RENAME_EXCHANGE)`` (Linux), so ``OUT`` is at every instant either the old or
   the new complete output. Where the exchange is not available a folder is replaced in two
   renames (``OUT`` to ``OUT.tmp-XXXXXXXX/old``, then ``new`` to ``OUT``); a run killed between
   them leaves no ``OUT``, and the next run to ``OUT`` finishes the move (step 3). A file is
   replaced by one ``rename``, atomic everywhere.

Files and folders follow the umask. An ``OSError`` while writing (disk full, read-only file
system, permission denied) becomes one :class:`~lowbit.errors.LowbitError` naming ``OUT``, with
the temporary output removed.

What counts as written by lowbit is in ``lowbit.checkpoints.io.marks``; the clean-up of
interrupted runs in ``lowbit.checkpoints.io.debris``.

These guarantees hold against the process being killed at any point; they do not order writes
against a power failure (no ``fsync``).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import sys
import tempfile
import warnings
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from lowbit.errors import LowbitError

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no advisory locks, outputs still atomic
    fcntl = None  # type: ignore[assignment]

from lowbit.checkpoints.io.debris import COMPLETE, MARKER, _remove_work, recover
from lowbit.checkpoints.io.marks import (
    _FIGURE_MARKS,
    FILES_KEY,
    WRITER_KEY,
    lowbit_made,
    writer_metadata,
    writer_tag,
)

__all__ = [  # the names the writers and the CLI use
    "COMPLETE",
    "FILES_KEY",
    "MARKER",
    "WRITER_KEY",
    "check_not_input",
    "check_output",
    "lock_path",
    "lowbit_made",
    "output_dir",
    "output_file",
    "recover",
    "same_file",
    "save_figure",
    "writer_metadata",
    "writer_tag",
]

_RENAME_NOREPLACE = 1
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100
# errors that can only come from writing the output, whichever file they name
_WRITE_ERRNOS = {errno.ENOSPC, errno.EROFS, errno.EFBIG, getattr(errno, "EDQUOT", errno.ENOSPC)}


# ---------------------------------------------------------------------------------------
# Checks
# ---------------------------------------------------------------------------------------


def check_not_input(
    out: str | os.PathLike[str], inputs: Iterable[str | os.PathLike[str]], *, flag: str = "out"
) -> None:
    """Refuse an output that is, contains or lies inside one of the inputs (real paths).

    Raises:
        LowbitError: naming the output and the input it would destroy; an output name the
            system cannot hold.
    """
    _check_name(Path(out))
    target = _real(Path(out))
    # device and inode too: a hard link (or a bind mount) is the input under another real path
    target_id = _identity(target)
    above = {i for i in map(_identity, target.parents) if i is not None}
    clashes = []
    for given in inputs:
        src = _real(Path(given))
        src_id = _identity(src)
        if target == src or (src_id is not None and src_id == target_id):
            clashes.append((0, "is", given))
        elif target in src.parents:
            clashes.append((1, "contains", given))
        elif src in target.parents or (src_id is not None and src_id in above):
            clashes.append((2, "lies inside", given))
    if clashes:
        _, why, given = min(clashes, key=lambda c: c[0])  # the most direct relation
        raise LowbitError(
            f"--{flag} {out} {why} the input {given}; writing it would destroy the input. "
            f"Choose another --{flag}"
        )


def _real(p: Path) -> Path:
    return Path(os.path.realpath(p))


def _identity(p: Path) -> tuple[int, int] | None:
    """(device, inode) of what ``p`` names, links followed; None when it does not exist."""
    try:
        st = os.stat(p)
    except (OSError, ValueError):
        return None
    return (st.st_dev, st.st_ino)


def same_file(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> bool:
    """Whether two paths name one file or folder: one real path, or one device and inode
    (hard links)."""
    ra, rb = _real(Path(a)), _real(Path(b))
    if ra == rb:
        return True
    ia = _identity(ra)
    return ia is not None and ia == _identity(rb)


# ---------------------------------------------------------------------------------------
# Writing
# ---------------------------------------------------------------------------------------


def check_output(
    path: str | os.PathLike[str],
    *,
    overwrite: bool = False,
    kind: str = "file",
    inputs: Iterable[str | os.PathLike[str]] = (),
) -> None:
    """The checks :func:`output_file` / :func:`output_dir` make, done early: a command that
    works for minutes before writing calls it first so a bad ``--out`` fails at once.

    Raises:
        LowbitError: an empty path, a missing directory, an input as output, an existing
            output without ``overwrite`` or not written by lowbit.
    """
    target = Path(path)
    if not str(path) or target.name in ("", ".", ".."):
        raise LowbitError(f"output path {str(path)!r} names no file or folder")
    _check_name(target)
    if not target.parent.is_dir():
        raise LowbitError(f"cannot write {target}: directory {target.parent} does not exist")
    check_not_input(target, inputs)
    _check_existing(target, kind, overwrite)


#: What lowbit adds to an output's name for its lock and temporary files beside it.
_BESIDE = max(len(".lowbit-lock") + 1, len(".tmp-") + 8)


def _check_name(target: Path) -> None:
    """Refuse a name its lock and temporary files cannot be made beside (a 243-255 byte name
    passed as itself but failed on ``.NAME.lowbit-lock``), a NUL, or bytes not a path's."""
    try:
        raw = os.fsencode(target.name)
        os.fsencode(str(target.parent))
    except UnicodeEncodeError:
        raise LowbitError(
            f"output path {str(target)[:80]!r} holds characters no file name can"
        ) from None
    if b"\0" in raw or "\0" in str(target):
        raise LowbitError(f"output path {str(target)[:80]!r} holds a NUL character")
    try:
        limit = os.pathconf(target.parent, "PC_NAME_MAX") if target.parent.is_dir() else 255
    except (OSError, ValueError):
        limit = 255
    if len(raw) + _BESIDE > limit:
        raise LowbitError(
            f"output name {target.name[:40]!r}... is {len(raw)} bytes; lowbit writes "
            f"{_BESIDE} more beside it (lock and temporary files), so the file system's "
            f"{limit}-byte limit allows {limit - _BESIDE}"
        )


def save_figure(fig: Any, path: str | os.PathLike[str], *, overwrite: bool = False,
                dpi: int = 120) -> None:  # fmt: skip
    """Save a matplotlib figure through :func:`output_file`, marked as lowbit's (PNG
    ``Software``, PDF/SVG ``Creator``) so ``overwrite`` may replace it later.

    Raises:
        LowbitError: as :func:`output_file`.
    """
    target = Path(path)
    fmt = target.suffix.lower().lstrip(".") or "png"
    key = _FIGURE_MARKS.get("." + fmt, (None,))[0]
    with output_file(target, overwrite=overwrite) as tmp:
        fig.savefig(tmp, dpi=dpi, format=fmt, metadata={key: writer_tag()} if key else None)


@contextlib.contextmanager
def output_dir(
    path: str | os.PathLike[str],
    *,
    overwrite: bool = False,
    inputs: Iterable[str | os.PathLike[str]] = (),
) -> Iterator[Path]:
    """Yield an empty folder to fill; it becomes ``path`` when the block succeeds.

    Args:
        path: the folder to write.
        overwrite: replace an existing folder that lowbit wrote.
        inputs: files and folders the output must not be, contain or lie inside.

    Yields:
        The temporary folder (``PATH.tmp-XXXXXXXX/new``).

    Raises:
        LowbitError: see the module docstring; nothing is left half-written.

    Warns:
        UserWarning: debris of an interrupted run found and completed or removed.
    """
    with _output(Path(path), "dir", overwrite, inputs) as new:
        yield new


@contextlib.contextmanager
def output_file(
    path: str | os.PathLike[str],
    *,
    overwrite: bool = False,
    inputs: Iterable[str | os.PathLike[str]] = (),
) -> Iterator[Path]:
    """Yield a path to write a file at; it becomes ``path`` when the block succeeds.

    Args, Raises and Warns: as :func:`output_dir`.
    """
    with _output(Path(path), "file", overwrite, inputs) as new:
        yield new


@contextlib.contextmanager
def _output(
    target: Path, kind: str, overwrite: bool, inputs: Iterable[str | os.PathLike[str]]
) -> Iterator[Path]:
    if not str(target) or target.name in ("", ".", ".."):
        raise LowbitError(f"output path {str(target)!r} names no file or folder")
    _check_name(target)
    parent = target.parent
    if not parent.is_dir():
        raise LowbitError(f"cannot write {target}: directory {parent} does not exist")
    check_not_input(target, inputs)
    with _writing(target, target):
        lock = _lock(target)
    try:
        with _writing(target, target):
            messages = recover(target)
        for message in messages:
            warnings.warn(message, UserWarning, stacklevel=4)
        _check_existing(target, kind, overwrite)
        with _writing(target, target):
            work = Path(tempfile.mkdtemp(prefix=f"{target.name}.tmp-", dir=parent))
        try:
            with _writing(target, work):
                (work / MARKER).write_text(
                    json.dumps({"writer": writer_tag(), "target": target.name, "kind": kind})
                )
                new = work / "new"
                if kind == "dir":
                    new.mkdir()
            with _writing(target, work):
                yield new
            with _writing(target, work):
                if not new.exists() or (kind == "dir") != new.is_dir():
                    raise LowbitError(f"internal error: nothing was written for {target}")
                if kind == "file":
                    os.chmod(new, _umask_mode(0o666))
                (work / COMPLETE).touch()
                _swap(new, target, work)
        except BaseException:
            _rollback(target, work)
            raise
        _remove_work(work)
    finally:
        _unlock(lock)


@contextlib.contextmanager
def _writing(target: Path, work: Path) -> Iterator[None]:
    """Turn an OSError of writing into one LowbitError naming the output, not a temporary."""
    try:
        yield
    except OSError as exc:
        named = str(exc.filename or "")
        ours = not named or named.startswith((str(work), str(target), str(lock_path(target))))
        if exc.errno in _WRITE_ERRNOS or (exc.errno in (errno.EACCES, errno.EPERM) and ours):
            raise LowbitError(
                f"cannot write {target}: {exc.strerror or exc} (nothing was written)"
            ) from None
        if exc.errno is None and "written" in str(exc):  # io's short write: a full disk
            raise LowbitError(
                f"cannot write {target}: the disk is full or the file too large ({exc}; "
                f"nothing was written)"
            ) from None
        raise


def _check_existing(target: Path, kind: str, overwrite: bool) -> None:
    if not os.path.lexists(target):
        return
    if not overwrite:
        raise LowbitError(
            f"{target} already exists; pass --overwrite (overwrite=True) to replace it"
        )
    if target.is_dir() and not target.is_symlink() and kind == "file":
        raise LowbitError(f"{target} is a folder; this output is a file")
    if target.is_file() and not target.is_symlink() and kind == "dir":
        raise LowbitError(f"{target} is a file; this output is a folder")
    why = lowbit_made(target)
    if why is not None:
        raise LowbitError(
            f"refusing to replace {target}: {why}. --overwrite replaces only outputs lowbit "
            f"wrote; move or delete it yourself, or choose another --out"
        )


def _umask_mode(base: int) -> int:
    """``base`` minus the process umask (read from /proc where it can be: setting the umask to
    read it would briefly change it for every thread)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return base & ~int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0)
    os.umask(mask)
    return base & ~mask


def _swap(new: Path, target: Path, work: Path) -> None:
    if not os.path.lexists(target):
        if not _renameat2(new, target, _RENAME_NOREPLACE):
            if os.path.lexists(target):
                raise LowbitError(f"{target} appeared while it was being written; not replaced")
            os.rename(new, target)
    elif new.is_file():
        os.replace(new, target)  # one atomic rename
    elif not _renameat2(new, target, _RENAME_EXCHANGE):
        # no exchange: two renames; a kill between them is completed by the next run (recover)
        os.rename(target, work / "old")
        os.rename(new, target)


def _renameat2(src: Path, dst: Path, flags: int) -> bool:
    """rename(2) with flags; False where the system or file system has no renameat2."""
    fn = _libc_renameat2()
    if fn is None:
        return False
    if fn(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), flags) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(dst))


_LIBC: list[Any] = []


def _libc_renameat2() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    if not _LIBC:
        try:
            fn = ctypes.CDLL(None, use_errno=True).renameat2
            fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p]
            fn.argtypes += [ctypes.c_uint]
            fn.restype = ctypes.c_int
        except (OSError, AttributeError):
            fn = None
        _LIBC.append(fn)
    return _LIBC[0]


def _rollback(target: Path, work: Path) -> None:
    """After a failure: put the old output back if it was moved aside, drop the temporary."""
    old = work / "old"
    if old.exists() and not os.path.lexists(target):
        with contextlib.suppress(OSError):
            os.rename(old, target)
    _remove_work(work)


# ---------------------------------------------------------------------------------------
# Lock
# ---------------------------------------------------------------------------------------


def lock_path(target: Path) -> Path:
    """The lock file of an output: ``.NAME.lowbit-lock`` beside it."""
    return target.parent / f".{target.name}.lowbit-lock"


def _lock(target: Path) -> tuple[int, Path] | None:
    if fcntl is None:  # pragma: no cover - Windows
        return None
    path = lock_path(target)
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, _umask_mode(0o666))
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise LowbitError(
                f"another lowbit run is writing {target} (it holds {path}); wait for it to "
                f"finish or choose another --out"
            ) from None
        except BaseException:
            os.close(fd)
            raise
        try:
            same = os.path.samestat(os.fstat(fd), os.stat(path))
        except FileNotFoundError:
            same = False
        if same:
            return fd, path
        os.close(fd)  # the holder removed the file as we opened it: lock the new one


def _unlock(held: tuple[int, Path] | None) -> None:
    if held is None:  # pragma: no cover - Windows
        return
    fd, path = held
    with contextlib.suppress(OSError):
        os.unlink(path)  # while still holding it: a waiting run then locks a fresh file
    os.close(fd)
