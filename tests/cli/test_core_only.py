"""Every CLI command with only the core installed (numpy, ml_dtypes) works or names its extra.

The environment is a fresh virtual environment (``python -m venv --without-pip``, no system
site-packages) whose site-packages holds links to this environment's numpy and ml_dtypes and a
``.pth`` line putting the checkout's ``src`` on the path: offline, in about a second, and
nothing else importable (the test checks that torch, transformers and tqdm are not).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

pytest.importorskip("torch")
pytest.importorskip("transformers")

from tiny_models import save_gguf, save_hf_folder, tiny_llama  # noqa: E402

SRC = Path(__file__).resolve().parents[2] / "src"
CORE = ("numpy", "ml_dtypes")
ONE_LINE = re.compile(r"^lowbit [a-z-]+: error: .*pip install 'lowbit\[(?P<extra>[a-z]+)\]'$")


def _core_venv(where: Path) -> Path:
    """A venv that can import lowbit, numpy and ml_dtypes and nothing else; its python."""
    base = getattr(sys, "_base_executable", None) or sys.executable
    subprocess.run([base, "-m", "venv", "--without-pip", str(where)], check=True)
    python = where / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    purelib = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    site = Path(purelib)
    parent = Path(sysconfig.get_paths()["purelib"])
    for entry in parent.iterdir():  # the packages, their bundled libraries, their metadata
        top = entry.name.split("-")[0].split(".")[0]
        if top in CORE:
            (site / entry.name).symlink_to(entry, target_is_directory=entry.is_dir())
    (site / "lowbit_src.pth").write_text(f"{SRC}\n")
    return python


@pytest.fixture(scope="module")
def core(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("core")
    python = _core_venv(root / "venv")
    model = tiny_llama()
    hf = save_hf_folder(model, root / "hf")
    gguf = save_gguf(model, root / "tiny.gguf")
    import numpy as np

    npy = root / "w.npy"
    np.save(npy, np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32))
    return {"python": python, "root": root, "hf": hf, "gguf": gguf, "npy": npy}


def _run(core: dict[str, Path], *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    return subprocess.run(
        [core["python"], "-m", "lowbit.cli", *args],
        cwd=core["root"], env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip


def test_the_venv_is_core_only(core: dict[str, Path]) -> None:
    """The environment imports lowbit from this checkout, and no optional dependency."""
    code = (
        "import importlib.util as u, lowbit; print(lowbit.__file__); "
        "print([m for m in ('torch', 'transformers', 'tqdm', 'safetensors', 'gguf', 'yaml', "
        "'tokenizers', 'matplotlib', 'numba') if u.find_spec(m)])"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    out = subprocess.run(
        [core["python"], "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert Path(out[0]).resolve().is_relative_to(SRC.resolve())
    assert out[1] == "[]"


# (command line, expected): "ok" = exit 0; an extra's name = exit 2 with one line naming it;
# "error" = exit 2 with one "lowbit CMD: error: ..." line (a bad argument, no traceback).
# Paths: hf (a tiny llama folder), gguf (the same as GGUF), npy (a 64x64 tensor), out* (outputs).
CASES = [
    (["formats"], "ok"),
    (["show", "0.3952"], "ok"),
    (["decode", "e4m3", "0x7e"], "ok"),
    (["values", "fp4"], "ok"),
    (["compare", "--group", "64"], "ok"),
    (["compare", "--group", "64", "--plot", "out.png"], "plot"),
    (["hardware"], "ok"),
    (["overflow-demo"], "ok"),
    (["plan", "--params", "1B"], "ok"),
    (["plan", "{hf}", "--precisions", "q8_0,int4:g128"], "ok"),
    (["quantize-tensor", "{npy}", "--to", "int4:g32"], "ok"),
    (["quantize", "{hf}", "--to", "int8", "--out", "out-lowbit"], "ok"),
    (["quantize", "{hf}", "--to", "q4_0", "--out", "out-q4", "--no-progress"], "ok"),
    (["quantize", "{hf}", "--to", "int8", "--out", "out-ct", "--out-format", "compressed-tensors"],
     "ok"),
    (["verify", "out-lowbit"], "ok"),
    (["verify", "out-ct"], "ok"),
    (["quantize", "{gguf}", "--to", "q4_0", "--out-format", "gguf", "--out", "o.gguf"], "models"),
    (["quantize", "{gguf}", "--to", "q4_k_m", "--out-format", "gguf", "--out", "k.gguf"],
     "models"),
    (["imatrix", "{gguf}", "--out", "im.gguf"], "models"),
    (["verify", "{gguf}"], "models"),
    (["eval", "{hf}", "--tokens", "64"], "models"),
    (["eval", "out-lowbit", "--tokens", "64"], "models"),
    (["train-lab", "--steps", "2"], "torch"),
    (["report", "out-lowbit", "--out", "r.html"], "ok"),
    (["sensitivity", "{hf}", "--schemes", "int4:g32"], "models"),
    (["explore", "--port", "70000", "--no-browser"], "error"),  # a server: only its checks
]  # fmt: skip


def test_every_command_has_a_case() -> None:
    """The cases cover every command ``lowbit --help`` lists (a new command needs one)."""
    from lowbit.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    assert set(sub.choices) == {args[0] for args, _ in CASES}


def test_every_command_in_a_core_only_environment(core: dict[str, Path]) -> None:
    """Each command line exits 0, or exits 2 with exactly one stderr line naming its extra;
    never a traceback such as "No module named 'tqdm'"."""
    failures = []
    for args, expected in CASES:
        argv = [a.format(**{k: str(v) for k, v in core.items()}) for a in args]
        r = _run(core, *argv)
        lines = r.stderr.splitlines()
        if expected == "ok":
            ok = r.returncode == 0 and "Traceback" not in r.stderr
        elif expected == "error":
            ok = r.returncode == 2 and len(lines) == 1 and ": error: " in lines[0]
        else:
            m = ONE_LINE.match(lines[0]) if len(lines) == 1 else None
            ok = r.returncode == 2 and m is not None and m["extra"] == expected
        if not ok:
            failures.append(f"{' '.join(args)} -> exit {r.returncode}, stderr: {r.stderr[-800:]}")
    assert not failures, "\n".join(failures)


def test_every_help_in_a_core_only_environment(core: dict[str, Path]) -> None:
    """``lowbit COMMAND --help`` works for every command with the core only."""
    code = (
        "import contextlib, io, sys\n"
        "from lowbit.cli import build_parser, main\n"
        "sub = next(a for a in build_parser()._actions if a.dest == 'command')\n"
        "for name in sub.choices:\n"
        "    with contextlib.redirect_stdout(io.StringIO()):\n"
        "        try:\n"
        "            main([name, '--help'])\n"
        "        except SystemExit as exc:\n"
        "            assert exc.code == 0, name\n"
        "print(len(sub.choices))\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    r = subprocess.run([core["python"], "-c", code], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert int(r.stdout) == len({args[0] for args, _ in CASES})
