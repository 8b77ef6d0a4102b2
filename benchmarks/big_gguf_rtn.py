"""Round to nearest at real sizes (issue 39's first target), from a Hugging Face folder in
bfloat16 (benchmarks/make_big_checkpoints.py writes Llama-3.1-8B's and a 7B-class
mixture's):

1. **Q4_K_M GGUF**: ``lowbit quantize FOLDER --to q4_k_m --out-format gguf`` against llama.cpp's
   two steps, ``convert_hf_to_gguf.py FOLDER --outtype bf16`` then ``llama-quantize BF16.gguf
   OUT.gguf Q4_K_M`` (the bf16 file removed after), alternated in one run. Target: lowbit's wall
   time <= 1.0x llama.cpp's, peak RSS <= 2 GB, no file beyond the output.
2. **int4 g128 (lowbit format) and NVFP4 (compressed-tensors)**: ``lowbit quantize FOLDER --to
   int4 --group 128`` and ``--to nvfp4 --out-format compressed-tensors`` against the I/O floor:
   reading every source shard and writing as many bytes as the output holds, in 16 MiB
   pieces, in this process (no ``fsync``, as lowbit does none). Target: <= 1.5x the floor.

Every command is a child process: its wall time, its CPU seconds (user + system, from
``os.wait4``: what the machine's other work moves least), its peak RSS (``ru_maxrss`` of
``os.wait4``: resident memory, including pages of memory-mapped files that are resident;
llama.cpp's two steps each) and the peak bytes in its scratch folder (polled every 10 ms by
bench_hf_direct's ``_measured``) beyond its final output. Each output's tensors
are compared: the two Q4_K_M files tensor by tensor (type and SHA-256 of the bytes). Outputs
are removed after each run, so the disk needed is the source plus the largest run's peak
(at 8B: the 16 GB bf16 GGUF and the 4.9 GB Q4_K_M of llama.cpp's route).

The source is read once before the runs (not timed; printed as the first read), so that the
first run does not pay alone for a cold page cache; with ``--repeat`` above 1 the order of
each part's runs alternates and the best time of each is kept.

usage: python benchmarks/big_gguf_rtn.py FOLDER [--work DIR] [--llamacpp DIR]
       [--parts gguf,int4,nvfp4] [--repeat 1] [--json]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from _machine import cpu
from _timing import compile_sources
from bench_hf_direct import _disk, _measured

SRC = Path(__file__).resolve().parents[1] / "src"
LLAMACPP = Path("/work/llamacpp/llama_cpp_python-0.3.36/vendor/llama.cpp")
PIECE = 16 << 20  # bytes per read / write of the I/O floor


def _source_files(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.safetensors"))


def read_source(folder: Path) -> int:
    """Read every safetensors shard once (the warm-up); the bytes read."""
    buf = bytearray(PIECE)
    total = 0
    for p in _source_files(folder):
        with open(p, "rb", buffering=0) as f:
            while n := f.readinto(buf):
                total += n
    return total


def io_floor(folder: Path, out: Path, nbytes: int) -> None:
    """Read every source shard and write ``nbytes`` of what was read to ``out``, interleaved
    as a streaming converter does (each piece written once the bytes it stands for are read)."""
    src = sum(p.stat().st_size for p in _source_files(folder))
    buf = bytearray(PIECE)
    done = written = 0
    with open(out, "wb", buffering=0) as dst:
        for p in _source_files(folder):
            with open(p, "rb", buffering=0) as f:
                while n := f.readinto(buf):
                    done += n
                    due = nbytes * done // src - written
                    while due > 0:
                        k = min(due, n)
                        dst.write(memoryview(buf)[:k])
                        written, due = written + k, due - k
        while written < nbytes:  # (rounding) the last bytes
            k = min(nbytes - written, PIECE)
            dst.write(memoryview(buf)[:k])
            written += k


#: one step's wall seconds, peak RSS in bytes (None: not measured) and CPU seconds
Step = tuple[float, int | None, float]


def _child(cmd: list[str], env: dict[str, str], log: Path) -> Step:
    """Run ``cmd``; its (seconds, peak RSS in bytes, CPU seconds). A failure ends the benchmark
    with the end of its log."""
    t0 = time.perf_counter()
    with open(log, "wb") as f:
        proc = subprocess.Popen(cmd, env=env, stdout=f, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        tail = log.read_text(errors="replace").splitlines()[-15:]
        raise SystemExit(f"{cmd[0]} {' '.join(cmd[1:4])} ... failed:\n" + "\n".join(tail))
    return seconds, usage.ru_maxrss * 1024, usage.ru_utime + usage.ru_stime  # KiB on Linux


def run(label: str, scratch: Path, steps: list[Callable[[], Step]],
        output: Path, cleanup: list[Path]) -> dict[str, Any]:  # fmt: skip
    """Time ``steps`` (each returns its :data:`Step`) with ``scratch``'s disk polled; remove
    ``cleanup`` (intermediates) after, and measure ``output``."""
    parts: list[Step] = []

    def go() -> None:
        for step in steps:
            parts.append(step())

    seconds, peak = _measured(scratch, go)
    for p in cleanup:
        p.unlink(missing_ok=True)
    out_bytes = _disk(output) if output.is_dir() else output.stat().st_size
    rss = [r for _, r, _ in parts if r is not None]
    return {"run": label, "seconds": round(seconds, 2),
            "step_seconds": [round(s, 2) for s, _, _ in parts],
            "cpu_seconds": round(sum(c for _, _, c in parts), 2),
            "peak_rss": max(rss) if rss else None, "step_peak_rss": [r for _, r, _ in parts],
            "output_bytes": out_bytes, "peak_disk": peak, "extra_disk": peak - out_bytes}  # fmt: skip


def tensor_digests(path: Path) -> dict[str, tuple[str, str]]:
    """Every tensor of a GGUF: (type, SHA-256 of its bytes)."""
    from gguf import GGUFReader

    out = {}
    for t in GGUFReader(str(path)).tensors:
        h = hashlib.sha256(memoryview(t.data.reshape(-1).view("u1")))
        out[t.name] = (t.tensor_type.name, h.hexdigest())
    return out


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def _best(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The run with the least wall time, with the largest peaks over all runs of it."""
    best = dict(min(rows, key=lambda r: r["seconds"]))
    for key in ("peak_rss", "peak_disk", "extra_disk"):
        values = [r[key] for r in rows if r[key] is not None]
        best[key] = max(values) if values else None
    best["all_seconds"] = [r["seconds"] for r in rows]
    return best


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("folder", type=Path, help="Hugging Face folder (bf16 safetensors)")
    ap.add_argument("--work", type=Path, default=Path("out/big-gguf-rtn"),
                    help="scratch folder for the outputs (emptied per run)")  # fmt: skip
    ap.add_argument("--llamacpp", type=Path, default=LLAMACPP,
                    help="llama.cpp source tree (convert_hf_to_gguf.py, gguf-py)")  # fmt: skip
    ap.add_argument("--convert", type=Path, help="convert_hf_to_gguf.py (default: in --llamacpp)")
    ap.add_argument("--llama-quantize", type=Path,
                    help="llama-quantize (default: --llamacpp/build/bin/llama-quantize)")  # fmt: skip
    ap.add_argument("--python", default=sys.executable, help="Python for the converter")
    ap.add_argument("--parts", default="gguf,int4,nvfp4", help="which parts, comma-separated")
    ap.add_argument("--repeat", type=int, default=1, help="runs of each (alternated); best kept")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    if a.repeat < 1:
        ap.error("--repeat must be at least 1")
    parts = [p.strip() for p in a.parts.split(",") if p.strip()]
    if unknown := set(parts) - {"gguf", "int4", "nvfp4"}:
        ap.error(f"unknown --parts {sorted(unknown)}; choose from gguf, int4, nvfp4")
    if not (a.folder / "config.json").is_file() or not _source_files(a.folder):
        ap.error(f"{a.folder}: not a Hugging Face folder with safetensors")
    convert = a.convert or a.llamacpp / "convert_hf_to_gguf.py"
    quantize = a.llama_quantize or a.llamacpp / "build" / "bin" / "llama-quantize"
    if "gguf" in parts and not (convert.is_file() and quantize.is_file()):
        ap.error(f"llama.cpp's tools not found: {convert}, {quantize}")
    work = a.work.resolve()
    logs = work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    threads = str(len(os.sched_getaffinity(0)))

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SRC), env.get("PYTHONPATH", "")) if p)
    compile_sources(SRC, env)  # bytecode written once, as pip install does
    conv_env = dict(os.environ)
    if (a.llamacpp / "gguf-py").is_dir():  # the gguf package that goes with the converter
        conv_env["PYTHONPATH"] = str(a.llamacpp / "gguf-py")
    lowbit = [sys.executable, "-m", "lowbit.cli", "quantize", str(a.folder), "--no-progress"]

    t0 = time.perf_counter()
    src_bytes = read_source(a.folder)
    first_read = time.perf_counter() - t0
    result: dict[str, Any] = {
        "cpu": cpu(), "folder": str(a.folder), "source_bytes": src_bytes,
        "first_read_s": round(first_read, 2), "repeat": a.repeat, "threads": int(threads),
    }  # fmt: skip

    def scratch(name: str) -> Path:
        d = work / name
        _remove(d)
        d.mkdir()
        return d

    def lowbit_gguf() -> dict[str, Any]:
        d = scratch("lowbit-gguf")
        out = d / "model.Q4_K_M.gguf"
        cmd = [*lowbit, "--to", "q4_k_m", "--out-format", "gguf", "--out", str(out)]
        row = run("lowbit", d, [lambda: _child(cmd, env, logs / "lowbit-gguf.log")], out, [])
        row["tensors"] = tensor_digests(out)
        _remove(d)
        return row

    def llamacpp_gguf() -> dict[str, Any]:
        d = scratch("llamacpp-gguf")
        bf16, out = d / "model.bf16.gguf", d / "model.Q4_K_M.gguf"
        conv = [a.python, str(convert), str(a.folder), "--outtype", "bf16", "--outfile", str(bf16)]
        quant = [str(quantize), str(bf16), str(out), "Q4_K_M", threads]
        row = run("llama.cpp", d, [lambda: _child(conv, conv_env, logs / "convert.log"),
                                   lambda: _child(quant, env, logs / "llama-quantize.log")],
                  out, [bf16])  # fmt: skip
        row["tensors"] = tensor_digests(out)
        _remove(d)
        return row

    def lowbit_to(name: str, args: list[str]) -> Callable[[], dict[str, Any]]:
        def go() -> dict[str, Any]:
            d = scratch(f"lowbit-{name}")
            out = d / "out"
            cmd = [*lowbit, *args, "--out", str(out)]
            row = run("lowbit", d, [lambda: _child(cmd, env, logs / f"lowbit-{name}.log")], out, [])
            sizes[name] = row["output_bytes"]
            _remove(d)
            return row

        return go

    def floor(name: str) -> Callable[[], dict[str, Any]]:
        def go() -> dict[str, Any]:
            d = scratch(f"floor-{name}")
            out = d / "out.bin"

            def step() -> Step:
                t, c = time.perf_counter(), time.thread_time()
                io_floor(a.folder, out, sizes[name])
                # in this process: its RSS not measured, its CPU this thread's
                return time.perf_counter() - t, None, time.thread_time() - c

            row = run("read + write", d, [step], out, [])
            _remove(d)
            return row

        return go

    sizes: dict[str, int] = {}
    plans: dict[str, list[Callable[[], dict[str, Any]]]] = {
        "gguf": [lowbit_gguf, llamacpp_gguf],
        "int4": [lowbit_to("int4", ["--to", "int4", "--group", "128"]), floor("int4")],
        "nvfp4": [lowbit_to("nvfp4", ["--to", "nvfp4", "--out-format", "compressed-tensors"]),
                  floor("nvfp4")],
    }  # fmt: skip
    for part in parts:
        ours: list[dict[str, Any]] = []
        theirs: list[dict[str, Any]] = []
        mine_run, base_run = plans[part]
        for i in range(a.repeat):  # lowbit first on even runs (the floor needs its size)
            if i % 2:
                theirs.append(base_run())
                ours.append(mine_run())
            else:
                ours.append(mine_run())
                theirs.append(base_run())
        mine, base = _best(ours), _best(theirs)
        # a tiny folder's floor can round to 0 s: no ratio then, rather than a division by zero
        ratio = round(mine["seconds"] / base["seconds"], 3) if base["seconds"] > 0 else None
        entry: dict[str, Any] = {"lowbit": mine, "baseline": base, "ratio": ratio}
        if part == "gguf":
            ta, tb = mine.pop("tensors"), base.pop("tensors")
            for r in (*ours, *theirs):
                r.pop("tensors", None)
            entry["same_tensors"] = sum(ta[k] == tb.get(k) for k in ta)
            entry["tensors"] = len(tb)
        result[part] = entry
    if a.json:
        print(json.dumps(result, indent=1))
        return 0
    _print(result, parts)
    return 0


_TITLES = {
    "gguf": ("Q4_K_M GGUF", "convert_hf_to_gguf.py --outtype bf16 + llama-quantize Q4_K_M"),
    "int4": ("int4 g128, lowbit format", "read the source + write the output's bytes"),
    "nvfp4": ("NVFP4, compressed-tensors", "read the source + write the output's bytes"),
}


def _print(r: dict[str, Any], parts: list[str]) -> None:
    gb = 1e9
    print(f"CPU: {r['cpu']}")
    print(f"source: {r['folder']}, {r['source_bytes'] / gb:.2f} GB of safetensors "
          f"(first read {r['first_read_s']:.1f} s); best of {r['repeat']} alternated run(s)")  # fmt: skip
    for part in parts:
        e = r[part]
        title, base = _TITLES[part]
        print(f"\n{title}: lowbit against {base}")
        print(f"  {'':14}{'wall s':>9}{'steps s':>16}{'CPU s':>9}{'peak RSS GB':>16}"
              f"{'output GB':>11}{'extra disk GB':>15}")  # fmt: skip
        for label, row in (("lowbit", e["lowbit"]), (e["baseline"]["run"], e["baseline"])):
            steps = " + ".join(f"{s:.1f}" for s in row["step_seconds"])
            rss = " / ".join(f"{r / gb:.2f}" for r in row["step_peak_rss"] if r is not None)
            print(f"  {label:14}{row['seconds']:9.1f}{steps:>16}{row['cpu_seconds']:9.1f}"
                  f"{rss or '-':>16}{row['output_bytes'] / gb:11.3f}"
                  f"{row['extra_disk'] / gb:15.3f}")  # fmt: skip
        ratio = "-" if e["ratio"] is None else f"{e['ratio']:.2f}"
        line = f"  ratio lowbit / baseline: {ratio}"
        if part == "gguf":
            line += f"; tensors with the same type and bytes: {e['same_tensors']} of {e['tensors']}"
        print(line)


if __name__ == "__main__":
    raise SystemExit(main())
