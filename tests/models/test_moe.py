"""Mixtures of experts from Hugging Face (lowbit.models.moe): Mixtral, Qwen2-MoE and Qwen3-MoE
built per expert from both checkpoint layouts with transformers' logits, routers kept, and
GPTQ / AWQ reaching every expert with the tokens and Hessian rank of each reported."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.torch

from lowbit.calibration.awq import awq_weights  # noqa: E402
from lowbit.calibration.data import Calibration  # noqa: E402
from lowbit.calibration.gptq import gptq_weights  # noqa: E402
from lowbit.checkpoints import open_checkpoint  # noqa: E402
from lowbit.checkpoints.experts_view import ExpertsView  # noqa: E402
from lowbit.checkpoints.lowbit_format.checkpoint import LowbitCheckpoint  # noqa: E402
from lowbit.checkpoints.streaming import plan_model  # noqa: E402
from lowbit.cli import main  # noqa: E402
from lowbit.errors import LowbitError  # noqa: E402
from lowbit.models.build import build_model, load_model  # noqa: E402
from lowbit.models.moe import expert_of, route_all_tokens  # noqa: E402
from lowbit.plans.components import classify  # noqa: E402
from lowbit.plans.plan import PrecisionPlan  # noqa: E402
from tiny_models import MOE_BLOCKS, MOE_FAMILIES, save_moe_folder, tiny_moe  # noqa: E402

WORDS = "river stone cloud garden lantern harbor meadow signal copper violet winter orchard"


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[object, Path, Path]]:
    """family -> (transformers model, per-expert folder, fused folder)."""
    root = tmp_path_factory.mktemp("moe")
    out = {}
    for kind in MOE_FAMILIES:
        model = tiny_moe(kind)
        out[kind] = (
            model,
            save_moe_folder(model, root / kind),
            save_moe_folder(model, root / f"{kind}-fused", fused=True),
        )
    return out


@pytest.fixture(scope="module")
def calib(tmp_path_factory: pytest.TempPathFactory) -> Calibration:
    w = WORDS.split()
    f = tmp_path_factory.mktemp("calib") / "calib.txt"
    f.write_text(" ".join(f"The {w[i % 12]} keeps {w[i * 7 % 12]}." for i in range(60)))
    return Calibration(source=str(f), samples=4, length=48)


@pytest.fixture(scope="module")
def mixtral_gptq(folders: dict, calib: Calibration) -> Any:
    """GPTQ of the per-expert Mixtral folder, every token through every expert: two tests
    read it (the expert coverage and the fused folder's equality), so it runs once."""
    return gptq_weights(folders["mixtral"][1], "int4:g32", calib, progress=False)


def _ids() -> object:
    return torch.randint(0, 261, (2, 17), generator=torch.Generator().manual_seed(3))


@pytest.mark.parametrize("kind", list(MOE_FAMILIES))
@pytest.mark.parametrize("layout", ["per-expert", "fused"])
def test_logits_equal_transformers(folders: dict, kind: str, layout: str) -> None:
    """Built from either checkpoint layout, one linear layer per expert, the model gives the
    transformers model's logits (float32, within 1e-4; here bit for bit). The fused layout
    reads as per-expert tensors too (under the expert names a per-expert checkpoint has)."""
    model, per_expert, fused = folders[kind]
    folder = per_expert if layout == "per-expert" else fused
    ckpt = open_checkpoint(folder)
    assert isinstance(ckpt, ExpertsView) == (layout == "fused")
    experts = {n for n in ckpt.names() if expert_of(n)}
    assert experts == {n for n in open_checkpoint(per_expert).names() if expert_of(n)}
    net = build_model(open_checkpoint(folder))
    experts = [m for m in net.modules() if hasattr(m, "route_all")]
    assert len(experts) == MOE_BLOCKS[kind] and all(len(m) == 4 for m in experts)
    with torch.no_grad():
        want = model(_ids()).logits
        got = net(_ids()).logits
        with route_all_tokens(net) as n:  # every token through every expert: same output
            assert n == MOE_BLOCKS[kind]
            every = net(_ids()).logits
    torch.testing.assert_close(got, want, rtol=0, atol=1e-4)
    torch.testing.assert_close(every, want, rtol=1e-5, atol=1e-5)


def test_routers_stay_high_precision(folders: dict) -> None:
    """The plan's default keeps every router and shared-expert gate; experts are quantized."""
    for kind in MOE_FAMILIES:
        applied = plan_model(open_checkpoint(folders[kind][1]), PrecisionPlan.uniform("int4:g32"))
        by_name = {t.name: t for t in applied.tensors}
        routers = [n for n in by_name if classify(n, 2) == "router"]
        assert routers and all(by_name[n].action == "keep" for n in routers), kind
        assert all("MoE router" in by_name[n].reason for n in routers)
        experts = [n for n in by_name if expert_of(n)]
        assert len(experts) == MOE_BLOCKS[kind] * 4 * 3
        assert all(by_name[n].action == "quantize" for n in experts)
    assert classify("model.layers.0.block_sparse_moe.gate.weight") == "router"
    assert classify("model.layers.0.mlp.shared_expert_gate.weight") == "router"
    assert classify("model.layers.0.mlp.gate_proj.weight") == "mlp"


@pytest.mark.parametrize("kind", ["mixtral", "qwen2_moe", "deepseek_v3"])
def test_gptq_reaches_every_expert(
    folders: dict, calib: Calibration, mixtral_gptq: Any, kind: str
) -> None:
    """With every token through every expert (the default), each expert layer is GPTQ'd on all
    calibration tokens and reports them with its Hessian's rank; routed, each sees its own
    share, and those under the floor are rounded to nearest with the reason given."""
    folder = folders[kind][1]
    run = (
        mixtral_gptq
        if kind == "mixtral"
        else gptq_weights(folder, "int4:g32", calib, progress=False)
    )
    experts = {n: e for n, e in run.layers.items() if expert_of(n)}
    assert len(experts) == 12 * MOE_BLOCKS[kind]
    total = run.calibration["tokens"]
    assert all(e["tokens"] == total and e["rank"] > 0 and "fallback" not in e
               for e in experts.values())  # fmt: skip
    assert all(run.methods[n] == "gptq" for n in experts)
    assert all(e["gptq"] < e["rtn"] for e in experts.values())

    routed = Calibration(**{**calib.to_dict(), "experts": "routed", "expert_min_tokens": 60})
    run = gptq_weights(folder, "int4:g32", routed, progress=False)
    experts = {n: e for n, e in run.layers.items() if expert_of(n)}
    assert len(experts) == 12 * MOE_BLOCKS[kind]
    tokens = [e["tokens"] for e in experts.values()]
    assert sum(tokens) == 2 * 3 * MOE_BLOCKS[kind] * total  # 2 experts a token, 3 layers each
    for n, e in experts.items():
        assert e["rank"] <= e["tokens"]
        low = e["tokens"] < 60
        assert ("fallback" in e) == low and run.methods[n] == ("rtn" if low else "gptq"), n
    assert any("fallback" in e for e in experts.values())
    assert run.calibration["experts"] == "routed"


def test_awq_folds_each_expert(folders: dict, calib: Calibration) -> None:
    """AWQ folds up_proj -> down_proj inside every expert and the shared expert, exactly: the
    original weights folded with the run's scales (not quantized) give the original logits."""
    model, folder, _ = folders["qwen2_moe"]
    run = awq_weights(folder, "int4:g32", calib, progress=False)
    made = [f for f in run.folds if "skipped" not in f]
    assert sum(".experts." in f["prev"] for f in made) == 2 * 4
    assert sum("shared_expert.up_proj" in f["prev"] for f in made) == 2
    ckpt = open_checkpoint(folder)
    folded = dict(run.replaced)
    for name, (rows, cols) in run.scales.items():  # stored = diag(1/rows) W diag(cols)
        w = np.asarray(ckpt.get(name), dtype=np.float64)
        folded[name] = (w / rows[:, None] * cols[None, :]).astype(np.float32)
    assert sum(".experts." in n for n in run.scales) == 2 * 4 * 2  # up and down
    with torch.no_grad():
        got = build_model(ckpt, weights=folded)(_ids()).logits
        want = model(_ids()).logits
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_compressed_tensors_per_expert_names(
    folders: dict, calib: Calibration, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``lowbit quantize --method gptq --out-format compressed-tensors`` of Mixtral writes each
    expert under the names vLLM loads (``block_sparse_moe.experts.N.w1.weight_packed``), the
    router unquantized, the scheme's targets also under the names vLLM's fused MoE layer looks
    up, and reports the experts' tokens."""
    out = tmp_path / "ct"
    rc = main([
        "quantize", str(folders["mixtral"][1]), "--to", "int4:g32", "--method", "gptq",
        "--calib", calib.source, "--calib-samples", "4", "--calib-len", "48",
        "--out", str(out), "--out-format", "compressed-tensors", "--no-progress",
    ])  # fmt: skip
    assert rc == 0
    said = capsys.readouterr().out
    assert "24 expert layers (all tokens)" in said
    from safetensors import safe_open

    with safe_open(str(out / "model.safetensors"), "np") as f:
        keys = set(f.keys())
    for e in range(4):
        for w in ("w1", "w2", "w3"):
            assert f"model.layers.1.block_sparse_moe.experts.{e}.{w}.weight_packed" in keys
    assert "model.layers.0.block_sparse_moe.gate.weight" in keys
    assert "model.layers.0.block_sparse_moe.gate.weight_packed" not in keys
    cfg = json.loads((out / "config.json").read_text())["quantization_config"]
    (group,) = cfg["config_groups"].values()
    # vLLM's fused MoE layer looks its scheme up as experts.0.gate_proj/up_proj/down_proj
    for proj in ("w1", "w2", "w3", "gate_proj", "up_proj", "down_proj"):
        assert (
            rf"re:model\.layers\.\d+\.block_sparse_moe\.experts\.\d+\.{proj}$" in (group["targets"])
        )


def test_missing_expert_is_one_error(folders: dict, tmp_path: Path) -> None:
    """A checkpoint lacking an expert's tensor is one LowbitError naming it (found against
    config.json before the model is built: lowbit.checkpoints.shape_checks)."""
    from safetensors.numpy import load_file, save_file

    src = folders["qwen3_moe"][1]
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text((src / "config.json").read_text())
    tensors = load_file(str(src / "model.safetensors"))
    del tensors["model.layers.1.mlp.experts.2.up_proj.weight"]
    save_file(tensors, str(bad / "model.safetensors"))
    with pytest.raises(
        LowbitError,
        match=r"layer 1 lacks expert 2's up_proj \(model\.layers\.1\.mlp\.experts\.2\.up_proj\.weight\)",
    ):
        build_model(open_checkpoint(bad))


def test_floor_and_mode_are_checked() -> None:
    """Calibration refuses an unknown experts mode and a negative floor."""
    with pytest.raises(LowbitError, match="'all' or 'routed'"):
        Calibration(experts="some")
    with pytest.raises(LowbitError, match="expert_min_tokens"):
        Calibration(expert_min_tokens=-1)
    assert np.isfinite(Calibration().expert_min_tokens)


def test_sensitivity_scores_every_expert(
    folders: dict, calib: Calibration, capsys: pytest.CaptureFixture[str]
) -> None:
    """``lowbit sensitivity`` of Mixtral measures each expert's tensors under their own
    checkpoint names (w1/w2/w3), the routers not at all."""
    rc = main([
        "sensitivity", str(folders["mixtral"][1]), "--schemes", "int4:g32", "--calib",
        calib.source, "--calib-samples", "2", "--calib-len", "32", "--no-progress", "--json",
    ])  # fmt: skip
    assert rc == 0
    names = set(json.dumps(json.loads(capsys.readouterr().out)).split('"'))
    experts = {n for n in names if expert_of(n)}
    assert len(experts) == 24
    assert not any(n.endswith("block_sparse_moe.gate.weight") for n in names)


@pytest.mark.parametrize("experts", ["all", "routed"])
def test_staged_walk_equals_the_group_walk(
    folders: dict, calib: Calibration, experts: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The MoE sublayer's two stages (every gate/up in one pass, every down in the next) give
    the group-by-group walk's codes and scales bit for bit: each expert's down projection reads
    only its own gate/up outputs, so what the other experts hold does not change its input."""
    import lowbit.calibration._layer_walk as lw

    data = Calibration(**{**calib.to_dict(), "experts": experts, "expert_min_tokens": 0})
    folder = folders["qwen2_moe"][1]
    staged = gptq_weights(folder, "int4:g32", data, progress=False)
    monkeypatch.setattr(lw, "_staged", lambda mine: False)
    grouped = gptq_weights(folder, "int4:g32", data, progress=False)
    assert set(staged.weights) == set(grouped.weights)
    assert sum(bool(expert_of(n)) for n in staged.weights) == 24
    for name, qt in staged.weights.items():
        np.testing.assert_array_equal(qt.codes, grouped.weights[name].codes, err_msg=name)
        np.testing.assert_array_equal(qt.scale, grouped.weights[name].scale, err_msg=name)
    for name, e in staged.layers.items():
        assert e["tokens"] == grouped.layers[name]["tokens"], name


def test_unknown_family_is_one_error(folders: dict, tmp_path: Path) -> None:
    """A config naming an architecture transformers does not have is one LowbitError line
    naming it and the closest it knows."""
    src = folders["qwen3_moe"][1]
    bad = tmp_path / "bad"
    bad.mkdir()
    cfg = json.loads((src / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps({**cfg, "model_type": "qwen3_moee"}))
    (bad / "model.safetensors").write_bytes((src / "model.safetensors").read_bytes())
    with pytest.raises(LowbitError, match=r"'qwen3_moee' is no architecture.*closest: qwen3_moe"):
        build_model(open_checkpoint(bad))


def test_awq_routed_floor(folders: dict, calib: Calibration) -> None:
    """AWQ with routed tokens rounds the expert layers under the floor to nearest (a fold that
    would change them is skipped) and says so; the others are AWQ's."""
    routed = Calibration(**{**calib.to_dict(), "experts": "routed", "expert_min_tokens": 60})
    run = awq_weights(folders["qwen2_moe"][1], "int4:g32", routed, progress=False)
    low = {n for n, e in run.layers.items() if "fallback" in e}
    assert low and all(expert_of(n) for n in low)
    assert all(run.methods[n] == "rtn" for n in low)
    assert all(run.methods[n] == "awq" for n in run.methods if expert_of(n) and n not in low)
    assert all(run.layers[n]["tokens"] < 60 for n in low)


@pytest.mark.parametrize("kind", ["mixtral", "qwen3_moe"])
def test_fused_on_disk_quantized_per_expert(
    folders: dict, calib: Calibration, mixtral_gptq: Any, kind: str, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """A fused folder (3-D ``experts.gate_up_proj`` / ``down_proj``) quantizes each expert as
    its own linear layer: round-to-nearest and GPTQ give, name for name, the codes and scales
    of the per-expert folder (the same weights one 2-D tensor per expert), every expert with a
    Hessian; compressed-tensors output carries the per-expert names vLLM loads (Mixtral's
    ``block_sparse_moe.experts.N.w1``), and both outputs read back to the same logits."""
    _, per_expert, fused = folders[kind]
    outs = {}
    for layout, folder in (("per-expert", per_expert), ("fused", fused)):
        out = tmp_path / layout
        assert main(["quantize", str(folder), "--to", "int4:g32", "--out", str(out),
                     "--no-progress"]) == 0  # fmt: skip
        outs[layout] = LowbitCheckpoint(out)
    capsys.readouterr()
    names = [n for n in outs["per-expert"].names() if expert_of(n)]
    assert len(names) == 12 * MOE_BLOCKS[kind]
    for n in names:
        a, b = outs["per-expert"].quantized(n), outs["fused"].quantized(n)
        np.testing.assert_array_equal(a.unpack(), b.unpack(), err_msg=n)
        np.testing.assert_array_equal(a.scale, b.scale, err_msg=n)
    with torch.no_grad():
        want = load_model(tmp_path / "per-expert")(_ids()).logits
        got = load_model(tmp_path / "fused")(_ids()).logits
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)

    first = (
        mixtral_gptq
        if kind == "mixtral"
        else gptq_weights(per_expert, "int4:g32", calib, progress=False)
    )
    runs = [first, gptq_weights(fused, "int4:g32", calib, progress=False)]
    for n in names:
        e = runs[1].layers[n]
        assert e["tokens"] == runs[1].calibration["tokens"] and e["rank"] > 0, n
        np.testing.assert_array_equal(runs[0].weights[n].codes, runs[1].weights[n].codes)

    ct = tmp_path / "ct"
    assert main(["quantize", str(fused), "--to", "int4:g32", "--out", str(ct),
                 "--out-format", "compressed-tensors", "--no-progress"]) == 0  # fmt: skip
    from safetensors import safe_open

    with safe_open(str(ct / "model.safetensors"), "np") as f:
        keys = set(f.keys())
    stem = "block_sparse_moe.experts.3.w3" if kind == "mixtral" else "mlp.experts.3.up_proj"
    assert f"model.layers.1.{stem}.weight_packed" in keys
    assert not any("gate_up_proj" in k for k in keys)
    with torch.no_grad():
        back = build_model(open_checkpoint(ct))(_ids()).logits
    torch.testing.assert_close(back, want, rtol=0, atol=1e-4)
