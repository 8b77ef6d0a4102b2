"""Per-tensor sensitivity: the cached scan, the proxy, and what they report."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from lowbit.checkpoints import open_checkpoint
from lowbit.checkpoints.tokenizer import build_tokenizer
from lowbit.errors import LowbitError
from lowbit.evaluation.scan_samples import ScanSamples as Calibration
from lowbit.evaluation.sensitivity import (
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


def _full_pass_moments(runner: Any, modules: list[str]) -> dict[str, np.ndarray]:
    """E[x^2] as the scan computed it before the pass stopped early: whole forward passes."""
    import torch

    sums: dict[str, Any] = {}
    counts: dict[str, int] = {}
    named = dict(runner.model.named_modules())
    hooks = []
    for m in modules:

        def grab(_mod: Any, args: tuple[Any, ...], name: str = m) -> None:
            x = args[0].detach().float().reshape(-1, args[0].shape[-1])
            sums[name] = sums.get(name, 0) + (x * x).sum(0).double()
            counts[name] = counts.get(name, 0) + x.shape[0]

        hooks.append(named[m].register_forward_pre_hook(grab))
    with torch.inference_mode():
        for inputs in runner.batches:
            runner.model(**inputs)
    for h in hooks:
        h.remove()
    return {m: (sums[m] / counts[m]).numpy() for m in modules}


@pytest.mark.parametrize("tie", [False, True])
def test_proxy_pass_stops_early_with_the_same_moments(
    tmp_path: Path, windows: Calibration, tie: bool
) -> None:
    """The proxy pass stops before the logits (or before the quantized head), and its input
    moments equal those of whole forward passes bit for bit."""
    import torch

    from lowbit.evaluation._sensitivity_runner import Runner
    from lowbit.models.build import build_model

    ckpt = open_checkpoint(save_hf_folder(tiny_llama(seed=3, tie=tie), tmp_path / "m"))
    model = build_model(ckpt, progress=False)
    runner = Runner(model, None, "causal", windows, 4)
    modules = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
    heads: list[int] = []
    hook = model.lm_head.register_forward_hook(lambda *_: heads.append(1))
    blocks_only = [m for m in modules if m != "lm_head"]
    got = runner.input_moments(blocks_only)
    assert heads == []  # no logits computed
    want = _full_pass_moments(runner, blocks_only)
    assert got.keys() == want.keys()
    for m in want:
        np.testing.assert_array_equal(got[m], want[m])
    hook.remove()
    with_head = runner.input_moments(modules)  # the head's input is seen, the head not run
    np.testing.assert_array_equal(
        with_head["lm_head"], _full_pass_moments(runner, modules)["lm_head"]
    )


def test_proxy_values_unchanged(
    llama_dir: Path, windows: Calibration, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The proxy of every trial is the weight error weighted by whole-pass input moments, bit
    for bit, with the trials on threads (three, whatever the machine has)."""
    from lowbit.evaluation import sensitivity as module
    from lowbit.evaluation.sensitivity import _Scan

    monkeypatch.setattr(module, "threads", lambda: 3)
    schemes = ("int4:g32", "int2:g32", "nf4", "int8:ch")
    ckpt = open_checkpoint(llama_dir)
    res = sensitivity(ckpt, schemes, windows, measure="proxy")
    scan = _Scan(ckpt, schemes, windows, None, "proxy", 4)
    want = _full_pass_moments(scan.runner, [scan.weights.module(n) for n in scan.names])
    from lowbit.checkpoints.steps import read_quantized

    plans = [t for a in scan.plans for t in a.quantized]  # scheme-major, as the entries
    for e, t in zip(res.entries, plans, strict=True):
        assert (e.tensor, e.scheme) == (t.name, t.scheme.label)
        w = np.asarray(ckpt.get(t.name), dtype=np.float64)
        err2 = ((w - read_quantized(ckpt, t).dequantize(np.float32)) ** 2).sum(0)
        assert e.proxy == float(err2 @ want[scan.weights.module(t.name)])


@pytest.mark.parametrize("workers", [1, 3])
def test_threaded_trials_equal_one_by_one(
    llama_dir: Path, windows: Calibration, monkeypatch: pytest.MonkeyPatch, workers: int
) -> None:
    """The local scan (proxy-only trials on threads while the next tensor is read and the
    exact trials run the model) gives the entries of one trial at a time, bit for bit, in
    scan order, with one progress tick per trial; tensors above the threads' size limit are
    quantized in the scan's own thread, with the same numbers."""
    from lowbit.evaluation import sensitivity as module
    from lowbit.evaluation.sensitivity import _Scan

    monkeypatch.setattr(module, "threads", lambda: workers)
    schemes = ("int8:ch", "int4:g32", "int2:g32", "nf4")
    ckpt = open_checkpoint(llama_dir)
    scan = _Scan(ckpt, schemes, windows, None, "exact", 4, exact_schemes=("int4:g32",))
    one = [scan.run(i) for i in range(scan.count)]
    assert sum(e.damage is not None for e in one) == len(scan.names)
    ticks: list[tuple[int, int]] = []
    got = scan.run_all(progress=lambda done, total: ticks.append((done, total)))
    assert got == one
    assert ticks == [(i + 1, scan.count) for i in range(scan.count)]
    sizes = sorted({ckpt.info(n).numel for n in scan.names})
    monkeypatch.setattr(module, "_PARALLEL_NUMEL", sizes[len(sizes) // 2])  # some of each
    assert scan.run_all() == one


def test_head_shortcut_equals_logits(llama_dir: Path, windows: Calibration) -> None:
    """The KL from the head's input (mu, const, log-sum-exp) equals the KL of the model's
    log-probabilities; the original scores 0."""
    import torch

    from lowbit.evaluation._sensitivity_runner import Runner
    from lowbit.models.build import build_model

    model = build_model(open_checkpoint(llama_dir), progress=False)
    fast = Runner(model, None, "causal", windows, 4)
    slow = Runner(model, None, "causal", windows, 4, head_shortcut=False)
    fast.reference()
    slow.reference()
    assert fast.head is not None and slow.head is None
    assert abs(fast.trial(0)) < 1e-12 and slow.trial(0) == 0.0
    w = model.model.layers[1].mlp.down_proj.weight
    saved = w.detach().clone()
    with torch.no_grad():
        w.add_(torch.randn(w.shape, generator=torch.Generator().manual_seed(0)) * 0.02)
    a, b = fast.trial(1), slow.trial(1)
    with torch.no_grad():
        w.copy_(saved)
    assert a > 1e-4
    assert a == pytest.approx(b, rel=1e-4)


def test_exact_schemes_scale_the_proxy(llama_dir: Path, windows: Calibration) -> None:
    """With exact_schemes, the other schemes' trials run no model and are scored by their proxy
    times the tensor's damage/proxy ratio; the measured ones equal a full exact scan's."""
    ckpt = open_checkpoint(llama_dir)
    full = sensitivity(ckpt, ("int4:g32", "int8:ch"), windows)
    part = sensitivity(ckpt, ("int4:g32", "int8:ch"), windows, exact_schemes=("int4:g32",))
    ft, pt = full.table(), part.table()
    for name, row in pt.items():
        a, b = row["int4:g32:fp32"], row["int8:ch:fp32"]
        assert a.damage == ft[name]["int4:g32:fp32"].damage and b.damage is None
        assert b.proxy == ft[name]["int8:ch:fp32"].proxy
        assert part.score(b) == pytest.approx(b.proxy * a.damage / a.proxy)
    with pytest.raises(LowbitError, match="not among the schemes"):
        sensitivity(ckpt, ("int4:g32",), windows, exact_schemes=("int8:ch",))


def test_chunks_balance_cost() -> None:
    """Chunks keep every trial once, in order, and split the costly trials among workers."""
    from lowbit.evaluation._sensitivity_workers import _chunks, _costs

    costs = _costs(70, 10, "exact", {0})  # 10 trials run the model, 60 do not
    chunks = _chunks(costs, 2)
    assert [i for c in chunks for i in c] == list(range(70))
    heavy = [sum(costs[i] for i in c) for c in chunks]
    assert len(chunks) >= 4 and max(heavy) <= 2.0  # no worker holds most of the model runs
    assert _chunks(_costs(5, 5, "proxy", {0}), 3) != []


def test_progress_means_the_same_as_everywhere(
    llama_dir: Path, windows: Calibration, capsys: pytest.CaptureFixture[str]
) -> None:
    """``progress=True`` draws a bar over the trials (it was a TypeError after the work),
    ``False`` none, a callable gets ``(done, total)``; a bad value is one LowbitError before
    any work."""
    pytest.importorskip("tqdm")
    ckpt = open_checkpoint(llama_dir)
    calls: list[tuple[int, int]] = []
    with_bar = sensitivity(ckpt, ("int4:g32",), windows, measure="proxy", progress=True)
    assert "sensitivity" in capsys.readouterr().err
    quiet = sensitivity(ckpt, ("int4:g32",), windows, measure="proxy", progress=False)
    assert capsys.readouterr().err == ""
    sensitivity(
        ckpt, ("int4:g32",), windows, measure="proxy", progress=lambda d, t: calls.append((d, t))
    )
    assert calls[-1][0] == calls[-1][1] == len(quiet.entries)
    assert [e.to_dict() for e in with_bar.entries] == [e.to_dict() for e in quiet.entries]
    with pytest.raises(LowbitError, match="progress must be True, False, None or a callable"):
        sensitivity(ckpt, ("int4:g32",), windows, progress="yes")  # type: ignore[arg-type]
