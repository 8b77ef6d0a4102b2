"""Shared pytest configuration."""

from __future__ import annotations

import os

import numpy as np
import pytest

import _kernel_switch

# Keep test runs reproducible and polite on the 2-core CI machine.
os.environ.setdefault("OMP_NUM_THREADS", "2")


def pytest_configure(config: pytest.Config) -> None:
    # make test's first pass: which tests read the kernel switch (tests/_kernel_switch.py)
    _kernel_switch.configure(config)


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(20261130)


@pytest.fixture(autouse=True, scope="session")
def _private_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Per-machine caches (the codec path choice) go to a temporary directory, not the
    user's cache directory."""
    os.environ["LOWBIT_CACHE_DIR"] = str(tmp_path_factory.mktemp("lowbit-cache"))
