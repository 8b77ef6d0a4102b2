"""Emulated FP8 matmul (lowbit.torch) against torch's native ``torch._scaled_mm`` in E4M3.

NOT YET RUN: the session that wrote it had no GPU. Needs a CUDA device with FP8 tensor
cores (compute capability >= 8.9: Ada, Hopper, Blackwell) and torch >= 2.3. Run:

    .venv/bin/python benchmarks/gpu_scaled_mm.py [--sizes 1024,4096,8192] [--json out.json]

What it measures, for ``A [M, K] @ W[N, K].T`` with A, W ~ N(0, 1) (plus a few outliers):

* agreement: both sides get the same E4M3 inputs (per-tensor power-of-two scales, rounded
  by lowbit's codec-exact ``round_to``); the emulation multiplies them in float32 on the
  GPU, ``_scaled_mm`` in FP8 tensor cores with FP32 accumulation and a BF16 (or FP32)
  output. Reported: max |difference| relative to max |result|, the fraction of outputs
  that are bit-identical once both are rounded to BF16, and that the FP8 inputs lowbit
  produced are bit-identical to ``tensor.to(torch.float8_e4m3fn)`` (the native cast).
* speed: median time of ``_scaled_mm`` and of the emulation (round + float32 matmul),
  each as a ratio to a plain BF16 matmul of the same shape.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys


def _time(fn, reps: int = 20) -> float:
    import torch

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def compare(m: int, k: int, n: int, seed: int = 0) -> dict:
    """One shape: agreement and timings (seconds) of emulated vs native FP8 matmul."""
    import torch

    from lowbit.torch import Quantizer, round_to

    dev = "cuda"
    g = torch.Generator(device=dev).manual_seed(seed)
    a = torch.randn(m, k, device=dev, generator=g)
    w = torch.randn(n, k, device=dev, generator=g)
    a[0, :8] *= 50  # a few activation outliers, as in real models
    qa, qw = Quantizer("e4m3", scaling="pow2"), Quantizer("e4m3", scaling="pow2")
    sa = qa.scale_for(a.abs().amax())
    sw = qw.scale_for(w.abs().amax())
    a8 = round_to(a / sa, "e4m3", saturate=True)  # float32 tensors holding E4M3 values
    w8 = round_to(w / sw, "e4m3", saturate=True)
    native_cast_equal = bool(
        torch.equal(a8, (a / sa).to(torch.float8_e4m3fn).float())
        and torch.equal(w8, (w / sw).to(torch.float8_e4m3fn).float())
    )

    def emulated() -> torch.Tensor:
        return (a8 @ w8.t()) * (sa * sw)

    fa, fw = a8.to(torch.float8_e4m3fn), w8.to(torch.float8_e4m3fn)
    one = torch.ones((), device=dev)

    def native(out_dtype=torch.bfloat16) -> torch.Tensor:
        # _scaled_mm wants B column-major: W[N, K] contiguous, transposed, is exactly that
        return torch._scaled_mm(fa, fw.t(), scale_a=sa.float() * one, scale_b=sw.float() * one,
                                out_dtype=out_dtype)  # fmt: skip

    def emulated_with_rounding() -> torch.Tensor:
        x8 = round_to(a / sa, "e4m3", saturate=True)
        y8 = round_to(w / sw, "e4m3", saturate=True)
        return (x8 @ y8.t()) * (sa * sw)

    ab, wb = a.bfloat16(), w.bfloat16()

    def bf16() -> torch.Tensor:
        return ab @ wb.t()

    ref = emulated()
    nat32 = native(torch.float32)
    nat16 = native()
    scale = float(ref.abs().max())
    out = {
        "shape": [m, k, n],
        "inputs_equal_native_cast": native_cast_equal,
        "max_rel_diff_fp32_out": float((nat32 - ref).abs().max()) / scale,
        "bf16_outputs_identical": float((nat16 == ref.bfloat16()).float().mean()),
        "max_rel_diff_bf16_out": float((nat16.float() - ref).abs().max()) / scale,
        "t_bf16_s": _time(bf16),
        "t_scaled_mm_s": _time(native),
        "t_emulated_s": _time(emulated_with_rounding),
    }
    out["scaled_mm_vs_bf16"] = out["t_scaled_mm_s"] / out["t_bf16_s"]
    out["emulated_vs_bf16"] = out["t_emulated_s"] / out["t_bf16_s"]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", default="1024,4096,8192", help="square sizes M=K=N to try")
    p.add_argument("--json", help="also write the results to this file")
    args = p.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("no CUDA device: nothing to compare (this script needs an FP8-capable GPU)")
        return 1
    cap = torch.cuda.get_device_capability()
    if cap < (8, 9):
        print(f"{torch.cuda.get_device_name()} (sm_{cap[0]}{cap[1]}) has no FP8 tensor cores")
        return 1
    rows = [compare(s, s, s) for s in (int(x) for x in args.sizes.split(","))]
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    print("| M=K=N | inputs = native cast | max rel diff (FP32 out) | BF16 outputs identical "
          "| _scaled_mm / BF16 time | emulated / BF16 time |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['shape'][0]} | {r['inputs_equal_native_cast']} | {r['max_rel_diff_fp32_out']:.2e} "
              f"| {100 * r['bf16_outputs_identical']:.2f}% | {r['scaled_mm_vs_bf16']:.2f} "
              f"| {r['emulated_vs_bf16']:.2f} |")  # fmt: skip
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
