"""MR-GPTQ (``lowbit.methods.mr_gptq``): GPTQ in the block-Hadamard-rotated basis."""

from __future__ import annotations

import numpy as np
import pytest

import lowbit
from layer_inputs import hessian, loud_inputs
from lowbit.methods.gptq import GPTQ, layer_error
from lowbit.methods.hadamard import hadamard, rotate_rows
from lowbit.methods.mr_gptq import MRGPTQ, RotatedTensor, rotate_hessian


def _block_diag(n: int, b: int) -> np.ndarray:
    """The block-diagonal rotation ``R`` written out: ``n / b`` copies of ``H_b``."""
    return np.kron(np.eye(n // b), hadamard(b))


def test_rotate_hessian_is_rt_h_r() -> None:
    """``rotate_hessian(H, b)`` = ``Rᵀ H R`` with ``R`` written out, and the Hessian of the
    rotated inputs ``X R``."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(50, 64))
    H = 2 * X.T @ X / 50
    R = _block_diag(64, 16)
    np.testing.assert_allclose(rotate_hessian(H, 16), R.T @ H @ R, rtol=1e-12, atol=1e-12)
    Xr = X @ R
    np.testing.assert_allclose(rotate_hessian(H, 16), 2 * Xr.T @ Xr / 50, atol=1e-10)


@pytest.mark.parametrize("spec", ["nvfp4", "fp4:g16", "mxfp4", "mxfp4:ct", "mxfp4:ceil"])
@pytest.mark.parametrize("order", ["none", "static"])
def test_identity_hessian_gives_rotated_round_to_nearest(spec: str, order: str) -> None:
    """H = c·I: ``Rᵀ H R`` = c·I, so MR-GPTQ's codes and scales are exactly round-to-nearest
    of ``W R``, and its dequantized weight is ``Q(W R) Rᵀ``."""
    rng = np.random.default_rng(1)
    W = rng.normal(size=(12, 128)).astype(np.float32)
    qt = MRGPTQ(act_order=order).quantize(W, 3.5 * np.eye(128), spec)
    assert isinstance(qt, RotatedTensor) and qt.block == (32 if "mx" in spec else 16)
    rtn = lowbit.quantize(rotate_rows(W.astype(np.float64), qt.block), qt.scheme)
    np.testing.assert_array_equal(qt.rotated.unpack(), rtn.unpack())
    np.testing.assert_array_equal(qt.rotated.scale, rtn.scale)
    R = _block_diag(128, qt.block)
    np.testing.assert_allclose(qt.dequantize(np.float64), rtn.dequantize(np.float64) @ R.T,
                               atol=1e-12)  # fmt: skip
    assert qt.nbytes == rtn.nbytes and qt.numel == rtn.numel


def test_rotated_gptq_beats_rotated_rounding() -> None:
    """On correlated inputs with loud channels, MR-GPTQ's output error (measured in the
    original basis with the original Hessian) is below round-to-nearest of ``W R``'s."""
    rng = np.random.default_rng(2)
    W = rng.normal(size=(32, 128))
    H = hessian(loud_inputs(rng, 400, rng.normal(size=(6, 128)), rng.choice(128, 3, replace=False)))
    qt = MRGPTQ().quantize(W, H, "mxfp4")
    rtn = lowbit.quantize(rotate_rows(W, 32), "mxfp4").dequantize(np.float64)
    assert layer_error(W, qt.dequantize(np.float64), H) < 0.8 * layer_error(
        W, rotate_rows(rtn, 32), H
    )


def test_settings_and_fallback() -> None:
    """MRGPTQ keeps GPTQ's settings and says it rotates; a weight whose width the block does
    not divide is quantized by plain GPTQ (a QuantizedTensor, no rotation)."""
    m = MRGPTQ(damp=0.05, act_order="none")
    assert isinstance(m, GPTQ) and m.name == "hadamard+gptq"
    assert m.to_dict() == {**GPTQ(damp=0.05, act_order="none").to_dict(),
                           "rotation": "block-hadamard"}  # fmt: skip
    W = np.random.default_rng(3).normal(size=(4, 40))
    qt = m.quantize(W, np.eye(40), "int4:g16")
    assert not isinstance(qt, RotatedTensor)
    ref = GPTQ(damp=0.05, act_order="none").quantize(W, np.eye(40), "int4:g16")
    np.testing.assert_array_equal(qt.unpack(), ref.unpack())
