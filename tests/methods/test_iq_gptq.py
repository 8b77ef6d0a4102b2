"""GPTQ onto llama.cpp's lattice i-quants (lowbit.methods._iq_gptq): bytes gguf-py decodes as
lowbit does, sign parity on every group, the codec's codes back from its own values, and lower
layer error than llama.cpp's rounding."""

from __future__ import annotations

import numpy as np
import pytest

from layer_inputs import correlated as _correlated
from lowbit.errors import LowbitError
from lowbit.ggml import blocks, iq_lattice
from lowbit.methods._ggml_gptq import GgmlTarget
from lowbit.methods._iq_gptq import LATTICE_TYPES, block_scales, round_group, solve_lattice
from lowbit.methods.gptq import GPTQ, layer_error

PARITY = ("IQ2_XXS", "IQ2_XS", "IQ3_XXS")


@pytest.fixture(scope="module")
def solved() -> dict[str, tuple[np.ndarray, np.ndarray, object]]:
    """Each type's weight, Hessian and GPTQ result (static act-order, diag(H) as importance)."""
    W, H = _correlated(0)
    return {t: (W, H, GPTQ().quantize(W, H, GgmlTarget(t))) for t in LATTICE_TYPES}


@pytest.mark.parametrize("qtype", LATTICE_TYPES)
def test_gguf_py_decodes_the_blocks_as_lowbit(qtype: str, solved) -> None:
    """gguf-py's dequantize of GPTQ's bytes equals lowbit's, bit for bit."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    W, _, q = solved[qtype]
    assert q.qtype == qtype and q.data.shape == (W.shape[0], blocks.row_bytes(qtype, W.shape[1]))
    theirs = dequantize(q.data, GGMLQuantizationType[qtype]).astype(np.float32)
    assert theirs.tobytes() == q.dequantize().tobytes()


@pytest.mark.parametrize("qtype", PARITY)
def test_every_sign_group_has_even_parity(qtype: str, solved) -> None:
    """Every group of 8 decoded values holds an even number of negatives (the 7 stored sign
    bits decode to the signs GPTQ chose), and no value is zero on a scaled block."""
    _, _, q = solved[qtype]
    v = q.dequantize().reshape(-1, 8)
    assert (v != 0).all()
    assert ((v < 0).sum(axis=1) % 2 == 0).all()


@pytest.mark.parametrize("qtype", LATTICE_TYPES)
def test_codec_values_round_back_to_the_codec_codes(qtype: str) -> None:
    """With llama.cpp's own scales, its decoded values (zero error) round to its own codes."""
    rng = np.random.default_rng(1)
    X = rng.standard_normal((32, 256)).astype(np.float32)
    im = rng.uniform(0.5, 2.0, 256).astype(np.float32)
    qw = np.ascontiguousarray(np.broadcast_to(im, X.shape))
    fit = iq_lattice.fit_lattice(qtype, X, qw)
    W = blocks.dequantize(blocks.quantize(X, qtype, imatrix=im), qtype).reshape(X.shape)
    db = block_scales(qtype, fit["d"], fit["ls"])
    dims = 256 // fit["gi"].shape[1]
    blk = 256 // db.shape[1]
    for g in range(32):
        gi, bits, vals = round_group(qtype, db[:, 8 * g // blk], W[:, 8 * g : 8 * g + 8], np.eye(8))
        assert np.array_equal(gi, fit["gi"][:, 8 * g // dims : 8 * (g + 1) // dims])
        assert np.array_equal(bits, fit["signs"][:, g])
        assert vals.tobytes() == W[:, 8 * g : 8 * g + 8].tobytes()


@pytest.mark.parametrize("qtype", LATTICE_TYPES)
def test_diagonal_hessian_no_worse_than_llamacpp(qtype: str) -> None:
    """With a diagonal Hessian (no error to move; its diagonal the importance) GPTQ keeps
    llama.cpp's scales and takes the nearest point: its weighted error is at most llama.cpp's."""
    rng = np.random.default_rng(2)
    W = rng.standard_normal((32, 512)).astype(np.float32)
    im = rng.uniform(0.5, 2.0, 512).astype(np.float32)
    H = np.diag(im.astype(np.float64))
    q = GPTQ(damp=0.0, act_order="none").quantize(W, H, GgmlTarget(qtype, im))
    rtn = blocks.dequantize(blocks.quantize(W, qtype, imatrix=im), qtype).reshape(W.shape)
    assert layer_error(W, q.dequantize(), H) <= layer_error(W, rtn, H)


@pytest.mark.parametrize("qtype", LATTICE_TYPES)
def test_correlated_hessian_lowers_layer_error(qtype: str, solved) -> None:
    """On correlated inputs GPTQ's ``tr(E H E^T)`` is well below llama.cpp's rounding (with
    diag(H) as its importance): measured 0.50-0.58 of it, asserted below 0.85."""
    W, H, q = solved[qtype]
    im = np.diag(H).astype(np.float32)
    rtn = blocks.dequantize(blocks.quantize(W, qtype, imatrix=im), qtype).reshape(W.shape)
    assert layer_error(W, q.dequantize(), H) < 0.85 * layer_error(W, rtn, H)


def test_act_order_none_also_decodes_and_improves() -> None:
    """Columns in order, each super-block's scales fitted as the walk reaches it."""
    W, H = _correlated(3, cols=512)
    q = GPTQ(act_order="none").quantize(W, H, GgmlTarget("IQ3_XXS"))
    im = np.diag(H).astype(np.float32)
    rtn = blocks.dequantize(blocks.quantize(W, "IQ3_XXS", imatrix=im), "IQ3_XXS").reshape(W.shape)
    assert layer_error(W, q.dequantize(), H) < 0.85 * layer_error(W, rtn, H)


def test_refusals() -> None:
    """TQ2_0 has no walk; IQ2_XXS needs an importance vector; rows must be whole 256-blocks."""
    with pytest.raises(LowbitError, match="TQ2_0"):
        GgmlTarget("TQ2_0")
    W, H = _correlated(4, rows=4, cols=256, n=512)
    with pytest.raises(LowbitError, match="importance"):
        GPTQ().quantize(W, H, GgmlTarget("IQ2_XXS", hessian_importance=False))
    with pytest.raises(LowbitError, match="256"):
        GPTQ().quantize(W[:, :128], H[:128, :128], GgmlTarget("IQ3_S"))


@pytest.mark.parametrize("qtype", ["IQ2_XXS", "IQ3_S", "IQ1_S", "IQ1_M"])
def test_refit_of_d_never_raises_the_error(qtype: str) -> None:
    """The super-block scales refitted to the chosen codes: layer error at most the walk's."""
    W, H = _correlated(5, rows=16, cols=512, n=1024)
    target = GgmlTarget(qtype, np.diag(H).astype(np.float32))
    err = []
    for refit in (False, True):
        data = solve_lattice(W.astype(np.float64), H, target, 0.01, True, refit)
        err.append(layer_error(W, blocks.dequantize(data, qtype).reshape(W.shape), H))
    assert err[1] <= err[0]
