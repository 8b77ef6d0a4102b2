"""lowbit.evaluation.block_sensitivity (``--measure block``): each trial runs one block on its
calibrated inputs; the GGUF budget and the lowbit scan take it."""

from __future__ import annotations

import json
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from lowbit.checkpoints.gguf.budget import budget_options
from lowbit.checkpoints.opener import open_checkpoint
from lowbit.cli import main
from lowbit.errors import LowbitError
from lowbit.evaluation import block_sensitivity as bs
from lowbit.evaluation.gguf_sensitivity import gguf_block_sensitivity
from lowbit.evaluation.scan_samples import ScanSamples

gguf = pytest.importorskip("gguf")
pytest.importorskip("transformers")

from tiny_models import save_gguf, tiny_llama  # noqa: E402


def _windows(n: int = 2, length: int = 24) -> ScanSamples:
    rng = np.random.default_rng(3)
    ids = rng.integers(0, 256, size=(n, length))
    return ScanSamples("test windows", windows=tuple(tuple(int(i) for i in w) for w in ids))


@pytest.fixture(scope="module")
def untied(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("blocksens") / "l256.gguf"
    return save_gguf(tiny_llama(hidden=256, inter=512), path, embedding="F32")


@pytest.fixture(scope="module")
def tied(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("blocksens") / "tied.gguf"
    return save_gguf(tiny_llama(tie=True), path, embedding="F32")


def _noise(scale: dict[str, float]) -> Any:
    """A roundtrip adding fixed noise to each tensor: ``candidate`` is its size (relative
    to the tensor's spread), times ``scale`` of the tensor (default 1)."""

    def roundtrip(name: str, w: np.ndarray, c: str) -> np.ndarray:
        rng = np.random.default_rng(zlib.crc32(name.encode()))
        e = rng.standard_normal(w.shape).astype(np.float32)
        return w + float(c) * scale.get(name, 1.0) * float(w.std()) * e

    return roundtrip


def _matrices(ckpt: Any) -> list[str]:
    return [n for n in ckpt.names() if n.endswith("weight") and len(ckpt.info(n).shape) == 2]


def test_deterministic_and_exactly_zero_for_a_lossless_candidate(untied: Path) -> None:
    """Two runs give the same numbers bit for bit; a candidate that changes nothing costs 0."""
    ckpt = open_checkpoint(untied)
    names = _matrices(ckpt)
    trials = {n: ["0", "0.01"] for n in names}
    a = bs.block_damages(ckpt, trials, _noise({}), _windows())
    b = bs.block_damages(ckpt, trials, _noise({}), _windows())
    assert a.damages == b.damages
    assert set(a.damages) == set(names)
    for n in names:
        assert a.damages[n]["0"] == 0.0
        assert a.damages[n]["0.01"] > 0.0, n
    assert a.blocks == [14, 14]  # 7 matrices per block, 2 candidates each


def test_larger_error_ranks_as_more_sensitive(untied: Path) -> None:
    """Ten times the weight error costs about a hundred times the damage (second order), and
    a tensor given thirty times the error of the others ranks first."""
    ckpt = open_checkpoint(untied)
    names = _matrices(ckpt)
    got = bs.block_damages(ckpt, {n: ["0.002", "0.02"] for n in names}, _noise({}), _windows())
    for n in names:
        ratio = got.damages[n]["0.02"] / got.damages[n]["0.002"]
        assert 60 < ratio < 140, (n, ratio)
    loud = "blk.0.attn_v.weight"
    got = bs.block_damages(ckpt, {n: ["0.002"] for n in names}, _noise({loud: 30.0}), _windows())
    worst = max(names, key=lambda n: got.damages[n]["0.002"])
    assert worst == loud


def test_trials_run_one_block_the_earlier_ones_dropped(
    untied: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """During the trials of block i only block i runs (no model pass), and only its weights
    and the first block's are in memory (the trials go last block first: the blocks after it
    freed, those before it not yet read)."""
    built: list[Any] = []
    real = bs.build_model

    def build(*args: Any, **kwargs: Any) -> Any:
        built.append(real(*args, **kwargs))
        return built[-1]

    monkeypatch.setattr(bs, "build_model", build)
    ckpt = open_checkpoint(untied)
    names = [n for n in _matrices(ckpt) if n.startswith("blk.")]
    calls: list[int] = []
    seen: list[tuple[int, list[int], list[bool]]] = []

    def roundtrip(name: str, w: np.ndarray, c: str) -> np.ndarray:
        net = built[-1]
        blocks = net.model.layers
        if not calls:  # the hooks of the trial walk, on its first trial
            for i, blk in enumerate(blocks):
                blk.register_forward_pre_hook(lambda *_a, i=i: calls.append(i))
        i = int(name.split(".")[1])
        seen.append((i, list(calls), [blk.mlp.down_proj.weight.numel() > 0 for blk in blocks]))
        calls.clear()
        calls.append(-1)
        return w * 0.99

    bs.block_damages(ckpt, {n: ["a"] for n in names}, roundtrip, _windows())
    assert len(built) == 2  # the reference walk's model, then the trials'
    for k, (i, before, loaded) in enumerate(seen):
        assert loaded == [j in (0, i) for j in range(len(loaded))], (k, i, loaded)
        ran = [j for j in before if j >= 0]
        assert set(ran) <= {i, i + 1}, (k, i, ran)  # this block's trials (or its turn's run)
        if k and seen[k - 1][0] == i:
            assert ran == [i] * len(ran) and ran, (k, i, ran)


def test_tied_embedding_and_head(tied: Path) -> None:
    """A token embedding tied to the head: its damage is the input part plus the head's exact
    KL, positive and growing with the error; the other tensors as usual."""
    ckpt = open_checkpoint(tied)
    options = budget_options(ckpt, ("Q4_0", "Q8_0"))
    assert "token_embd.weight" in options and "output.weight" not in options
    got = gguf_block_sensitivity(ckpt, options, _windows())
    d = got.damages["token_embd.weight"]
    assert d["Q4_0"] > d["Q8_0"] > 0.0
    assert all(v["Q4_0"] > v["Q8_0"] >= 0.0 for v in got.damages.values())
    assert got.metric == bs.BLOCK_METRIC


def test_not_a_block_tensor_is_an_error(untied: Path) -> None:
    ckpt = open_checkpoint(untied)
    norm = "blk.0.attn_norm.weight"
    with pytest.raises(LowbitError, match="needs token windows"):
        bs.block_damages(ckpt, {}, _noise({}), ScanSamples("none"))
    got = bs.block_damages(ckpt, {norm: ["0.01"]}, _noise({}), _windows())
    assert got.damages[norm]["0.01"] > 0  # a norm inside a block is a block tensor


def test_cli_measure_block_writes_a_file_that_verifies(
    untied: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`lowbit quantize --size N --out-format gguf --measure block`: the file fits, holds the
    plan, records the measure, and `lowbit verify` passes it."""
    out = tmp_path / "b.gguf"
    size = 800_000
    rc = main(["quantize", str(untied), "--size", str(size), "--out-format", "gguf", "--out",
               str(out), "--candidates", "Q3_K,Q6_K", "--calib-samples", "1",
               "--calib-len", "16", "--measure", "block", "--json"])  # fmt: skip
    assert rc == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["measure"] == "block" and doc["metric"] == bs.BLOCK_METRIC
    assert out.stat().st_size == doc["bytes"] <= size
    types = {t.name: t.tensor_type.name for t in gguf.GGUFReader(out).tensors}
    assert {r["tensor"]: r["type"] for r in doc["tensors"]} == types
    assert len({t for t in types.values() if t != "F32"}) == 2  # a real mix
    assert main(["verify", str(out)]) == 0
    rc = main(["quantize", str(untied), "--size", str(size), "--out-format", "gguf", "--out",
               str(tmp_path / "c.gguf"), "--measure", "proxy"])  # fmt: skip
    assert rc == 2
    assert "no proxy" in capsys.readouterr().err


def test_lowbit_scan_measure_block(tmp_path: Path) -> None:
    """``lowbit.scan(measure="block")``: every trial has a damage (and the proxy beside it),
    fewer bits cost more, and the budget solver takes the result."""
    from lowbit.jobs.budget import mixed_plan, scan
    from tiny_models import save_hf_folder

    folder = save_hf_folder(tiny_llama(), tmp_path / "hf")
    res = scan(folder, ["int4:g32", "int8:ch"], samples=2, length=24, measure="block",
               progress=False)  # fmt: skip
    assert res.measure == "block" and res.metric == bs.BLOCK_METRIC
    table = res.table()
    assert table and all(e.damage is not None and e.damage >= 0 for e in res.entries)
    low, high = res.schemes
    worse = sum(t[low].damage > t[high].damage for t in table.values())
    assert worse == len(table)
    mixed, _ = mixed_plan(folder, budget=6.0, sensitivity_result=res)
    assert mixed.measure == "block"


def test_cli_sensitivity_measure_block(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`lowbit sensitivity --measure block` prints a damage per trial and writes a result
    that reads back with its measure."""
    from lowbit.evaluation.sensitivity_result import SensitivityResult
    from tiny_models import save_hf_folder

    folder = save_hf_folder(tiny_llama(), tmp_path / "hf")
    out = tmp_path / "s.json"
    rc = main(["sensitivity", str(folder), "--schemes", "int4:g32,int8:ch", "--measure",
               "block", "--calib-samples", "2", "--calib-len", "24", "--out", str(out)])  # fmt: skip
    assert rc == 0
    text = capsys.readouterr().out
    assert "damage int4:g32" in text and "proxy vs block" in text
    back = SensitivityResult.from_dict(json.loads(out.read_text()))
    assert back.measure == "block" and all(e.damage is not None for e in back.entries)
