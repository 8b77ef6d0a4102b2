"""GPTQ of a big folder, killed with SIGKILL at random moments and started again with the
same command each time: wall time, every process's peak RSS and CPU seconds, the output's
SHA-256, and whether it equals a reference output (an uninterrupted run's). Issue 39's
"killed at three random moments and resumed, byte-identical output" at real sizes
(docs/scale.md, "Resuming a stopped run"). Never part of ``make test``: hours at 8B.

    python benchmarks/big_gptq_resume.py SRC OUT --kills 3 --expect 5400 --seed 39 \\
        [--reference REF_FILE] [--json RESULT.json] -- --to q4_k_m --out-format gguf \\
        --method gptq --calib-samples 4 --calib-len 512

The arguments after ``--`` go to ``lowbit quantize SRC --out OUT``. Process *i* (the first
run, then each restart) is killed at a moment drawn from ``--seed`` uniformly over 5-95 % of
``--expect`` seconds after it starts (a moment past its end kills nothing); the restart after
the last kill runs to the end. Drawn per process, a kill can land after a block's record was
kept, so the restarts resume from blocks, not only start over. Each process's stderr goes to
``OUT.logN``; the last lines of each are kept in the result.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _machine import cpu
from lowbit.calibration._resume import resume_folder


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 24), b""):
            h.update(chunk)
    return h.hexdigest()


def _tree(root: int) -> list[int]:
    """``root`` and its live descendants (``script`` starts the job in a session of its own,
    so a process group would miss it)."""
    parent = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent[int(stat.parent.name)] = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo += [c for c, p in parent.items() if p == pid]
    return tree


def _sample(pids: list[int], seen: dict[int, tuple[float, float, float]]) -> None:
    """Each process's peak RSS (VmHWM, GB), CPU seconds so far and the largest anonymous RSS
    sampled (RssAnon, GB: RSS without the pages of memory-mapped files, which the source's
    safetensors are), into ``seen``."""
    tick = os.sysconf("SC_CLK_TCK")
    for pid in pids:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        kb = {ln.split(":")[0]: ln.split()[1] for ln in status.splitlines() if "kB" in ln}
        # the largest of each seen (an exiting process's status has no memory lines left)
        old = seen.get(pid, (0.0, 0.0, 0.0))
        hwm = max(int(kb.get("VmHWM", 0)) * 1024 / 1e9, old[0])
        cpu = max((int(fields[11]) + int(fields[12])) / tick, old[1])
        seen[pid] = (hwm, cpu, max(int(kb.get("RssAnon", 0)) * 1024 / 1e9, old[2]))


def _run(cmd: list[str], log: Path, kill_after: float | None) -> dict:
    """One run of the job under a terminal (``script``: lowbit shows its progress bars, whose
    last lines the log keeps), it and its descendants sent SIGKILL after ``kill_after``
    seconds (None: never). Peak RSS and CPU seconds are sampled from /proc every 0.2 s, so a
    killed process counts too."""
    t0 = time.monotonic()
    # a terminal of 0 columns (script's, without one of its own) would hide tqdm's bars
    line = "stty cols 160 rows 50; exec " + " ".join(shlex.quote(c) for c in cmd)
    proc = subprocess.Popen(
        ["script", "-qfec", line, str(log)],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
    )  # fmt: skip
    seen: dict[int, tuple[float, float, float]] = {}
    killed = False
    while proc.poll() is None:
        tree = _tree(proc.pid)
        _sample(tree, seen)
        if kill_after is not None and time.monotonic() - t0 >= kill_after:
            for pid in reversed(tree):  # the job first, then ``script``
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            killed = True
            proc.wait()
            break
        time.sleep(0.2)
    tail = log.read_bytes()[-2000:].decode("utf-8", "replace").replace("\r", "\n")
    return {
        "wall_s": round(time.monotonic() - t0, 1),
        "cpu_s": round(sum(c for _, c, _ in seen.values()), 1),
        "peak_rss_gb": round(max((r for r, _, _ in seen.values()), default=0.0), 2),
        "peak_anon_gb": round(max((a for _, _, a in seen.values()), default=0.0), 2),
        "killed": killed,
        "returncode": None if killed else proc.returncode,
        "log": str(log),
        "tail": [ln for ln in tail.splitlines() if ln.strip()][-3:],
    }


def main() -> None:
    argv = sys.argv[1:]
    extra: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1 :]
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("src")
    ap.add_argument("out")
    ap.add_argument("--kills", type=int, default=3)
    ap.add_argument("--expect", type=float, required=True, help="expected running seconds")
    ap.add_argument("--seed", type=int, default=39)
    ap.add_argument("--reference", help="an uninterrupted run's output to compare bytes with")
    ap.add_argument("--json", help="write the result here too")
    args = ap.parse_args(argv)
    out = Path(args.out)
    lowbit = str(Path(sys.executable).with_name("lowbit"))
    cmd = [lowbit, "quantize", args.src, "--out", str(out), *extra]
    rng = random.Random(args.seed)
    moments = [rng.uniform(0.05, 0.95) * args.expect for _ in range(args.kills)]
    print(f"kill moments (s after each start): {[round(m) for m in moments]}", flush=True)
    runs: list[dict] = []
    t0 = time.monotonic()
    while True:
        kill_after = moments[len(runs)] if len(runs) < len(moments) else None
        run = _run(cmd, Path(f"{out}.log{len(runs)}"), kill_after)
        runs.append(run)
        print(json.dumps({k: run[k] for k in run if k != "log"}), flush=True)
        record = resume_folder(out)
        if not run["killed"] or (out.exists() and not record.exists()):
            break  # done (a kill that came after the output was whole ends the job too)
    res: dict = {
        "command": cmd,
        "machine": cpu(),
        "kill_moments_s": [round(m, 1) for m in moments],
        "processes": runs,
        "wall_s": round(time.monotonic() - t0, 1),
        "cpu_s": round(sum(r["cpu_s"] for r in runs), 1),
        "peak_rss_gb": max(r["peak_rss_gb"] for r in runs),
        "peak_anon_gb": max(r["peak_anon_gb"] for r in runs),
        "returncode": runs[-1]["returncode"],
    }
    if out.exists() and out.is_file():
        res["output_bytes"] = out.stat().st_size
        res["output_sha256"] = _sha256(out)
        if args.reference:
            res["reference_sha256"] = _sha256(Path(args.reference))
            res["identical"] = res["reference_sha256"] == res["output_sha256"]
    leftovers = sorted(p.name for p in out.parent.iterdir() if p.name.startswith(f".{out.name}"))
    res["left_beside_output"] = leftovers
    print(json.dumps(res, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
