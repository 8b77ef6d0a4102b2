"""lowbit.quantize_model with a calibrated method writes what ``lowbit quantize --method ...``
writes; it refuses bad combinations before any calibration; ``import lowbit`` stays light."""

from __future__ import annotations

import ast
import contextlib
import io
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytestmark = pytest.mark.torch

import lowbit  # noqa: E402
import lowbit.calibration.calibrated as calibrated  # noqa: E402
from lowbit.calibration.gptq import gptq_weights  # noqa: E402
from lowbit.checkpoints.lowbit_format.checkpoint import LowbitCheckpoint  # noqa: E402
from lowbit.cli import main  # noqa: E402
from lowbit.errors import LowbitError  # noqa: E402
from tiny_models import save_hf_folder, tiny_bert, tiny_llama  # noqa: E402

WORDS = "river stone cloud lantern maple copper violet harbor meadow falcon ember quartz"
DOCS = Path(__file__).resolve().parents[2] / "docs"


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path, list[str]]]:
    """kind -> (model folder, calibration text, CLI calibration options)."""
    d = tmp_path_factory.mktemp("calibrated")
    w = WORDS.split()
    llama_text = d / "llama.txt"
    llama_text.write_text(" ".join(f"The {w[i % 12]} keeps {w[i * 7 % 12]}." for i in range(60)))
    bert_text = d / "bert.txt"
    words = w * 6
    bert_text.write_text(
        " ".join(f"The {x} stays near sentence number {i}." for i, x in enumerate(words))
    )
    bert = tiny_bert(bias_std=0.05)  # BERT's init zeroes biases; a fold divides them
    return {
        "llama": (save_hf_folder(tiny_llama(), d / "llama"), llama_text, ["3", "64"]),
        "bert": (save_hf_folder(bert, d / "bert"), bert_text, ["40", "64"]),
    }


def _cli(*argv: str) -> None:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main([*argv, "--no-progress"])
    assert rc == 0, err.getvalue()


def _same_checkpoint(a: Path, b: Path) -> None:
    """The same files, tensors byte for byte; the manifests equal but for the seconds."""
    assert sorted(p.name for p in a.iterdir()) == sorted(p.name for p in b.iterdir())
    shards = sorted(a.glob("*.safetensors"))
    assert shards
    for f in shards:
        assert f.read_bytes() == (b / f.name).read_bytes(), f.name
    ma, mb = LowbitCheckpoint(a).manifest, LowbitCheckpoint(b).manifest
    for m in (ma, mb):
        m.pop("manifest_sha256", None)
        m["method"].pop("seconds")
    assert ma == mb


# (kind, CLI options, API method, plan)
CASES = [
    ("llama", ["--to", "int4:g32", "--method", "gptq"], lambda: lowbit.GPTQ(), "int4:g32"),
    (
        "llama",
        ["--to", "int4:g32:asym", "--method", "gptq", "--damp", "0.05", "--act-order", "none"],
        lambda: lowbit.GPTQ(damp=0.05, act_order="none"),
        "int4:g32:asym",
    ),
    ("llama", ["--to", "int4:g32", "--method", "awq"], lambda: "awq", "int4:g32"),
    (
        "llama",
        ["--to", "nf4:g32", "--method", "awq", "--no-clip"],
        lambda: lowbit.AWQ(clip=False),
        "nf4:g32",
    ),
    (
        "llama",
        ["--to", "int8:ch", "--activations", "int8", "--smooth", "0.5"],
        lambda: lowbit.SmoothQuant(alpha=0.5),
        "int8:ch+int8",
    ),
    ("bert", ["--to", "int4:g32", "--method", "gptq"], lambda: "gptq", "int4:g32"),
    ("bert", ["--to", "int4:g32", "--method", "awq"], lambda: lowbit.AWQ(), "int4:g32"),
    (
        "bert",
        ["--to", "int8:ch", "--activations", "int8", "--smooth"],
        lambda: "smoothquant",
        "int8:ch+int8",
    ),
]


def _plan(spec: str) -> Any:
    scheme, _, acts = spec.partition("+")
    return lowbit.PrecisionPlan.uniform(scheme, activations=acts or None)


@pytest.mark.parametrize(
    ("kind", "options", "method", "spec"),
    CASES,
    ids=[f"{c[0]}-{'-'.join(c[1][1:])}" for c in CASES],
)
def test_same_checkpoint_as_the_cli(
    models: dict[str, Any], tmp_path: Path, kind: str, options: list[str], method: Any, spec: str
) -> None:
    """The Python call writes the CLI's checkpoint: every tensor byte for byte (codes, scales,
    folded norms), the same manifest and method record (seconds aside); it returns the record."""
    folder, text, (samples, length) = models[kind]
    _cli("quantize", str(folder), *options, "--calib", str(text), "--calib-samples", samples,
         "--calib-len", length, "--out", str(tmp_path / "cli"))  # fmt: skip
    calib = lowbit.Calibration(source=str(text), samples=int(samples), length=int(length))
    res = lowbit.quantize_model(
        folder, _plan(spec), tmp_path / "api", method=method(), calibration=calib, progress=False
    )
    _same_checkpoint(tmp_path / "cli", tmp_path / "api")
    record = LowbitCheckpoint(tmp_path / "api").manifest["method"]
    assert res["method"] == record
    name = record["method"]
    assert name == (method() if isinstance(method(), str) else method().name)
    moved = record["gptq_tensors" if name == "gptq" else "method_tensors"]
    assert moved == 12 if kind == "bert" else moved == 14
    assert res["out"] == str(tmp_path / "api") and res["totals"]["quantized"] == moved + (
        kind == "bert"  # the pooler, outside the blocks, rounded to nearest
    )


def test_compressed_tensors_and_a_path_source(models: dict[str, Any], tmp_path: Path) -> None:
    """GPTQ to compressed-tensors, calibration given as a path (a .jsonl of records, default
    sizes): the CLI's folder, file for file."""
    folder, _, _ = models["llama"]
    records = tmp_path / "calib.jsonl"
    w = WORDS.split()
    records.write_text("\n".join(json.dumps({"text": f"A {x} and a {x}."}) for x in w))
    _cli("quantize", str(folder), "--to", "int4:g32", "--method", "gptq", "--calib",
         str(records), "--out-format", "compressed-tensors", "--out", str(tmp_path / "cli"))  # fmt: skip
    res = lowbit.quantize_model(
        folder, _plan("int4:g32"), tmp_path / "api", method="gptq", calibration=records,
        out_format="compressed-tensors", progress=False,
    )  # fmt: skip
    assert res["method"]["calibration"]["source"] == str(records)
    assert res["method"]["calibration"]["samples_used"] == len(w)
    for f in sorted((tmp_path / "cli").iterdir()):
        assert f.read_bytes() == (tmp_path / "api" / f.name).read_bytes(), f.name


def test_round_to_nearest_and_rules_naming_gptq(models: dict[str, Any], tmp_path: Path) -> None:
    """The default rounds to nearest (no record, no calibration) as ``lowbit quantize`` does;
    with a plan whose rules say ``method: gptq`` it calibrates those tensors alone, as the
    CLI's default ``--method rtn`` does."""
    folder, text, _ = models["llama"]
    _cli("quantize", str(folder), "--to", "int4:g32", "--out", str(tmp_path / "cli"))
    res = lowbit.quantize_model(folder, _plan("int4:g32"), tmp_path / "api", progress=False)
    assert res["method"] is None
    assert "method" not in LowbitCheckpoint(tmp_path / "api").manifest
    for f in sorted((tmp_path / "cli").glob("*.safetensors")):
        assert f.read_bytes() == (tmp_path / "api" / f.name).read_bytes()

    rules = [{"regex": r"model\.layers\.0\.self_attn\..*", "format": "int4:g32", "method": "gptq"}]
    doc = {"version": 1, "default": "int4:g32", "rules": rules}
    (tmp_path / "plan.json").write_text(json.dumps(doc))
    _cli("quantize", str(folder), "--plan", str(tmp_path / "plan.json"), "--calib", str(text),
         "--calib-samples", "3", "--calib-len", "64", "--out", str(tmp_path / "cli-r"))  # fmt: skip
    calib = lowbit.Calibration(source=str(text), samples=3, length=64)
    res = lowbit.quantize_model(
        folder, lowbit.PrecisionPlan.from_dict(doc), tmp_path / "api-r", calibration=calib,
        progress=False,
    )  # fmt: skip
    _same_checkpoint(tmp_path / "cli-r", tmp_path / "api-r")
    assert res["method"]["gptq_tensors"] == 4
    ckpt = LowbitCheckpoint(tmp_path / "api-r")
    assert ckpt.entry("model.layers.0.self_attn.q_proj.weight")["method"] == "gptq"
    assert ckpt.entry("model.layers.1.self_attn.q_proj.weight")["method"] == "rtn"


def test_weights_and_a_record_as_before(models: dict[str, Any], tmp_path: Path) -> None:
    """A record (Mapping) with ``weights=`` is written as it is, as before the calibrated
    methods: the tensors given, the record in the manifest and per tensor."""
    folder, text, _ = models["llama"]
    run = gptq_weights(folder, "int4:g32", lowbit.Calibration(source=str(text), samples=2,
                       length=32), progress=False)  # fmt: skip
    record = {"method": "gptq", "note": "made elsewhere"}
    res = lowbit.quantize_model(
        folder, _plan("int4:g32"), tmp_path / "q", method=record, weights=run.weights,
        progress=False,
    )  # fmt: skip
    assert res["method"] == record
    ckpt = LowbitCheckpoint(tmp_path / "q")
    assert ckpt.manifest["method"] == record
    for name, qt in run.weights.items():
        assert ckpt.entry(name)["method"] == "gptq"
        np.testing.assert_array_equal(ckpt.get(name), qt.dequantize())


REFUSALS = [
    ({"method": "gptqq"}, "int4:g32", "unknown method 'gptqq'"),
    ({"method": 3}, "int4:g32", "method must be one of"),
    ({"method": "rtn", "calibration": "default"}, "int4:g32", "method 'rtn' rounds to nearest"),
    ({"calibration": "default"}, "int4:g32", "method 'rtn' rounds to nearest"),
    ({"method": {"method": "gptq"}, "calibration": "default"}, "int4:g32", "a method record"),
    ({"method": "gptq", "calibration": 7}, "int4:g32", "calibration must be a Calibration"),
    ({"method": "gptq", "calibration": "x.csv"}, "int4:g32", "use 'default', a .txt"),
    ({"method": "smoothquant"}, "int8:ch", "the plan must give its quantized tensors one"),
    ({"method": lowbit.SmoothQuant()}, "int8:ch", "it has none"),
    ({"method": lowbit.SmoothQuant(activations="fp8")}, "int8:ch+int8", "plan's activations"),
    ({"method": "gptq", "weights": {}}, "int4:g32", "makes its own"),
    ({"method": "gptq", "out_format": "gguf"}, "nf4", "lowbit writes GGUF Q8_0 and Q4_0"),
    ({"method": "awq", "rules": "gptq"}, "int4:g32", "one run calibrates with one method"),
    ({"method": "gptq", "rules": "awq"}, "int4:g32", "one run calibrates with one method"),
    ({"method": lowbit.GPTQ(), "rules": "awq"}, "int4:g32", "one run calibrates with one"),
    ({"method": "smoothquant", "rules": "gptq"}, "int8:ch+int8", "SmoothQuant rounds to"),
    ({"method": "smoothquant", "rules": "awq"}, "int8:ch+int8", "SmoothQuant rounds to"),
    ({"method": "gptq", "exists": True}, "int4:g32", "pass overwrite=True"),
]


@pytest.mark.parametrize(("kwargs", "spec", "message"), REFUSALS)
def test_refusals_before_any_calibration(
    models: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    kwargs: dict[str, Any], spec: str, message: str,
) -> None:  # fmt: skip
    """Each bad combination is one LowbitError naming it, raised before calibration starts,
    with nothing written."""

    def never(*args: Any, **kw: Any) -> Any:
        raise AssertionError("calibration ran")

    monkeypatch.setattr(calibrated, "gptq_weights", never)
    monkeypatch.setattr(calibrated, "awq_weights", never)
    folder, _, _ = models["llama"]
    kwargs = dict(kwargs)
    plan = _plan(spec)
    if "rules" in kwargs:
        scheme, _, acts = spec.partition("+")
        rule = {"component": "mlp", "format": scheme, "method": kwargs.pop("rules")}
        plan = lowbit.PrecisionPlan.from_dict(
            {"default": scheme, "activations": acts or None, "rules": [rule]}
        )
    out = tmp_path / "out"
    if kwargs.pop("exists", False):
        out.mkdir()
    with pytest.raises(LowbitError, match=re.escape(message)):
        lowbit.quantize_model(folder, plan, out, progress=False, **kwargs)
    assert not out.exists() or not any(out.iterdir())


def test_import_lowbit_does_not_import_torch() -> None:
    """``import lowbit`` and naming the calibrated API (lowbit.GPTQ, AWQ, SmoothQuant,
    Calibration, quantize_model) load neither torch nor transformers."""
    code = (
        "import sys, lowbit\n"
        "loaded = [m for m in ('torch', 'transformers') if m in sys.modules]\n"
        "lowbit.GPTQ(damp=0.01, act_order='static'); lowbit.AWQ(); lowbit.SmoothQuant()\n"
        "lowbit.Calibration(); lowbit.quantize_model\n"
        "print(loaded, [m for m in ('torch', 'transformers') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[] []"


def test_the_docs_example_calls_what_exists() -> None:
    """docs/quantize-models.md's "From Python" example names only lowbit attributes that exist,
    with arguments their signatures take (running it would quantize SmolLM2)."""
    import inspect

    text = (DOCS / "quantize-models.md").read_text(encoding="utf-8")
    section = text.split("### From Python", 1)[1]
    block = re.search(r"```python\n(.*?)```", section, re.S)
    assert block is not None
    calls = [
        n
        for n in ast.walk(ast.parse(block.group(1)))
        if isinstance(n, ast.Call)
        and isinstance(n.func, ast.Attribute)
        and isinstance(n.func.value, ast.Name)
        and n.func.value.id == "lowbit"
    ]
    named = {c.func.attr for c in calls}  # type: ignore[attr-defined]
    assert {"quantize_model", "GPTQ", "AWQ", "SmoothQuant", "Calibration"} <= named
    for call in calls:
        target = getattr(lowbit, call.func.attr)  # type: ignore[attr-defined]
        sig = inspect.signature(target)
        sig.bind(*[None] * len(call.args), **{k.arg: None for k in call.keywords if k.arg})


@pytest.mark.parametrize(
    ("rule", "cli", "method"),
    [("awq", [], "rtn"), ("rtn", ["--method", "awq"], "awq")],
    ids=["rules-name-awq", "awq-but-rules-say-rtn"],
)
def test_rule_methods_as_the_cli(
    models: dict[str, Any], tmp_path: Path, rule: str, cli: list[str], method: str
) -> None:
    """A plan whose MLP rule names ``method: awq`` (AWQ there alone) or ``method: rtn`` under
    ``method='awq'`` (AWQ elsewhere, its folds into those tensors skipped) writes what
    ``lowbit quantize --plan`` writes, tensor for tensor."""
    folder, text, (samples, length) = models["llama"]
    doc = {"default": "int4:g32", "rules": [{"component": "mlp", "format": "int4:g32",
                                             "method": rule}]}  # fmt: skip
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(json.dumps(doc))
    calib = ["--calib", str(text), "--calib-samples", samples, "--calib-len", length]
    _cli("quantize", str(folder), "--plan", str(plan_file), *cli, *calib,
         "--out", str(tmp_path / "cli"))  # fmt: skip
    res = lowbit.quantize_model(
        folder, lowbit.PrecisionPlan.from_dict(doc), tmp_path / "api", method=method,
        calibration=lowbit.Calibration(source=str(text), samples=int(samples),
                                       length=int(length)),
        progress=False,
    )  # fmt: skip
    _same_checkpoint(tmp_path / "cli", tmp_path / "api")
    assert res["method"]["method"] == "awq"
    manifest = LowbitCheckpoint(tmp_path / "api").manifest
    by_method = {n: e.get("method") for n, e in manifest["tensors"].items()}
    mlp = {n: m for n, m in by_method.items() if ".mlp." in n and n.endswith("proj.weight")}
    assert mlp and set(mlp.values()) == ({"awq"} if rule == "awq" else {"rtn"})
