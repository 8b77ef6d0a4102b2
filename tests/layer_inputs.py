"""Inputs of a linear layer as calibrated methods see them, shared by the GPTQ tests."""

from __future__ import annotations

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
