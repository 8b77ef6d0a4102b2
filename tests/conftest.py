"""Shared pytest configuration."""

from __future__ import annotations

import os

import numpy as np
import pytest

# Keep test runs reproducible and polite on the 2-core CI machine.
os.environ.setdefault("OMP_NUM_THREADS", "2")


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(20261130)
