"""Per-tensor sensitivity: the cached scan, the proxy, and what they report."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from lowbit.checkpoints import open_checkpoint
from lowbit.checkpoints.gguf_tokenizer import build_tokenizer
from lowbit.evaluation.sensitivity import (
    Calibration,
    SensitivityResult,
    sensitivity,
    spearman,
)
from tiny_models import save_gguf, save_hf_folder, tiny_bert, tiny_llama

SCHEMES = ("int8:ch", "int4:g32", "int2:g32")


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_hf_folder(tiny_llama(seed=3), tmp_path_factory.mktemp("sens") / "llama")


@pytest.fixture(scope="module")
def windows() -> Calibration:
    rng = np.random.default_rng(7)
    ids = rng.integers(0, 256, size=(6, 24))
    return Calibration("random bytes", windows=tuple(tuple(int(t) for t in w) for w in ids))


def test_cached_scan_equals_uncached(llama_dir: Path, windows: Calibration) -> None:
    """Starting a trial at the changed block gives the damage of a full forward pass."""
    ckpt = open_checkpoint(llama_dir)
    fast = sensitivity(ckpt, SCHEMES, windows, batch=4)
    slow = sensitivity(ckpt, SCHEMES, windows, cached=False, batch=4)
    assert [e.tensor for e in fast.entries] == [e.tensor for e in slow.entries]
    got = np.array([e.damage for e in fast.entries])
    want = np.array([e.damage for e in slow.entries])
    assert (got > 0).all()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-9)


def test_gguf_layout_matches_safetensors(tmp_path: Path, windows: Calibration) -> None:
    """A GGUF source (llama.cpp's names, permuted q/k rows) gives the same per-tensor damages."""
    model = tiny_llama(seed=3)
    hf = open_checkpoint(save_hf_folder(model, tmp_path / "hf"))
    gg = open_checkpoint(save_gguf(model, tmp_path / "m.gguf", embedding="F32"))
    a = sensitivity(hf, ("int4:g32",), windows)
    b = sensitivity(gg, ("int4:g32",), windows)
    np.testing.assert_allclose(
        sorted(e.damage for e in a.entries), sorted(e.damage for e in b.entries), rtol=1e-3
    )


def test_entries_and_costs(llama_dir: Path, windows: Calibration) -> None:
    """Every 2-D linear weight appears once per scheme; fewer bits cost more damage overall."""
    res = sensitivity(open_checkpoint(llama_dir), SCHEMES, windows)
    table = res.table()
    assert len(table) == 2 * 7  # q k v o gate up down in each of 2 layers
    assert all(
        set(row) == {"int8:ch:fp32", "int4:g32:fp32", "int2:g32:fp32"} for row in table.values()
    )
    for row in table.values():
        assert row["int8:ch:fp32"].bits > row["int4:g32:fp32"].bits > row["int2:g32:fp32"].bits
    total = {s: sum(row[s].damage for row in table.values()) for s in row}
    assert total["int8:ch:fp32"] < total["int4:g32:fp32"] < total["int2:g32:fp32"]
    rho = res.rank_correlation()
    assert rho is not None and rho > 0.5  # the proxy ranks trials much like the measurement
    again = SensitivityResult.from_dict(res.to_dict())
    assert again == res


def test_proxy_only_runs_no_trials(llama_dir: Path, windows: Calibration) -> None:
    """measure='proxy' gives every proxy and no exact damage."""
    res = sensitivity(open_checkpoint(llama_dir), ("int4:g32",), windows, measure="proxy")
    assert all(e.damage is None and np.isfinite(e.proxy) and e.proxy > 0 for e in res.entries)
    assert res.rank_correlation() is None


def test_encoder(tmp_path: Path) -> None:
    """An encoder's damage is 1 - cosine of pooled embeddings: small, and the cache changes
    nothing (a random BERT's attention is nearly uniform, so q/k damages can round to 0)."""
    folder = save_hf_folder(tiny_bert(seed=1), tmp_path / "bert")
    ckpt = open_checkpoint(folder)
    calib = Calibration("s", sentences=("the cat sat", "a dog ran far", "to be or not", "x y z"))
    res = sensitivity(ckpt, ("int4:g32",), calib, tokenizer=build_tokenizer(ckpt))
    assert res.kind == "encoder"
    d = np.array([e.damage for e in res.entries])
    assert ((d > -1e-6) & (d < 0.5)).all() and d.max() > 1e-7
    slow = sensitivity(ckpt, ("int4:g32",), calib, tokenizer=build_tokenizer(ckpt), cached=False)
    np.testing.assert_allclose(d, [e.damage for e in slow.entries], rtol=1e-4, atol=1e-9)


def test_spearman() -> None:
    """Spearman: 1 for the same order, -1 reversed, ties take their mean rank."""
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 1, 2], [5, 5, 9]) == pytest.approx(1.0)
