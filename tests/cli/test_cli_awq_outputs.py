"""lowbit quantize --method awq / --smooth to compressed-tensors and GGUF, plan rules naming
``method: awq``, and --w8a8, in-process."""

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

from lowbit.calibration.awq import awq_weights  # noqa: E402
from lowbit.calibration.data import Calibration  # noqa: E402
from lowbit.calibration.gptq import gptq_weights  # noqa: E402
from lowbit.checkpoints import open_checkpoint  # noqa: E402
from lowbit.checkpoints.gguf.names import gguf_to_hf_name, unpermute_qk  # noqa: E402
from lowbit.checkpoints.lowbit_format.checkpoint import LowbitCheckpoint  # noqa: E402
from lowbit.cli import main  # noqa: E402
from lowbit.errors import LowbitError  # noqa: E402
from lowbit.evaluation.calibrated_variants import awq_variant  # noqa: E402
from lowbit.methods.smoothquant import SmoothQuant  # noqa: E402
from lowbit.plans.plan import PrecisionPlan  # noqa: E402
from lowbit.plans.rules import parse_rule  # noqa: E402
from lowbit.quant.scheme_text import parse_scheme  # noqa: E402
from lowbit.quant.tensor import quantize  # noqa: E402
from tiny_models import (  # noqa: E402
    gguf_metadata,
    gguf_tensors,
    save_gguf,
    save_hf_folder,
    tiny_bert,
    tiny_llama,
)

HEADS = {"q_proj": 4, "k_proj": 2}  # tiny_llama's query and key-value heads


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("awq_out")
    text = d / "calib.txt"
    text.write_text(" ".join(f"Sentence {i} says {i * 7 % 13} things." for i in range(40)))
    sentences = d / "sentences.txt"  # encoders calibrate on sentences
    words = "red green blue small large quick slow bright dark old new warm".split() * 3
    sentences.write_text(
        " ".join(f"The {w} one stays near number {i}." for i, w in enumerate(words))
    )
    bert = tiny_bert(bias_std=0.05)  # BERT's init zeroes biases; a fold divides them
    return {
        "text": text,
        "sentences": sentences,
        "folder": save_hf_folder(tiny_llama(), d / "llama"),
        "gguf": save_gguf(tiny_llama(), d / "llama.gguf", embedding="F32"),
        "bert": save_hf_folder(bert, d / "bert"),
    }


CAL = ["--calib-samples", "3", "--calib-len", "50", "--no-progress"]


def _calib(setup: dict[str, Path], bert: bool = False) -> Calibration:
    if bert:
        return Calibration(source=str(setup["sentences"]), samples=20, length=50)
    return Calibration(source=str(setup["text"]), samples=3, length=50)


def _raw(folder: Path) -> dict[str, Any]:
    from safetensors import safe_open

    raw = {}
    for f in sorted(folder.glob("*.safetensors")):
        with safe_open(f, framework="pt") as sf:
            raw.update({k: sf.get_tensor(k) for k in sf.keys()})
    return raw


def _ct_dequantize(folder: Path) -> dict[str, np.ndarray]:
    """compressed-tensors' own model-free decompression of every tensor of a folder."""
    from compressed_tensors.entrypoints.convert.converters.ct_dequantizer import (
        CompressedTensorsDequantizer,
    )

    res = CompressedTensorsDequantizer(folder, dtype=torch.float32).process(_raw(folder))
    return {k: v.numpy() for k, v in res.items()}


def _transformers(folder: Path, bert: bool) -> Any:
    from transformers.utils.quantization_config import CompressedTensorsConfig

    auto = transformers.AutoModel if bert else transformers.AutoModelForCausalLM
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # transformers: "You passed quantization_config ..."
        return auto.from_pretrained(
            folder,
            dtype=torch.float32,
            quantization_config=CompressedTensorsConfig(dequantize=True),
        ).eval()


def _outputs(model: Any, bert: bool) -> np.ndarray:
    ids = torch.randint(0, 250, (2, 20), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        out = model(input_ids=ids)
    return (out.last_hidden_state if bert else out.logits).numpy().astype(np.float64)


def _hf(name: str, source: str, arr: np.ndarray) -> tuple[str, np.ndarray]:
    """A checkpoint tensor's transformers name and values (GGUF: q/k rows un-permuted)."""
    if source != "gguf":
        return name, arr
    hf = gguf_to_hf_name(name)
    kind = hf.split(".")[-2]
    return hf, unpermute_qk(arr, HEADS[kind]) if kind in HEADS else arr


CT_CASES = [
    ("folder", "awq", "int4:g32"),
    ("gguf", "awq", "int4:g32:asym"),
    ("bert", "awq", "int4:g32"),
    ("folder", "int8", "int8:ch"),
    ("bert", "int8", "int8:ch"),
    ("folder", "fp8", "fp8_e4m3:ch"),
]


@pytest.mark.parametrize(("source", "how", "spec"), CT_CASES)
def test_awq_and_smoothquant_to_compressed_tensors(
    setup: dict[str, Path], tmp_path: Path, source: str, how: str, spec: str
) -> None:
    """AWQ (int4) and SmoothQuant (W8A8) as compressed-tensors: its own decompressor gives
    exactly lowbit's dequantized weights, the folded norms/biases are written folded (not the
    originals), W8A8 declares dynamic per-token activations, lowbit verify passes, and
    transformers loads a model whose outputs are those of lowbit eval's AWQ / SmoothQuant
    variant."""
    pytest.importorskip("compressed_tensors")
    src, bert = setup[source], source == "bert"
    out = tmp_path / "ct"
    if how == "awq":
        opts, method = ["--to", spec, "--method", "awq"], None
    else:
        opts = ["--w8a8", how, "--smooth", "0.5"]
        method = SmoothQuant(alpha=0.5, activations="int8" if how == "int8" else "fp8")
    cal = _calib(setup, bert)
    argv = ["quantize", str(src), *opts, "--calib", cal.source, "--calib-samples",
            str(cal.samples), "--calib-len", "50", "--no-progress", "--out", str(out),
            "--out-format", "compressed-tensors", "--json"]  # fmt: skip
    assert main(argv) == 0
    assert main(["verify", str(out)]) == 0
    run = awq_weights(src, spec, cal, method, progress=False)
    name = "awq" if how == "awq" else "smoothquant"
    assert sum(m == name for m in run.methods.values()) == (12 if bert else 14)
    got = _ct_dequantize(out)
    for n, qt in run.weights.items():
        hf, want = _hf(n, source, qt.dequantize())
        np.testing.assert_array_equal(got[hf], want, err_msg=hf)
    raw = _raw(out)
    original = open_checkpoint(str(src))
    assert run.replaced  # norms (llama) or value biases (BERT)
    for n, arr in run.replaced.items():
        hf, want = _hf(n, source, arr)
        np.testing.assert_array_equal(raw[hf].numpy(), want, err_msg=hf)
        assert not np.allclose(want, _hf(n, source, np.asarray(original.get(n)))[1]), n
    groups = json.loads((out / "config.json").read_text())["quantization_config"]["config_groups"]
    acts = [g.get("input_activations") for g in groups.values()]
    if how == "awq":
        assert acts == [None] * len(acts)
    else:
        assert all(a["dynamic"] is True and a["strategy"] == "token" for a in acts), acts
        assert {a["type"] for a in acts} == {"int" if how == "int8" else "float"}
    loaded = _outputs(_transformers(out, bert), bert)
    variant = awq_variant(src, spec, cal, method, progress=False)
    want = _outputs(variant.model, bert)
    assert np.linalg.norm(loaded - want) <= 1e-5 * np.linalg.norm(want)
    if source == "folder" and how == "awq":  # the folds matter: the original norms do not fit
        with torch.no_grad():
            model = _transformers(out, bert)
            for n in run.replaced:
                model.get_parameter(n).copy_(torch.from_numpy(np.asarray(original.get(n))))
        far = _outputs(model, bert)
        assert np.linalg.norm(far - want) > 1e-2 * np.linalg.norm(want)


def test_a_written_original_norm_is_caught(setup: dict[str, Path], tmp_path: Path) -> None:
    """The folded-norm check above can fail: a folder written from the unfolded source (what
    the writer did before it took AWQ's folded checkpoint) has the original norms."""
    from lowbit.checkpoints.streaming import quantize_model

    src = setup["folder"]
    run = awq_weights(src, "int4:g32", _calib(setup), progress=False)
    out = tmp_path / "ct"
    quantize_model(src, PrecisionPlan.uniform("int4:g32"), out, out_format="compressed-tensors",
                   weights=run.weights, progress=False)  # fmt: skip
    raw = _raw(out)
    n = next(iter(run.replaced))
    assert not np.array_equal(raw[n].numpy(), run.replaced[n])


@pytest.mark.parametrize("spec", ["q4_0", "q8_0"])
def test_awq_to_gguf(setup: dict[str, Path], tmp_path: Path, spec: str) -> None:
    """--method awq --out-format gguf: the gguf package's reader gives AWQ's dequantized
    weights in Q4_0/Q8_0 and the folded norms (float32), not the source's norms."""
    gguf = pytest.importorskip("gguf")
    src = setup["gguf"]
    out = tmp_path / f"tiny.{spec}.gguf"
    argv = ["quantize", str(src), "--to", spec, "--method", "awq", "--calib", str(setup["text"]),
            *CAL, "--out", str(out), "--out-format", "gguf", "--json"]  # fmt: skip
    assert main(argv) == 0
    run = awq_weights(src, spec, _calib(setup), progress=False)
    assert sum(m == "awq" for m in run.methods.values()) == 14
    stored = {t.name: t for t in gguf.GGUFReader(str(out)).tensors}
    for name, qt in run.weights.items():
        t = stored[name]
        assert t.tensor_type.name == spec.upper()
        deq = gguf.quants.dequantize(t.data, t.tensor_type).reshape(qt.shape)
        np.testing.assert_array_equal(deq, qt.dequantize(), err_msg=name)
    source = open_checkpoint(str(src))
    assert len(run.replaced) == 4  # each block's two norms
    for name, arr in run.replaced.items():
        t = stored[name]
        assert t.tensor_type.name == "F32"
        np.testing.assert_array_equal(np.asarray(t.data).reshape(arr.shape), arr, err_msg=name)
        assert not np.allclose(arr, source.get(name)), name
    kept = "token_embd.weight"
    np.testing.assert_array_equal(np.asarray(stored[kept].data), source.get(kept))


def test_awq_to_gguf_refuses_inexact_folds(
    setup: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A fold into a tensor the plan keeps and the GGUF stores in a block type (Q8_0) cannot be
    written exactly: one error says why. --smooth to GGUF is refused (no activation format)."""
    pytest.importorskip("gguf")
    from lowbit.checkpoints.gguf.writer import GGUFTensor, write_gguf

    model = tiny_llama()
    tensors: dict[str, Any] = gguf_tensors(model)
    for name in [n for n in tensors if "ffn_up" in n]:
        tensors[name] = GGUFTensor(tensors[name], "Q8_0")
    blocky = write_gguf(tmp_path / "up-q8.gguf", tensors, metadata=gguf_metadata(model), arch="llama",
                        progress=False)  # fmt: skip
    plan = tmp_path / "plan.yaml"
    plan.write_text('rules:\n  - {match: "*ffn_up*", format: keep}\n')
    argv = ["quantize", str(blocky), "--plan", str(plan), "--method", "awq",
            "--calib", str(setup["text"]), *CAL]  # fmt: skip
    assert main([*argv, "--to", "q4_0", "--out-format", "gguf", "--out", str(tmp_path / "x.gguf")]
                ) == 2  # fmt: skip
    err = capsys.readouterr().err
    assert "blk.0.ffn_up.weight" in err and "stores it as Q8_0" in err
    assert not (tmp_path / "x.gguf").exists()
    ct = tmp_path / "ct"  # compressed-tensors holds the folded up_proj (float32)
    assert main([*argv, "--to", "int4:g32", "--out", str(ct), "--out-format",
                 "compressed-tensors"]) == 0  # fmt: skip
    assert _raw(ct)["model.layers.0.mlp.up_proj.weight"].dtype == torch.float32
    capsys.readouterr()
    sq = ["quantize", str(setup["gguf"]), "--to", "q8_0", "--activations", "int8", "--smooth",
          "--calib", str(setup["text"]), *CAL, "--out-format", "gguf", "--out",
          str(tmp_path / "sq.gguf")]  # fmt: skip
    assert main(sq) == 2
    assert "GGUF cannot declare" in capsys.readouterr().err


def test_plan_rules_name_awq(
    setup: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``method: awq`` rules run AWQ without --method: their tensors are AWQ's, the others are
    rounded to nearest as stored (folds that would change them skipped, saying why)."""
    src = setup["folder"]
    plan = tmp_path / "plan.yaml"
    plan.write_text("default: int4:g32\nrules:\n"
                    "  - {component: attention, ndim: 2, format: int4:g32, method: awq}\n"
                    "  - {match: '*down_proj*', format: int4:g32, method: awq}\n")  # fmt: skip
    out = tmp_path / "q"
    argv = ["quantize", str(src), "--plan", str(plan), "--calib", str(setup["text"]), *CAL,
            "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    assert "AWQ of 10 tensors (4 folds)" in capsys.readouterr().out
    ckpt = LowbitCheckpoint(out)
    pp = PrecisionPlan.from_file(plan)
    run = awq_weights(src, pp, _calib(setup), progress=False, default_method="rtn")
    original = open_checkpoint(str(src))
    methods = {n: m for n, m in run.methods.items()}
    assert sorted(set(methods.values())) == ["awq", "rtn"]
    for name, qt in run.weights.items():
        assert ckpt.entry(name)["method"] == methods[name]
        assert ("self_attn" in name or "down" in name) == (methods[name] == "awq"), name
        np.testing.assert_array_equal(ckpt.get(name), qt.dequantize(), err_msg=name)
        if methods[name] == "rtn":
            rtn = quantize(np.asarray(original.get(name), np.float32), parse_scheme("int4:g32"))
            np.testing.assert_array_equal(ckpt.get(name), rtn.dequantize(), err_msg=name)
    skipped = [(f["prev"], f["skipped"]) for f in run.folds if "skipped" in f]
    assert skipped == [
        (f"model.layers.{i}.{prev}", why)
        for i in range(2)
        for prev, why in (
            ("post_attention_layernorm", "the plan quantizes none of its linear layers by awq"),
            ("mlp.up_proj", f"it would change model.layers.{i}.mlp.up_proj.weight, which the "
             "plan rounds to nearest"),
        )
    ]  # fmt: skip
    assert ckpt.manifest["method"]["folds"] == run.folds
    assert set(run.replaced) == {f"model.layers.{i}.input_layernorm.weight" for i in range(2)}


def test_gptq_and_awq_do_not_mix(
    setup: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A plan naming gptq and awq (or a rule's method against --method) is one error, before
    any calibration; so are the library functions given the other method's rules."""
    src = setup["folder"]
    plan = tmp_path / "plan.yaml"
    plan.write_text("default: int4:g32\nrules:\n"
                    "  - {component: attention, ndim: 2, format: int4:g32, method: awq}\n"
                    "  - {component: mlp, ndim: 2, format: int4:g32, method: gptq}\n")  # fmt: skip
    argv = ["quantize", str(src), "--plan", str(plan), "--calib", str(setup["text"]), *CAL,
            "--out", str(tmp_path / "q")]  # fmt: skip
    assert main(argv) == 2
    assert "asks for awq and gptq" in capsys.readouterr().err
    one = tmp_path / "one.yaml"
    one.write_text("default: int4:g32\nrules:\n"
                   "  - {component: attention, ndim: 2, format: int4:g32, method: awq}\n")  # fmt: skip
    assert main([*argv[:3], str(one), *argv[4:], "--method", "gptq"]) == 2
    assert "asks for awq and gptq" in capsys.readouterr().err
    assert not (tmp_path / "q").exists()
    with pytest.raises(LowbitError, match="calibrates with gptq, but the plan asks for awq"):
        gptq_weights(src, PrecisionPlan.from_file(one), _calib(setup), default_method="rtn")
    with pytest.raises(LowbitError, match="asks for awq and gptq"):
        awq_weights(src, PrecisionPlan.from_file(plan), _calib(setup))
    with pytest.raises(LowbitError, match=r"SmoothQuant rounds to nearest.*method: awq"):
        awq_weights(src, PrecisionPlan.from_file(one), _calib(setup), SmoothQuant())
    gptq = tmp_path / "gptq.yaml"
    gptq.write_text(
        "default: int8:ch\nrules:\n  - {match: '*q_proj*', format: int8:ch, method: gptq}\n"
    )
    assert main(["quantize", str(src), "--plan", str(gptq), "--w8a8", "--smooth", *argv[4:]]) == 2
    assert "SmoothQuant rounds to nearest after its folds: the plan's rules name method: gptq" in (
        capsys.readouterr().err
    )
    assert parse_rule({"match": "*", "format": "int4", "method": "AWQ"}).method == "awq"


def _dry(argv: list[str], capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    assert main(["quantize", "--dry-run", "--json", *argv]) == 0
    return json.loads(capsys.readouterr().out)


def test_w8a8_shorthand(setup: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    """--w8a8 FMT is --activations FMT with int8:ch / fp8_e4m3:ch weights unless --to says
    (8-bit only); a contradicting --activations or a non-8-bit --to is one error."""
    src = str(setup["folder"])
    for w8a8, label, act in (("int8", "int8:ch", "int8"), ("fp8", "fp8_e4m3:ch", "float8_e4m3fn")):
        rows = [t for t in _dry([src, "--w8a8", w8a8], capsys)["tensors"]
                if t["action"] == "quantize"]  # fmt: skip
        assert len(rows) == 14
        assert {(t["format"], t["activations"]) for t in rows} == {(label + ":fp32", act)}
        short = _dry([src, "--w8a8", w8a8], capsys)["tensors"]
        assert short == _dry([src, "--to", label, "--activations", w8a8], capsys)["tensors"]
    rows = _dry([src, "--w8a8", "--to", "int8:g32"], capsys)["tensors"]
    assert {(t["format"], t["activations"]) for t in rows if t["action"] == "quantize"} == {
        ("int8:g32:fp32", "int8")
    }
    same = _dry([src, "--w8a8", "int8", "--activations", "int8"], capsys)["tensors"]
    assert same == _dry([src, "--w8a8", "int8"], capsys)["tensors"]
    for bad, why in (
        (["--w8a8", "int8", "--activations", "fp8"], "contradicts it"),
        (["--w8a8", "--to", "int4:g32"], "--w8a8 means 8-bit weights"),
        (["--w8a8", "fp8", "--to", "bf16"], "--w8a8 means 8-bit weights"),
    ):
        assert main(["quantize", src, "--dry-run", *bad]) == 2
        assert why in capsys.readouterr().err


def test_eval_of_the_written_folder_is_awqs_row(
    setup: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """lowbit eval of the compressed-tensors folder AWQ wrote reports the numbers of lowbit
    eval's in-memory AWQ row (same calibration), not round-to-nearest's."""
    pytest.importorskip("compressed_tensors")
    src, out = setup["folder"], tmp_path / "ct"
    cal = ["--calib", str(setup["text"]), "--calib-samples", "3", "--calib-len", "50"]
    assert main(["quantize", str(src), "--to", "int4:g32", "--method", "awq", *cal,
                 "--no-progress", "--out-format", "compressed-tensors", "--out", str(out)]) == 0  # fmt: skip
    capsys.readouterr()
    assert main(["eval", str(src), str(out), "--schemes", "int4:g32", "--methods", "rtn,awq",
                 *cal, "--tokens", "256", "--window", "64", "--threads", "1", "--json"]) == 0  # fmt: skip
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)["rows"]}
    disk, awq, rtn = rows["ct"], rows["int4:g32 awq"], rows["int4:g32"]
    for key in ("perplexity", "kl_mean"):
        assert disk[key] == pytest.approx(awq[key], rel=1e-5), key
    assert abs(disk["kl_mean"] - rtn["kl_mean"]) > 1e-3 * rtn["kl_mean"]
