"""Cold start: the first call of each CLI command, and of ``lowbit.quantize``, in a fresh process.

Each case runs twice in new Python processes sharing one numba cache folder
(``NUMBA_CACHE_DIR``), made empty for the first: **cold** is the first run (numba, where
a case loads it, compiles its kernels and writes them to the cache), **warm** the second
(the kernels load from the cache). Python's bytecode caches are written first, as
``pip install`` does (``_timing.child_env``), so the cold figures are those of a freshly
installed lowbit's first run. Times are wall seconds and CPU seconds (user + system) of the child
process; the machine's load average is printed beside them, since wall time on a shared
machine is mostly other people's work. "numba" says whether the process imported numba.

The CLI cases run ``lowbit.cli.main`` (what the ``lowbit`` script calls); the
``lowbit.quantize`` cases quantize a 64x128 float32 tensor (below
``lowbit.codecs._numba.MIN_KERNEL_SIZE``), a 1024x1024 one (above it, but far below
``KERNEL_WORTH``, the values a process sends down the numpy path before the compiled kernels
are worth loading) and a 65536x1024 one (``KERNEL_WORTH`` values: it loads them) to int4 in
groups of 128, and dequantize it.

Target (issue 13): ``show``, ``decode``, ``values`` and ``formats`` under 0.5 s cold.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from _timing import child_env, compile_sources

SRC = Path(__file__).resolve().parents[1] / "src"

_CLI = """\
import atexit, sys
atexit.register(lambda: sys.stderr.write(f"\\n@@numba={'numba' in sys.modules}\\n"))
from lowbit.cli import main
sys.exit(main(sys.argv[1:]))
"""

_API = """\
import atexit, sys
atexit.register(lambda: sys.stderr.write(f"\\n@@numba={'numba' in sys.modules}\\n"))
import numpy as np, lowbit
rows = int(sys.argv[1])
x = np.random.default_rng(0).standard_normal((rows, 1024 if rows > 64 else 128), np.float32)
lowbit.quantize(x, "int4", group_size=128).dequantize()
"""

TARGET = 0.5  # seconds, cold, for the commands below
TARGETED = ("show", "decode", "values", "formats")


def _cases(tmp: Path, quick: bool) -> list[tuple[str, list[str]]]:
    npy = tmp / "w.npy"
    np.save(npy, np.random.default_rng(0).standard_normal((256, 512)).astype(np.float32))
    cli = [
        ("lowbit show 0.3952", ["show", "0.3952"]),
        ("lowbit decode e4m3 0x7e", ["decode", "e4m3", "0x7e"]),
        ("lowbit values fp4", ["values", "fp4"]),
        ("lowbit formats", ["formats"]),
        ("lowbit hardware", ["hardware"]),
        ("lowbit overflow-demo", ["overflow-demo"]),
        ("lowbit plan --params 7B", ["plan", "--params", "7B"]),
        ("lowbit quantize-tensor w.npy --to int4 --group 128", [
            "quantize-tensor", str(npy), "--to", "int4", "--group", "128"]),
        ("lowbit compare --group 64 (262,144 values)", ["compare", "--group", "64"]),
        ("lowbit quantize smollm2 --to int4 --group 128 --dry-run", [
            "quantize", "smollm2", "--to", "int4", "--group", "128", "--dry-run"]),
        ("lowbit --help", ["--help"]),
    ]  # fmt: skip
    if quick:
        cli = cli[:4]
    return [(name, ["-c", _CLI, *argv]) for name, argv in cli] + [
        ("lowbit.quantize 64x128 int4 g128", ["-c", _API, "64"]),
        ("lowbit.quantize 1024x1024 int4 g128", ["-c", _API, "1024"]),
        ("lowbit.quantize 65536x1024 int4 g128", ["-c", _API, "65536"]),
        ("python -c 'import lowbit'", ["-c", "import lowbit"]),
        ("python -c 'import lowbit.cli'", ["-c", "import lowbit.cli"]),
        ("python -c 'import numpy' (the floor)", ["-c", "import numpy"]),
    ]


def _once(args: list[str], env: dict[str, str]) -> tuple[float, float, bool | None]:
    """(wall s, CPU s, numba imported) of one child process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, *args], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        text=True, check=False,
    )  # fmt: skip
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode not in (0,):
        raise RuntimeError(f"{args[2:]} exited {proc.returncode}: {proc.stderr[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    numba = None
    if "@@numba=" in proc.stderr:
        numba = proc.stderr.rsplit("@@numba=", 1)[1].strip().startswith("True")
    return wall, cpu, numba


def run(quick: bool = False) -> str:
    rows = []
    load0 = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        base = child_env(SRC)
        compile_sources(SRC, base)
        for name, args in _cases(tmp, quick):
            cache = tmp / f"numba-{len(rows)}"
            cache.mkdir()
            env = dict(base, NUMBA_CACHE_DIR=str(cache))
            cold = _once(args, env)
            warm = _once(args, env)
            rows.append((name, cold, warm))
    load1 = os.getloadavg()
    lines = [
        "## Cold start: first call in a fresh process",
        "",
        f"Load average {load0[0]:.2f} before, {load1[0]:.2f} after (1-minute); one thread "
        "(OMP_NUM_THREADS=1). Cold: an empty numba cache; warm: the second process, the cache "
        "filled. Wall and CPU seconds of the child process.",
        "",
        "| case | cold wall s | cold CPU s | warm wall s | warm CPU s | numba | target |",
        "|---|---:|---:|---:|---:|---|---|",
    ]
    for name, cold, warm in rows:
        command = name.split()[1] if name.startswith("lowbit ") else ""
        target = ""
        if command in TARGETED:
            ok = cold[1] < TARGET  # CPU: wall on a shared machine counts others' work
            target = f"< {TARGET} s: {'met' if ok else 'MISSED'} (CPU)"
        numba = {None: "?", True: "loaded", False: "no"}[cold[2]]
        lines.append(
            f"| {name} | {cold[0]:.2f} | {cold[1]:.2f} | {warm[0]:.2f} | {warm[1]:.2f} "
            f"| {numba} | {target} |"
        )
    lines += [
        "",
        "Arrays below `MIN_KERNEL_SIZE` (65,536 values) take the numpy path, bit for bit the "
        "kernels' results, so a scalar, a value table or a small tensor never imports numba; "
        "larger ones take it too until the process has sent `KERNEL_WORTH` (2^26, 67 M) "
        "values down it, the ski-rental rule of `lowbit.codecs._numba` (a one-off job of "
        "fewer values finishes sooner without numba's start), and the kernels from then on. "
        "The CLI imports only the module of the command it runs. The 65536x1024 case shows "
        "what loading the compiled kernels costs (numba's import plus compiling, cold, or "
        "loading from the cache, warm).",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    print(run(quick="--quick" in sys.argv))
