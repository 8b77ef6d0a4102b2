"""One Llama-3.1-8B decoder block through lowbit's GPTQ, timed against its arithmetic floor.

Builds a one-block ``LlamaForCausalLM`` at Llama-3.1-8B's widths (hidden 4,096, MLP 14,336, 32
query and 8 key/value heads, llama3 rope; a 1,024-token vocabulary, since only the block is
timed), captures the block's inputs for ``--samples`` x ``--length`` random tokens as
``lowbit.calibration.gptq`` does, then runs the walk that run uses
(``lowbit.calibration._layer_walk.LayerWalk``: collect each group's Hessian with forward hooks,
GPTQ the group, propagate) with the same solve (``GPTQ.quantize_shared``).

It prints, per part, the floating-point operations, the floor (operations over the machine's
matrix-multiply rate measured in the same run: torch float32 for the forward passes and
``X^T X``, numpy float64 for GPTQ's factorisation and updates, on the threads each part
uses), the measured wall and CPU seconds and their ratio to the floor, and the peak resident
memory. Counting (multiply-add = 2 operations, per token ``t``):

- forward: the walk runs the block once, plus o_proj and down_proj once more (the residual
  adds the quantized last layer's output from its stashed input): ``2 (P + P_o + P_down) t``
  with ``P`` the block's 218.1 M linear weights, plus attention's ``2 L d`` per token;
- Hessians: ``X^T X`` of the four distinct inputs (4,096 x 3 and 14,336), upper block
  triangle only (10 of 16 blocks): ``0.625 x 2 in^2 t``;
- factor: per distinct input one Cholesky and one triangular inverse, ``2 in^3 / 3``;
- updates: GPTQ's column loop, ``rows x in^2`` per layer (q/k/v and gate/up stacked).

Memory: the measured peak RSS (``ru_maxrss``, in 10^9 bytes and GiB), and the peak by
arithmetic (:func:`memory_phases`: the walk's large buffers at its three highest points, on
the RSS measured before the walk) for this run's samples and for 64, which a 64-sample run
(hours on two cores) would measure.

Usage: ``python benchmarks/gptq_block_floor.py [--samples 8] [--length 512] [--threads N]
[--solve-threads N] [--scheme int4:g128] [--hidden 4096 --inter 14336 --heads 32 --kv 8]
[--json FILE]``. ``--samples 64`` is the 32,768 tokens of the 8B targets.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))


def _rates(threads: int, solve_threads: int) -> dict[str, float]:
    """The best of three products, FLOP/s: torch float32 on ``threads``, numpy float64 on
    ``solve_threads`` (what GPTQ's solve gets)."""
    import torch

    from lowbit.models._threads import _numpy_blas_threads

    n = 4096
    a = torch.randn(n, n)
    b = torch.randn(n, n)
    x = np.random.default_rng(0).standard_normal((n, n))
    out = {}
    for key, fn in (("torch_f32", lambda: torch.mm(a, b)), ("numpy_f64", lambda: x @ x)):
        best, best_cpu = float("inf"), float("inf")
        with _numpy_blas_threads(solve_threads):
            for _ in range(3):
                t0, c0 = time.perf_counter(), time.process_time()
                fn()
                best = min(best, time.perf_counter() - t0)
                best_cpu = min(best_cpu, time.process_time() - c0)
        out[key] = 2 * n**3 / best
        out[key + "_per_cpu_s"] = 2 * n**3 / best_cpu  # a rate the machine's load leaves alone
    return out


@contextmanager
def _timed(store: dict[str, list[float]], key: str) -> Any:
    t0, c0 = time.perf_counter(), time.process_time()
    try:
        yield
    finally:
        got = store.setdefault(key, [0.0, 0.0])
        got[0] += time.perf_counter() - t0
        got[1] += time.process_time() - c0


def _model(args: argparse.Namespace) -> Any:
    import torch
    import transformers

    cfg = transformers.LlamaConfig(
        vocab_size=1024, hidden_size=args.hidden, intermediate_size=args.inter,
        num_hidden_layers=1, num_attention_heads=args.heads, num_key_value_heads=args.kv,
        max_position_embeddings=131072, rms_norm_eps=1e-5, rope_theta=500000.0,
        rope_scaling={"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                      "original_max_position_embeddings": 8192, "rope_type": "llama3"},
        tie_word_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(0)
    with torch.device("meta"):
        net = transformers.LlamaForCausalLM(cfg)
    net = net.to_empty(device="cpu").eval()
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in net.named_parameters():
            if "norm" in name:
                p.fill_(1.0)
            else:  # trained-like spread: row scales and a few outlier input channels
                p.normal_(0.0, 0.02, generator=gen)
                if p.ndim == 2:
                    p.mul_(torch.exp(0.3 * torch.randn(p.shape[0], 1, generator=gen)))
    return net


def flops(args: argparse.Namespace, tokens: int) -> dict[str, float]:
    d, f = args.hidden, args.inter
    hd = d // args.heads
    kv = args.kv * hd
    qkv, o, gu, down = d * (d + 2 * kv), d * d, 2 * d * f, d * f
    weights = qkv + o + gu + down
    attn = 2 * args.length * d  # QK^T and AV, causal: half of 2 x 2 L d
    return {
        "plain": 2.0 * weights * tokens + attn * tokens,
        "forward": 2.0 * (weights + o + down) * tokens + attn * tokens,
        "hessian": 0.625 * 2.0 * (3 * d * d + f * f) * tokens,
        "factor": (2.0 / 3.0) * (3 * d**3 + f**3),
        "updates": float((d + 2 * kv) * d * d + d * d * d + 2 * f * d * d + d * f * f),
    }


def _rss_now() -> int:
    """The process's resident bytes now (Linux ``/proc/self/statm``; 0 elsewhere)."""
    import os

    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return 0
    return pages * os.sysconf("SC_PAGE_SIZE")


def memory_phases(args: argparse.Namespace, samples: int) -> dict[str, float]:
    """Bytes of the large buffers the walk holds at each of its three highest points, by
    arithmetic on what the code keeps (beyond the block's weights and torch, measured):

    - down_proj's collection: the block's inputs (``N L d`` float32), down_proj's stashed
      inputs (``N L f``), its float32 window sum (``f^2``) and float64 total (``f^2``), one
      sample's MLP temporaries (about ``4 L f``);
    - down_proj's solve: the inputs, the stash unless parked (``_Stash.PARK_BYTES``), ``H``
      and the factor (one more ``f^2`` float64 from ``_BLOCKED_FROM`` inputs, three before),
      the weight's float64 copies (the caller's, GPTQ's, the transposed one the loop walks)
      and the loop's update temporary (one chunk of ``_UPDATE_VALUES``);
    - gate/up's solve: the inputs, o_proj's stash (``N L d``), ``H`` and its factor
      (``d^2``), four float64 copies of the stacked ``2 f x d`` weights, the update chunk.

    Not counted: the allocator's slack and smaller temporaries (the 4-sample run measured
    0.3 GB above this sum).
    """
    from lowbit.calibration._layer_walk import _Stash
    from lowbit.methods._hessian_factor import _BLOCKED_FROM
    from lowbit.methods.gptq import _UPDATE_VALUES

    d, f, L = args.hidden, args.inter, args.length
    act = samples * L * d * 4
    stash = samples * L * f * 4
    held = 0 if stash > _Stash.PARK_BYTES else stash
    factor = 1 if f >= _BLOCKED_FROM else 3
    chunk = _UPDATE_VALUES * 8
    return {
        "down_proj collect": act + stash + f * f * 12 + 4 * L * f * 4,
        "down_proj solve": act + held + (1 + factor) * f * f * 8 + 3 * d * f * 8 + chunk,
        "gate/up solve": act + samples * L * d * 4 + 2 * d * d * 8 + 4 * 2 * f * d * 8 + chunk,
    }


def memory_estimates(args: argparse.Namespace, rss_before_walk: int) -> dict[str, Any]:
    """The peak by :func:`memory_phases` for this run's samples and for 64 (the 8B targets'
    64 x 512 tokens): the RSS before the walk less its inputs, plus the highest phase."""
    base = rss_before_walk - args.samples * args.length * args.hidden * 4
    out: dict[str, Any] = {"base_gb": base / 1e9}
    for n in sorted({args.samples, 64}):
        phases = memory_phases(args, n)
        out[str(n)] = {
            "phases_gb": {k: v / 1e9 for k, v in phases.items()},
            "peak_gb": (base + max(phases.values())) / 1e9,
        }
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from lowbit.calibration._layer_walk import LayerWalk
    from lowbit.calibration.blocks import _capture, _set_weight
    from lowbit.calibration.hessians import HessianCollector
    from lowbit.methods import gptq as gptq_mod
    from lowbit.methods.gptq import GPTQ
    from lowbit.models._threads import _numpy_blas_threads, _threads

    threads = args.threads or torch.get_num_threads()
    solve_threads = args.solve_threads or 1
    times: dict[str, list[float]] = {}
    with _threads(threads):
        rates = _rates(threads, solve_threads)
        t0 = time.perf_counter()
        net = _model(args)
        build_s = time.perf_counter() - t0
        gen = torch.Generator().manual_seed(1)
        samples = [({"input_ids": torch.randint(0, 1024, (1, args.length), generator=gen)}, None)
                   for _ in range(args.samples)]  # fmt: skip
        block = net.model.layers[0]
        method = GPTQ()
        scheme = args.scheme
        with torch.inference_mode(), _numpy_blas_threads(1):
            states = _capture(net, block, samples, causal=True)
            with _timed(times, "plain forward (reference)"):
                for h, a, k in states:
                    block(h, *a, **k)
            rss_before_walk = _rss_now()  # torch, the block's weights, its inputs
            linears = {n: m for n, m in block.named_modules() if isinstance(m, torch.nn.Linear)}
            walk = LayerWalk.of(block, states, method)
            assert walk is not None, "the walk could not decompose the block"
            factor = gptq_mod._factor

            def timed_factor(*a: Any, **k: Any) -> Any:
                with _timed(times, "factor"):
                    return factor(*a, **k)

            gptq_mod._factor = timed_factor
            marks = {"solve": 0.0}

            def solve(col: HessianCollector) -> None:
                t = time.perf_counter()
                for group in col.groups().values():
                    with _timed(times, "hessian finish (float64 total, symmetrize)"):
                        H = col.hessian(group[0], release=True)  # as gptq_weights
                    ws = {m: linears[m].weight.double().numpy() for m in group}
                    with _timed(times, "gptq (factor + updates)"), \
                            _numpy_blas_threads(solve_threads):  # fmt: skip
                        qts = method.quantize_shared(ws, H, dict.fromkeys(group, scheme))
                    for m in group:
                        _set_weight(linears[m], qts[m].dequantize(np.float64))
                    del H, ws, qts
                marks["solve"] += time.perf_counter() - t

            try:
                with _timed(times, "walk (all)"):
                    walk.run(block, states, samples, linears, solve, outputs=True)
            finally:
                gptq_mod._factor = factor
    tokens = args.samples * args.length
    fl = flops(args, tokens)
    w_all, c_all = times["walk (all)"]
    w_gptq, c_gptq = times["gptq (factor + updates)"]
    w_fin, c_fin = times["hessian finish (float64 total, symmetrize)"]
    w_fac, c_fac = times["factor"]
    w_fwd, c_fwd = times["plain forward (reference)"]
    collect_w = w_all - w_gptq - w_fin  # hooked forwards + X^T X + propagation
    collect_c = c_all - c_gptq - c_fin
    f32, f64 = rates["torch_f32"], rates["numpy_f64"]
    f32c, f64c = rates["torch_f32_per_cpu_s"], rates["numpy_f64_per_cpu_s"]
    parts = [
        ("forward (plain pass, x1 of the walk's)", fl["plain"], f32, f32c, w_fwd, c_fwd),
        ("forward + Hessians + propagation", fl["forward"] + fl["hessian"], f32, f32c,
         collect_w, collect_c),
        ("Hessian finish (float64, symmetric)", 0.0, f64, f64c, w_fin, c_fin),
        ("GPTQ factor (Cholesky + inverse)", fl["factor"], f64, f64c, w_fac, c_fac),
        ("GPTQ updates (column loop)", fl["updates"], f64, f64c, w_gptq - w_fac, c_gptq - c_fac),
    ]  # fmt: skip
    cpu_floor = (fl["forward"] + fl["hessian"]) / f32c + (fl["factor"] + fl["updates"]) / f64c
    total_floor = (fl["forward"] + fl["hessian"]) / f32 + (fl["factor"] + fl["updates"]) / f64
    return {
        "widths": {"hidden": args.hidden, "inter": args.inter, "heads": args.heads,
                   "kv": args.kv},
        "tokens": tokens, "samples": args.samples, "length": args.length,
        "threads": threads, "solve_threads": solve_threads, "scheme": scheme,
        "rates_gflops": {k: v / 1e9 for k, v in rates.items()},
        "flops": fl, "build_s": build_s,
        "parts": [{"part": p, "flop": f, "floor_s": f / r if f else 0.0, "wall_s": w, "cpu_s": c,
                   "ratio": (w / (f / r)) if f else None,
                   "cpu_floor_s": f / rc if f else 0.0,
                   "cpu_ratio": (c / (f / rc)) if f else None}
                  for p, f, r, rc, w, c in parts],
        "block_wall_s": w_all, "block_cpu_s": c_all, "block_floor_s": total_floor,
        "block_ratio": w_all / total_floor, "block_cpu_floor_s": cpu_floor,
        "block_cpu_ratio": c_all / cpu_floor,
        "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9,
        "memory": memory_estimates(args, rss_before_walk),
    }  # fmt: skip


def show(res: dict[str, Any]) -> None:
    r = res["rates_gflops"]
    print(f"one Llama block {res['widths']}, {res['samples']} x {res['length']} tokens, "
          f"{res['threads']} torch threads, numpy float64 on {res['solve_threads']}, "
          f"{res['scheme']}")  # fmt: skip
    print(f"matrix rate in this run: torch float32 {r['torch_f32']:.1f} GFLOP/s "
          f"({r['torch_f32_per_cpu_s']:.1f} per CPU second), numpy float64 "
          f"{r['numpy_f64']:.1f} GFLOP/s ({r['numpy_f64_per_cpu_s']:.1f} per CPU second)")  # fmt: skip
    print(f"{'part':42s} {'GFLOP':>7s} {'floor s':>8s} {'wall s':>7s} {'ratio':>6s} "
          f"{'cpu floor':>9s} {'cpu s':>7s} {'ratio':>6s}")  # fmt: skip

    def ratio(x: float | None) -> str:
        return f"{x:6.2f}" if x is not None else "     -"

    for p in res["parts"]:
        print(f"{p['part']:42s} {p['flop'] / 1e9:7.0f} {p['floor_s']:8.1f} {p['wall_s']:7.1f} "
              f"{ratio(p['ratio'])} {p['cpu_floor_s']:9.1f} {p['cpu_s']:7.1f} "
              f"{ratio(p['cpu_ratio'])}")  # fmt: skip
    work = sum(res["flops"].values()) - res["flops"]["plain"]
    print(f"{'block (the walk: all but the plain pass)':42s} {work / 1e9:7.0f} "
          f"{res['block_floor_s']:8.1f} {res['block_wall_s']:7.1f} {ratio(res['block_ratio'])} "
          f"{res['block_cpu_floor_s']:9.1f} {res['block_cpu_s']:7.1f} "
          f"{ratio(res['block_cpu_ratio'])}")  # fmt: skip
    print(f"peak RSS {res['peak_rss_gb']:.2f} GB = {res['peak_rss_gb'] / 1.073741824:.2f} GiB "
          f"(model build {res['build_s']:.1f} s)")  # fmt: skip
    mem = res["memory"]
    print(f"memory by arithmetic (memory_phases), GB: torch + the block's weights "
          f"{mem['base_gb']:.2f} (measured before the walk) plus")  # fmt: skip
    for n, got in mem.items():
        if n == "base_gb":
            continue
        phases = ", ".join(f"{k} {v:.2f}" for k, v in got["phases_gb"].items())
        print(f"  N = {n}: {phases}; peak {got['peak_gb']:.2f} GB")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--length", type=int, default=512)
    ap.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    ap.add_argument("--solve-threads", type=int, help="numpy BLAS threads of the solve "
                    "(default 1, as lowbit's GPTQ run)")  # fmt: skip
    ap.add_argument("--scheme", default="int4:g128")
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--inter", type=int, default=14336)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv", type=int, default=8)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    res = run(args)
    show(res)
    if args.json:
        args.json.write_text(json.dumps(res, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
