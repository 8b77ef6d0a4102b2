"""``lowbit sensitivity`` and ``lowbit quantize/plan --budget``: JSON, the plan file that
reproduces the checkpoint, the budget kept, workers and Ray giving the local result."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from lowbit.checkpoints.streaming import checkpoint_tensors, open_model
from lowbit.cli import main
from lowbit.plans.plan import PrecisionPlan

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytestmark = pytest.mark.torch

from tiny_models import save_hf_folder, tiny_llama  # noqa: E402

SCAN = ["--schemes", "int8:ch,int4:g32,int2:g32", "--calib-samples", "2", "--calib-len", "32"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_hf_folder(tiny_llama(seed=3), tmp_path_factory.mktemp("mixed") / "tiny")


@pytest.fixture(scope="module")
def scan_file(folder: Path) -> Path:
    out = folder.parent / "sens.json"
    assert main(["sensitivity", str(folder), *SCAN, "--out", str(out), "--no-progress",
                 "--json"]) == 0  # fmt: skip
    return out


def _json(capsys: pytest.CaptureFixture[str], argv: list[str]) -> Any:
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def _digests(folder: Path) -> dict[str, str]:
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.glob("*.safetensors"))
    }


def test_sensitivity_json_and_table(
    folder: Path, scan_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The --out file is the --json document: every tensor x scheme with bits, proxy, damage;
    calibration from token 32,768 of the default text; the table names the correlation."""
    capsys.readouterr()
    doc = json.loads(scan_file.read_text())
    assert doc["kind"] == "causal" and doc["measure"] == "exact"
    assert len(doc["entries"]) == 14 * 3
    assert "from token 32,768" in doc["calibration"]
    assert all(e["damage"] > 0 and e["proxy"] > 0 and e["bits"] > 0 for e in doc["entries"])
    assert -1 <= doc["rank_correlation"] <= 1
    assert main(["sensitivity", str(folder), "--schemes", "int4:g32", "--measure", "proxy",
                 "--calib-samples", "2", "--calib-len", "32", "--no-progress"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "proxy int4:g32" in out and "down_proj" in out and "damage int4" not in out


def test_fisher_measure(folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--measure fisher scans with the Fisher proxy only and says so in the JSON; --proxy
    fisher gives it beside the exact damage; plan --budget runs it; contradictions fail."""
    doc = _json(capsys, ["sensitivity", str(folder), *SCAN, "--measure", "fisher",
                         "--no-progress", "--json"])  # fmt: skip
    assert doc["measure"] == "proxy" and doc["proxy"] == "fisher"
    assert "E[g_i^2]" in doc["proxy_formula"] and "gradient_pass" in doc["seconds"]
    assert all(e["damage"] is None and e["proxy"] > 0 for e in doc["entries"])
    assert main(["sensitivity", str(folder), "--schemes", "int4:g32", "--proxy", "fisher",
                 "--calib-samples", "2", "--calib-len", "32", "--no-progress"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "damage int4:g32" in out and "proxy (fisher): sum_ij E[g_i^2]" in out
    shown = _json(capsys, ["plan", str(folder), "--budget", "4.5", *SCAN, "--measure",
                           "fisher", "--json"])  # fmt: skip
    assert shown["bits_per_weight"] <= 4.5 and "E[g_i^2]" in shown["metric"]
    assert main(["sensitivity", str(folder), *SCAN, "--measure", "fisher", "--proxy",
                 "input"]) == 2  # fmt: skip
    assert "drop --proxy input" in capsys.readouterr().err


def _plot_has_scheme_colours(png: Path, schemes: set[str]) -> None:
    """--plot draws each scheme in the report's colour for it: the palette's first colours,
    one per scheme (cheapest first), each painted."""
    matplotlib = pytest.importorskip("matplotlib.image")
    from lowbit.view.palette import QUALITATIVE

    img = (matplotlib.imread(png)[..., :3] * 255).round().astype(int)
    painted = {f"#{r:02x}{g:02x}{b:02x}" for r, g, b in img.reshape(-1, 3)}
    assert 1 < len(schemes) <= len(QUALITATIVE)
    assert set(QUALITATIVE[: len(schemes)]) <= painted
    assert not set(QUALITATIVE[len(schemes) :]) & painted


def test_budget_plan_file_reproduces_checkpoint(
    folder: Path, scan_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """quantize --budget stays within the budget, writes OUT.plan.json (and --plot a map in
    the report's colours), and quantize --plan of that file writes the same tensor bytes;
    plan --budget shows the same choice."""
    a = tmp_path / "a"
    plot = tmp_path / "plan.png"
    doc = _json(capsys, ["quantize", str(folder), "--budget", "4.5", "--sensitivity",
                         str(scan_file), "--out", str(a), "--no-progress", "--json",
                         "--plot", str(plot)])  # fmt: skip
    assert doc["totals"]["bits_per_weight"] <= 4.5
    _plot_has_scheme_colours(plot, {t["scheme"] for t in doc["mixed"]["tensors"]} - {"keep"})
    assert doc["mixed"]["bits_per_weight"] == pytest.approx(doc["totals"]["bits_per_weight"])
    assert len({t["scheme"] for t in doc["mixed"]["tensors"]}) > 1  # really mixed
    assert doc["mixed"]["solver"]["gap"] >= 0
    assert {"total", "plan", "quantize", "write", "other"} == set(doc["seconds"])
    plan_file = Path(doc["plan_file"])
    assert plan_file == tmp_path / "a.plan.json"
    b = tmp_path / "b"
    assert main(["quantize", str(folder), "--plan", str(plan_file), "--out", str(b),
                 "--no-progress", "--json"]) == 0  # fmt: skip
    capsys.readouterr()
    assert _digests(a) and _digests(a) == _digests(b)
    shown = _json(capsys, ["plan", str(folder), "--budget", "4.5", "--sensitivity",
                           str(scan_file), "--json"])  # fmt: skip
    assert shown["plan"] == doc["mixed"]["plan"]
    assert main(["plan", str(folder), "--budget", "4.5", "--sensitivity", str(scan_file)]) == 0
    out = capsys.readouterr().out
    assert "optimality" in out and "predicted damage" in out and "q_proj" in out


@pytest.mark.parametrize("method", ["gptq", "awq"])
def test_budget_with_calibrated_plan_file_reproduces_checkpoint(
    folder: Path, scan_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], method: str
) -> None:
    """quantize --budget --method gptq (awq) writes a plan whose every rule names the method, so
    quantize --plan of it (no --method) writes the same tensor bytes; the same plan without
    the methods rounds to nearest (other bytes), and with --method gives them back."""
    calib = ["--calib-samples", "2", "--calib-len", "32"]
    a = tmp_path / "a"
    doc = _json(capsys, ["quantize", str(folder), "--budget", "4.5", "--sensitivity",
                         str(scan_file), "--method", method, *calib, "--out", str(a),
                         "--no-progress", "--json"])  # fmt: skip
    assert doc["method"]["method"] == method
    assert doc["totals"]["bits_per_weight"] <= 4.5
    assert len({t["scheme"] for t in doc["mixed"]["tensors"]}) > 1
    plan = json.loads(Path(doc["plan_file"]).read_text())
    assert plan == doc["mixed"]["plan"]
    assert plan["rules"] and all(r["method"] == method for r in plan["rules"])
    assert doc["replay"][3:] == ["--plan", doc["plan_file"], *calib]

    def quantize(name: str, plan_doc: dict[str, Any], *more: str) -> dict[str, str]:
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(plan_doc))
        out = tmp_path / name
        assert main(["quantize", str(folder), "--plan", str(path), *calib, *more, "--out",
                     str(out), "--no-progress", "--json"]) == 0  # fmt: skip
        capsys.readouterr()
        return _digests(out)

    assert _digests(a) and quantize("b", plan) == _digests(a)
    bare = {**plan, "rules": [{k: v for k, v in r.items() if k != "method"}
                              for r in plan["rules"]]}  # fmt: skip
    assert quantize("c", bare) != _digests(a)  # without the methods: round to nearest
    assert quantize("d", bare, "--method", method) == _digests(a)
    # the same choice as the round-to-nearest plan (the scan decides, not the method)
    rtn = _json(capsys, ["plan", str(folder), "--budget", "4.5", "--sensitivity",
                         str(scan_file), "--json"])  # fmt: skip
    tensors = checkpoint_tensors(open_model(str(folder)))

    def labels(plan_doc: dict[str, Any]) -> dict[str, str]:
        applied = PrecisionPlan.from_dict(plan_doc).apply(tensors)
        return {t.name: t.label for t in applied.quantized}

    assert labels(rtn["plan"]) == labels(bare)


def test_budget_never_exceeded(
    folder: Path, scan_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """For budgets across the range, the chosen plan's stored bits/weight is within it, and a
    larger budget never predicts more damage."""
    last = None
    for bpw in (3.2, 3.7, 4.4, 5.1, 6.3, 8.6):
        doc = _json(capsys, ["plan", str(folder), "--budget", str(bpw), "--sensitivity",
                             str(scan_file), "--json"])  # fmt: skip
        assert doc["bits_per_weight"] <= bpw
        assert last is None or doc["predicted_damage"] <= last + 1e-12
        last = doc["predicted_damage"]
    size = _json(capsys, ["plan", str(folder), "--size", "175kB", "--sensitivity",
                          str(scan_file), "--json"])  # fmt: skip
    assert size["total_bytes"] <= 175_000
    assert main(["plan", str(folder), "--size", "150kB", "--sensitivity", str(scan_file)]) == 2
    assert "need at least 162,560 bytes" in capsys.readouterr().err


def test_preset_and_errors(
    folder: Path, scan_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--plan-preset writes llama.cpp's rule in lowbit schemes; bad combinations are one line."""
    doc = _json(capsys, ["quantize", str(folder), "--plan-preset", "q4_k_m_like", "--to",
                         "int4:g32", "--dry-run", "--json"])  # fmt: skip
    labels = {t["name"]: t["format"] for t in doc["tensors"] if t["action"] == "quantize"}
    # two layers: llama.cpp's rule promotes the last (layer >= 7 * 2 // 8)
    assert labels["model.layers.1.self_attn.v_proj.weight"] == "int6:g128:fp32"
    assert labels["model.layers.1.mlp.down_proj.weight"] == "int6:g128:fp32"
    assert labels["model.layers.0.self_attn.v_proj.weight"] == "int4:g32:fp32"
    assert labels["model.layers.1.self_attn.q_proj.weight"] == "int4:g32:fp32"
    for argv, msg in (
        (["--budget", "4.5", "--to", "int4"], "drop --to"),
        (["--budget", "4.5"], "need candidate schemes"),
        (["--budget", "4.5", "--size", "1MB"], "not both"),
        (["--budget", "lots", "--sensitivity", str(scan_file)], "a number of bits"),
        (["--budget", "1", "--sensitivity", str(scan_file)], "below the cheapest plan"),
        (
            ["--budget", "4.5", "--sensitivity", str(scan_file), "--scale-method", "mse"],
            "--scale-method: write it into the candidate schemes",
        ),
        (
            ["--plan-preset", "q4_k_m_like", "--to", "int4", "--group", "64", "--asym"],
            "--group, --asym: write it into --to",
        ),
    ):
        assert main(["quantize", str(folder), *argv, "--out", str(tmp_path / "x")]) == 2
        assert msg in capsys.readouterr().err


def test_workers_equal_local(folder: Path, scan_file: Path) -> None:
    """Two worker processes give the one-process result, trial for trial."""
    from lowbit.evaluation.sensitivity import SensitivityResult

    local = SensitivityResult.from_dict(json.loads(scan_file.read_text()))
    out = scan_file.parent / "sens2.json"
    assert main(["sensitivity", str(folder), *SCAN, "--workers", "2", "--out", str(out),
                 "--no-progress", "--json"]) == 0  # fmt: skip
    par = SensitivityResult.from_dict(json.loads(out.read_text()))
    assert [(e.tensor, e.scheme, e.bits) for e in par.entries] == [
        (e.tensor, e.scheme, e.bits) for e in local.entries
    ]
    for a, b in zip(par.entries, local.entries, strict=True):
        assert a.damage == pytest.approx(b.damage, rel=1e-5, abs=1e-12)
        assert a.proxy == pytest.approx(b.proxy, rel=1e-6)


# The Ray scan runs in its own process (a session of its own, so that a timeout ends Ray's
# daemons too): its warnings are not pytest's errors, and a hung start cannot hang the suite.
_RAY_SCAN = """
import json, sys
import ray
from lowbit.checkpoints import open_checkpoint
from lowbit.checkpoints.tokenizer import build_tokenizer
from lowbit.evaluation.scan_samples import scan_samples
from lowbit.evaluation.sensitivity import sensitivity

ckpt = open_checkpoint(sys.argv[1])
calib = scan_samples("causal", build_tokenizer(ckpt), samples=2, length=32)
ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False,
         object_store_memory=100 * 2**20)
try:
    got = sensitivity(ckpt, ("int8:ch", "int4:g32", "int2:g32"), calib, ray=True)
finally:
    ray.shutdown()
with open(sys.argv[2], "w", encoding="utf-8") as f:
    json.dump(got.to_dict(), f)
"""
_RAY_TIMEOUT = 300  # seconds; measured: about 20 s wall on 2 busy cores


@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="ray is not installed")
def test_ray_equals_local(folder: Path, scan_file: Path) -> None:
    """A local Ray instance (one CPU) runs the trials as actors; the result is the local one."""
    from lowbit.evaluation.sensitivity import SensitivityResult

    local = SensitivityResult.from_dict(json.loads(scan_file.read_text()))
    out = scan_file.parent / "sens-ray.json"
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-c", _RAY_SCAN, str(folder), str(out)]
    proc = subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
    )
    try:
        log, _ = proc.communicate(timeout=_RAY_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"the Ray scan did not finish in {_RAY_TIMEOUT} s")
    assert proc.returncode == 0, log.decode(errors="replace")[-4000:]
    got = SensitivityResult.from_dict(json.loads(out.read_text()))
    assert got.seconds["workers"] == 1
    assert [(e.tensor, e.scheme, e.bits) for e in got.entries] == [
        (e.tensor, e.scheme, e.bits) for e in local.entries
    ]
    for a, b in zip(got.entries, local.entries, strict=True):
        assert a.damage == pytest.approx(b.damage, rel=1e-5, abs=1e-12)
        assert a.proxy == pytest.approx(b.proxy, rel=1e-6)
