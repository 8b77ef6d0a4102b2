"""The quantize pipeline end to end: compressed-tensors and GGUF outputs read back by their own
tools, interrupted writes, output-format checks, byte counts, model resolution."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import lowbit
from lowbit.checkpoints import open_checkpoint
from lowbit.checkpoints.streaming import (
    open_model,
    output_nbytes,
    plan_model,
    quantize_model,
    quantized_weights,
    resolve_model,
)
from lowbit.errors import LowbitError
from lowbit.plans.plan import PrecisionPlan

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")
pytestmark = pytest.mark.torch

from tiny_models import save_gguf, save_hf_folder, tiny_llama  # noqa: E402


def _bits(a: Any) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


@pytest.fixture(scope="module")
def llama() -> Any:
    return tiny_llama()


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory: pytest.TempPathFactory, llama: Any) -> Path:
    return save_hf_folder(llama, tmp_path_factory.mktemp("hf") / "tiny")


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory: pytest.TempPathFactory, llama: Any) -> Path:
    return save_gguf(llama, tmp_path_factory.mktemp("gguf") / "tiny.gguf")


def _tensor_bytes(folder: Path) -> dict[str, int]:
    """Bytes of every tensor of a safetensors folder, by name (from the headers)."""
    out = {}
    for f in folder.glob("*.safetensors"):
        with open(f, "rb") as fh:
            n = int.from_bytes(fh.read(8), "little")
            header = json.loads(fh.read(n))
        header.pop("__metadata__", None)
        out.update({k: v["data_offsets"][1] - v["data_offsets"][0] for k, v in header.items()})
    return out


# ------------------------------------------------------------------- compressed-tensors


CT_RULES = [
    {"match": "*.q_proj.weight", "format": "int8:ch:asym"},
    {"match": "*.k_proj.weight", "format": "fp8_e4m3:ch"},
    {"match": "*.v_proj.weight", "format": "int8:ch", "activations": "int8"},
    {"match": "*.o_proj.weight", "format": "int4:g32:asym"},
]


@pytest.mark.parametrize("source", ["hf", "gguf"])
def test_compressed_tensors_pipeline_decompresses_exactly(
    tmp_path: Path, hf_folder: Path, gguf_file: Path, source: str
) -> None:
    """A quantize run written as compressed-tensors decompresses, through compressed-tensors'
    own converter, to exactly lowbit's dequantized weights (GGUF sources: HF names, q/k rows
    un-permuted); byte counts from the plan equal the file's; the tokenizer travels."""
    pytest.importorskip("compressed_tensors")
    from compressed_tensors.entrypoints.convert.converters.ct_dequantizer import (
        CompressedTensorsDequantizer,
    )
    from safetensors import safe_open

    from lowbit.checkpoints.gguf.names import gguf_to_hf_name
    from lowbit.models.build import hf_tensors

    src = hf_folder if source == "hf" else gguf_file
    plan = PrecisionPlan.uniform("int4", group_size=32, rules=CT_RULES)
    out = tmp_path / "ct"
    res = quantize_model(src, plan, out, out_format="compressed-tensors", progress=False)
    parts = res["seconds_parts"]  # reading and rounding vs the rest, summing to the call's
    assert parts["quantize"] > 0 and parts["write"] >= 0
    assert parts["quantize"] + parts["write"] == pytest.approx(res["seconds"])
    assert (out / "tokenizer.json").exists()
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["quantization_config"]["quant_method"] == "compressed-tensors"
    loaded: dict[str, Any] = {}
    for f in out.glob("*.safetensors"):
        with safe_open(f, framework="pt") as sf:
            loaded.update({k: sf.get_tensor(k) for k in sf.keys()})
    decompressed = CompressedTensorsDequantizer(out, dtype=torch.float32).process(loaded)
    ckpt = open_checkpoint(src)
    applied = plan_model(ckpt, plan, out_format="compressed-tensors")
    hf_values = dict(hf_tensors(ckpt, progress=False))  # un-permuted float32 originals
    sizes = _tensor_bytes(out)
    for t in applied.tensors:
        name = gguf_to_hf_name(t.name) if source == "gguf" else t.name
        got = decompressed[name].float().numpy()
        if t.action == "quantize":
            want = lowbit.quantize(hf_values[name], t.scheme).dequantize()
            module = name.removesuffix(".weight")
            stored = sum(v for k, v in sizes.items() if k.startswith(module + ".weight"))
            assert stored == output_nbytes(t, "compressed-tensors"), name
        elif source == "gguf" and t.dtype == "Q8_0":  # kept: float16, not float32
            want = hf_values[name].astype(np.float16).astype(np.float32)
        else:
            want = hf_values[name]
        np.testing.assert_array_equal(_bits(got), _bits(want), err_msg=name)
    assert sum(t.action == "quantize" for t in applied.tensors) == 14


# --------------------------------------------------------------------------------- GGUF


def _gguf_tensors(path: Path) -> dict[str, Any]:
    return {t.name: t for t in gguf.GGUFReader(path).tensors}


def test_gguf_exact_q4_0_from_lowbit_codes(tmp_path: Path, gguf_file: Path) -> None:
    """int4 groups of 32 with float16 scales are written as Q4_0 blocks holding lowbit's own
    codes: gguf-py dequantizes them to exactly QuantizedTensor.dequantize(); kept tensors and
    metadata are copied byte for byte; the file builds a model again."""
    from gguf.constants import GGMLQuantizationType as T

    plan = PrecisionPlan.uniform("int4:g32:fp16")
    out = tmp_path / "tiny.Q4_0.gguf"
    done = quantize_model(gguf_file, plan, out, out_format="gguf", progress=False)
    assert 0 < done["seconds_parts"]["quantize"] < done["seconds"]
    src, res = _gguf_tensors(gguf_file), _gguf_tensors(out)
    assert list(res) == list(src)
    reader = open_checkpoint(gguf_file)
    applied = plan_model(reader, plan, out_format="gguf")
    for t in applied.tensors:
        r = res[t.name]
        assert int(r.n_bytes) == output_nbytes(t, "gguf")
        if t.action == "quantize":
            assert r.tensor_type == T.Q4_0
            got = gguf.quants.dequantize(r.data, T.Q4_0).reshape(t.shape)
            want = lowbit.quantize(reader.get(t.name), t.scheme).dequantize()
            np.testing.assert_array_equal(_bits(got), _bits(want), err_msg=t.name)
        else:
            assert r.tensor_type == src[t.name].tensor_type
            np.testing.assert_array_equal(np.asarray(r.data), np.asarray(src[t.name].data))
    fields = gguf.GGUFReader(out).fields
    assert fields["general.name"].contents() == "tiny-llama"
    assert fields["llama.block_count"].contents() == 2
    assert fields["tokenizer.ggml.merges"].contents() == ["Ġ t"]
    model = lowbit.load_model(out, progress=False)
    assert isinstance(model, transformers.LlamaForCausalLM)


@pytest.mark.parametrize(("to", "qtype", "warns"), [("q8_0", "Q8_0", False), ("int8:ch", "Q8_0", True),
                                                    ("q4_0", "Q4_0", False)])  # fmt: skip
def test_gguf_llamacpp_rounding_is_bit_exact(
    tmp_path: Path, gguf_file: Path, to: str, qtype: str, warns: bool
) -> None:
    """--to q8_0 / q4_0 (and int schemes GGUF cannot hold exactly, with a warning) use
    llama.cpp's reference rounding: the bytes equal gguf-py's quantizer's."""
    from gguf.constants import GGMLQuantizationType as T

    rounding = "llama.cpp" if to.startswith("q") else "auto"
    out = tmp_path / "o.gguf"
    kw = {"out_format": "gguf", "gguf_rounding": rounding, "progress": False}
    if warns:
        with pytest.warns(UserWarning, match="llama.cpp's own Q4_0/Q8_0 rounding"):
            quantize_model(gguf_file, PrecisionPlan.uniform(to), out, **kw)
    else:
        quantize_model(gguf_file, PrecisionPlan.uniform(to), out, **kw)
    reader = open_checkpoint(gguf_file)
    res = _gguf_tensors(out)
    n = 0
    for name, r in res.items():
        if name.startswith("blk.") and len(r.shape) == 2:
            want = gguf.quants.quantize(np.asarray(reader.get(name), np.float32), T[qtype])
            np.testing.assert_array_equal(np.asarray(r.data), want, err_msg=name)
            n += 1
    assert n == 14


# ------------------------------------------------------------------ interrupted writes


@pytest.mark.parametrize("out_format", ["lowbit", "compressed-tensors", "gguf"])
@pytest.mark.parametrize("exc", [RuntimeError, KeyboardInterrupt])
def test_interrupted_write_leaves_nothing(
    tmp_path: Path, gguf_file: Path, monkeypatch: pytest.MonkeyPatch, out_format: str, exc: type
) -> None:
    """A failure midway (the 5th tensor's quantization) leaves no output and no temporaries."""
    import lowbit.checkpoints.steps
    import lowbit.quant.tensor

    real = lowbit.quant.tensor.quantize
    calls = {"n": 0}

    def failing(*args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 5:
            raise exc("injected failure")
        return real(*args, **kwargs)

    monkeypatch.setattr(lowbit.quant.tensor, "quantize", failing)
    # the writers call quantize through the name their module imported
    import lowbit.checkpoints.compressed_tensors.pipeline
    import lowbit.checkpoints.gguf.pipeline

    for module in (lowbit.checkpoints.steps, lowbit.checkpoints.compressed_tensors.pipeline,
                   lowbit.checkpoints.gguf.pipeline):  # fmt: skip
        if hasattr(module, "quantize"):
            monkeypatch.setattr(module, "quantize", failing)
    work = tmp_path / "work"
    work.mkdir()
    out = work / ("o.gguf" if out_format == "gguf" else "o")
    with pytest.raises(exc, match="injected failure"):
        plan = PrecisionPlan.uniform("q8_0" if out_format == "gguf" else "int8")
        quantize_model(gguf_file, plan, out, out_format=out_format, progress=False)
    assert calls["n"] == 5
    assert list(work.iterdir()) == []


def test_existing_output_needs_overwrite(tmp_path: Path, hf_folder: Path) -> None:
    """An existing output is refused unless overwrite=True, which replaces it whole."""
    out = tmp_path / "q"
    quantize_model(hf_folder, PrecisionPlan.uniform("int8"), out, progress=False)
    with pytest.raises(LowbitError, match="already exists"):
        quantize_model(hf_folder, PrecisionPlan.uniform("int4:g32"), out, progress=False)
    quantize_model(
        hf_folder, PrecisionPlan.uniform("int4:g32"), out, overwrite=True, progress=False
    )
    assert "int4:g32:fp32" in (out / "lowbit.json").read_text()
    with pytest.raises(LowbitError, match="already a lowbit checkpoint"):
        open_model(out)


# ------------------------------------------------------------------- output-format checks


@pytest.mark.parametrize(
    ("source", "to", "out_format", "message"),
    [
        ("hf", "nf4", "compressed-tensors", r"model\.layers\.0\.\S+ .* compressed-tensors defines"),
        ("hf", "int4:g48", "compressed-tensors", "divide its length 128 .group 48"),
        ("hf", "int8:ch:fp16", "compressed-tensors", "fp32 scales"),
        ("hf", "mxfp6_e2m3", "compressed-tensors", "compressed-tensors defines int1..int8"),
        ("hf", "mxfp4", "compressed-tensors", None),
        ("hf", "nf4", "gguf", r"model\.layers\.0\.\S+ .*Q8_0 and Q4_0"),
        ("gguf", "nf4", "gguf", r"blk\.0\.\S+ .*Q8_0 and Q4_0"),
        ("gguf", "int4:g32:asym", "compressed-tensors", None),
    ],
)
def test_output_format_refuses_what_it_cannot_hold(
    hf_folder: Path, gguf_file: Path, source: str, to: str, out_format: str, message: str | None
) -> None:
    """Schemes an output format lacks are refused before any work, naming the tensor."""
    ckpt = open_checkpoint(hf_folder if source == "hf" else gguf_file)
    plan = PrecisionPlan.uniform(to)
    if message is None:
        assert len(plan_model(ckpt, plan, out_format=out_format).quantized) == 14
        return
    with pytest.raises(LowbitError, match=message):
        plan_model(ckpt, plan, out_format=out_format)


def test_quantized_weights_stream_in_order(gguf_file: Path) -> None:
    """quantized_weights yields each planned tensor's QuantizedTensor in file order."""
    ckpt = open_checkpoint(gguf_file)
    applied = plan_model(ckpt, PrecisionPlan.uniform("nf4"))
    got = list(quantized_weights(ckpt, applied, progress=False))
    assert [t.name for t, _ in got] == [t.name for t in applied.quantized]
    t, qt = got[3]
    np.testing.assert_array_equal(qt.unpack(), lowbit.quantize(ckpt.get(t.name), "nf4").unpack())


def test_resolve_model(tmp_path: Path) -> None:
    """Paths win over shipped names; unknown names are a LowbitError listing the shipped ones."""
    (tmp_path / "minilm").mkdir()
    assert resolve_model(tmp_path / "minilm") == tmp_path / "minilm"
    with pytest.raises(LowbitError, match="not a shipped model: minilm, smollm2"):
        resolve_model(tmp_path / "nope")
    try:
        assert resolve_model(None).name == "SmolLM2-135M-Instruct.Q4_1.gguf"
        assert resolve_model("all-MiniLM-L6-v2").name == "model"
    except ImportError:  # the model packages are not installed here
        pass


@pytest.mark.parametrize("method", ["gptq", "awq"])
def test_rule_methods_need_calibrated_weights(tmp_path: Path, hf_folder: Path, method: str) -> None:
    """A rule naming a calibrated method is not silently rounded to nearest: without weights=
    the writer refuses, naming the tensor and the method; method: rtn writes."""
    rules = [{"component": "attention", "ndim": 2, "format": "int4:g32", "method": method}]
    plan = PrecisionPlan.from_dict({"default": "int4:g32", "rules": rules})
    with pytest.raises(LowbitError, match=f"self_attn.*method: {method}, and nothing"):
        quantize_model(hf_folder, plan, tmp_path / "q", progress=False)
    assert not (tmp_path / "q").exists()
    rtn = PrecisionPlan.from_dict({"default": "int4:g32", "rules": [{**rules[0], "method": "rtn"}]})
    assert (
        quantize_model(hf_folder, rtn, tmp_path / "r", progress=False)["totals"]["quantized"] == 14
    )
