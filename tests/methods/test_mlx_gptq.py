"""GPTQ onto MLX's affine grid (lowbit.methods._mlx_gptq): mx.quantize's bytes when nothing
moves, less output error than round to nearest when something does."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from lowbit.calibration._memory import SpilledTensors
from lowbit.errors import LowbitError
from lowbit.methods._mlx_gptq import MLXQuantized, MLXTarget
from lowbit.methods.gptq import GPTQ, layer_error
from lowbit.quant import mlx as Q

DT = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}


@pytest.mark.parametrize("dtype", list(DT))
@pytest.mark.parametrize(("bits", "group"), [(4, 64), (3, 32), (8, 128), (1, 32), (6, 64)])
@pytest.mark.parametrize("act_order", ["static", "none"])
def test_diagonal_hessian_gives_mlx_bytes(
    dtype: str, bits: int, group: int, act_order: str
) -> None:
    """With a diagonal Hessian no error moves: words, scales and biases are mx.quantize's of
    the weight in the model dtype (lowbit.quant.mlx, byte-identical to it)."""
    rng = np.random.default_rng(bits * 7 + group)
    W = (rng.standard_t(3, (24, 256)) * 0.05).astype(np.float32)
    H = np.diag(rng.uniform(0.5, 2.0, 256))
    got = GPTQ(act_order=act_order).quantize(W, H, MLXTarget(bits, group, dtype))
    words, scales, biases = Q.quantize(W.astype(DT[dtype]), group_size=group, bits=bits)
    assert got.words.tobytes() == words.tobytes()
    assert got.scales.dtype == scales.dtype and got.scales.tobytes() == scales.tobytes()
    assert got.biases.tobytes() == biases.tobytes()


def test_less_output_error_than_round_to_nearest() -> None:
    """Correlated inputs with outlier channels: GPTQ's tr(dW H dW^T) is below MLX's RTN's."""
    rng = np.random.default_rng(5)
    W = rng.standard_normal((64, 256)).astype(np.float32) * 0.05
    X = rng.standard_normal((4096, 256)) @ (np.eye(256) + 0.3 * rng.standard_normal((256, 256)))
    X[:, :8] *= 10
    H = 2 * X.T @ X / len(X)
    for bits, group in ((3, 64), (4, 32)):
        t = MLXTarget(bits, group, "float16")
        q = GPTQ().quantize(W, H, t)
        assert layer_error(W, q.dequantize(), H) < 0.8 * layer_error(W, t.rtn(W, H), H)


def test_spills_and_reads_back() -> None:
    """MLXQuantized goes through the whole-model run's spill to disk bit for bit."""
    W = np.random.default_rng(1).standard_normal((8, 64)).astype(np.float32)
    q = GPTQ().quantize(W, np.eye(64), MLXTarget(5, 32, "bfloat16"))
    store = SpilledTensors()
    store["w"] = q
    back = store["w"]
    assert isinstance(back, MLXQuantized) and back.scales.dtype == ml_dtypes.bfloat16
    assert back.dequantize().tobytes() == q.dequantize().tobytes()
    assert back.shape == (8, 64) and back.nbytes == q.nbytes


def test_bad_targets() -> None:
    """Bits, groups and dtypes MLX does not hold; rows that are not whole groups."""
    for kw, msg in [({"bits": 7}, "bits"), ({"group_size": 16}, "groups"),
                    ({"dtype": "float64"}, "dtype")]:  # fmt: skip
        with pytest.raises(LowbitError, match=msg):
            MLXTarget(**kw)
    with pytest.raises(LowbitError, match="do not divide rows of 96"):
        GPTQ().quantize(np.zeros((4, 96), np.float32), np.eye(96), MLXTarget(4, 64))


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize(("bits", "group"), [(4, 64), (3, 32), (2, 64), (8, 128)])
def test_searched_grid_never_worse_than_the_edge_rule(dtype: str, bits: int, group: int) -> None:
    """With a diagonal Hessian (nothing moves) the searched scales and biases are each row's
    least weighted error among candidates that include the edge rule's: every group's
    weighted error, decoded as MLX decodes (model-dtype scale and bias), is at most
    mx.quantize's, and lower in total on heavy-tailed rows."""
    rng = np.random.default_rng(bits + group)
    W = (rng.standard_t(3, (32, 256)) * 0.05).astype(np.float32)
    d = rng.uniform(0.1, 3.0, 256)
    H = np.diag(d)
    edge = GPTQ().quantize(W, H, MLXTarget(bits, group, dtype))
    got = GPTQ().quantize(W, H, MLXTarget(bits, group, dtype, search=True))
    assert got.scales.dtype == edge.scales.dtype and got.words.shape == edge.words.shape
    Wd = W.astype(DT[dtype]).astype(np.float64)
    e_edge = ((edge.dequantize(np.float64) - Wd) ** 2 * d).reshape(32, -1, group).sum(-1)
    e_got = ((got.dequantize(np.float64) - Wd) ** 2 * d).reshape(32, -1, group).sum(-1)
    assert np.all(e_got <= e_edge * (1 + 1e-6) + 1e-12)
    assert e_got.sum() < (0.98 if bits < 8 else 1.0 + 1e-9) * e_edge.sum()


def test_searched_grid_lowers_gptq_output_error() -> None:
    """Correlated inputs: GPTQ with searched group grids (the Hessian's diagonal as weights)
    has less output error than with MLX's edge rule, at 4 and 3 bits."""
    rng = np.random.default_rng(7)
    W = rng.standard_t(4, (64, 256)).astype(np.float32) * 0.05
    X = rng.standard_normal((4096, 256)) @ (np.eye(256) + 0.3 * rng.standard_normal((256, 256)))
    X[:, :8] *= 10
    H = 2 * X.T @ X / len(X)
    for bits in (4, 3):
        edge = GPTQ().quantize(W, H, MLXTarget(bits, 64, "bfloat16"))
        searched = GPTQ().quantize(W, H, MLXTarget(bits, 64, "bfloat16", search=True))
        assert layer_error(W, searched.dequantize(), H) < 0.95 * layer_error(
            W, edge.dequantize(), H
        )


def test_searched_grid_decodes_as_mlx_decodes() -> None:
    """The searched scales and biases (negative ones included) are plain MLX tensors:
    ``mx.dequantize`` of the words, scales and biases gives the values lowbit decodes."""
    mx = pytest.importorskip("mlx.core", reason="mlx[cpu] is not installed")
    rng = np.random.default_rng(3)
    W = rng.standard_t(3, (16, 128)).astype(np.float32)
    q = GPTQ().quantize(W, np.eye(128), MLXTarget(3, 64, "float16", search=True))
    got = mx.dequantize(mx.array(q.words), mx.array(q.scales), mx.array(q.biases),
                        group_size=64, bits=3)  # fmt: skip
    assert np.array(got).astype(np.float32).tobytes() == q.dequantize(np.float32).tobytes()
