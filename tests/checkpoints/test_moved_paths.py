"""The module paths documented before checkpoints/ was split by format keep working: each old
path warns once and is the very module at its new path; the names that became packages keep
their names without a warning."""

from __future__ import annotations

import importlib
import sys
import warnings

import pytest

from lowbit.checkpoints._moved import MOVED


@pytest.mark.parametrize("old", sorted(MOVED))
def test_old_path_warns_and_is_the_new_module(old: str) -> None:
    new = importlib.import_module(MOVED[old])
    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=MOVED[old].replace(".", r"\.")):
        module = importlib.import_module(old)
    assert module is new
    assert module.__spec__ is not None and module.__spec__.name == MOVED[old]


def test_packages_keep_their_documented_names() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        from lowbit.checkpoints.compressed_tensors import CTTensor, write_compressed_tensors
        from lowbit.checkpoints.lowbit_format import LowbitCheckpoint, write_lowbit_checkpoint

    assert CTTensor.__module__ == "lowbit.checkpoints.compressed_tensors.tensor"
    assert callable(write_compressed_tensors) and callable(write_lowbit_checkpoint)
    assert LowbitCheckpoint.__module__ == "lowbit.checkpoints.lowbit_format.checkpoint"


def test_quantize_model_is_the_function_not_a_module() -> None:
    """``from lowbit.checkpoints import quantize_model`` is the function even after the module
    that defines it was imported (it used to be that module)."""
    importlib.import_module("lowbit.checkpoints.streaming")
    from lowbit.checkpoints import quantize_model

    assert callable(quantize_model) and quantize_model.__name__ == "quantize_model"
