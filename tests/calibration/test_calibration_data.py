"""lowbit.calibration.data: calibration data never overlaps what lowbit eval measures;
Hessians are 2 X^T X / n of the tokens that count, shared by layers reading one input."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.torch

from lowbit import LowbitError  # noqa: E402
from lowbit.calibration.data import (  # noqa: E402
    DEFAULT_START,
    Calibration,
    decoder_windows,
    encoder_texts,
)
from lowbit.calibration.hessians import HessianCollector  # noqa: E402
from lowbit.checkpoints import open_checkpoint  # noqa: E402
from lowbit.checkpoints.tokenizer import build_tokenizer  # noqa: E402
from lowbit.evaluation.perplexity import (  # noqa: E402
    _tokens_and_windows,
    default_text,
    sentences_from_text,
    tokenize,
)
from lowbit.evaluation.variants import DEFAULT_SENTENCES, DEFAULT_TOKENS  # noqa: E402
from tiny_models import byte_tokenizer_json, shipped_path  # noqa: E402


def _byte_tokenizer() -> Any:
    from tokenizers import Tokenizer

    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(byte_tokenizer_json()), pad_token="<pad>"
    )


def _eval_positions(tok: Any, tokens: int) -> tuple[list[int], set[int]]:
    """Every token id of the default text, and the positions lowbit eval's windows read."""
    _, _, ids, _, spans = _tokens_and_windows(tok, None, None, 512, None, tokens)
    all_ids = tokenize(tok, default_text()[1])
    assert ids == all_ids[: len(ids)]  # positions count the same tokens
    return all_ids, {p for b, e, _ in spans for p in range(b, e)}


def _window_positions(all_ids: list[int], windows: list[list[int]], start: int) -> set[int]:
    """Positions of consecutive windows from ``start`` (checked against the token ids)."""
    pos: set[int] = set()
    at = start
    for w in windows:
        assert all_ids[at : at + len(w)] == w
        pos.update(range(at, at + len(w)))
        at += len(w)
    return pos


@pytest.mark.parametrize("tokens", [DEFAULT_TOKENS, 16_384, 40_000])
def test_decoder_calibration_never_overlaps_evaluation(tokens: int) -> None:
    """The default windows start at token 32,768, after what eval scores by default (4,096;
    perplexity()'s 16,384); an evaluation of more tokens pushes them further (``avoid``)."""
    tok = _byte_tokenizer()
    all_ids, evaluated = _eval_positions(tok, tokens)
    wins = decoder_windows(tok, Calibration(samples=6, length=300), avoid=tokens)
    start = max(DEFAULT_START, tokens)
    calibrated = _window_positions(all_ids, wins, start)
    assert len(wins) == 6 and len(calibrated) == 1800
    assert max(evaluated) < start == min(calibrated)
    assert not evaluated & calibrated


def test_default_calibration_fits_smollm2() -> None:
    """SmolLM2's tokenizer gives room for the default 128 x 512 after token 32,768 (no
    warning), and none of it is in the 16,384 tokens the issue's benchmarks score."""
    tok = build_tokenizer(open_checkpoint(shipped_path("smollm2")))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        wins = decoder_windows(tok, Calibration())
    all_ids, evaluated = _eval_positions(tok, 16_384)
    assert len(wins) == 128 and {len(w) for w in wins} == {512}
    assert not evaluated & _window_positions(all_ids, wins, DEFAULT_START)


def test_text_files_start_at_zero_and_warn_when_short(tmp_path: Path) -> None:
    """A .txt source is read from its first token; fewer windows than asked warn and use
    what fits; none at all is an error."""
    f = tmp_path / "c.txt"
    f.write_text("abcdefghij" * 25)  # 250 byte tokens
    tok = _byte_tokenizer()
    wins = decoder_windows(tok, Calibration(source=str(f), samples=2, length=100))
    assert wins == [tokenize(tok, f.read_text())[:100], tokenize(tok, f.read_text())[100:200]]
    with pytest.warns(UserWarning, match="room for 2 windows"):
        assert len(decoder_windows(tok, Calibration(source=str(f), samples=5, length=100))) == 2
    with pytest.raises(LowbitError, match="no room"):
        decoder_windows(tok, Calibration(source=str(f), length=300))


def test_jsonl_records(tmp_path: Path) -> None:
    """A .jsonl source gives one sample per record (strings or {"text": ...}), truncated to
    the window; bad lines are named."""
    f = tmp_path / "c.jsonl"
    f.write_text('"hello world"\n\n{"text": "second record here", "id": 2}\n"x"\n')
    tok = _byte_tokenizer()
    wins = decoder_windows(tok, Calibration(source=str(f), samples=2, length=5))
    assert wins == [tokenize(tok, "hello world")[:5], tokenize(tok, "second record here")[:5]]
    assert encoder_texts(Calibration(source=str(f))) == ["hello world", "second record here", "x"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('"ok"\n{"id": 3}\n')
    with pytest.raises(LowbitError, match=r"bad.jsonl:2"):
        encoder_texts(Calibration(source=str(bad)))
    bad.write_text("{not json\n")
    with pytest.raises(LowbitError, match="not JSON"):
        encoder_texts(Calibration(source=str(bad)))


@pytest.mark.parametrize("n_eval", [DEFAULT_SENTENCES, 500])
def test_encoder_calibration_never_overlaps_evaluation(n_eval: int) -> None:
    """Encoder calibration texts are sentences the evaluation (same n and seed) never draws."""
    text = default_text()[1]
    measured = sentences_from_text(text, n_eval, seed=0)
    calib = encoder_texts(Calibration(), exclude=measured)
    assert len(calib) == 256 == len(set(calib))
    assert not set(calib) & set(measured)
    assert calib == encoder_texts(Calibration(), exclude=measured)  # deterministic
    assert calib != encoder_texts(Calibration(seed=1), exclude=measured)


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"source": "data.csv"}, "txt"),
        ({"source": "missing.txt"}, "no such file"),
        ({"samples": 0}, "samples"),
        ({"length": -3}, "length"),
        ({"start": -1}, "start"),
    ],
)
def test_bad_calibration(kw: dict[str, Any], match: str) -> None:
    """Bad sources and sizes are LowbitErrors naming them."""
    with pytest.raises(LowbitError, match=match):
        Calibration(**kw)


def test_describe() -> None:
    """The words a report prints."""
    assert Calibration(samples=32).describe("causal-lm") == (
        "32 x 512 tokens of the default text from token 32,768"
    )
    assert Calibration().describe("encoder") == "256 texts of the default text"


# ---- Hessians -------------------------------------------------------------------------------


class _Toy(torch.nn.Module):
    """q and k read the same tensor; o reads another."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.q = torch.nn.Linear(6, 4)
        self.k = torch.nn.Linear(6, 3)
        self.o = torch.nn.Linear(4, 5)

    def forward(self, x: Any) -> Any:
        return self.o(self.q(x) * self.k(x).sum(-1, keepdim=True))


def test_hessians_of_real_tokens() -> None:
    """H = 2 X^T X / n over the unmasked tokens of every pass; q and k share theirs."""
    toy = _Toy()
    g = torch.Generator().manual_seed(1)
    batches = [torch.randn(2, 5, 6, generator=g), torch.randn(3, 4, 6, generator=g)]
    masks = [torch.rand(2, 5, generator=g) > 0.3, None]
    with HessianCollector({"q": toy.q, "k": toy.k, "o": toy.o}) as col, torch.no_grad():
        for x, m in zip(batches, masks, strict=True):
            col.next_sample(m)
            toy(x)
    assert col.groups() == {"q": ["q", "k"], "o": ["o"]}
    X = torch.cat([batches[0][masks[0]], batches[1].reshape(-1, 6)]).double().numpy()
    np.testing.assert_allclose(col.hessian("q"), 2 * X.T @ X / len(X), rtol=1e-5, atol=1e-6)
    assert col.hessian("k") is not col.hessian("q")  # a fresh array, equal values
    np.testing.assert_array_equal(col.hessian("k"), col.hessian("q"))
    assert col.tokens("q") == len(X) and col.tokens("o") == len(X)
    with torch.no_grad():
        O = torch.cat(
            [
                (toy.q(x) * toy.k(x).sum(-1, keepdim=True))[m] if m is not None else
                (toy.q(x) * toy.k(x).sum(-1, keepdim=True)).reshape(-1, 4)
                for x, m in zip(batches, masks, strict=True)
            ]
        ).double().numpy()  # fmt: skip
    np.testing.assert_allclose(col.hessian("o"), 2 * O.T @ O / len(O), rtol=1e-5, atol=1e-6)
    assert not toy.q._forward_hooks  # removed on exit


def test_channel_statistics_and_rows_of_real_tokens() -> None:
    """stats=True keeps mean and max |x| per input channel of the unmasked tokens, rows=N up to
    N of them per pass (each a real input row); hessian=False sums no X^T X."""
    toy = _Toy()
    g = torch.Generator().manual_seed(2)
    batches = [torch.randn(2, 5, 6, generator=g), torch.randn(3, 4, 6, generator=g)]
    masks = [torch.rand(2, 5, generator=g) > 0.3, None]
    with HessianCollector({"q": toy.q, "k": toy.k}, hessian=False, stats=True, rows=3) as col:
        with torch.no_grad():
            for x, m in zip(batches, masks, strict=True):
                col.next_sample(m)
                toy(x)
    X = torch.cat([batches[0][masks[0]], batches[1].reshape(-1, 6)]).double().numpy()
    np.testing.assert_allclose(col.mean_abs("k"), np.abs(X).mean(0), rtol=1e-6)
    np.testing.assert_array_equal(col.max_abs("q"), np.abs(X).max(0).astype(np.float32))
    kept = col.rows("q")
    assert kept.shape == (6, 6)
    assert all(any(np.array_equal(r, x.astype(np.float32)) for x in X) for r in kept)
    with pytest.raises(LowbitError, match="no Hessian"):
        col.hessian("q")


def test_hessian_of_an_unused_layer() -> None:
    """A layer no pass reached has no Hessian: a LowbitError, not zeros."""
    toy = _Toy()
    with HessianCollector({"q": toy.q}) as col:
        pass
    with pytest.raises(LowbitError, match="saw no calibration tokens"):
        col.hessian("q")


def test_jsonl_file_round_trip(tmp_path: Path) -> None:
    """Records written by json.dumps read back unchanged (unicode, newlines inside)."""
    texts = ["ünïcode ✓", "two\nlines", '"quoted"']
    f = tmp_path / "r.jsonl"
    f.write_text("\n".join(json.dumps({"text": t}) for t in texts), encoding="utf-8")
    assert Calibration(source=str(f)).records() == texts
