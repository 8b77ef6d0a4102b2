"""lowbit.training: loss scaling, delayed FP8 scaling, recipes, the lab runner, the demos."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from lowbit.cli import main  # noqa: E402
from lowbit.errors import LowbitError  # noqa: E402
from lowbit.torch import EmulatedLinear  # noqa: E402
from lowbit.training import (  # noqa: E402
    AdamW,
    DelayedScaling,
    LabConfig,
    LossScaler,
    ModelConfig,
    TextData,
    get_recipe,
    load_quantized,
    run_recipe,
    save_quantized,
    set_frozen,
    train_lab,
)
from lowbit.training.lab import quantize_weights  # noqa: E402
from lowbit.training.overflow import CASES, outcome, overflow_table  # noqa: E402

pytestmark = pytest.mark.torch
torch.set_num_threads(2)

TINY = ModelConfig(d_model=32, n_layers=1, n_heads=2, ctx=16)


@pytest.fixture(scope="module")
def data() -> TextData:
    return TextData.from_text()


def tiny_cfg(steps: int = 4) -> LabConfig:
    return LabConfig(steps=steps, batch_size=4, val_batches=1, eval_every=2, model=TINY, threads=1)


# ---- loss scaling ------------------------------------------------------------------------


def test_loss_scaler_schedule_scripted() -> None:
    """Growth after growth_interval good steps, backoff and a skipped step on each inf/NaN."""
    s = LossScaler(init_scale=8.0, growth_interval=3)
    script = [False, False, False, False, True, False, False, False, True, True]
    applied = [s.update(bad) for bad in script]
    assert applied == [not b for b in script]
    # 8 -> 16 after 3 good; backoff to 8 on inf; 3 good -> 16; two infs -> 8 -> 4
    assert s.history == [8, 8, 8, 16, 16, 8, 8, 8, 16, 8]
    assert s.scale == 4.0
    assert s.skipped == 3 and s.steps == 10
    static = LossScaler(init_scale=8.0, dynamic=False, growth_interval=1)
    assert [static.update(b) for b in (False, True, False)] == [True, False, True]
    assert static.scale == 8.0 and static.skipped == 1


def test_loss_scaler_unscale_detects_nonfinite() -> None:
    """unscale_ divides gradients by the scale and reports inf/NaN."""
    p, q = torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(2))
    p.grad, q.grad = torch.tensor([4.0, 8.0, 16.0]), torch.tensor([2.0, 4.0])
    s = LossScaler(init_scale=4.0)
    assert s.unscale_([p, q]) is False
    assert p.grad.tolist() == [1.0, 2.0, 4.0] and q.grad.tolist() == [0.5, 1.0]
    q.grad = torch.tensor([math.inf, 1.0])
    assert s.unscale_([p, q]) is True
    with pytest.raises(LowbitError):
        LossScaler(init_scale=0.0)


def _fp16_linear() -> tuple[EmulatedLinear, torch.nn.Linear]:
    lin = torch.nn.Linear(4, 4, bias=False)
    torch.nn.init.ones_(lin.weight)
    f = "float16"
    return EmulatedLinear(lin, input=f, weight=f, output=f, grad_output=f, grad_input=f,
                          grad_weight=f), lin  # fmt: skip


def _steps(loss_factor: float, scaler: LossScaler | None, n: int = 30) -> torch.Tensor:
    em, lin = _fp16_linear()
    opt = AdamW(lin.parameters())
    x = torch.ones(2, 4)
    for _ in range(n):
        loss = loss_factor * em(x).sum()
        (scaler.scale_loss(loss) if scaler else loss).backward()
        ok = scaler.update(scaler.unscale_(opt.params)) if scaler else True
        if ok:
            opt.step(1e-3)
        opt.zero_grad()
    return lin.weight.detach()


def test_fp16_overflow_needs_loss_scaling() -> None:
    """A gradient of 1e5 overflows FP16: NaN weights without scaling; the dynamic scaler backs off below 1."""
    w = _steps(1e5, None, n=1)
    assert not torch.isfinite(w).all()
    s = LossScaler()
    w = _steps(1e5, s)
    assert torch.isfinite(w).all() and (w != 1.0).all()
    assert s.skipped >= 17 and s.scale < 1.0  # 2**16 halved until 1e5 * scale fits under 65504


def test_fp16_underflow_needs_loss_scaling() -> None:
    """A gradient of 1e-8 underflows in FP16 (weights never move); scaled by 2**16 it survives."""
    w = _steps(1e-8, None, n=3)
    assert (w == 1.0).all()
    s = LossScaler()
    w = _steps(1e-8, s, n=3)
    assert (w < 1.0).all() and s.skipped == 0


# ---- delayed scaling ------------------------------------------------------------------------


def _feed(q: DelayedScaling, amaxes: list[float]) -> list[float]:
    scales = []
    for a in amaxes:
        q(torch.tensor([a, -a / 3]))
        scales.append(q.scale)
    return scales


def test_delayed_scaling_amax_history() -> None:
    """Each call uses the scale from the previous calls' amax history (max over the window)."""
    q = DelayedScaling("e4m3", history_len=3)
    used = []
    for a in [448.0, 4 * 448, 2 * 448, 448.0, 448.0, 448.0 / 8]:
        before = q.scale
        out = q(torch.tensor([a]))
        s = before if before is not None else 2.0 ** math.ceil(math.log2(a / 448))
        used.append(s)
        assert out.item() == min(a / s, 448.0) * s  # saturates when the lagging scale is too small
    assert used == [1.0, 1.0, 4.0, 4.0, 4.0, 2.0]
    assert list(q.history) == [448.0, 448.0, 56.0]
    assert q.scale == 1.0
    assert q.stats["saturated"] == 1  # the 1792 that arrived while the scale was still 1


def test_delayed_scaling_most_recent_margin_and_edge_cases() -> None:
    """most_recent follows the last amax; margin doubles the scale; inf/zero/frozen leave it."""
    q = DelayedScaling("e4m3", history_len=4, amax_compute="most_recent", margin=1)
    assert _feed(q, [448.0, 4 * 448.0, 448.0]) == [2.0, 8.0, 2.0]
    q(torch.tensor([math.inf, 1.0]))
    assert q.scale == 2.0 and len(q.history) == 3
    q(torch.zeros(3))
    assert q.scale == 2.0  # recorded, but an amax of 0 gives no scale
    q.frozen = True
    q(torch.tensor([1e4]))
    assert q.scale == 2.0 and list(q.history)[-1] == 0.0
    with pytest.raises(LowbitError):
        DelayedScaling("e4m3", history_len=0)
    with pytest.raises(LowbitError):
        DelayedScaling("e4m3", amax_compute="mean")


# ---- optimizer, data, recipes -----------------------------------------------------------------


def test_bf16_weights_lose_small_updates_unless_stochastic() -> None:
    """An update of 1e-3 to a BF16 weight of 1.0 is lost to nearest rounding; SR keeps it on average."""
    for rounding, moved in (("nearest_even", False), ("stochastic", True)):
        p = torch.nn.Parameter(torch.ones(20_000))
        opt = AdamW([p], storage="bfloat16", rounding=rounding, seed=1)
        for _ in range(5):
            p.grad = torch.ones_like(p)
            opt.step(1e-3)
        mean = float(p.detach().mean())
        assert (abs(mean - (1 - 5e-3)) < 5e-4) is moved
        assert (mean == 1.0) is not moved
        assert (opt.lost == opt.updates) is not moved


def test_text_data_split_and_batches(data: TextData) -> None:
    """The text splits 90/10 at the end; batches are reproducible from the generator."""
    total = len(data.train) + len(data.val)
    assert abs(len(data.val) - total // 10) <= 1 and total > 400_000
    a = data.batch(torch.Generator().manual_seed(3), 4, 16)
    b = data.batch(torch.Generator().manual_seed(3), 4, 16)
    assert torch.equal(a[0], b[0]) and torch.equal(a[0][:, 1:], a[1][:, :-1])
    v = data.val_batches(2, 4, 16)
    assert len(v) == 2 and v[0][0].shape == (4, 16)
    with pytest.raises(LowbitError):
        TextData.from_text("abc", val_fraction=1.5)


def test_bad_configs_raise() -> None:
    """Unknown recipes, heads that do not divide the width, bad steps raise LowbitError."""
    with pytest.raises(LowbitError, match="unknown recipe"):
        get_recipe("fp7")
    with pytest.raises(LowbitError):
        ModelConfig(d_model=30, n_heads=4)
    with pytest.raises(LowbitError):
        LabConfig(steps=0)


def test_run_recipe_reproducible(data: TextData) -> None:
    """Two runs of one recipe with the same seed give identical loss curves."""
    a, _ = run_recipe("fp8-hybrid", tiny_cfg(3), data)
    b, _ = run_recipe("fp8-hybrid", tiny_cfg(3), data)
    assert a.train_curve == b.train_curve and a.val_curve == b.val_curve


def test_train_lab_tiny_run_table_and_json(data: TextData, tmp_path) -> None:
    """A few steps of several recipes give the table, PTQ rows, comparisons and JSON."""
    recipes = ["fp32", "fp16", "fp16-scaled", "bf16-pure-sr", "fp8-mx", "qat-int4", "qat-w4a8"]
    lab = train_lab(recipes, tiny_cfg(), data=data, save_dir=tmp_path)
    headers, rows = lab.table()
    assert [r[0] for r in rows] == [*recipes, "ptq-int4", "ptq-w4a8"]
    assert len(headers) == len(rows[0])
    res = lab.by_name()
    assert all(len(r.train_curve) == 4 and r.val_curve[-1][0] == 4 for r in lab.results)
    assert res["fp16-scaled"].loss_scale is not None
    assert len(res["fp16-scaled"].skipped_at) == res["fp16-scaled"].skipped_steps
    assert res["bf16-pure-sr"].updates_lost is not None
    # QAT weights are bit-identical to lowbit.quantize's, so the converted model scores the same
    for name in ("qat-int4", "qat-w4a8"):
        assert res[name].converted_val == res[name].final_val
        assert res[name].checkpoint_bytes > 0
    d = json.loads(json.dumps(lab.to_dict(), allow_nan=True))
    assert set(d) == {"note", "config", "recipes", "ptq", "comparisons"}
    assert "qat_closer_than_ptq-int4" in d["comparisons"]
    assert "emulation" in d["note"].lower()


def test_quantized_checkpoint_round_trip(data: TextData, tmp_path) -> None:
    """save_quantized writes QuantizedTensors that load back with identical codes and scales."""
    rec = get_recipe("qat-int4")
    _, model = run_recipe(rec, tiny_cfg(2), data)
    qts = quantize_weights(model, rec)
    path = tmp_path / "m.safetensors"
    size = save_quantized(path, model, qts)
    assert size == path.stat().st_size
    back = load_quantized(path)
    for name, qt in qts.items():
        assert np.array_equal(back[name].codes, qt.codes)
        assert np.array_equal(back[name].dequantize(), qt.dequantize())
    assert back["tok.weight"].dtype == np.float32
    assert not list(tmp_path.glob("*.tmp"))


def test_set_frozen_stops_history(data: TextData) -> None:
    """Evaluation with frozen quantizers leaves every amax history and counter unchanged."""
    _, model = run_recipe("fp8-hybrid", tiny_cfg(2), data)
    qz = [q for m in model.modules() if isinstance(m, EmulatedLinear) for _, q in m.roles.items()]
    before = [(list(q.history), dict(q.stats)) for q in qz]
    set_frozen(model, True)
    model(data.val_batches(1, 2, 16)[0][0])
    assert [(list(q.history), q.stats) for q in qz] == before
    set_frozen(model, False)
    model(data.val_batches(1, 2, 16)[0][0])
    inputs = [m.roles.input for m in model.modules() if isinstance(m, EmulatedLinear)]
    assert [len(q.history) for q in inputs] == [3] * 5  # 2 training steps + this forward


# ---- overflow demo and CLI ------------------------------------------------------------------


def test_overflow_outcomes() -> None:
    """10k x 10k is inf in FP16, NaN in E4M3, 448 saturated; 1e-8 underflows in FP16; BF16 loses 1+1e-3."""
    case = {c.label: c for c in CASES}
    assert outcome(lowbit_fmt("fp16"), case["1e4*1e4"])["outcome"] == "inf"
    assert outcome(lowbit_fmt("fp16"), case["65504+1"]) == {"value": 65504.0, "outcome": "rounded"}
    assert outcome(lowbit_fmt("fp16"), case["65504+16"])["outcome"] == "inf"
    assert outcome(lowbit_fmt("e4m3"), case["448+32"])["outcome"] == "NaN"
    assert outcome(lowbit_fmt("e4m3"), case["448+32"], saturate=True) == {
        "value": 448.0,
        "outcome": "saturated",
    }
    assert outcome(lowbit_fmt("fp16"), case["grad 1e-8"])["outcome"] == "underflow"
    assert outcome(lowbit_fmt("bf16"), case["grad 1e-8"])["outcome"] == "rounded"
    assert outcome(lowbit_fmt("bf16"), case["1+1e-3"])["outcome"] == "lost"
    assert outcome(lowbit_fmt("int8"), case["1e4*1e4"])["outcome"] == "saturated"
    t = overflow_table()
    assert {f["bits"] for f in t["formats"]} == {8, 16}
    assert len(t["formats"][0]["results"]) == len(CASES)


def lowbit_fmt(name: str):
    import lowbit

    return lowbit.format(name)


def test_cli_overflow_demo(capsys) -> None:
    """overflow-demo prints every case for the chosen formats; --json is parseable."""
    assert main(["overflow-demo", "--formats", "fp16,e4m3"]) == 0
    out = capsys.readouterr().out
    assert "float16" in out and "inf" in out and "NaN" in out
    assert main(["overflow-demo", "--formats", "e4m3", "--saturate", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["saturate"] is True and d["formats"][0]["results"][0]["outcome"] == "saturated"
    assert main(["overflow-demo", "--formats", "fp9"]) == 2


def test_cli_train_lab(capsys, tmp_path) -> None:
    """train-lab runs a tiny lab, prints the emulation note, the table and claims, writes the plot."""
    png = tmp_path / "curves.png"
    argv = ["train-lab", "--recipes", "fp32,fp16,qat-int4", "--steps", "2", "--d-model", "32",
            "--layers", "1", "--ctx", "16", "--batch-size", "4", "--threads", "1", "--quiet", "--plot", str(png)]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert (
        "Emulation on the CPU" in out and "ptq-int4" in out and "FP16 without loss scaling" in out
    )
    assert png.stat().st_size > 10_000
    assert main([*argv[:-2], "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in d["recipes"]] == ["fp32", "fp16", "qat-int4"] and d["claims"]
    assert main(["train-lab", "--recipes", "fp7"]) == 2
    assert main(["train-lab", "--list"]) == 0


def test_overflow_module_does_not_import_torch() -> None:
    """lowbit.training.overflow (and the CLI parser) work without importing torch."""
    code = (
        "import sys; import lowbit.training.overflow as o; o.overflow_table(['fp16']);"
        "from lowbit.cli import build_parser; build_parser(); print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
