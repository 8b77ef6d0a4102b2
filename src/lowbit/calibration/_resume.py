"""A whole-model GPTQ run that can be killed and continued: a resume record after every block.

``lowbit quantize --method gptq --out OUT`` (and :func:`lowbit.quantize_model` with
``method="gptq"``) keeps, beside ``OUT``, the folder ``.OUT.lowbit-resume/`` (marked by the
file ``.lowbit-resume`` inside it; never inside an input, since ``OUT`` may not be). After
each block's layers are quantized it holds:

- ``tensors/N.npz``: every quantized tensor so far, as
  :class:`~lowbit.calibration._memory.SpilledTensors` keeps them (GPTQ writes them there in
  the first place: no second copy);
- ``states-B.bin``: the hidden states leaving block ``B`` for every calibration sample (the
  next block's inputs), their raw bytes;
- ``record.json``: the block ``B``, each tensor file's name, metadata and SHA-256, the
  states' dtypes, shapes and SHA-256, the per-layer report and which tensors GPTQ quantized,
  and the **fingerprint** of everything the result depends on: the source files' names,
  sizes and modification times, every planned tensor's scheme and method, the GPTQ settings,
  the calibration settings and the SHA-256 of the calibration tokens, the compute precision,
  torch's thread count, and the versions of lowbit, numpy and torch.

``record.json`` is written last, through a rename, so a kill at any instant (``kill -9``
included) leaves the record of the last finished block, whose files are all in place. The
next run with the same command finds it, checks it (fingerprint equal, every file present
with its hash) and continues with the block after ``B``: the same hidden states (bit for bit),
the same tensors, so the same output bytes as a run never interrupted (tests/calibration/
test_gptq_resume.py). A record that does not match or fails a check is never used: by
default the run says why in one warning line and starts over (the folder is emptied);
with ``resume=True`` (``--resume``) it refuses with one :class:`~lowbit.errors.LowbitError`
line instead (nothing to resume is refused as well). A folder by that name without the mark
is never touched: refused. The folder is removed once the output is written.

A run holds an exclusive ``flock`` on ``.OUT.lowbit-resume/lock`` while it calibrates: a second
run to the same output fails at once. Calibration workers (``--workers``, ``--ray``) do not
keep a record.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import warnings
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from lowbit.errors import LowbitError

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no lock, the record still checked
    fcntl = None  # type: ignore[assignment]

__all__ = ["Resume", "resume_folder"]

MARK = ".lowbit-resume"
VERSION = 1
_RECORD = "record.json"


def resume_folder(out: str | os.PathLike[str]) -> Path:
    """Where the resume record of an output ``OUT`` lives: ``.OUT.lowbit-resume`` beside it."""
    out = Path(out)
    return out.parent / f".{out.name}.lowbit-resume"


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            h.update(chunk)
    return h.hexdigest()


def source_files(path: Any) -> list[list[Any]]:
    """Name, size and modification time (ns) of the checkpoint's files (a folder's top-level
    files, or the one file)."""
    p = Path(path)
    files = sorted(f for f in p.iterdir() if f.is_file()) if p.is_dir() else [p]
    out = []
    for f in files:
        st = f.stat()
        out.append([f.name, st.st_size, st.st_mtime_ns])
    return out


def tokens_digest(samples: list[Any]) -> str:
    """SHA-256 of the calibration samples' token ids and masks, in order."""
    h = hashlib.sha256()
    for inputs, mask in samples:
        for key in sorted(inputs):
            t = inputs[key]
            h.update(key.encode())
            h.update(str(tuple(t.shape)).encode())
            h.update(t.contiguous().numpy().tobytes())
        if mask is not None:
            h.update(mask.contiguous().numpy().tobytes())
    return h.hexdigest()


class Resume:
    """The resume record of one run (see the module docstring).

    Args:
        folder: the record's folder (:func:`resume_folder` of the output).
        fingerprint: what determines the result (JSON-able; compared whole).
        require: ``True`` (``--resume``): a missing or unusable record is an error instead of a
            fresh start.
    """

    def __init__(self, folder: str | os.PathLike[str], *, require: bool = False) -> None:
        self.folder = Path(folder)
        self.require = bool(require)
        self.fingerprint: dict[str, Any] = {}
        self._lock: Any = None
        self._record: dict[str, Any] | None = None

    # -- opening --------------------------------------------------------------------------

    def open(self, fingerprint: Mapping[str, Any]) -> int:
        """Lock the folder, check what it holds against ``fingerprint``; return the first
        block to run (0: from the start, the folder emptied and marked).

        Raises:
            LowbitError: a folder of that name lowbit did not mark; another run holding it;
                with ``require``, no record or one that does not match or fails a check.
        """
        self.fingerprint = json.loads(json.dumps(dict(fingerprint)))  # as stored
        f = self.folder
        if os.path.lexists(f) and (f.is_symlink() or not f.is_dir() or not (f / MARK).is_file()):
            raise LowbitError(
                f"{f} exists but is not a lowbit resume record (no {MARK} mark); move it away"
            )
        fresh = not f.exists()
        f.mkdir(parents=False, exist_ok=True)
        if fresh:
            (f / MARK).write_text(json.dumps({"kind": "lowbit-gptq-resume"}) + "\n")
        self._take_lock()
        why = "no record yet" if fresh else self._check()
        if why is None:
            return int(self._record["block"]) + 1  # type: ignore[index]
        if self.require:
            self.close()
            if fresh:  # made just now: leave nothing behind
                remove_record(f)
            raise LowbitError(f"--resume: cannot resume from {f}: {why}")
        if not fresh and why != "no record yet":
            warnings.warn(f"not resuming from {f}: {why}; starting over", UserWarning, stacklevel=3)
        self._empty()
        return 0

    def _take_lock(self) -> None:
        if fcntl is None:  # pragma: no cover
            return
        fd = os.open(self.folder / "lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise LowbitError(
                f"another run is calibrating into {self.folder} (its lock is held); wait for it "
                "or stop it"
            ) from None
        self._lock = weakref.finalize(self, os.close, fd)  # closed with this object at the latest

    def _check(self) -> str | None:
        """Why the folder's record cannot be used, or None (then it is loaded)."""
        path = self.folder / _RECORD
        if not path.exists():
            return "no record yet"
        try:
            rec = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError) as e:
            return f"its record is unreadable ({type(e).__name__})"
        if not isinstance(rec, dict) or rec.get("version") != VERSION:
            return "its record is of another version"
        old = rec.get("fingerprint")
        if old != self.fingerprint:
            keys = sorted(set(old or {}) | set(self.fingerprint))
            diff = [k for k in keys if (old or {}).get(k) != self.fingerprint.get(k)]
            return f"it was made by another run (different {', '.join(diff) or 'fingerprint'})"
        try:
            for name, (file, _meta, digest) in rec["tensors"].items():
                p = self.folder / "tensors" / file
                if not p.is_file() or _sha256_file(p) != digest:
                    return f"tensor {name}'s file is missing or changed"
            st = rec["states"]
            if st is not None:
                p = self.folder / st["file"]
                if not p.is_file() or p.stat().st_size != st["bytes"]:
                    return "the saved hidden states are missing or truncated"
                if _sha256_file(p) != st["sha256"]:
                    return "the saved hidden states do not match their checksum"
            int(rec["block"])
            dict(rec["methods"]), dict(rec["layers"])
        except (KeyError, TypeError, ValueError) as e:
            return f"its record is malformed ({type(e).__name__})"
        self._record = rec
        return None

    def _empty(self) -> None:
        for p in self.folder.iterdir():
            if p.name in (MARK, "lock"):
                continue
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            else:
                p.unlink()
        self._record = None

    # -- what a resumed run takes back ---------------------------------------------------

    @property
    def tensors_folder(self) -> Path:
        """Where the run's :class:`SpilledTensors` keep their files."""
        return self.folder / "tensors"

    def restore(self, weights: Any, methods: dict[str, str], layers: dict[str, Any]) -> list[Any]:
        """Put the record's tensors into ``weights`` (a SpilledTensors on
        :attr:`tensors_folder`), its methods and report into the dicts; return the saved hidden
        states (torch tensors; empty when the record's block was the last)."""
        import torch

        rec = self._record
        assert rec is not None, "restore() without a usable record"
        for name, (file, meta, _digest) in rec["tensors"].items():
            weights.adopt(name, str(self.tensors_folder / file), meta)
        methods.update(rec["methods"])
        layers.update(rec["layers"])
        st = rec["states"]
        if st is None:
            return []
        raw = np.fromfile(self.folder / st["file"], dtype=np.uint8)
        out, at = [], 0
        for dtype, shape in st["items"]:
            t = torch.empty(shape, dtype=getattr(torch, dtype))  # torch's own aligned memory
            n = t.numel() * t.element_size()
            t.view(-1).view(torch.uint8).copy_(torch.from_numpy(raw[at : at + n]))
            out.append(t)
            at += n
        return out

    # -- after each block ----------------------------------------------------------------

    def save(
        self,
        block: int,
        hidden: list[Any] | None,
        weights: Any,
        methods: Mapping[str, str],
        layers: Mapping[str, Any],
    ) -> None:
        """Record that ``block`` is finished: ``hidden`` (the next block's inputs, or None
        after the last block), the tensors in ``weights`` so far, ``methods`` and ``layers``.
        The record is replaced by one rename, after every file it names is written."""
        import torch

        old = (self._record or {}).get("states")
        tensors = {}
        prev = (self._record or {}).get("tensors", {})
        for name, (path, meta) in weights.entries().items():
            file = Path(path).name
            known = prev.get(name)
            digest = known[2] if known and known[0] == file else _sha256_file(Path(path))
            tensors[name] = [file, meta, digest]
        states = None
        if hidden is not None:
            file = f"states-{block}.bin"
            h = hashlib.sha256()
            items, total = [], 0
            tmp = self.folder / (file + ".tmp")
            with open(tmp, "wb") as f:
                for t in hidden:
                    raw = t.detach().contiguous().reshape(-1).view(torch.uint8).numpy()
                    f.write(raw)
                    h.update(raw)
                    total += raw.size
                    items.append([str(t.dtype).removeprefix("torch."), list(t.shape)])
            os.replace(tmp, self.folder / file)
            states = {"file": file, "bytes": total, "sha256": h.hexdigest(), "items": items}
        rec = {
            "version": VERSION,
            "fingerprint": self.fingerprint,
            "block": int(block),
            "states": states,
            "tensors": tensors,
            "methods": dict(methods),
            "layers": dict(layers),
        }
        tmp = self.folder / (_RECORD + ".tmp")
        tmp.write_text(json.dumps(rec), encoding="utf-8")
        os.replace(tmp, self.folder / _RECORD)
        self._record = rec
        if old is not None and (states is None or old["file"] != states["file"]):
            with contextlib.suppress(OSError):
                (self.folder / old["file"]).unlink()

    # -- the end ---------------------------------------------------------------------------

    def close(self) -> None:
        """Release the lock (the record stays for the next run)."""
        if self._lock is not None:
            self._lock()  # closes the file (once)
            self._lock = None

    def remove(self) -> None:
        """Delete the folder (the output is written), its mark last."""
        self.close()
        remove_record(self.folder)

    def __enter__(self) -> Resume:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        """The run's end: an error (or an interrupt) keeps the record for the next run and
        releases the lock; a run whose output is whole removes the record."""
        if exc_type is None:
            self.remove()
        else:
            self.close()


def remove_record(folder: str | os.PathLike[str]) -> None:
    """Delete a resume folder lowbit marked (anything else is left alone)."""
    f = Path(folder)
    if f.is_symlink() or not (f / MARK).is_file():
        return
    for p in f.iterdir():
        if p.name == MARK:
            continue
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                p.unlink()
    with contextlib.suppress(OSError):
        (f / MARK).unlink()
        f.rmdir()
