"""lowbit's methods onto MLX grids: AWQ (scales folded, groups clipped, rounded as
mx.quantize rounds) and --budget / --size with MLX candidates priced in exact file bytes."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import lowbit
from lowbit.calibration.data import Calibration
from lowbit.checkpoints.verify import verify_checkpoint
from lowbit.cli import main
from lowbit.jobs.mlx import quantize_to_mlx

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("safetensors")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tiny_models import save_hf_folder, tiny_llama  # noqa: E402

pytestmark = pytest.mark.torch

HELD_OUT = "Copper lanterns hum over violet harbors while winter orchards wait for spring. " * 3


@pytest.fixture(scope="module")
def salient(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path, Path]:
    """A tiny tied llama whose first 8 channels are 12x louder after every norm (the salient
    input channels AWQ protects), its folder and a calibration text."""
    d = tmp_path_factory.mktemp("mlx-awq")
    model = tiny_llama(1, tie=True)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.input_layernorm.weight[:8] *= 12
            layer.post_attention_layernorm.weight[:8] *= 12
    calib = d / "calib.txt"
    calib.write_text(" ".join(f"The river {i} keeps the stone {i * 7 % 13}." for i in range(200)))
    return model, save_hf_folder(model, d / "src"), calib


def _kl(model: Any, folder: Path) -> float:
    """KL of a folder's next-token distributions from the float model's, on held-out text."""
    from lowbit.models.build import load_model

    ids = torch.tensor([[257, *list(HELD_OUT.encode())[:200]]])
    with torch.no_grad():
        ref = model(ids).logits.float().log_softmax(-1)
        got = load_model(folder)(ids).logits.float().log_softmax(-1)
    return float((ref.exp() * (ref - got)).sum(-1).mean())


def test_awq_onto_mlx(salient: tuple[Any, Path, Path], tmp_path: Path) -> None:
    """--method awq onto MLX's 4-bit g64 grid: every block linear AWQ'd (half the calibrated
    layer error of round to nearest), the folds written (the norms carry 1/s), and on held-out
    text the folder's KL from the float model is at least 15 % below round to nearest's."""
    model, src, calib = salient
    cal = Calibration(source=str(calib), samples=8, length=64)
    rtn = quantize_to_mlx(src, tmp_path / "rtn", progress=False)
    awq = lowbit.quantize_model(src, out=tmp_path / "awq", out_format="mlx", method="awq",
                                calibration=cal, threads=2, progress=False)  # fmt: skip
    rec = awq.method
    assert rec is not None and rec["method"] == "awq" and rec["awq_tensors"] == 14
    assert rec["mean_error"]["awq"] < 0.6 * rec["mean_error"]["rtn"]
    assert any("alpha" in f for f in rec["folds"])
    assert awq.bytes == rtn.bytes  # the same grids: the same file sizes
    from safetensors.numpy import load_file

    norm = "model.layers.0.input_layernorm.weight"
    a = load_file(str(tmp_path / "awq" / "model.safetensors"))[norm]
    assert not np.array_equal(a, model.model.layers[0].input_layernorm.weight.detach().numpy())
    assert _kl(model, tmp_path / "awq") < 0.85 * _kl(model, tmp_path / "rtn")
    assert verify_checkpoint(tmp_path / "awq")["kind"] == "mlx"


def test_cli_awq_and_refusals(salient: tuple[Any, Path, Path], tmp_path: Path, capsys) -> None:
    """The CLI's --method awq --out-format mlx, and one line for methods MLX does not take
    (hadamard) and AWQ onto the FP modes."""
    _, src, calib = salient
    out = tmp_path / "awq"
    argv = ["quantize", str(src), "--out-format", "mlx", "--method", "awq", "--q-bits", "3",
            "--q-group-size", "32", "--calib", str(calib), "--calib-samples", "4",
            "--calib-len", "48", "--out", str(out), "--threads", "2"]  # fmt: skip
    assert main(argv) == 0
    assert "AWQ onto the MLX grids: 14 tensors" in capsys.readouterr().out
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["quantization"] == {"group_size": 32, "bits": 3, "mode": "affine"}
    bad = ["quantize", str(src), "--out-format", "mlx", "--out", str(tmp_path / "x")]
    assert main([*bad, "--method", "hadamard"]) == 2
    assert "gptq or awq onto the same affine grids" in capsys.readouterr().err
    assert main([*bad, "--method", "awq", "--q-mode", "mxfp4"]) == 2
    assert "affine only" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_mlx_lm_loads_awq_folder(salient: tuple[Any, Path, Path], tmp_path: Path) -> None:
    """mlx_lm.load runs the AWQ folder with the logits of lowbit's own evaluation of it."""
    pytest.importorskip("mlx.core", reason="mlx[cpu] is not installed (pip install 'mlx[cpu]')")
    pytest.importorskip("mlx_lm", reason="mlx-lm is not installed (pip install mlx-lm)")
    import mlx.core as mx
    from mlx_lm import load

    from lowbit.models.build import load_model

    _, src, calib = salient
    out = tmp_path / "awq"
    cal = Calibration(source=str(calib), samples=4, length=48)
    quantize_to_mlx(src, out, method="awq", calibration=cal, threads=2, progress=False)
    ids = [[257, 72, 101, 108, 108, 111, 32, 116, 104, 101, 114, 101]]
    model, _ = load(str(out))
    theirs = np.array(model(mx.array(ids)).astype(mx.float32))
    with torch.no_grad():
        ours = load_model(out)(torch.tensor(ids)).logits.float().numpy()
    assert np.max(np.abs(theirs - ours)) <= 2e-4 * float(theirs.max() - theirs.min())


# --- budgets with MLX candidates ------------------------------------------------------------

CANDS = ["2bit-g64", "3bit-g32", "4bit-g64", "8bit-g64"]


@pytest.fixture(scope="module")
def budgeted(salient: tuple[Any, Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A --size budget halfway between the all-2-bit and all-8-bit folders, written."""
    from lowbit.jobs.mlx_budget import mlx_budget

    _, src, calib = salient
    out = tmp_path_factory.mktemp("mlx-budget") / "m"
    res = mlx_budget(src, out, size=60_000, candidates=CANDS, scan_text=str(calib),
                     scan_samples_count=2, scan_length=32, progress=False)  # fmt: skip
    return res, out


def test_budget_bytes_are_the_plans(budgeted: Any) -> None:
    """The folder's tensor bytes equal the plan's prediction exactly and fit the size; each
    module is stored on its chosen grid, as config.json's per-module entries say (mlx-lm's
    spelling), and the reader takes them back."""
    from safetensors.numpy import load_file

    from lowbit.checkpoints import open_checkpoint
    from lowbit.checkpoints.mlx.budget import module_bytes

    res, out = budgeted
    plan = res.details["plan"]
    t = load_file(str(out / "model.safetensors"))
    stored = sum(a.nbytes for a in t.values())
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert stored == plan["tensor_bytes"] == index["metadata"]["total_size"] <= 60_000
    assert len(set(plan["modules"].values())) > 1  # a mix, not one grid
    q = json.loads((out / "config.json").read_text())["quantization"]
    back = open_checkpoint(out)
    qbytes = 0
    for module, grid in plan["modules"].items():
        bits, group = int(grid.split("bit-g")[0]), int(grid.split("bit-g")[1])
        assert q[module] == {"group_size": group, "bits": bits, "mode": "affine"}
        assert (
            t[f"{module}.weight"].shape[-1] * 32 // bits == back.info(f"{module}.weight").shape[-1]
        )
        assert t[f"{module}.scales"].shape[-1] * group == back.info(f"{module}.weight").shape[-1]
        p = back.modules[module]
        qbytes += module_bytes(tuple(back.info(f"{module}.weight").shape), p, np.float32)
        assert (p.bits, p.group_size) == (bits, group)
    assert qbytes == plan["quantized_bytes"]


def test_budget_loads_in_mlx_lm(budgeted: Any) -> None:
    """mlx_lm.load runs the budget's mixed folder with lowbit's logits."""
    pytest.importorskip("mlx.core", reason="mlx[cpu] is not installed (pip install 'mlx[cpu]')")
    pytest.importorskip("mlx_lm", reason="mlx-lm is not installed (pip install mlx-lm)")
    import mlx.core as mx
    from mlx_lm import load

    from lowbit.models.build import load_model

    _, out = budgeted
    ids = [[257, 72, 101, 108, 108, 111, 32, 116, 104, 101, 114, 101]]
    model, _ = load(str(out))
    theirs = np.array(model(mx.array(ids)).astype(mx.float32))
    with torch.no_grad():
        ours = load_model(out)(torch.tensor(ids)).logits.float().numpy()
    assert np.max(np.abs(theirs - ours)) <= 2e-4 * float(theirs.max() - theirs.min())


def test_quantize_model_routes_mlx_budgets(budgeted: Any, salient: Any, tmp_path: Path) -> None:
    """lowbit.quantize_model(model, None, out, out_format="mlx", size=...) is mlx_budget: the
    same folder, byte for byte; lowbit.mlx_budget is that job; a budget with to=/bits=, or a
    dry run without one, is refused."""
    from lowbit.jobs import mlx_budget as job

    _, src, calib = salient
    res, out = budgeted
    got = lowbit.quantize_model(src, None, tmp_path / "q", out_format="mlx", size=60_000,
                                candidates=CANDS, calibration=str(calib), scan_samples=2,
                                scan_length=32, progress=False)  # fmt: skip
    assert got.details["plan"] == res.details["plan"]
    for name in ("model.safetensors", "config.json"):
        assert (tmp_path / "q" / name).read_bytes() == (out / name).read_bytes(), name
    assert lowbit.mlx_budget is job.mlx_budget
    for kw, msg in [
        ({"to": "mixed_3_6", "budget": 4.0}, "drop to=/bits=/group_size="),
        ({"bits": 3, "size": 60_000}, "drop to=/bits=/group_size="),
        ({"dry_run": True}, "dry_run with out_format='mlx' shows a budget's plan"),
    ]:
        with pytest.raises(lowbit.LowbitError, match=re.escape(msg)):
            lowbit.quantize_model(src, out=tmp_path / "r", out_format="mlx", **kw)
    assert not (tmp_path / "r").exists()


def test_cli_budget_bits_per_weight(
    salient: tuple[Any, Path, Path], tmp_path: Path, capsys
) -> None:
    """--budget BPW --out-format mlx --dry-run: the plan's stored bits per quantized weight are
    within the budget, and nothing is written."""
    _, src, calib = salient
    out = tmp_path / "b"
    argv = ["quantize", str(src), "--out-format", "mlx", "--budget", "3.5", "--candidates",
            ",".join(CANDS), "--calib", str(calib), "--scan-samples", "2", "--scan-len", "32",
            "--out", str(out), "--dry-run", "--json"]  # fmt: skip
    assert main(argv) == 0
    plan = json.loads(capsys.readouterr().out)["plan"]
    assert 3.0 < plan["bits_per_weight"] <= 3.5
    assert not out.exists()


def test_cli_budget_block_measure(salient: tuple[Any, Path, Path], tmp_path: Path, capsys) -> None:
    """--measure block with --out-format mlx: a block-local damage for every candidate of every
    module, finite and >= 0, and a plan within the budget."""
    from lowbit.checkpoints import open_checkpoint
    from lowbit.checkpoints.mlx.budget import budget_options, parse_candidates
    from lowbit.evaluation.block_sensitivity import BLOCK_METRIC

    _, src, calib = salient
    argv = ["quantize", str(src), "--out-format", "mlx", "--budget", "3.5", "--candidates",
            ",".join(CANDS), "--calib", str(calib), "--scan-samples", "2", "--scan-len", "32",
            "--measure", "block", "--out", str(tmp_path / "b"), "--dry-run", "--json"]  # fmt: skip
    assert main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["measure"], doc["metric"]) == ("block", BLOCK_METRIC)
    options = budget_options(open_checkpoint(src), parse_candidates(CANDS))
    assert {n: sorted(d) for n, d in doc["damages"].items()} == {
        n: sorted(o) for n, o in options.items()
    }
    values = [v for d in doc["damages"].values() for v in d.values()]
    assert all(np.isfinite(v) and v >= 0 for v in values)
    assert 3.0 < doc["plan"]["bits_per_weight"] <= 3.5


def test_block_measure_uses_the_rounder(salient: tuple[Any, Path, Path]) -> None:
    """gguf_block_sensitivity's rounder is what a trial stores: one that keeps the weight gives
    no damage at all, MLX's grids damage every module, 2 bits more than 8."""
    from lowbit.checkpoints import open_checkpoint
    from lowbit.checkpoints.mlx.budget import budget_options, parse_candidates
    from lowbit.checkpoints.mlx.writer import model_dtype
    from lowbit.checkpoints.tokenizer import build_tokenizer
    from lowbit.evaluation.gguf_sensitivity import gguf_block_sensitivity
    from lowbit.evaluation.scan_samples import scan_samples
    from lowbit.jobs.mlx_budget import _rounder

    _, src, calib = salient
    ckpt = open_checkpoint(src)
    options = budget_options(ckpt, parse_candidates(["2bit-g64", "8bit-g64"]))
    windows = scan_samples("causal", build_tokenizer(ckpt), str(calib), samples=2, length=32)
    kept = gguf_block_sensitivity(ckpt, options, windows, rounder=lambda w, _t, _v: w)
    mlx = gguf_block_sensitivity(ckpt, options, windows, rounder=_rounder(model_dtype(ckpt, None)))
    assert set(kept.damages) == set(mlx.damages) == set(options) and len(options) > 1
    assert all(v == 0.0 for d in kept.damages.values() for v in d.values())
    for d in mlx.damages.values():
        assert d["2bit-g64"] > d["8bit-g64"] > 0


@pytest.mark.parametrize(
    ("extra", "msg"),
    [
        (["--budget", "3.5", "--candidates", "4bit-g48"], "MLX candidate '4bit-g48'"),
        (["--budget", "3.5", "--candidates", "q4_k"], "spell grids <bits>bit-g<group>"),
        (["--budget", "3.5", "--q-bits", "3"], "drop --to/--q-bits"),
        (["--budget", "lots"], "stored bits per quantized weight"),
        (["--size", "1KB", "--candidates", "2bit-g64"], "below the smallest candidates"),
        (["--budget", "3.5", "--measure", "proxy"], "--measure block); no proxy"),
        (["--budget", "3.5", "--scale-method", "percentile"], "does not apply to --out-format"),
        (["--budget", "3.5", "--scale-method", "mse"], "chooses GPTQ's MLX group scales"),
    ],
)
def test_cli_budget_bad_input(
    salient: tuple[Any, Path, Path], tmp_path: Path, capsys, extra: list[str], msg: str
) -> None:
    """Bad budget input: one LowbitError line, exit 2, no folder."""
    _, src, calib = salient
    argv = ["quantize", str(src), "--out-format", "mlx", "--calib", str(calib), "--scan-samples",
            "1", "--scan-len", "16", "--out", str(tmp_path / "x"), *extra]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert msg in err and err.count("\n") == 1
    assert not (tmp_path / "x").exists()
