"""lowbit's nvfp4 and mxfp4:ct against compressed-tensors' own quantizer and compressors:
packed bytes, scale bytes and the tensor scale equal, on random, edge and real weights."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import lowbit
from lowbit.quant.scheme_text import parse_scheme

torch = pytest.importorskip("torch")
pytest.importorskip("compressed_tensors")
from compressed_tensors.compressors.mxfp4.base import MXFP4PackedCompressor  # noqa: E402
from compressed_tensors.compressors.nvfp4.base import NVFP4PackedCompressor  # noqa: E402
from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme  # noqa: E402
from compressed_tensors.quantization.quant_scheme import (  # noqa: E402
    MXFP4A16,
    MXFP8A16,
    NVFP4A16,
)
from compressed_tensors.quantization.utils.helpers import (  # noqa: E402
    calculate_qparams,
    generate_gparam,
)

sys.path[:0] = [str(Path(__file__).resolve().parents[i]) for i in (0, 1)]
from test_fp4_served import _cases  # noqa: E402

pytestmark = pytest.mark.torch
torch.set_num_threads(1)


def ct_nvfp4(x: np.ndarray, g: torch.Tensor | None = None) -> dict[str, np.ndarray]:
    """compressed-tensors' NVFP4 (W4A16 args): the tensor scale from ``generate_gparam`` (or
    ``g``, a shared one), group scales from ``calculate_qparams``, bytes from the compressor."""
    w = torch.from_numpy(x)
    scheme = QuantizationScheme(targets=["Linear"], **NVFP4A16)
    if g is None:
        g = generate_gparam(w.min(), w.max())
    wg = w.reshape(w.shape[0], -1, 16)
    scale, zp = calculate_qparams(wg.amin(-1), wg.amax(-1), scheme.weights, global_scale=g)
    sd = NVFP4PackedCompressor.compress(
        {"weight": w, "weight_scale": scale, "weight_global_scale": g, "weight_zero_point": zp},
        scheme,
    )
    return {
        "packed": sd["weight_packed"].numpy(),
        "scale": sd["weight_scale"].view(torch.uint8).numpy(),
        "global": sd["weight_global_scale"].numpy(),
    }


def ct_mx(x: np.ndarray, preset: dict, group: int = 32) -> tuple[np.ndarray, np.ndarray]:
    """compressed-tensors' MX scales (``generate_mx_scales``) as E8M0 bytes, and for FP4 the
    MXFP4 compressor's packed bytes (else the rounded element values)."""
    w = torch.from_numpy(x)
    scheme = QuantizationScheme(targets=["Linear"], **preset)
    wg = w.reshape(w.shape[0], -1, group)
    scale, zp = calculate_qparams(wg.amin(-1), wg.amax(-1), scheme.weights)
    if scheme.weights.num_bits == 4:
        sd = MXFP4PackedCompressor.compress(
            {"weight": w, "weight_scale": scale, "weight_zero_point": zp}, scheme
        )
        return sd["weight_packed"].numpy(), sd["weight_scale"].numpy()
    from compressed_tensors.quantization.lifecycle.forward import quantize

    q = quantize(w, scale, zp, scheme.weights, dtype=torch.float32)
    e = (127 + torch.floor(torch.log2(scale))).to(torch.uint8)
    return q.numpy(), e.numpy()


def _real() -> dict[str, np.ndarray]:
    from lowbit.checkpoints import open_checkpoint
    from tiny_models import shipped_path

    ckpt = open_checkpoint(shipped_path("minilm"))
    names = [
        n for n in ckpt.names() if n.endswith(("intermediate.dense.weight", "output.dense.weight"))
    ]
    return {n: np.array(ckpt.get(n), np.float32) for n in sorted(names)[:3]}


def _all_cases() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(11)
    cases = dict(_cases())
    cases["bf16_values"] = torch.randn(16, 96, dtype=torch.bfloat16).float().numpy()
    cases["wide"] = (rng.standard_normal((8, 512)) * 1e-3).astype(np.float32)
    return cases


@pytest.mark.parametrize("path", ["numpy", "kernels"])
@pytest.mark.parametrize("case", list(_all_cases()))
def test_nvfp4_bytes_equal_compressed_tensors(case: str, path: str) -> None:
    """Packed nibbles, E4M3 scale bytes and the float32 tensor scale equal compressed-tensors',
    on the numpy path and the one-pass compiled kernel."""
    from lowbit.codecs import _numba

    if path == "kernels":
        pytest.importorskip("numba")
    x = _all_cases()[case]
    with _numba.numpy_only() if path == "numpy" else _numba.kernels_always():
        qt = lowbit.quantize(x, parse_scheme("nvfp4"), underflow="ignore")
    want = ct_nvfp4(x)
    arrays, _ = qt.to_arrays()
    assert np.array_equal(arrays["codes"].reshape(want["packed"].shape), want["packed"])
    assert np.array_equal(arrays["scale"], want["scale"])
    assert np.array_equal(arrays["tensor_scale"], want["global"])


def test_nvfp4_bytes_equal_compressed_tensors_on_minilm() -> None:
    """The same on MiniLM's feed-forward weights (outliers of 40-175 standard deviations)."""
    for name, x in _real().items():
        qt = lowbit.quantize(x, parse_scheme("nvfp4"))
        want = ct_nvfp4(x)
        arrays, _ = qt.to_arrays()
        assert np.array_equal(arrays["codes"].reshape(want["packed"].shape), want["packed"]), name
        assert np.array_equal(arrays["scale"], want["scale"]), name
        assert np.array_equal(arrays["tensor_scale"], want["global"]), name


@pytest.mark.parametrize("case", list(_all_cases()))
def test_mxfp4_ct_rule_bytes_equal_compressed_tensors(case: str) -> None:
    """mxfp4:ct: packed nibbles and E8M0 scale bytes equal the MXFP4 compressor's."""
    x = _all_cases()[case]
    if x.shape[1] % 32:
        pytest.skip("MX blocks of 32")
    qt = lowbit.quantize(x, parse_scheme("mxfp4:ct"), underflow="ignore")
    packed, scale = ct_mx(x, MXFP4A16)
    arrays, _ = qt.to_arrays()
    assert np.array_equal(arrays["codes"].reshape(packed.shape), packed)
    assert np.array_equal(arrays["scale"].reshape(scale.shape), scale)


def test_mxfp8_ct_rule_scales_equal_compressed_tensors() -> None:
    """mxfp8_e4m3:ct: E8M0 scales and element values equal compressed-tensors' MXFP8."""
    for x in [_all_cases()["normal"], _all_cases()["heavy_tail"], *_real().values()]:
        qt = lowbit.quantize(x, parse_scheme("mxfp8_e4m3:ct"), underflow="ignore")
        values, scale = ct_mx(x, MXFP8A16)
        arrays, _ = qt.to_arrays()
        assert np.array_equal(arrays["scale"].reshape(scale.shape), scale)
        elem = qt.dequantize() / np.repeat(qt.scale, 32, axis=1)
        assert np.array_equal(elem, values)


def test_shared_global_scale_matches() -> None:
    """With q/k/v's tensor scales replaced by their minimum (llm-compressor's fused update,
    as vLLM requires one per fused layer) compressed-tensors' bytes follow the shared scale;
    quantize_shared_tensor_scale gives the same bytes."""
    from lowbit.quant.shared_scale import quantize_shared_tensor_scale

    rng = np.random.default_rng(5)
    xs = [(rng.standard_normal((16, 64)) * s).astype(np.float32) for s in (1.0, 3.0, 0.2)]
    qts = quantize_shared_tensor_scale(xs, parse_scheme("nvfp4"))
    g = torch.min(
        torch.cat(
            [generate_gparam(torch.from_numpy(x).min(), torch.from_numpy(x).max()) for x in xs]
        )
    )
    for x, qt in zip(xs, qts, strict=True):
        want = ct_nvfp4(x, g.reshape(1))
        arrays, _ = qt.to_arrays()
        assert qt.tensor_scale == np.float32(g)
        assert np.array_equal(arrays["codes"].reshape(want["packed"].shape), want["packed"])
        assert np.array_equal(arrays["scale"], want["scale"])


def test_ct_args_names() -> None:
    """The presets this file compares against are compressed-tensors' NVFP4A16 and MXFP4A16."""
    nv, mx = NVFP4A16["weights"], MXFP4A16["weights"]
    assert (
        isinstance(nv, QuantizationArgs) and nv.group_size == 16 and nv.strategy == "tensor_group"
    )
    assert (
        isinstance(mx, QuantizationArgs) and mx.group_size == 32 and mx.scale_dtype == torch.uint8
    )
