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

These guarantees hold against the process being killed at any point; they do not order writes
against a power failure (no ``fsync``).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import re
import shutil
import struct
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

WRITER_KEY = "lowbit.writer"  # safetensors __metadata__ / GGUF metadata: which lowbit wrote it
FILES_KEY = "lowbit.files"  # safetensors __metadata__ of a folder's shards: the folder's files
MARKER = ".lowbit-output"
COMPLETE = ".lowbit-complete"
_LOWBIT_JSON = "lowbit.json"
_SHARD = re.compile(r"model(-\d{5}-of-\d{5})?\.safetensors")
_RENAME_NOREPLACE = 1
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100
# errors that can only come from writing the output, whichever file they name
_WRITE_ERRNOS = {errno.ENOSPC, errno.EROFS, errno.EFBIG, getattr(errno, "EDQUOT", errno.ENOSPC)}


def writer_tag() -> str:
    """The value of the ``lowbit.writer`` mark: ``lowbit <version>``."""
    from lowbit import __version__

    return f"lowbit {__version__}"


def writer_metadata(files: Iterable[str] | None = None) -> dict[str, str]:
    """Safetensors ``__metadata__`` entries that mark a file as lowbit's (and, for the shards of a
    folder, list every file of that folder so a later ``overwrite`` can tell them from others)."""
    meta = {WRITER_KEY: writer_tag()}
    if files is not None:
        meta[FILES_KEY] = json.dumps(sorted(files))
    return meta


# ---------------------------------------------------------------------------------------
# Checks
# ---------------------------------------------------------------------------------------


def check_not_input(
    out: str | os.PathLike[str], inputs: Iterable[str | os.PathLike[str]], *, flag: str = "out"
) -> None:
    """Refuse an output that is, contains or lies inside one of the inputs (real paths).

    Raises:
        LowbitError: naming the output and the input it would destroy.
    """
    target = _real(Path(out))
    clashes = []
    for given in inputs:
        src = _real(Path(given))
        if target == src:
            clashes.append((0, "is", given))
        elif target in src.parents:
            clashes.append((1, "contains", given))
        elif src in target.parents:
            clashes.append((2, "lies inside", given))
    if clashes:
        _, why, given = min(clashes, key=lambda c: c[0])  # the most direct relation
        raise LowbitError(
            f"--{flag} {out} {why} the input {given}; writing it would destroy the input. "
            f"Choose another --{flag}"
        )


def _real(p: Path) -> Path:
    return Path(os.path.realpath(p))


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
    try:
        if path.stat().st_size > limit:
            return None
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
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
    from lowbit.checkpoints import _gguf

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
}


def _figure_marked(p: Path, limit: int = 256 * 2**20) -> bool:
    try:
        if p.stat().st_size > limit:
            return False
        return _FIGURE_MARKS[p.suffix.lower()][1] in p.read_bytes()
    except OSError:
        return False


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
    if not target.parent.is_dir():
        raise LowbitError(f"cannot write {target}: directory {target.parent} does not exist")
    check_not_input(target, inputs)
    _check_existing(target, kind, overwrite)


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


# ---------------------------------------------------------------------------------------
# Debris of interrupted runs
# ---------------------------------------------------------------------------------------


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
            if (work / COMPLETE).exists() and os.path.lexists(new):
                os.rename(new, target)
                restored = f"; moved its complete new output to {target}"
            elif os.path.lexists(old):
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
        if lowbit_made(inner) is not None:
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
