"""Evaluation under load: ``lowbit eval``'s measuring loop, on idle cores and on busy ones.

SmolLM2-135M (the shipped GGUF, float32 in torch) and a second copy of it (what a
quantized variant costs to run: its weights are dequantized floats) are compared by
``lowbit.evaluation._compare.compare_causal``, the loop ``lowbit eval`` runs: the
reference's log-probabilities once per window, reused for every variant, under
``torch.inference_mode``. Reported: tokens/s (tokens through a model per second: the
text's tokens times two models, over the loop's wall time), the loop's CPU seconds, and
the threads used, for torch threads 1, every usable core, and the default
(``default_threads``: under PASSIVE, every usable core).

"Loaded": one CPU-bound competing process per usable core (a busy loop, started before
and stopped after), so every core is contended; "idle" is whatever else the machine runs
(its load average is printed: on a shared machine idle is not idle, so run this on a
quiet one for the real figures). Each set of rows runs in a child process, whose
OMP_WAIT_POLICY is fixed before torch loads: PASSIVE, as the ``lowbit`` command sets it,
and once OpenMP's own default for comparison. Target (issue 13): the default's loaded
tokens/s within 3x of its idle tokens/s.
"""

from __future__ import annotations

import copy
import json
import multiprocessing as mp
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from _timing import child_env

SRC = Path(__file__).resolve().parents[1] / "src"
WINDOW = 256


def _burn(stop: Any) -> None:  # pragma: no cover - runs in a child process
    x = 0
    while not stop.is_set():
        for _ in range(100_000):
            x += 1


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _measure(tokens: int, settings: list[tuple[str, int | None]]) -> dict[str, Any]:
    """Run in a child process: every setting idle, then loaded; tokens/s, CPU s, threads."""
    from lowbit.checkpoints.streaming import open_model
    from lowbit.checkpoints.tokenizer import build_tokenizer
    from lowbit.evaluation._compare import Variant, compare_causal
    from lowbit.models.build import build_model

    ckpt = open_model("smollm2")
    tok = build_tokenizer(ckpt)
    ref = build_model(ckpt, progress=False)
    variants = [Variant(name="copy", format="float32", model=copy.deepcopy(ref))]

    def measure(threads: int | None, n: int) -> list[float]:
        c0 = time.process_time()
        measured, _ = compare_causal(
            variants, ref, tok, window=WINDOW, max_tokens=n, threads=threads, progress=False
        )
        cpu = time.process_time() - c0
        out["batch"] = measured["batch"]
        return [2 * measured["tokens"] / measured["seconds"], cpu, measured["threads"]]

    out: dict[str, Any] = {"loads": {}}
    measure(1, WINDOW)  # warm-up: first-call allocations, the tokenizer
    for state in ("idle", "loaded"):
        stop = mp.Event()
        burners = []
        if state == "loaded":
            burners = [mp.Process(target=_burn, args=(stop,), daemon=True) for _ in range(_cores())]
            for b in burners:
                b.start()
            time.sleep(1.0)  # let them take the cores
        try:
            out["loads"][state] = os.getloadavg()[0]
            for label, threads in settings:
                out[f"{state} {label}"] = measure(threads, tokens)
        finally:
            stop.set()
            for b in burners:
                b.join(timeout=10)
    out["loads"]["after"] = os.getloadavg()[0]
    return out


def _child(tokens: int, settings: list[tuple[str, int | None]], policy: str | None) -> Any:
    env = child_env(SRC)
    env.pop("OMP_NUM_THREADS", None)  # torch.set_num_threads decides, as in lowbit eval
    env.pop("OMP_WAIT_POLICY", None)
    if policy:
        env["OMP_WAIT_POLICY"] = policy
    proc = subprocess.run(
        [sys.executable, __file__, "--child", json.dumps([tokens, settings])],
        env=env, capture_output=True, text=True, check=False, cwd=Path(__file__).parent,
    )  # fmt: skip
    if proc.returncode or "@@" not in proc.stdout:
        raise RuntimeError(f"eval child failed: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.rsplit("@@", 1)[1])


def run(quick: bool = False) -> str:
    tokens = 256 if quick else 1024
    cores = _cores()
    settings: list[tuple[str, int | None]] = [
        ("1", 1),
        (f"{cores} (all)", cores),
        ("default", None),
    ]
    if quick:
        settings = settings[-1:]
    passive = _child(tokens, settings, "PASSIVE")  # what the lowbit CLI sets
    spin = _child(tokens, [(f"{cores} (all)", cores)], None)  # OpenMP's own default
    loads = passive["loads"]
    lines = [
        "## Evaluation under load (lowbit eval's loop, SmolLM2-135M, 2 models)",
        "",
        f"{tokens} tokens in windows of {WINDOW}, the reference and one variant; {cores} usable "
        f"cores. Load average (1-minute) at the idle runs {loads['idle']:.2f}, at the loaded "
        f"runs {loads['loaded']:.2f} ({cores} competing busy processes), {loads['after']:.2f} "
        "after. Rows: torch threads, OMP_WAIT_POLICY=PASSIVE (what `lowbit` sets unless the "
        "environment says otherwise) except the last row, OpenMP's own default (threads spin "
        f"at barriers). Windows per forward: {passive['batch']} (lowbit eval's default "
        '`--batch`; batch sizes are compared by hand in "Batched windows in lowbit eval" '
        "below).",
        "",
        "| torch threads | idle tokens/s | idle CPU s | loaded tokens/s | loaded CPU s "
        "| loaded / idle time |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    rows = [(label, passive, "") for label, _ in settings]
    rows.append((f"{cores} (all)", spin, ", OpenMP default wait policy"))
    for label, res, note in rows:
        i_tps, i_cpu, i_thr = res[f"idle {label}"]
        l_tps, l_cpu, l_thr = res[f"loaded {label}"]
        used = f" (used {i_thr:.0f} idle, {l_thr:.0f} loaded)" if label == "default" else ""
        lines.append(
            f"| {label}{used}{note} | {i_tps:,.0f} | {i_cpu:.1f} | {l_tps:,.0f} | {l_cpu:.1f} "
            f"| {i_tps / l_tps:.1f}x |"
        )
    ratio = passive["idle default"][0] / passive["loaded default"][0]
    lines += [
        "",
        f"Target: the default's loaded time within 3x of idle: {ratio:.1f}x, "
        f"{'met' if ratio <= 3 else 'MISSED'}. With every core contended by one busy process "
        "each, a thread's fair share is half a core, so 2x is the floor for any thread count.",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        n, chosen = json.loads(sys.argv[2])
        print("@@" + json.dumps(_measure(n, [tuple(c) for c in chosen])))
    else:
        print(run(quick="--quick" in sys.argv))
