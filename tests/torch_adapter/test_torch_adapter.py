"""lowbit.torch: exact rounding in torch, fake quantization with STE, emulated linears."""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import lowbit  # noqa: E402
from lowbit import FORMATS  # noqa: E402
from lowbit.errors import LowbitError, NaNPolicyError  # noqa: E402
from lowbit.torch import (  # noqa: E402
    EmulatedLinear,
    EmulatedMatMul,
    MatMul,
    Quantizer,
    emulate,
    emulation_stats,
    fake_quantize,
    pow2_at_least,
    random_bits,
    round_to,
)

pytestmark = pytest.mark.torch
torch.set_num_threads(2)

SMALL = sorted(n for n, f in FORMATS.items() if f.bits <= 8)
SIXTEEN = ["bfloat16", "float16"]


def _probe_points(f: lowbit.Format, rng: np.random.Generator) -> np.ndarray:
    """Every value, every midpoint and its float32 neighbours, extremes, random bit patterns."""
    v = f.values().astype(np.float32)
    mids = ((f.values()[1:] + f.values()[:-1]) / 2).astype(np.float32)
    up = np.nextafter(mids, np.float32(np.inf))
    down = np.nextafter(mids, np.float32(-np.inf))
    top = min(f.max, 3.4e38)
    with np.errstate(over="ignore"):
        extremes = np.array(
            [0.0, 2.0**-149, 2.0**-126, top * 1.01, top * 2, 1e30, 3.4e38, np.inf]
        ).astype(np.float32)
    over = np.nextafter(np.array([top], np.float32), np.float32(np.inf))
    rand = rng.integers(0, 2**32, size=8_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    scaled = (rng.standard_normal(8_000) * (top / 8)).astype(np.float32)
    pts = np.concatenate([v, mids, up, down, extremes, over, scaled])
    pts = np.concatenate([pts, -pts, rand])
    return pts[~np.isnan(pts)]


def _same_bits(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Equal as bit patterns (so -0 differs from +0), any NaN equal to any NaN."""
    if a.dtype == np.float32:
        eq = a.view(np.uint32) == b.view(np.uint32)
    else:
        eq = a.view(np.uint64) == b.view(np.uint64)
    return eq | (np.isnan(a) & np.isnan(b))


def _codec(f: lowbit.Format, pts: np.ndarray, **kw) -> np.ndarray:
    """The numpy codec's values, fed float64 (exact): one rounding from the exact value."""
    return f.decode(f.encode(pts.astype(np.float64), **kw), dtype=np.float64).astype(pts.dtype)


def _check(pts: np.ndarray, got: np.ndarray, want: np.ndarray) -> None:
    bad = ~_same_bits(got, want)
    assert not bad.any(), (pts[bad][:5], got[bad][:5], want[bad][:5])


# ---- round_to --------------------------------------------------------------------------


@pytest.mark.parametrize("name", SMALL + SIXTEEN)
@pytest.mark.parametrize("saturate", [False, True])
def test_round_to_matches_codec_float32(name: str, saturate: bool, rng) -> None:
    """round_to on float32 equals decode(encode(x)) bit for bit at every code, midpoint and neighbour."""
    f = FORMATS[name]
    pts = _probe_points(f, rng)
    if not getattr(f, "signed", True) and not f.has_nan and not saturate:
        pts = np.abs(pts)  # the codec refuses negative input there
    got = round_to(torch.from_numpy(pts), f, saturate=saturate).numpy()
    _check(pts, got, _codec(f, pts, saturate=saturate))


@pytest.mark.parametrize("name", SMALL + SIXTEEN + ["float32", "tensorfloat32"])
def test_round_to_matches_codec_float64(name: str, rng) -> None:
    """round_to on float64 input rounds once from the exact value, as the codec does."""
    f = FORMATS[name]
    if f.bits <= 16:
        pts = _probe_points(f, rng).astype(np.float64)
    else:  # too many values to list: random float32 bit patterns and their neighbourhoods
        bits32 = rng.integers(0, 2**32, size=8_000, dtype=np.uint64).astype(np.uint32)
        p32 = bits32.view(np.float32)
        p32 = p32[np.isfinite(p32)].astype(np.float64)
        pts = np.concatenate([p32, p32 * (1 + 2.0**-30), p32 * (1 - 2.0**-25)])
        pts = pts[np.isfinite(pts)]
    extra = rng.standard_normal(8_000) * np.exp2(rng.integers(-30, 30, 8_000))
    pts = np.concatenate([pts, extra, extra * (1 + 2.0**-40)])
    if not getattr(f, "signed", True) and not f.has_nan:
        pts = np.abs(pts)
    got = round_to(torch.from_numpy(pts), f).numpy()
    _check(pts, got, _codec(f, pts))


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_round_to_half_inputs(dtype: str, rng) -> None:
    """16-bit tensors round as their exact float32 values would, and keep their dtype."""
    x = torch.from_numpy(rng.standard_normal(5000).astype(np.float32) * 50).to(
        getattr(torch, dtype)
    )
    for name in ("float8_e4m3fn", "float8_e5m2", "float4_e2m1fn", "int4"):
        got = round_to(x, name)
        assert got.dtype == x.dtype
        want = _codec(FORMATS[name], x.float().numpy())
        np.testing.assert_array_equal(got.float().numpy(), want)


@pytest.mark.parametrize(
    "name", ["bfloat16", "float16", "float8_e4m3fn", "float8_e5m2", "float4_e2m1fn", "int4", "int8"]
)
def test_round_to_stochastic_matches_codec(name: str, rng) -> None:
    """Stochastic rounding with given random bits equals the codec's with the same bits."""
    f = FORMATS[name]
    x = np.concatenate(
        [
            (rng.standard_normal(30_000) * min(f.max, 1e4) / 4).astype(np.float32),
            np.array([2.0**-149, -(2.0**-140), 1e-30, 0.0], dtype=np.float32),
        ]
    )
    bits = rng.integers(0, 2**64, size=x.size, dtype=np.uint64, endpoint=False)
    bits[:3] = [0, 2**64 - 1, 2**63]
    got = round_to(
        torch.from_numpy(x),
        f,
        rounding="stochastic",
        random_bits=torch.from_numpy(bits.view(np.int64)),
    ).numpy()
    want = _codec(f, x, rounding="stochastic", random_bits=bits)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


def test_round_to_stochastic_is_unbiased() -> None:
    """A value 1/4 of the way between two bf16 neighbours rounds up about 1/4 of the time."""
    lo = 1.0
    x = torch.full((200_000,), lo + 2.0**-7 / 4)
    r = round_to(x, "bf16", rounding="stochastic", seed=1)
    frac_up = float((r > lo).double().mean())
    assert abs(frac_up - 0.25) < 0.005
    assert set(torch.unique(r).tolist()) == {1.0, 1.0 + 2.0**-7}


def test_round_to_rejects_bad_input() -> None:
    """Integer tensors, unknown policies and NaN for NaN-less formats raise LowbitError."""
    with pytest.raises(LowbitError):
        round_to(torch.arange(3), "fp8")
    with pytest.raises(LowbitError):
        round_to(torch.ones(2), "fp8", nan="keep")
    with pytest.raises(NaNPolicyError):
        round_to(torch.tensor([math.nan]), "int4")
    assert round_to(torch.tensor([math.nan]), "int4", nan="zero").item() == 0.0


# ---- fake quantization and the straight-through estimator -------------------------------


def test_fake_quantize_ste_clipped_and_identity() -> None:
    """Clipped STE: gradient 1 where x/scale is inside [min, max], 0 outside; identity: 1 everywhere."""
    x = torch.tensor([-20.0, -8.0, -3.3, 0.2, 6.9, 7.0, 7.4, 9.0], requires_grad=True)
    y = fake_quantize(x, "int4", scale=1.0)
    assert y.tolist() == [-8.0, -8.0, -3.0, 0.0, 7.0, 7.0, 7.0, 7.0]
    y.sum().backward()
    assert x.grad.tolist() == [0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0]
    x.grad = None
    fake_quantize(x, "int4", scale=1.0, ste="identity").sum().backward()
    assert x.grad.tolist() == [1.0] * 8


@pytest.mark.parametrize(
    ("fmt", "kw"),
    [
        ("int4", {"group_size": 32}),
        ("int8", {"axis": 0}),
        ("nf4", {"group_size": 64}),
        ("fp4", {"group_size": 32}),
        ("e4m3", {}),
    ],
)
def test_fake_quantize_absmax_equals_lowbit_quantize(fmt: str, kw: dict, rng) -> None:
    """absmax fake-quant values equal lowbit.quantize(...).dequantize() bit for bit."""
    w = (rng.standard_normal((16, 128)) * np.exp2(rng.integers(-3, 3, (16, 1)))).astype(np.float32)
    got = fake_quantize(torch.from_numpy(w), fmt, scale="absmax", **kw).numpy()
    want = lowbit.quantize(w, fmt, **kw).dequantize(np.float32)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


def test_mx_quantizer_equals_lowbit_mx(rng) -> None:
    """Quantizer(scaling='mx', group_size=32) equals lowbit.quantize(x, 'mxfp8_e4m3')."""
    x = (rng.standard_normal((8, 96)) * np.exp2(rng.integers(-8, 8, (8, 96)))).astype(np.float32)
    for name, elem in (("mxfp8_e4m3", "e4m3"), ("mxfp8_e5m2", "e5m2"), ("mxfp4", "fp4")):
        got = Quantizer(elem, scaling="mx", group_size=32)(torch.from_numpy(x)).numpy()
        want = lowbit.quantize(x, name).dequantize(np.float32)
        np.testing.assert_array_equal(got, want)


def test_fake_quantize_rejects_bad_groups() -> None:
    """A group size that does not divide the last dimension raises LowbitError."""
    with pytest.raises(LowbitError, match="group_size"):
        fake_quantize(torch.ones(4, 48), "int4", scale="absmax", group_size=32)
    with pytest.raises(LowbitError, match="ste"):
        fake_quantize(torch.ones(4), "int4", ste="none")


def test_pow2_at_least_exact() -> None:
    """pow2_at_least gives 2**ceil(log2 r), exact at powers of two."""
    r = torch.tensor([1.0, 1.0000001, 0.75, 0.5, 3.0, 2.0**-130], dtype=torch.float64)
    assert pow2_at_least(r).tolist() == [1.0, 2.0, 1.0, 0.5, 4.0, 2.0**-130]


def test_quantizer_scalings_and_counters() -> None:
    """pow2 maps amax under max with a power-of-two scale; mx follows OCP MX; counters count."""
    x = torch.tensor([1000.0, -3.0, 1e-9, 0.0])
    q = Quantizer("e4m3", scaling="pow2")
    assert q.scale_for(torch.tensor(1000.0)).item() == 4.0  # 1000/448 -> 2**ceil(log2 2.23)
    out = q(x)
    assert out.tolist()[:2] == [1024.0, -3.0]  # 250 is not in E4M3 (240, 256): 256 * 4
    assert q.stats["underflow"] == 1 and q.stats["values"] == 4
    mx = Quantizer("e4m3", scaling="mx", group_size=4)
    # amax 1000: floor(log2 1000) = 9, emax(E4M3) = 8 -> scale 2; 1000/2 = 500 clamps to 448
    assert mx(x).tolist()[0] == 896.0
    assert mx.stats["saturated"] == 1
    f16 = Quantizer("fp16")
    assert math.isinf(f16(torch.tensor([1e4 * 1e4])).item())
    assert f16.stats["overflow"] == 1
    with pytest.raises(LowbitError):
        Quantizer("fp16", scaling="nope")


# ---- emulated linear ----------------------------------------------------------------------


def _ref_round(a: np.ndarray, name: str, scale: float = 1.0) -> np.ndarray:
    f = lowbit.format(name)
    return f.decode(f.encode(a / scale, saturate=True), dtype=np.float64) * scale


def test_emulated_linear_equals_float64_reference(rng) -> None:
    """Forward and backward of EmulatedLinear equal a float64 numpy reference with the same rounding."""
    x = rng.standard_normal((3, 5, 64)) * 4
    w = rng.standard_normal((32, 64)) * 0.1
    b = np.round(rng.standard_normal(32) * 8) / 8  # few bits, so adding it stays exact
    g = rng.standard_normal((3, 5, 32)) * 1e-3
    lin = torch.nn.Linear(64, 32).double()
    with torch.no_grad():
        lin.weight.copy_(torch.from_numpy(w))
        lin.bias.copy_(torch.from_numpy(b))

    def pow2(name: str):
        return lambda: Quantizer(name, scaling="pow2")

    em = EmulatedLinear(lin, input=pow2("e4m3"), weight=pow2("e4m3"), grad_output=pow2("e5m2"))
    xt = torch.from_numpy(x).requires_grad_(True)
    y = em(xt)
    y.backward(torch.from_numpy(g))

    sx = 2.0 ** math.ceil(math.log2(np.abs(x).max() / 448))
    sw = 2.0 ** math.ceil(math.log2(np.abs(w).max() / 448))
    sg = 2.0 ** math.ceil(math.log2(np.abs(g).max() / 57344))
    xq, wq, gq = _ref_round(x, "e4m3", sx), _ref_round(w, "e4m3", sw), _ref_round(g, "e5m2", sg)
    # products of FP8 values are exact in float64 and these sums stay exact too
    np.testing.assert_array_equal(y.detach().numpy(), xq @ wq.T + b)
    np.testing.assert_array_equal(xt.grad.numpy(), gq @ wq)
    np.testing.assert_array_equal(
        lin.weight.grad.numpy(), gq.reshape(-1, 32).T @ xq.reshape(-1, 64)
    )
    np.testing.assert_array_equal(lin.bias.grad.numpy(), gq.reshape(-1, 32).sum(0))


def test_emulated_linear_output_and_grad_rounding(rng) -> None:
    """fp16 roles round the output, dx and dW to float16 values (float32 accumulation)."""
    lin = torch.nn.Linear(16, 8)
    em = EmulatedLinear(lin, input="fp16", weight="fp16", output="fp16", grad_output="fp16",
                        grad_input="fp16", grad_weight="fp16")  # fmt: skip
    x = torch.randn(4, 16, requires_grad=True)
    y = em(x)
    assert torch.equal(y, y.half().float())
    y.sum().backward()
    for t in (x.grad, lin.weight.grad, lin.bias.grad):
        assert torch.equal(t, t.half().float())
    ref = torch.nn.functional.linear(x.half().float(), lin.weight.half().float(), lin.bias)
    assert torch.equal(y, ref.half().float())


def test_emulate_swaps_linears_and_matmuls() -> None:
    """emulate replaces nn.Linear and MatMul in place, keeps parameters, honours exclude."""

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = torch.nn.Linear(4, 4)
            self.mm = MatMul()
            self.head = torch.nn.Linear(4, 2)

        def forward(self, x):
            h = self.a(x)
            return self.head(self.mm(h, h.transpose(-1, -2)) @ h)

    net = Net()
    params = list(net.parameters())
    emulate(net, input="bf16", weight="bf16", exclude=["head"])
    assert isinstance(net.a, EmulatedLinear) and isinstance(net.mm, EmulatedMatMul)
    assert type(net.head) is torch.nn.Linear
    assert [p is q for p, q in zip(params, net.parameters(), strict=True)] == [True] * 4
    out = net(torch.randn(3, 4))
    out.sum().backward()
    assert net.a.weight.grad is not None
    stats = emulation_stats(net)
    assert stats["input"]["values"] > 0 and stats["weight"]["values"] == 16


def test_random_bits_reproducible() -> None:
    """random_bits with the same seed gives the same bits; they span the whole 64-bit range."""
    a, b = random_bits((1000,), seed=3), random_bits((1000,), seed=3)
    assert torch.equal(a, b)
    assert (a < 0).any() and (a > 0).any()
