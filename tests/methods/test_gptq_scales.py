"""GPTQ with a scheme's scale method other than absmax (``mse``: a clipping range per group
searched to minimise the rounding error, as GPTQModel's ``mse`` option and llm-compressor's MSE
observer do): the scales are lowbit.quantize's, and the codes are those of Algorithm 1 given
those scales, for symmetric and asymmetric (zero-point) integer grids and float grids."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import lowbit
from layer_inputs import hessian, loud_inputs
from lowbit.methods.gptq import gptq_quantize, layer_error
from lowbit.plans.rules import parse_action
from lowbit.quant.scheme import ScaleMethod


def _hessian(rng: np.random.Generator, n: int, d: int) -> np.ndarray:
    """``2 XᵀX / n`` of correlated inputs (low rank plus noise, three loud channels)."""
    X = rng.normal(size=(n, 6)) @ rng.normal(size=(6, d)) + 0.3 * rng.normal(size=(n, d))
    X[:, rng.choice(d, 3, replace=False)] *= 4.0
    return 2.0 * X.T @ X / n


def _weights(rng: np.random.Generator, out: int, d: int) -> np.ndarray:
    """float32-exact weights with heavy tails (Student t, 3 degrees of freedom): a few large
    values per group, where clipping pays (for Gaussian groups of 16 it rarely does)."""
    return rng.standard_t(3, size=(out, d)).astype(np.float32).astype(np.float64)


def _fit(scheme: Any, group: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(scale, zero point) per row of ``group [out, g]`` as lowbit.quantize chooses them."""
    qt = lowbit.quantize(np.ascontiguousarray(group), scheme)
    z = np.zeros(group.shape[0]) if qt.zero_point is None else qt.zero_point[:, 0]
    return qt.scale[:, 0].astype(np.float64), z.astype(np.float64)


def _round_int4(w: np.ndarray, s: np.ndarray, z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """lowbit's int4 codes (-8..7, as ``unpack`` gives them) and values, written out:
    ``clip(rint(w / s) + z)``, value ``(code - z) · s``."""
    c = np.clip(np.rint(w / s) + z, -8, 7)
    return c.astype(np.int64), (c - z) * s


def algorithm1(W: np.ndarray, H: np.ndarray, scheme: Any, g: int, static: bool) -> np.ndarray:
    """Algorithm 1 (one column at a time, ``np.linalg.inv``), each group's scales from
    ``lowbit.quantize`` of the group: its original values (static act-order) or its values as
    the loop reaches it (no act-order)."""
    W = W.copy()
    out, n = W.shape
    H = H + 0.01 * np.mean(np.diag(H)) * np.eye(n)
    order = np.argsort(-np.diag(H), kind="stable") if static else np.arange(n)
    U = np.linalg.cholesky(np.linalg.inv(H[order][:, order])).T
    params = {k // g: _fit(scheme, W[:, k : k + g]) for k in range(0, n, g)} if static else {}
    Wp = W[:, order]
    codes = np.zeros((out, n), dtype=np.int64)
    for j in range(n):
        col = order[j]
        if not static and col % g == 0:
            params[col // g] = _fit(scheme, Wp[:, j : j + g])
        c, q = _round_int4(Wp[:, j], *params[col // g])
        codes[:, col] = c
        Wp[:, j:] -= np.outer((Wp[:, j] - q) / U[j, j], U[j, j:])
    return codes


@pytest.mark.parametrize("spec", ["int4:g16:mse", "int4:g16:asym:mse"])
@pytest.mark.parametrize("static", [False, True])
@pytest.mark.parametrize("block_size", [24, 128])
def test_mse_equals_algorithm1(spec: str, static: bool, block_size: int) -> None:
    """The codes of Algorithm 1 with lowbit.quantize's MSE scales and zero points (blocks of
    24 cut groups of 16, so a group's scales come from values with pending updates)."""
    rng = np.random.default_rng(21)
    W = _weights(rng, 24, 64)
    H = _hessian(rng, 400, 64)
    scheme = parse_action(spec)
    order = "static" if static else "none"
    qt = gptq_quantize(W, H, scheme, act_order=order, block_size=block_size)
    assert qt.scheme.scale_method is ScaleMethod.MSE and qt.scheme == scheme
    np.testing.assert_array_equal(
        qt.unpack().astype(np.int64), algorithm1(W, H, scheme, 16, static)
    )


@pytest.mark.parametrize(
    "spec",
    ["int4:g16:asym:mse", "int4:g16:mse", "int4:g40:asym:mse", "int4:ch:asym:mse", "int4:t:mse",
     "fp4:g32:mse", "nf4:mse"],
)  # fmt: skip
@pytest.mark.parametrize("order", ["none", "static"])
def test_uncorrelated_inputs_give_quantize_with_mse(spec: str, order: str) -> None:
    """H = c·I: GPTQ moves no error, so codes, scales and zero points are exactly
    lowbit.quantize's with the MSE search, which differ from absmax's (the search did run)."""
    rng = np.random.default_rng(22)
    W = _weights(rng, 12, 100).astype(np.float32)
    scheme = parse_action(spec)
    qt = gptq_quantize(W, 2.5 * np.eye(100), scheme, act_order=order)
    rtn = lowbit.quantize(W, scheme)
    np.testing.assert_array_equal(qt.unpack(), rtn.unpack())
    np.testing.assert_array_equal(qt.scale, rtn.scale)
    assert (qt.zero_point is None) == (":asym" not in spec)
    if rtn.zero_point is not None:
        np.testing.assert_array_equal(qt.zero_point, rtn.zero_point)
    absmax = lowbit.quantize(W, parse_action(spec.replace(":mse", "")))
    assert np.mean(rtn.scale < absmax.scale) > 0.2  # clipped groups: smaller scales


@pytest.mark.parametrize("spec", ["int4:g32:asym:mse", "int4:g32:mse"])
def test_static_mse_keeps_quantize_scales(spec: str) -> None:
    """Static act-order fixes every group's MSE scales and zero points from the original
    weights: exactly lowbit.quantize's, so the stored scales match round-to-nearest's and only
    the codes move; zero points stay in the int4 range."""
    rng = np.random.default_rng(23)
    W = _weights(rng, 16, 128).astype(np.float32)
    H = _hessian(rng, 500, 128)
    scheme = parse_action(spec)
    qt = gptq_quantize(W, H, scheme, act_order="static")
    rtn = lowbit.quantize(W, scheme)
    np.testing.assert_array_equal(qt.scale, rtn.scale)
    if rtn.zero_point is not None:
        np.testing.assert_array_equal(qt.zero_point, rtn.zero_point)
        assert qt.zero_point.min() >= -8 and qt.zero_point.max() <= 7
    assert not np.array_equal(qt.unpack(), rtn.unpack())
    assert qt.nbytes == rtn.nbytes and qt.scale.shape == rtn.scale.shape


@pytest.mark.parametrize("spec", ["int4:g32:asym:mse", "int4:g32:mse"])
def test_mse_gptq_lowers_output_error(spec: str) -> None:
    """With MSE scales too, GPTQ's layer-output error is far below round-to-nearest's (with
    the same MSE scales), on the calibration inputs and on held-out ones."""
    rng = np.random.default_rng(24)
    d = 128
    mix = rng.normal(size=(8, d))
    loud = rng.choice(d, 3, replace=False)

    W = _weights(rng, 48, d) * 0.05
    H, Htest = (hessian(loud_inputs(rng, 2048, mix, loud)) for _ in range(2))
    scheme = parse_action(spec)
    rtn = lowbit.quantize(W, scheme).dequantize(np.float64)
    for order in ("none", "static"):
        g = gptq_quantize(W, H, scheme, act_order=order).dequantize(np.float64)
        for h in (H, Htest):
            ratio = layer_error(W, g, h) / layer_error(W, rtn, h)
            assert ratio < 0.3, (order, ratio)
