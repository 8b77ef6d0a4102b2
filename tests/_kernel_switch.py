"""`make test`'s kernels-off pass: the tests whose results can depend on the kernel switch.

The compiled kernels and the numpy path must give the same bits. Every choice between them
reads one function, ``lowbit.codecs._numba.enabled()``, per call, and where its answer makes
the call do something it would not do with the kernels off (run a kernel, cut other chunks)
the reader calls ``_numba.taken()`` (``tests/codecs/test_kernel_switch.py`` keeps both true).
A test during which nothing called ``taken()`` ran exactly the kernels-off path, so its
kernels-off run would repeat it; `make test` runs only the others again with ``LOWBIT_NUMBA=0``.

With ``LOWBIT_SWITCH_RECORD=<file>`` in the environment this plugin records, during the
kernels-on pass, which tests took such a branch, directly or through what they share:

- in this process, while a test (its setup, call or teardown) runs;
- in the processes a test starts (the CLI through ``subprocess``, spawned worker pools, Ray's
  workers), which inherit ``LOWBIT_SWITCH_LOG`` and ``PYTEST_CURRENT_TEST`` and append the
  test's id to a log (``lowbit.codecs._switch_log``);
- a fixture wider than a function (module, session) whose setup took one: every test that
  uses it;
- a test module whose import took one: all its tests;
- a ``functools.cache``/``lru_cache`` function (of lowbit or the tests) whose computation
  took one: every test that calls it afterwards (its hit count moves);
- tests marked ``kernel_switch`` (tests of the switch itself), always.

It writes the node ids, in collection order, only when the run was the whole suite (no paths,
``-k``, ``-m``, deselection or ``--co``) and passed, and when no branch was taken where it
cannot follow it (outside any test, in a ``cached_property``, in a helper module's import that
others share, in a child without a test id); otherwise it writes no list and says why (what it
saw goes to ``<file>.partial``), and `make test` runs the whole suite without the kernels.
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
import threading
from pathlib import Path
from types import CodeType
from typing import Any

import pytest

RECORD_ENV = "LOWBIT_SWITCH_RECORD"
MARKER = "kernel_switch"


def _calls(cached: Any) -> int:
    info = cached.cache_info()
    return int(info.hits + info.misses)


class Recorder:
    """Which tests took a kernel branch, and whether the record can be trusted."""

    def __init__(self, out: Path, root: Path) -> None:
        self.out = out
        self.root = str(root)  # the modules under it (not installed packages) are indexed
        self.log = out.with_name(out.name + ".log")
        self.tests: set[str] = set()
        self.modules: set[str] = set()  # nodeids of modules whose import took one
        self.fixtures: set[Any] = set()  # FixtureDefs wider than a function that took one
        self.reasons: set[str] = set()  # why the record cannot be trusted
        self.count = 0  # branches taken in this process
        self.current: str | None = None
        self.collecting: Any = None  # the Module being imported
        self.deselected = 0
        self.main = threading.get_ident()
        # cached functions (code object -> functools wrapper) and cached properties (code ->
        # name), of lowbit's and the tests' modules; the caches whose computation took one
        self.cached: dict[CodeType, Any] = {}
        self.properties: dict[CodeType, str] = {}
        self.switch_caches: set[Any] = set()
        self.scanned: set[str] = set()
        self.n_modules = 0
        self.items: list[Any] = []

    # ---- the branches ---------------------------------------------------------------------

    def note(self) -> None:
        """Called by ``_numba.taken()`` in this process."""
        self.count += 1
        if self.current is not None:
            self.tests.add(self.current)
        elif self.collecting is None:
            self.reasons.add("a kernel branch was taken outside any test")
        if len(sys.modules) != self.n_modules:
            self._scan()
        frames = [sys._getframe(1)]
        if threading.get_ident() != self.main:  # a pool thread: its caller waits in the main one
            main = sys._current_frames().get(self.main)
            if main is not None:
                frames.append(main)
        for frame in frames:
            f: Any = frame
            while f is not None:
                code = f.f_code
                if code in self.cached:
                    self.switch_caches.add(self.cached[code])
                elif code in self.properties:
                    self.reasons.add(
                        f"a cached_property took a kernel branch: {self.properties[code]}"
                    )
                elif (
                    self.collecting is not None
                    and code.co_name == "<module>"
                    and Path(code.co_filename) != Path(str(self.collecting.path))
                    and self._ours(code.co_filename)
                ):
                    self.reasons.add(
                        f"a shared module's import took a kernel branch: {code.co_filename}"
                    )
                f = f.f_back

    def _scan(self) -> None:
        """Index the cached functions and properties of newly imported lowbit/tests modules."""
        self.n_modules = len(sys.modules)
        for name, module in list(sys.modules.items()):
            if name in self.scanned or module is None:
                continue
            self.scanned.add(name)
            if not (name == "lowbit" or name.startswith("lowbit.")) and not self._ours(
                getattr(module, "__file__", None) or ""
            ):
                continue
            for obj in list(vars(module).values()):
                self._index(obj, name)
                if isinstance(obj, type) and obj.__module__ == name:
                    for attr in list(vars(obj).values()):
                        self._index(attr, f"{name}.{obj.__qualname__}")

    def _ours(self, file: str) -> bool:
        return file.startswith(self.root) and "site-packages" not in file

    def _index(self, obj: Any, where: str) -> None:
        if isinstance(obj, functools.cached_property):
            self.properties[obj.func.__code__] = f"{where}.{obj.attrname}"
        elif hasattr(obj, "cache_info") and hasattr(obj, "__wrapped__"):
            code = getattr(inspect.unwrap(obj), "__code__", None)
            if code is not None:
                self.cached[code] = obj

    def _mark(self) -> tuple[int, int, int]:
        """Branches here, calls of the caches that took one, and the children's log size."""
        log = self.log.stat().st_size if self.log.exists() else 0
        return self.count, sum(_calls(c) for c in list(self.switch_caches)), log

    # ---- pytest hooks -----------------------------------------------------------------------

    @pytest.hookimpl(hookwrapper=True)
    def pytest_make_collect_report(self, collector: pytest.Collector) -> Any:
        if not isinstance(collector, pytest.Module):
            yield
            return
        self.collecting = collector
        before = self._mark()
        try:
            yield
        finally:
            self.collecting = None
        if self._mark() != before:
            self.modules.add(collector.nodeid)

    def pytest_deselected(self, items: list[Any]) -> None:
        self.deselected += len(items)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_fixture_setup(self, fixturedef: Any, request: Any) -> Any:
        before = self._mark()
        yield
        if fixturedef.scope != "function" and self._mark() != before:
            self.fixtures.add(fixturedef)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: Any) -> Any:
        self.current = item.nodeid
        calls = {c: _calls(c) for c in self.switch_caches}
        try:
            yield
        finally:
            self.current = None
        if any(_calls(c) != calls.get(c, -1) for c in self.switch_caches):
            self.tests.add(item.nodeid)

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self.items = list(session.items)

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        config = session.config
        reasons = set(self.reasons)
        if exitstatus != 0:
            reasons.add(f"pytest's exit status was {exitstatus}")
        whole = config.args_source == pytest.Config.ArgsSource.TESTPATHS
        if not whole or config.option.keyword or config.option.markexpr:
            reasons.add("not the whole suite was selected")
        if self.deselected or config.option.collectonly:
            reasons.add("some tests were deselected or none ran")
        ids = self._ids(reasons)
        self.out.parent.mkdir(parents=True, exist_ok=True)
        self.out.unlink(missing_ok=True)
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        partial = self.out.with_name(self.out.name + ".partial")
        partial.unlink(missing_ok=True)
        if reasons:  # what it saw, for a look, under a name make test does not read
            partial.write_text("".join(f"{i}\n" for i in ids))
            why = "; ".join(sorted(reasons))
            msg = f"kernel switch record not written ({why}): the kernels-off pass runs everything"
        else:
            self.out.write_text("".join(f"{i}\n" for i in ids))
            msg = (
                f"kernel switch record: {len(ids)} of {len(self.items)} tests took a kernel branch "
                f"({self.out})"
            )
        if reporter is not None:
            reporter.write_line("")  # after the progress line
            reporter.write_line(msg)

    def _ids(self, reasons: set[str]) -> list[str]:
        """The node ids that took a kernel branch, in collection order."""
        chosen = set(self.tests)
        if self.log.exists():
            for line in self.log.read_text().splitlines():
                if line == "?":
                    reasons.add("a process outside any test took a kernel branch")
                elif line:
                    chosen.add(line)
            self.log.unlink()
        known = {item.nodeid for item in self.items}
        strays = sorted(i for i in chosen if i not in known)
        if strays:
            reasons.add(f"branches by tests not collected: {strays[:3]}")
        for item in self.items:
            if item.get_closest_marker(MARKER) is not None:
                chosen.add(item.nodeid)
            elif item.parent is not None and any(
                n.nodeid in self.modules for n in item.listchain()
            ):
                chosen.add(item.nodeid)
            elif self.fixtures and self._uses_switch_fixture(item):
                chosen.add(item.nodeid)
        return [item.nodeid for item in self.items if item.nodeid in chosen]

    def _uses_switch_fixture(self, item: Any) -> bool:
        info = getattr(item, "_fixtureinfo", None)
        if info is None:  # pytest changed: by name, which can only take more tests
            names = {f.argname for f in self.fixtures}
            return bool(names & set(getattr(item, "fixturenames", ())))
        return any(d in self.fixtures for defs in info.name2fixturedefs.values() for d in defs)


def configure(config: pytest.Config) -> None:
    """Register the recorder when ``LOWBIT_SWITCH_RECORD`` names the list to write."""
    target = os.environ.get(RECORD_ENV)
    if not target:
        return
    from lowbit.codecs import _numba, _switch_log

    out = Path(target).resolve()
    recorder = Recorder(out, config.rootpath)
    recorder.log.parent.mkdir(parents=True, exist_ok=True)
    recorder.log.unlink(missing_ok=True)
    os.environ[_switch_log.ENV] = str(recorder.log)  # for the processes the tests start
    _numba.consulted = recorder.note
    config.pluginmanager.register(recorder, "lowbit-kernel-switch")
