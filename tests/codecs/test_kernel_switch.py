"""The kernel switch is read in one place, per call, and `make test` records who it steers.

`make test`'s kernels-off pass (``LOWBIT_NUMBA=0``) runs only the tests that, in its first pass,
took a branch they would not take with the kernels off (``lowbit.codecs._numba.taken()``;
``tests/_kernel_switch.py`` records them). That is sound while every choice between a kernel
and the numpy path reads ``lowbit.codecs._numba.enabled()`` at the time of the call and the
reader notes the branches its answer opens: a reading cached at import, a second reader of
``LOWBIT_NUMBA``, or a new reader that notes nothing would hide tests from the record. These
tests keep that true, and run the recorder on a small suite of its own.
"""

from __future__ import annotations

import ast
import functools
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import lowbit

SRC = Path(lowbit.__file__).resolve().parent
TESTS = Path(__file__).resolve().parents[1]
SWITCH = SRC / "codecs" / "_numba.py"
READERS = {"enabled", "use_kernels", "_use_kernels", "_ggml_kernels"}
# The functions that read enabled() and call taken() where its answer changes what the call
# does; a new reader joins this list once it does the same (and its test below).
NOTED = {
    "codecs/_numba.py": {"use_kernels"},
    "ggml/_numba.py": {"_ggml_kernels"},
    "ggml/_search.py": {"_use_kernels"},
    "ggml/iq_lattice.py": {"use_kernels"},
    "formats/ints.py": {"_encode_compiled"},
    "quant/_engine.py": {"_chunks"},
}


@functools.cache
def _modules() -> list[tuple[Path, ast.Module]]:
    return [(p, ast.parse(p.read_text(), str(p))) for p in sorted(SRC.rglob("*.py"))]


def test_only_enabled_reads_the_switch() -> None:
    """``LOWBIT_NUMBA`` and ``HAVE_NUMBA`` are read in ``codecs/_numba.py`` only, and
    ``HAVE_NUMBA`` there only by ``enabled()``: every kernel choice passes through it."""
    where = []
    for path, tree in _modules():
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and node.value == "LOWBIT_NUMBA" and path != SWITCH:
                where.append(f"{path.relative_to(SRC)}:{node.lineno} LOWBIT_NUMBA")
            name = node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", None)
            if name == "HAVE_NUMBA" and path != SWITCH:
                where.append(f"{path.relative_to(SRC)}:{node.lineno} HAVE_NUMBA")
    tree = ast.parse(SWITCH.read_text())
    for fn in ast.walk(tree):
        if isinstance(fn, ast.FunctionDef) and fn.name != "enabled":
            for node in ast.walk(fn):
                if isinstance(node, ast.Name) and node.id == "HAVE_NUMBA":
                    where.append(f"codecs/_numba.py:{node.lineno} HAVE_NUMBA in {fn.name}")
    assert not where, where


def _calls(fn: ast.AST, name: str) -> bool:
    return any(
        isinstance(n, ast.Call)
        and (n.func.attr if isinstance(n.func, ast.Attribute) else getattr(n.func, "id", None))
        == name
        for n in ast.walk(fn)
    )


def test_every_reader_notes_its_branches() -> None:
    """The functions that call ``enabled()`` are the listed ones, and each calls ``taken()``."""
    readers: dict[str, set[str]] = {}
    for path, tree in _modules():
        for fn in ast.walk(tree):
            if isinstance(fn, ast.FunctionDef) and _calls(fn, "enabled"):
                readers.setdefault(path.relative_to(SRC).as_posix(), set()).add(fn.name)
                assert _calls(fn, "taken"), f"{path.name}:{fn.name} reads enabled() unnoted"
    assert readers == NOTED


def test_taken_exactly_when_the_kernels_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """``use_kernels``, the K-quant searches' and the GGML blocks' rules and the engine's
    pieces note a branch when, and only when, they leave the kernels-off path."""
    from lowbit.codecs import _numba
    from lowbit.ggml import _numba as _ggml
    from lowbit.ggml import _search, iq_lattice
    from lowbit.quant import _engine

    notes: list[int] = []
    monkeypatch.setattr(_numba, "consulted", lambda: notes.append(1))
    monkeypatch.setattr(_numba, "HAVE_NUMBA", True)  # the rules, not numba, are under test
    # a rental of its own, unbought, whether or not earlier tests loaded numba
    fresh = _numba._Rental(iq_lattice.IQ_KERNEL_WORTH, lambda: False)
    monkeypatch.setattr(iq_lattice, "_rental", fresh)

    def noted(call: object) -> tuple[object, int]:
        notes.clear()
        return call(), len(notes)  # type: ignore[operator]

    assert noted(lambda: _numba.use_kernels(10)) == (False, 0)
    assert noted(lambda: _search._use_kernels(10)) == (False, 0)
    assert noted(lambda: _ggml._ggml_kernels(10)) == (False, 0)
    assert noted(lambda: iq_lattice.use_kernels(10)) == (False, 0)
    with _numba.kernels_always():
        assert noted(lambda: _numba.use_kernels(10)) == (True, 1)
        assert noted(lambda: _search._use_kernels(10)) == (True, 1)
        assert noted(lambda: _ggml._ggml_kernels(10))[0] is True
        assert noted(lambda: iq_lattice.use_kernels(10)) == (True, 1)
        with _numba.numpy_only():
            assert noted(lambda: _numba.use_kernels(10)) == (False, 0)
    assert noted(lambda: _ggml._ggml_kernels(_ggml.GGML_ALONE)) == (True, 1)
    assert noted(lambda: list(_engine._chunks((1, 1, 64, 64)))) == (
        list(_engine._chunks((1, 1, 64, 64))),
        0,
    )
    big = (1, 1, 4096, 1024)  # pieces of 2^17 values without the kernels, 2^20 with
    with _numba.numpy_only():
        off = list(_engine._chunks(big))
    on, n = noted(lambda: list(_engine._chunks(big)))
    assert n == 1 and len(off) == 32 and len(on) == 4  # type: ignore[arg-type]


def test_no_reading_at_import() -> None:
    """No module reads the switch at import (a module-level or default-argument call of
    ``enabled``/``use_kernels``): a reading kept from import would decide later calls unseen."""
    where = []
    for path, tree in _modules():
        inside: set[int] = set()
        for fn in ast.walk(tree):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                body = fn.body if isinstance(fn.body, list) else [fn.body]
                inside.update(id(n) for stmt in body for n in ast.walk(stmt))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and id(node) not in inside:
                f = node.func
                name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)
                if name in READERS:
                    where.append(f"{path.relative_to(SRC)}:{node.lineno}")
    assert not where, where


def test_fixtures_are_requested_statically() -> None:
    """No test asks for a fixture at run time (``request.getfixturevalue``): the recorder finds
    the users of a shared fixture that took a kernel branch by the fixtures each test names."""
    hits = [
        f"{p.relative_to(TESTS)}"
        for p in TESTS.rglob("*.py")
        if p.name != Path(__file__).name and "getfixturevalue" in p.read_text()
    ]
    assert not hits, hits


_SUITE = {
    "conftest.py": """
        import sys
        sys.path.insert(0, {tests!r})
        import _kernel_switch
        import pytest

        def pytest_configure(config):
            _kernel_switch.configure(config)

        @pytest.fixture(scope="session")
        def shared():
            from lowbit.codecs import _numba
            return _numba.taken()
    """,
    "helpers.py": """
        import functools
        from lowbit.codecs import _numba

        @functools.cache
        def table():
            return _numba.taken()
    """,
    "test_a.py": """
        import subprocess, sys
        import pytest
        import helpers
        from lowbit.codecs import _numba

        def test_reads():
            _numba.taken()

        def test_small():  # the numpy path either way
            _numba.use_kernels(1)

        def test_plain():
            assert 1 + 1 == 2

        def test_fixture_first(shared):
            pass

        def test_fixture_again(shared):
            pass

        def test_cache_first():
            helpers.table()

        def test_cache_hit():
            helpers.table()

        def test_child():
            code = "from lowbit.codecs import _numba; _numba.taken()"
            subprocess.run([sys.executable, "-c", code], check=True)

        @pytest.mark.kernel_switch
        def test_marked():
            pass
    """,
    "pytest.ini": """
        [pytest]
        testpaths = .
        markers =
            kernel_switch: always in the kernels-off pass
    """,
}


@pytest.mark.kernel_switch
def test_recorder_lists_the_readers(tmp_path: Path) -> None:
    """The recorder lists the tests that take a kernel branch in the process, in a child,
    through a session fixture, through a cache, or by marker, not the others; a partial run
    writes no list."""
    suite = tmp_path / "suite"
    suite.mkdir()
    for name, text in _SUITE.items():
        (suite / name).write_text(textwrap.dedent(text.format(tests=str(TESTS))))
    out = tmp_path / "list.txt"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LOWBIT_SWITCH", "PYTEST_"))}
    env["LOWBIT_SWITCH_RECORD"] = str(out)
    env["PYTHONPATH"] = os.pathsep.join([str(SRC.parent), str(suite)])
    run = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    done = subprocess.run(run, cwd=suite, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    got = [line.split("::")[1] for line in out.read_text().splitlines()]
    assert got == [
        "test_reads",
        "test_fixture_first",
        "test_fixture_again",
        "test_cache_first",
        "test_cache_hit",
        "test_child",
        "test_marked",
    ], done.stdout
    assert "7 of 9 tests took a kernel branch" in done.stdout
    # make test's second pass: exactly the listed tests, as pytest reads them from the file
    off = {k: v for k, v in env.items() if k != "LOWBIT_SWITCH_RECORD"}
    again = subprocess.run(
        [*run, "--co", f"@{out}"], cwd=suite, env={**off, "LOWBIT_NUMBA": "0"},
        capture_output=True, text=True,
    )  # fmt: skip
    assert again.returncode == 0, again.stdout + again.stderr
    assert [line for line in again.stdout.splitlines() if "::" in line] == out.read_text().split()
    done = subprocess.run([*run, "-k", "plain"], cwd=suite, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert not out.exists()
    assert "not the whole suite was selected" in done.stdout
