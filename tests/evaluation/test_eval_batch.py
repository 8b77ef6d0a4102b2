"""Batched windows in causal-LM evaluation: the same numbers as one window per forward (to the
last bits a batched GEMM may change), the same windows and facts, a batch the memory cap
bounds, and bad batch values refused."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from lowbit.cli import main
from lowbit.errors import LowbitError

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.torch

from lowbit.evaluation.perplexity import (  # noqa: E402
    DEFAULT_BATCH,
    MAX_LOGITS_BYTES,
    _batches,
    _windows,
    batch_size,
    perplexity,
)
from lowbit.evaluation.variants import Variant, compare_causal, evaluate_variants  # noqa: E402
from tiny_models import (  # noqa: E402
    VOCAB,
    byte_fast_tokenizer,
    perturbed,
    save_hf_folder,
    tiny_llama,
)

# 300 tokens in windows of 48: six full windows and a last one of 12 tokens (stride 24: eleven
# full ones and a last of 36), so batches of 4 or 5 leave a short full-length batch too
TOKENS, WINDOW = 300, 48
# a batched forward runs GEMMs of other shapes, whose blocking may change the last bits of the
# logits. Measured here (AMD EPYC with AVX-512, torch on one thread): the same bits at every
# batch, on this tiny llama and on SmolLM2 (docs/benchmarks.md); 1e-5 is the stated tolerance
# for other kernel paths, and wrong windows or offsets move these numbers by far more.
RTOL = 1e-5
FACTS = ("text", "text_tokens", "tokens", "scored", "window", "stride", "windows", "bos", "dtype")


def _text() -> str:
    words = "river stone cloud garden lantern harbor meadow signal copper violet winter".split()
    return " ".join(
        f"The {words[i % 11]} keeps {i} quiet {words[(i * 7) % 11]}s." for i in range(60)
    )


@pytest.fixture(scope="module")
def models() -> tuple[Any, Any, Any]:
    ref = tiny_llama()
    return ref, perturbed(ref, 0.02, 1), byte_fast_tokenizer()


def _forward_batches(model: Any) -> tuple[list[tuple[int, ...]], Any]:
    """Record the input_ids shape of every forward of ``model``."""
    shapes: list[tuple[int, ...]] = []

    def hook(_module: Any, _args: Any, kwargs: dict[str, Any]) -> None:
        shapes.append(tuple(kwargs["input_ids"].shape))

    return shapes, model.register_forward_pre_hook(hook, with_kwargs=True)


# ------------------------------------------------------------------------ windows


@pytest.mark.parametrize(("stride", "size"), [(48, 4), (48, 5), (24, 4), (48, 1), (48, 100)])
def test_batches_group_windows_of_one_length(stride: int, size: int) -> None:
    """Batches keep window order, hold at most ``size`` windows of one length, and the last,
    shorter window of the text goes on its own."""
    spans = _windows(TOKENS, WINDOW, stride)
    groups = _batches(spans, size)
    assert [s for g in groups for s in g] == spans
    assert all(1 <= len(g) <= size and len({e - b for b, e, _ in g}) == 1 for g in groups)
    assert spans[-1][1] - spans[-1][0] < WINDOW and groups[-1] == [spans[-1]]
    full = len(spans) - 1
    assert len(groups) == -(-full // size) + 1  # as few forwards as the size allows


# --------------------------------------------------------------------- batch size


class _Config:
    vocab_size = 49_152  # SmolLM2's


class _NoHead:
    config = _Config()


def test_batch_size_from_the_memory_cap() -> None:
    """The cap on float32 logits picks fewer windows: SmolLM2's 512-token windows are 96 MiB
    each, so 1 GiB holds 10 (5 when a reference's logits are held too)."""
    smol = _NoHead()
    assert MAX_LOGITS_BYTES == 2**30
    assert batch_size(smol, 512, 16) == 10 and batch_size(smol, 512, 16, models=2) == 5
    assert batch_size(smol, 512, 4) == 4 and batch_size(smol, 2048, 4) == 2
    assert batch_size(smol, 512, 8, max_logits_bytes=512 * 49_152 * 4 * 3 - 1) == 2
    assert batch_size(smol, 512, 8, max_logits_bytes=1) == 1  # never below one window
    assert batch_size(object(), 512, 8) == 1  # no vocabulary to size the logits by
    model = tiny_llama()  # the output embeddings' rows give the width
    per_window = WINDOW * VOCAB * 4
    assert batch_size(model, WINDOW, 8, max_logits_bytes=3 * per_window) == 3
    assert batch_size(model, WINDOW, 8, max_logits_bytes=3 * per_window, models=2) == 1


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2", None])
def test_batch_size_refuses_bad_values(bad: Any) -> None:
    """batch (and the cap) must be positive integers: anything else is one LowbitError."""
    with pytest.raises(LowbitError, match="batch must be a positive integer"):
        batch_size(_NoHead(), 512, bad)
    with pytest.raises(LowbitError, match="max_logits_bytes must be a positive integer"):
        batch_size(_NoHead(), 512, 2, max_logits_bytes=bad)


# --------------------------------------------------------------------- perplexity


@pytest.mark.parametrize("stride", [None, 24])
@pytest.mark.parametrize("batch", [2, 4, 5, 64])
def test_batched_perplexity_equals_unbatched(models: Any, stride: int | None, batch: int) -> None:
    """perplexity() with B windows per forward: the same windows, facts and top-1 agreement,
    nll/perplexity/KL within the stated tolerance, and fewer forwards."""
    ref, model, tok = models
    kw = {"window": WINDOW, "stride": stride, "max_tokens": TOKENS, "threads": 1}
    one = perplexity(model, tok, _text(), reference=ref, batch=1, progress=False, **kw)
    shapes, handle = _forward_batches(model)
    try:
        many = perplexity(model, tok, _text(), reference=ref, batch=batch, progress=False, **kw)
    finally:
        handle.remove()
    assert {k: many[k] for k in FACTS} == {k: one[k] for k in FACTS}
    assert one["batch"] == 1 and many["batch"] == batch
    spans = _windows(TOKENS, WINDOW, stride or WINDOW)
    assert shapes == [(len(g), g[0][1] - g[0][0]) for g in _batches(spans, batch)]
    assert len(shapes) < len(spans) and shapes[-1] == (1, spans[-1][1] - spans[-1][0])
    for key in ("perplexity", "nll", "reference_perplexity", "kl_mean", "kl_max"):
        assert many[key] == pytest.approx(one[key], rel=RTOL, abs=1e-9), key
    assert many["top1_agreement"] == one["top1_agreement"]
    assert one["kl_mean"] > 1e-4  # the variant differs: KL is compared on a real number


def test_perplexity_batch_capped_and_refused(models: Any) -> None:
    """The cap lowers the batch perplexity() reports (the model's and the reference's logits
    count together); a bad batch is a LowbitError before any forward."""
    ref, model, tok = models
    per_window = WINDOW * VOCAB * 4
    kw = {"window": WINDOW, "max_tokens": TOKENS, "threads": 1, "progress": False}
    got = perplexity(model, tok, _text(), batch=8, max_logits_bytes=3 * per_window, **kw)
    assert got["batch"] == 3
    got = perplexity(
        model, tok, _text(), reference=ref, batch=8, max_logits_bytes=3 * per_window, **kw
    )
    assert got["batch"] == 1
    assert perplexity(model, tok, _text(), **kw)["batch"] == DEFAULT_BATCH
    for bad in (0, -2, 2.0):
        with pytest.raises(LowbitError, match="batch"):
            perplexity(model, tok, _text(), batch=bad, **kw)


# ------------------------------------------------------------ variants against the original


@pytest.mark.parametrize("batch", [3, 4])
def test_batched_compare_causal(models: Any, batch: int) -> None:
    """compare_causal with B windows per forward: within the tolerance of one window per
    forward, and bit for bit perplexity()'s numbers at the same batch (simulated int8
    activations included, so the activation hooks wrap the batched forward)."""
    from lowbit.models.activations import simulate_activations

    ref, model, tok = models
    variants = [
        Variant("original", "", ref),
        Variant("a", "", model),
        Variant("a+int8", "", model, activations="int8"),
    ]
    kw = {"window": WINDOW, "max_tokens": TOKENS, "threads": 1, "progress": False}
    m1, one = compare_causal(variants[:2], ref, tok, _text(), batch=1, **kw)
    mb, many = compare_causal(variants, ref, tok, _text(), batch=batch, **kw)
    assert {k: mb[k] for k in FACTS} == {k: m1[k] for k in FACTS}
    assert (m1["batch"], mb["batch"]) == (1, batch)
    for a, b in zip(one, many[:2], strict=True):
        for key in ("perplexity", "nll", "kl_mean", "kl_max"):
            assert b[key] == pytest.approx(a[key], rel=RTOL, abs=1e-9), key
        assert b["top1_agreement"] == a["top1_agreement"]
    assert many[0]["kl_mean"] == 0 and many[0]["top1_agreement"] == 1
    for v, row in zip(variants, many, strict=True):
        if v.activations:
            with simulate_activations(v.model, "int8"):
                want = perplexity(v.model, tok, _text(), reference=ref, batch=batch, **kw)
        else:
            want = perplexity(v.model, tok, _text(), reference=ref, batch=batch, **kw)
        for key in ("perplexity", "nll", "kl_mean", "kl_max", "top1_agreement"):
            assert row[key] == want[key], (v.name, key)
    assert many[2]["nll"] != many[1]["nll"]


# --------------------------------------------------------------------------------- CLI


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("batch")
    (root / "text.txt").write_text(_text())
    return save_hf_folder(tiny_llama(), root / "tiny")


@pytest.mark.parametrize("bad", ["0", "-3", "1.5", "two", ""])
def test_cli_bad_batch_is_one_line(
    folder: Path, capsys: pytest.CaptureFixture[str], bad: str
) -> None:
    """lowbit eval --batch with 0, a negative, a non-integer: exit 2, one error line."""
    assert main(["eval", str(folder), "--schemes", "none", f"--batch={bad}"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert "--batch must be a positive integer" in err, err


def test_cli_batch_recorded_and_equal(folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """lowbit eval --batch 2 --json records the batch used and gives unbatched numbers to the
    tolerance; the table's line says the windows per forward; --help explains the option."""
    import json

    argv = ["eval", str(folder), "--schemes", "int4:g32", "--tokens", "140", "--window", "40",
            "--text", str(folder.parent / "text.txt"), "--threads", "1"]  # fmt: skip
    docs = {}
    for b in ("1", "2"):
        assert main([*argv, "--batch", b, "--json"]) == 0
        docs[b] = json.loads(capsys.readouterr().out)
    one, two = docs["1"], docs["2"]
    assert one["measured"]["batch"] == 1 and two["measured"]["batch"] == 2
    assert one["measured"]["windows"] == two["measured"]["windows"] == 4  # 3 x 40 + 20
    for a, b in zip(one["rows"], two["rows"], strict=True):
        assert a["name"] == b["name"]
        assert b["perplexity"] == pytest.approx(a["perplexity"], rel=RTOL)
        assert b["kl_mean"] == pytest.approx(a["kl_mean"], rel=RTOL, abs=1e-9)
    assert main([*argv, "--batch", "2", "--no-progress"]) == 0
    assert "2 windows per forward" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["eval", "--help"])
    assert "--batch N" in capsys.readouterr().out


def test_evaluate_variants_refuses_bad_batch_before_loading(tmp_path: Path) -> None:
    """A bad batch fails before any model is read (the model path does not even exist)."""
    with pytest.raises(LowbitError, match="batch must be a positive integer"):
        evaluate_variants(tmp_path / "missing", [], ["int8:ch"], batch=0)
