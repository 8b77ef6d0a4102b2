"""Format codec speed: encode float32 -> codes and decode codes -> float32, against peers.

Every case encodes 16M float32 values (1M with --quick) of two kinds: N(0, 1), and
"wide" data (log-uniform magnitudes from 1/8 of the format's smallest positive value to
8x its largest, random signs: underflow, subnormals, normals and overflow). The peers
are ml_dtypes' ``astype`` (numpy's for float16), measured in the same run on the same
arrays; the generic-path cases (a custom layout, a P3109 format, stochastic and
toward-zero rounding, which no peer offers) are set against ml_dtypes' nearest-even
cast of a format of the same width. Times are the median of several runs; lowbit's
kernels split arrays of 1M+ values across the process's cores (lowbit._parallel), the
peers run on one thread; "copy" is a plain numpy copy of the float32 array (4 bytes a
value, one thread), so "vs copy" = copy time / lowbit time is the fraction of
memory-copy speed reached.
"""

from __future__ import annotations

import time
from typing import Any

import ml_dtypes
import numpy as np

import lowbit
from lowbit import FloatFormat, _parallel
from lowbit.codecs import _numba as _fast

# (format, peer dtype, target ratio of lowbit's time to the peer's)
_MLD = [
    ("float8_e4m3fn", 0.2),
    ("float8_e5m2", 0.2),
    ("float8_e4m3fnuz", 0.2),
    ("float6_e3m2fn", 0.2),
    ("float6_e2m3fn", 0.2),
    ("float4_e2m1fn", 0.2),
    ("float8_e8m0fnu", 0.2),
    ("bfloat16", 1.0),
]
# Where docs/formats.md says lowbit deliberately differs from the peer, those inputs are
# left out of the comparison: E8M0 of 0 and of float32 subnormals.
_DIFFERS = {"float8_e8m0fnu": lambda x: (x == 0) | (np.abs(x) < 2.0**-126)}
_CUSTOM = FloatFormat(name="custom_e4m3_b9_ext", ebits=4, mbits=3, bias=9, inf="high", nan="high")


def _median(fn: Any, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def _data(fmt: FloatFormat, n: int, kind: str, rng: np.random.Generator) -> np.ndarray:
    if kind == "N(0,1)":
        return rng.standard_normal(n, dtype=np.float32)
    f32 = np.finfo(np.float32)
    lo = max(fmt.smallest_positive / 8, float(f32.smallest_subnormal))
    hi = min(fmt.max * 8, float(f32.max))
    mag = np.exp(rng.uniform(np.log(lo), np.log(hi), n))
    sign = rng.choice(np.array([-1.0, 1.0]), n)
    return (mag * sign).astype(np.float32)


def _agree(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and bool(np.array_equal(a, b))


def _same_values(a: np.ndarray, b: np.ndarray) -> bool:
    nan = np.isnan(a)
    return bool(np.array_equal(nan, np.isnan(b))) and bool(
        np.array_equal(a[~nan].view(np.uint32), b[~nan].view(np.uint32))
    )


def run(quick: bool) -> str:
    n = 1 << (20 if quick else 24)
    repeat = 5 if quick else 7
    rng = np.random.default_rng(20261130)
    rows: list[list[str]] = []
    failures = 0
    copy = _median(rng.standard_normal(n, dtype=np.float32).copy, 2 * repeat + 1)

    def timed_pair(ours: Any, theirs: Any) -> tuple[float, float]:
        """Median times of the two, run alternately so that drift hits both alike."""
        ours(), theirs()  # warm up: kernels compiled, tables built
        a, b = [], []
        for _ in range(repeat):
            a.append(_median(ours, 1))
            b.append(_median(theirs, 1))
        return float(np.median(a)), float(np.median(b))

    def case(name: str, data: str, op: str, ours: Any, peer: str, theirs: Any, target: float,
             agree: str) -> None:  # fmt: skip
        nonlocal failures
        with np.errstate(over="ignore", invalid="ignore"):
            t, tp = timed_pair(ours, theirs)
        ratio = t / tp
        failures += ratio > target
        rows.append(
            [name, data, op, f"{t * 1e3:.1f}", f"{peer} {tp * 1e3:.1f}", f"{ratio:.3f}",
             f"<= {target:g}", "pass" if ratio <= target else "FAIL", f"{copy / t:.2f}", agree]
        )  # fmt: skip

    def check(name: str, fmt: FloatFormat, x: np.ndarray, peer: np.dtype) -> tuple[str, str]:
        """Whether codes and decoded values equal the peer's, outside documented differences."""
        note = ""
        if name in _DIFFERS:
            skip = _DIFFERS[name](x)
            x = x[~skip]
            if skip.any():
                note = f" (left out: {int(skip.sum()):,} inputs where docs/formats.md says they differ)"
        with np.errstate(over="ignore", invalid="ignore"):
            codes, theirs = fmt.encode(x), x.astype(peer)
            enc = _agree(codes, theirs.view(codes.dtype))
            dec = _same_values(fmt.decode(codes), theirs.astype(np.float32))
        return ("yes" if enc else "NO") + note, ("yes" if dec else "NO") + note

    peers = [(name, np.dtype(getattr(ml_dtypes, name)), "ml_dtypes", t) for name, t in _MLD]
    peers.append(("float16", np.dtype(np.float16), "numpy", 0.5))
    for name, peer, who, target in peers:
        fmt = lowbit.format(name)
        for kind in ("N(0,1)", "wide"):
            x = _data(fmt, n, kind, rng)
            with np.errstate(over="ignore", invalid="ignore"):
                codes, theirs = fmt.encode(x), x.astype(peer)
            enc_ok, dec_ok = check(name, fmt, x, peer)
            case(name, kind, "encode", lambda x=x, f=fmt: f.encode(x), who,
                 lambda x=x, p=peer: x.astype(p), target, enc_ok)  # fmt: skip
            case(name, kind, "decode", lambda c=codes, f=fmt: f.decode(c), who,
                 lambda y=theirs: y.astype(np.float32), target, dec_ok)  # fmt: skip

    # the generic path against ml_dtypes' nearest-even cast of a same-width format
    e4m3 = lowbit.format("float8_e4m3fn")
    peer = np.dtype(ml_dtypes.float8_e4m3fn)
    generic = [
        (f"{_CUSTOM.name} (custom layout)", _CUSTOM, {}),
        ("p3109_k8p3se", lowbit.format("p3109_k8p3se"), {}),
        ("float8_e4m3fn stochastic", e4m3, {"rounding": "stochastic", "seed": 1}),
        ("float8_e4m3fn toward_zero", e4m3, {"rounding": "toward_zero"}),
    ]
    for name, fmt, kw in generic:
        for kind in ("N(0,1)", "wide"):
            x = _data(fmt, n, kind, rng)
            case(name, kind, "encode", lambda x=x, f=fmt, kw=kw: f.encode(x, **kw),
                 "ml_dtypes e4m3fn RNE", lambda x=x: x.astype(peer), 1.0, "n/a")  # fmt: skip
            if not kw:
                with np.errstate(over="ignore", invalid="ignore"):
                    codes, theirs = fmt.encode(x), x.astype(peer)
                case(name, kind, "decode", lambda c=codes, f=fmt: f.decode(c),
                     "ml_dtypes e4m3fn", lambda y=theirs: y.astype(np.float32), 1.0,
                     "n/a")  # fmt: skip

    header = ["case", "data", "op", "lowbit ms", "peer ms", "ratio", "target", "", "vs copy",
              "agrees"]  # fmt: skip
    lines = [
        "## Format codecs: encode and decode",
        "",
        f"{n:,} float32 values per case; median of {repeat} runs; compiled kernels "
        f"{'on (numba)' if _fast.enabled() else 'OFF (numba missing: numpy path)'}, "
        f"on {_parallel.threads()} threads (the peers on one); "
        f"a numpy copy of the float32 array takes {copy * 1e3:.1f} ms.",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "|".join("---" for _ in header) + "|",
        *("| " + " | ".join(r) + " |" for r in rows),
        "",
        f"{len(rows) - failures} of {len(rows)} cases meet their target. ratio = lowbit time / "
        "peer time (lower is faster); vs copy = numpy-copy time of the float32 array / lowbit "
        "time (1.0 = memory-copy speed). agrees: the codes (encode) or the values' bits "
        "(decode; NaNs compared as NaN) equal the peer's on the same data. Stochastic "
        "rounding includes drawing 64 random bits per value from the seed.",
    ]
    return "\n".join(lines)
