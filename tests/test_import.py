"""``import lowbit`` stays light: numpy only, ml_dtypes when first needed."""

from __future__ import annotations

import subprocess
import sys


def test_import_does_not_load_heavy_modules() -> None:
    """torch, transformers, matplotlib, safetensors and numba stay unloaded on import."""
    code = (
        "import sys, lowbit; lowbit.format('e4m3').encode([1.0]);"
        "heavy = [m for m in ('torch', 'transformers', 'matplotlib', 'safetensors', 'gguf')"
        " if m in sys.modules]; print(','.join(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_import_does_not_load_numba() -> None:
    """numba (about half a second to import) loads with the first compiled kernel, not before."""
    code = "import sys, lowbit; print(any(m in sys.modules for m in ('numba', 'llvmlite')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_small_inputs_do_not_load_numba() -> None:
    """Arrays below the kernel threshold (a scalar, a value table, a 64x128 tensor) take the
    numpy path: encoding, decoding, quantizing and the CLI's show/decode/values leave numba
    unloaded, so they answer without importing or compiling it."""
    code = (
        "import sys, io, contextlib, numpy as np, lowbit\n"
        "from lowbit.cli import main\n"
        "x = np.linspace(-3, 3, 64 * 128, dtype=np.float32).reshape(64, 128)\n"
        "for name in ('e4m3', 'fp4', 'bf16', 'int8', 'nf4'):\n"
        "    f = lowbit.format(name)\n"
        "    f.decode(f.encode(x))\n"
        "for fmt, g in (('int4', 32), ('fp8_e4m3', None), ('nf4', 64), ('mxfp4', None)):\n"
        "    lowbit.quantize(x, fmt, group_size=g).dequantize()\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    for argv in (['show', '0.3952'], ['decode', 'e4m3', '0x7e'], ['values', 'fp4']):\n"
        "        assert main(argv) == 0, argv\n"
        "print(any(m in sys.modules for m in ('numba', 'llvmlite')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_light_commands_do_not_import_ml_dtypes() -> None:
    """ml_dtypes 0.7's import takes 0.7-0.8 s of CPU (0.1 s for 0.6), more than a whole
    ``lowbit show``: it loads when a bfloat16 cast of a large array, an ml_dtypes input or a
    checkpoint needs it, so import, small encodes and the light commands stay without it."""
    light = (
        ["show", "0.3952"], ["decode", "e4m3", "0x7e"], ["values", "fp4"], ["formats"],
        ["plan", "--params", "7B"], ["hardware"], ["--help"],
    )  # fmt: skip
    for argv in light:
        code = (
            "import sys, io, contextlib, numpy as np, lowbit\n"
            "from lowbit.cli import main\n"
            "x = np.linspace(-3, 3, 8192, dtype=np.float32)\n"
            "lowbit.format('bf16').decode(lowbit.format('bf16').encode(x))\n"
            "lowbit.format('e4m3').describe()\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    try:\n"
            f"        main({argv!r})\n"
            "    except SystemExit:\n"
            "        pass\n"
            "print('ml_dtypes' in sys.modules)"
        )
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        assert out.returncode == 0, (argv, out.stderr[-2000:])
        assert out.stdout.strip() == "False", argv


def test_cli_imports_only_the_command_it_runs() -> None:
    """``lowbit show`` imports cmd_show's module alone (not eval's, quantize's or the
    checkpoint readers); the full parser, for ``lowbit --help``, still has every command."""
    code = (
        "import sys, io, contextlib\n"
        "from lowbit.cli import build_parser, main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    assert main(['show', '0.5']) == 0\n"
        "mods = ('lowbit.cli.cmd_eval', 'lowbit.cli.cmd_quantize', 'lowbit.checkpoints.opener')\n"
        "print([m for m in mods if m in sys.modules])\n"
        "sub = next(a for a in build_parser()._actions if a.dest == 'command')\n"
        "print(len(sub.choices), 'eval' in sub.choices, 'show' in sub.choices)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded, full = out.stdout.strip().splitlines()
    assert loaded == "[]"
    count, has_eval, has_show = full.split()
    assert int(count) >= 16 and has_eval == has_show == "True"


def test_version_matches_pyproject() -> None:
    """lowbit.__version__ (lowbit/_version.py) is pyproject.toml's version."""
    import re
    from pathlib import Path

    import lowbit

    text = (Path(__file__).parents[1] / "pyproject.toml").read_text(encoding="utf-8")
    match = re.search(r'^version = "([^"]+)"', text, re.MULTILINE)
    assert match is not None and lowbit.__version__ == match.group(1)
