"""The kernel switch is read in one place, per call, and `make test` records who reads it.

`make test`'s kernels-off pass (``LOWBIT_NUMBA=0``) runs only the tests that read the switch in
its first pass (``tests/_kernel_switch.py``). That is sound while every choice between a kernel
and the numpy path goes through ``lowbit.codecs._numba.enabled()`` at the time of the call: a
reading cached at import, or a second reader of ``LOWBIT_NUMBA``, would hide tests from the
record. These tests keep that true, and run the recorder on a small suite of its own.
"""

from __future__ import annotations

import ast
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
            return _numba.use_kernels(1)
    """,
    "helpers.py": """
        import functools
        from lowbit.codecs import _numba

        @functools.cache
        def table():
            return _numba.use_kernels(1)
    """,
    "test_a.py": """
        import subprocess, sys
        import pytest
        import helpers
        from lowbit.codecs import _numba

        def test_reads():
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
            code = "from lowbit.codecs import _numba; _numba.use_kernels(1)"
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
    """The recorder lists the tests that read the switch in the process, in a child, through a
    session fixture, through a cache, or by marker, not the others; a partial run writes no
    list."""
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
    assert "7 of 8 tests read the switch" in done.stdout
    done = subprocess.run([*run, "-k", "plain"], cwd=suite, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert not out.exists()
    assert "not the whole suite was selected" in done.stdout
