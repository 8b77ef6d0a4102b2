"""Which codec path is faster on this machine, measured once and cached per machine.

The compiled kernels (numba) and the numpy path give the same bits, but which is faster
depends on the CPU: on the AMD EPYC of docs/benchmarks.md the kernels encode FP8 in a third
of the numpy path's time, on an Intel Xeon with AMX they were measured slower (issue 28).
So the first time a process would run a kernel of a kind (float32 encode through the
float32 core, bfloat16-like encode, table decode, ...) for which the numpy path has a fast
route too, both run on a few MB of that call's own data, on one thread, interleaved (best
of ``ROUNDS``), and the faster is used for that kind from then on (:func:`choose`: the
kernels unless the numpy path is faster).

The verdicts are cached in a small JSON file, ``codec_paths.json`` in the user's cache
directory (``$LOWBIT_CACHE_DIR``, else ``$XDG_CACHE_HOME/lowbit``, else
``~/.cache/lowbit``; ``%LOCALAPPDATA%\\lowbit`` on Windows), under a key naming the
machine: CPU model and flags, numba, numpy and lowbit versions, so a new CPU, a new numba
or a new lowbit measures afresh (entries of up to ``MAX_MACHINES`` machines are kept, for
home directories shared by several machines). A file that cannot be read, is not lowbit's,
or was written by another machine is ignored, and one that cannot be written is left
alone: the choice is then measured in each process. It never changes a result.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from lowbit._cpu import cpu_flags, cpu_model
from lowbit._version import __version__

__all__ = ["PathChoice", "cache_file", "choose", "cpu_key", "machine_key", "time_pair"]

CACHE_NAME = "codec_paths.json"
CACHE_VERSION = 1
MAX_MACHINES = 16
ROUNDS = 5
SAMPLE_VALUES = 1 << 20  # 4 MB of float32: past L2, as the arrays that reach a kernel are
_PATHS = ("kernels", "numpy")


def choose(
    kernel_seconds: float,
    numpy_seconds: float,
    paths: tuple[str, str] = _PATHS,
    margin: float = 1.0,
) -> str:
    """``"kernels"`` unless the numpy path was measured faster (then ``"numpy"``).

    In general: the first of ``paths`` unless the second took less than ``margin`` times
    the first's seconds (a margin above 1 asks the first path to win by that factor)."""
    return paths[1] if numpy_seconds < kernel_seconds * margin else paths[0]


def cache_file() -> Path:
    """Where the verdicts are cached (see the module docstring)."""
    root = os.environ.get("LOWBIT_CACHE_DIR", "").strip()
    if root:
        return Path(root).expanduser() / CACHE_NAME
    xdg = os.environ.get("XDG_CACHE_HOME", "").strip()
    local = os.environ.get("LOCALAPPDATA", "").strip() if sys.platform == "win32" else ""
    base = Path(xdg) if xdg else Path(local) if local else Path.home() / ".cache"
    return base / "lowbit" / CACHE_NAME


def cpu_key() -> str:
    """The CPU as a cache key: its model and a digest of its flags."""
    flags = hashlib.sha256(" ".join(sorted(cpu_flags())).encode()).hexdigest()[:16]
    return f"{cpu_model()} | flags {flags}"


def machine_key() -> str:
    """The machine as the cache knows it: CPU model, a digest of its flags, and the
    numba, numpy and lowbit versions (any change measures again)."""
    try:
        from importlib.metadata import version

        numba = version("numba")
    except Exception:  # not installed, or broken metadata: the key still holds
        numba = "none"
    return f"{cpu_key()} | numba {numba} | numpy {np.__version__} | lowbit {__version__}"


def time_pair(
    kernel: Callable[[], Any],
    numpy_path: Callable[[], Any],
    rounds: int = ROUNDS,
    clock: Callable[[], float] = time.perf_counter,
) -> tuple[float, float]:
    """Best seconds of ``kernel()`` and of ``numpy_path()`` over ``rounds`` interleaved
    rounds, after one warm-up call of each (kernels compiled, tables built)."""
    kernel()
    numpy_path()
    best = [float("inf"), float("inf")]
    for _ in range(rounds):
        for i, fn in enumerate((kernel, numpy_path)):
            t0 = clock()
            fn()
            best[i] = min(best[i], clock() - t0)
    return best[0], best[1]


def _read(path: Path) -> dict[str, Any]:
    """The cache's machines, or {} if the file is missing, unreadable or not lowbit's."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return {}
    if not isinstance(data, dict) or data.get("version") != CACHE_VERSION:
        return {}
    machines = data.get("machines")
    return machines if isinstance(machines, dict) else {}


def _valid(entry: Any, paths: tuple[str, str], fields: tuple[str, str]) -> bool:
    return (
        isinstance(entry, dict)
        and entry.get("path") in paths
        and all(isinstance(entry.get(k), (int, float)) for k in fields)
    )


class PathChoice:
    """The per-kind verdicts of one process, backed by the cache file.

    ``kernels_win(kind, measure)`` answers from memory, else from the cache file, else by
    calling ``measure()`` (seconds of the kernel and of the numpy path on the same data)
    and recording the verdict. ``file`` and ``key`` are callables so tests can point them
    elsewhere.

    The same machinery serves any pair of equivalent ways (``paths``, with the cache
    fields ``fields`` holding their nanoseconds and ``detail`` what was timed): the model
    work's bf16-or-float32 choice (``lowbit.models._compute``) is one, with a ``margin``
    the first way must win by (:func:`choose`).
    """

    def __init__(
        self,
        file: Callable[[], Path] = cache_file,
        key: Callable[[], str] = machine_key,
        paths: tuple[str, str] = _PATHS,
        fields: tuple[str, str] = ("kernel_ns", "numpy_ns"),
        margin: float = 1.0,
        detail: Callable[[], dict[str, Any]] = lambda: {"values": SAMPLE_VALUES},
    ) -> None:
        self._file = file
        self._key = key
        self._paths = paths
        self._fields = fields
        self._margin = margin
        self._detail = detail
        self._lock = threading.Lock()
        self.known: dict[str, dict[str, Any]] | None = None

    def _load(self) -> dict[str, dict[str, Any]]:
        if self.known is None:
            mine = _read(self._file()).get(self._key(), {})
            mine = mine if isinstance(mine, dict) else {}
            self.known = {
                kind: e for kind, e in mine.items() if _valid(e, self._paths, self._fields)
            }
        return self.known

    def first_wins(self, kind: str, measure: Callable[[], tuple[float, float]]) -> bool:
        """Whether the first of ``paths`` is the one to use for ``kind`` on this machine
        (``measure()``: seconds of the first and of the second way)."""
        first = self._paths[0]
        known = self.known
        if known is not None and kind in known:
            return bool(known[kind]["path"] == first)
        with self._lock:
            known = self._load()
            if kind not in known:
                first_s, second_s = measure()
                known[kind] = {
                    "path": choose(first_s, second_s, self._paths, self._margin),
                    self._fields[0]: round(first_s * 1e9),
                    self._fields[1]: round(second_s * 1e9),
                    **self._detail(),
                }
                self._save(kind, known[kind])
            return bool(known[kind]["path"] == first)

    def kernels_win(self, kind: str, measure: Callable[[], tuple[float, float]]) -> bool:
        """Whether the kernels are the faster path for ``kind`` on this machine."""
        return self.first_wins(kind, measure)

    def _save(self, kind: str, entry: dict[str, Any]) -> None:
        """Add one verdict to the file (other machines' entries kept); failures ignored."""
        path = self._file()
        machines = _read(path)
        key = self._key()
        mine = machines.pop(key, None)
        mine = mine if isinstance(mine, dict) else {}
        mine[kind] = entry
        others = list(machines.items())[-(MAX_MACHINES - 1) :]
        data = {"version": CACHE_VERSION, "machines": {**dict(others), key: mine}}
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as fh:
                    json.dump(data, fh, indent=1, sort_keys=True)
                os.replace(tmp, path)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
        except OSError:
            pass  # a read-only or missing cache directory: measure again next process
