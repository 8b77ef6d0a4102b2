"""GPTQ onto llama.cpp's block types (lowbit.methods._ggml_gptq, lowbit.ggml.grids): with no
error to move it writes llama-quantize's bytes; with a real Hessian it lowers the layer error."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from lowbit.errors import LowbitError
from lowbit.ggml import blocks, grids, legacy_blocks
from lowbit.methods._ggml_gptq import GgmlTarget
from lowbit.methods.gptq import GPTQ, layer_error

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "llamacpp" / "blocks"
MANIFEST = json.loads((FIXTURES / "manifest.json").read_text())
CASES = [o for o in MANIFEST["outputs"] if o["type"] in grids.GPTQ_TYPES]
_ROW_SIGMA = ("Q4_0", "Q4_1", "Q5_0", "Q5_1")  # importance weighted by the whole row's mean square


def _case(o: dict) -> tuple[np.ndarray, np.ndarray | None, bytes]:
    """The fixture's input, importance vector and bytes, cut to 512 columns where the bytes of
    a row's first blocks do not depend on the rest of the row."""
    x = np.load(FIXTURES / MANIFEST["inputs"][o["input"]]["file"]).astype(np.float32)
    im = None
    if o["imatrix"]:
        im = np.load(FIXTURES / MANIFEST["inputs"][o["input"]]["imatrix"]).astype(np.float32)
    want = np.frombuffer((FIXTURES / o["file"]).read_bytes(), np.uint8).reshape(x.shape[0], -1)
    cols = x.shape[1] if (o["imatrix"] and o["type"] in _ROW_SIGMA) else min(512, x.shape[1])
    want = want[:, : blocks.row_bytes(o["type"], cols)]
    return x[:, :cols], None if im is None else im[:cols], want.tobytes()


@pytest.mark.parametrize(
    "o", CASES, ids=[f"{o['input']}-{o['type']}-{'im' if o['imatrix'] else 'plain'}" for o in CASES]
)
def test_fitted_grids_give_llamacpp_bytes(o: dict) -> None:
    """Fitting each block, rounding it column by column and packing gives llama.cpp's bytes."""
    x, im, want = _case(o)
    t = blocks.TYPES[o["type"]]
    s2 = legacy_blocks.row_sigma2(x) if im is not None else None
    parts = []
    for k in range(x.shape[1] // t.block):
        xs = x[:, k * t.block : (k + 1) * t.block]
        fit = grids.fit_block(t.name, xs, None if im is None else im[k * t.block :][: t.block], s2)
        codes = [grids.round_columns(t.name, fit, j, xs[:, j : j + 1])[0] for j in range(t.block)]
        parts.append(grids.pack_block(t.name, fit, np.concatenate(codes, axis=1)))
    assert np.concatenate(parts, axis=1).tobytes() == want


@pytest.mark.parametrize(
    "o", CASES, ids=[f"{o['input']}-{o['type']}-{'im' if o['imatrix'] else 'plain'}" for o in CASES]
)
def test_diagonal_hessian_is_llama_quantize(o: dict) -> None:
    """With a diagonal Hessian no error moves: GPTQ writes llama.cpp's bytes, without
    importance (identity Hessian, importance off) and with it (the importance vector as the
    Hessian's diagonal, which GPTQ takes as its importance)."""
    x, im, want = _case(o)
    if x.shape[1] > 1024:  # whole rows of 1536 (the fitted-grid test has them): 15 s each
        pytest.skip("a 1536-column Hessian's factor is slow here; the grid test covers the row")
    if im is None:
        H, target = np.eye(x.shape[1]), GgmlTarget(o["type"], hessian_importance=False)
    else:
        H, target = np.diag(im.astype(np.float64)), GgmlTarget(o["type"])
    for order in ("none", "static"):
        qt = GPTQ(act_order=order).quantize(x, H, target)
        assert qt.qtype == o["type"] and qt.shape == x.shape
        assert qt.data.tobytes() == want, order
        np.testing.assert_array_equal(qt.dequantize(), blocks.dequantize(qt.data, o["type"]))


def _correlated(rows: int, cols: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A weight, inputs with correlated columns of unequal energy, and their Hessian."""
    rng = np.random.default_rng(seed)
    W = rng.standard_normal((rows, cols)) * 0.05
    mix = rng.standard_normal((cols, cols)) / np.sqrt(cols) + np.eye(cols)
    X = (rng.standard_normal((4 * cols, cols)) * rng.uniform(0.2, 3.0, cols)) @ mix
    return W, X, 2 * X.T @ X / X.shape[0]


@pytest.mark.parametrize("qtype", ["Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS", "IQ4_NL",
                                   "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"])  # fmt: skip
def test_gptq_lowers_the_layer_error(qtype: str) -> None:
    """On correlated inputs, ||(W - Q) X|| of GPTQ is below llama.cpp's rounding on the same
    type with the same importance (the Hessian's diagonal), for both column orders."""
    W, X, H = _correlated(64, 256, seed=1)
    target = GgmlTarget(qtype)
    rtn = target.rtn(W, H)
    base = np.linalg.norm((W - rtn) @ X.T)
    for order in ("none", "static"):
        qt = GPTQ(act_order=order).quantize(W, H, target)
        assert qt.data.shape == (64, blocks.row_bytes(qtype, 256))
        err = np.linalg.norm((W - qt.dequantize(np.float64)) @ X.T)
        assert err < 0.9 * base, (order, err, base)
        assert layer_error(W, qt.dequantize(), H) < layer_error(W, rtn, H)


def test_bad_targets() -> None:
    """A type without per-block scales, rows that are not whole blocks, a wrong-length
    importance vector: one LowbitError each."""
    with pytest.raises(LowbitError, match="TQ1_0"):
        GgmlTarget("TQ1_0")
    with pytest.raises(LowbitError, match="multiple"):
        GPTQ().quantize(np.ones((4, 96)), np.eye(96), GgmlTarget("Q4_K"))
    with pytest.raises(LowbitError, match="importance"):
        GPTQ().quantize(np.ones((4, 256)), np.eye(256), GgmlTarget("Q4_K", np.ones(7)))
