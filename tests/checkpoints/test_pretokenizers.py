"""GGUF tokenizers cut text as llama.cpp does (``tokenizer.ggml.pre``), or refuse the type."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from lowbit.checkpoints.gguf._pretokenizers import pre_tokenizer
from lowbit.errors import LowbitError

pytest.importorskip("tokenizers")
transformers = pytest.importorskip("transformers")
pytest.importorskip("torch")

from lowbit.checkpoints import open_checkpoint  # noqa: E402
from lowbit.checkpoints.tokenizer import build_tokenizer  # noqa: E402
from tiny_models import save_gguf, shipped_path, tiny_llama  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = "fixtures/smollm2-pydoc-topics-llamacpp-tokens"


def _fixture() -> Path:
    """llama.cpp's token ids: tests/fixtures in the repository (a copy of the shared fixture,
    so a fresh clone runs this test), else shared/ in the checkout or ../shared beside it."""
    for base in (ROOT / "tests", ROOT / "shared", ROOT / ".." / "shared"):
        if (base / f"{FIXTURE}.npy").is_file():
            return base / FIXTURE
    pytest.skip(f"{FIXTURE}.npy not found in {ROOT / 'shared'} or {ROOT.parent / 'shared'}")


def _pieces(pre: str | None, text: str) -> list[str]:
    return [p for p, _ in pre_tokenizer(pre).pre_tokenize_str(text)]


# ---- pre_tokenizer ------------------------------------------------------------------------


def test_smollm_splits_every_digit() -> None:
    """smollm (llama.cpp's SMOLLM): \\p{N} first, so each digit is its own piece; gpt-2 keeps
    a run of digits (with its leading space) together."""
    assert _pieces("smollm", "x 2024, y") == ["x", "Ġ", "2", "0", "2", "4", ",", "Ġy"]
    assert _pieces("gpt-2", "x 2024, y") == ["x", "Ġ2024", ",", "Ġy"]


def test_llama_bpe_groups_digits_in_threes() -> None:
    """llama-bpe (Llama 3): digits in runs of at most three, case-insensitive contractions."""
    assert _pieces("llama-bpe", "12345 DON'T") == ["123", "45", "ĠDON", "'T"]


def test_default_splits_punctuation_first() -> None:
    """default (no tokenizer.ggml.pre): punctuation runs are cut before GPT-2's expression."""
    assert _pieces(None, "a+=b 1234") == ["a", "+=", "b", "Ġ", "123", "4"]
    assert _pieces("default", "a+=b 1234") == _pieces(None, "a+=b 1234")  # absent: default


def test_unknown_type_is_refused() -> None:
    """A type lowbit does not implement is one LowbitError naming it and the known ones."""
    with pytest.raises(LowbitError, match=r"'qwen2'.*not implemented.*smollm"):
        pre_tokenizer("qwen2")


# ---- the tokenizer built from a GGUF ------------------------------------------------------


@pytest.fixture(scope="module")
def smollm2_tokenizer() -> Any:
    return build_tokenizer(open_checkpoint(shipped_path("smollm2")))


def test_smollm2_reproduces_llamacpp_tokens(smollm2_tokenizer: Any) -> None:
    """SmolLM2's GGUF tokenizer gives llama.cpp's 112,955 ids for the default text exactly."""
    from lowbit.evaluation.perplexity import default_text, tokenize

    base = _fixture()
    meta = json.loads(base.with_suffix(".json").read_text())
    _, text = default_text()
    if hashlib.sha256(text.encode()).hexdigest() != meta["text_sha256"]:
        pytest.skip(f"this Python's pydoc_data.topics is not the fixture's ({meta['python']})")
    want = np.load(base.with_suffix(".npy")).astype(np.int64)
    got = np.asarray(tokenize(smollm2_tokenizer, text), dtype=np.int64)
    assert len(want) == meta["tokens"] == 112_955
    assert len(got) == len(want)
    np.testing.assert_array_equal(got, want)


def test_unknown_pre_in_gguf_is_refused(tmp_path: Path) -> None:
    """A GGUF whose pre-tokenizer lowbit does not implement gets no tokenizer, with the reason."""
    path = save_gguf(tiny_llama(), tmp_path / "t.gguf", metadata={"tokenizer.ggml.pre": "qwen2"})
    with pytest.raises(LowbitError, match="'qwen2'"):
        build_tokenizer(open_checkpoint(path))


def test_compressed_tensors_tokenizer_json_carries_it(tmp_path: Path) -> None:
    """The tokenizer.json written into a compressed-tensors folder from a GGUF source splits
    as the GGUF's pre-tokenizer says (smollm: digit by digit) and gives the same ids."""
    from tokenizers import Tokenizer

    import lowbit
    from lowbit.plans.plan import PrecisionPlan

    src = save_gguf(tiny_llama(), tmp_path / "t.gguf", metadata={"tokenizer.ggml.pre": "smollm"})
    out = tmp_path / "ct"
    lowbit.quantize_model(
        src, PrecisionPlan.uniform("int8"), out, out_format="compressed-tensors", progress=False
    )
    written = Tokenizer.from_file(str(out / "tokenizer.json"))
    text = "year 2024: x'll 7 tt"
    assert written.pre_tokenizer.pre_tokenize_str(text) == pre_tokenizer("smollm").pre_tokenize_str(
        text
    )
    ours = build_tokenizer(open_checkpoint(src)).backend_tokenizer
    assert written.encode(text).ids == ours.encode(text).ids
    assert [t for t in written.encode("2024").tokens] == ["2", "0", "2", "4"]
