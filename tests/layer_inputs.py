"""Inputs of a linear layer as calibrated methods see them, and the layers order's reference
check, shared by the GPTQ tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np


def loud_inputs(
    rng: np.random.Generator, n: int, mix: np.ndarray, loud: np.ndarray, noise: float = 0.5
) -> np.ndarray:
    """``n`` input rows: a low-rank mix (``mix``: rank x width) plus noise, the ``loud``
    channels 4x louder (as LLM activations have a few)."""
    X = rng.normal(size=(n, mix.shape[0])) @ mix + noise * rng.normal(size=(n, mix.shape[1]))
    X[:, loud] *= 4.0
    return X


def hessian(X: np.ndarray) -> np.ndarray:
    """GPTQ's ``2 XᵀX / n``."""
    return 2.0 * X.T @ X / X.shape[0]


def assert_groups_match_alone(
    run: Any,
    source: Path,
    calib: Any,
    prefix: str,
    block: int,
    groups: list[tuple[str, ...]],
    tmp_path: Path,
) -> None:
    """The layers order's reference: for each group of block ``block`` (module paths under
    ``f"{prefix}{block}."``), a ``blocks`` GPTQ of that group alone (int4:g32), on a copy of
    the model holding ``run``'s weights for every group before it and every earlier block,
    gives ``run``'s codes and scales."""
    from lowbit.calibration.gptq import gptq_weights
    from lowbit.checkpoints import open_checkpoint
    from lowbit.methods.gptq import GPTQ
    from lowbit.models.build import build_model
    from lowbit.plans.plan import PrecisionPlan
    from tiny_models import save_hf_folder

    ckpt = open_checkpoint(source)
    pre = f"{prefix}{block}."
    earlier = {
        n: qt.dequantize()
        for n, qt in run.weights.items()
        if any(f"{prefix}{b}." in n for b in range(block))
    }
    blocks = GPTQ(sequential="blocks")
    for g, group in enumerate(groups):
        done = dict(earlier)
        for prev in groups[:g]:
            done |= {
                pre + m + ".weight": run.weights[pre + m + ".weight"].dequantize() for m in prev
            }
        folder = save_hf_folder(build_model(ckpt, weights=done), tmp_path / f"b{block}g{g}")
        only = PrecisionPlan.uniform(
            "keep", rules=[{"match": pre + m + ".weight", "format": "int4:g32"} for m in group]
        )
        ref = gptq_weights(folder, only, calib, blocks, progress=False)
        assert ref.sequential == "blocks"
        assert set(ref.weights) == {pre + m + ".weight" for m in group}
        for name, qt in ref.weights.items():
            np.testing.assert_array_equal(qt.codes, run.weights[name].codes, err_msg=name)
            np.testing.assert_array_equal(qt.scale, run.weights[name].scale, err_msg=name)


def correlated(
    seed: int, rows: int = 24, cols: int = 512, n: int = 2048
) -> tuple[np.ndarray, np.ndarray]:
    """A weight, and the Hessian ``2 X^T X / n`` of inputs whose columns are correlated and
    of unequal scale (as a layer's activations): the i-quant GPTQ tests' layer."""
    rng = np.random.default_rng(seed)
    W = rng.standard_normal((rows, cols)).astype(np.float32)
    mix = rng.standard_normal((cols, cols)) / np.sqrt(cols)
    X = rng.standard_normal((n, cols)) @ (np.eye(cols) + 0.9 * mix)
    X *= rng.uniform(0.3, 3.0, cols)
    return W, 2 * X.T @ X / n
