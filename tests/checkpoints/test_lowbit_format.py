"""lowbit's quantized checkpoint: exact round trip, layout known before quantizing, shards,
GGUF raw kept tensors, load / load_model, W8A8 simulation where the plan asks, bad manifests."""

from __future__ import annotations

import json
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lowbit
from lowbit.checkpoints import open_checkpoint
from lowbit.checkpoints.lowbit_format.checkpoint import LowbitCheckpoint, is_lowbit_checkpoint
from lowbit.checkpoints.streaming import quantize_model
from lowbit.errors import LowbitError
from lowbit.plans.plan import PrecisionPlan
from lowbit.plans.rules import parse_action
from lowbit.quant.layout import quantized_arrays
from lowbit.quant.scheme import Scheme

pytest.importorskip("safetensors")


def _bits(a: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(a)
    return a.view(np.dtype(f"u{a.dtype.itemsize}"))


def _write_st(path: Path, tensors: dict[str, np.ndarray]) -> Path:
    """A safetensors file through lowbit's streaming writer (bf16/fp8 included)."""
    from lowbit.checkpoints.io import safetensors_write as _safetensors

    entries = [_safetensors.Entry(k, v.dtype, v.shape, lambda v=v: v) for k, v in tensors.items()]
    _safetensors.write_file(path, entries, {"format": "pt"})
    return path


@pytest.fixture
def mixed_folder(tmp_path: Path, rng: np.random.Generator) -> Path:
    """A folder of float32 / bfloat16 / float16 / int64 tensors with a config and tokenizer file."""
    folder = tmp_path / "src"
    folder.mkdir()
    t = {
        "model.embed_tokens.weight": rng.standard_normal((50, 64)).astype(np.float32),
        "model.layers.0.self_attn.q_proj.weight": rng.standard_normal((64, 64)).astype(
            ml_dtypes.bfloat16
        ),
        "model.layers.0.self_attn.q_proj.bias": rng.standard_normal(64).astype(np.float32),
        "model.layers.0.mlp.up_proj.weight": rng.standard_normal((96, 64)).astype(np.float16),
        "model.layers.0.mlp.down_proj.weight": (rng.standard_normal((64, 96)) * 3).astype(
            np.float32
        ),
        "model.layers.0.mlp.gate_proj.weight": rng.standard_normal((96, 64)).astype(np.float32),
        "model.layers.0.self_attn.o_proj.weight": rng.standard_normal((64, 64)).astype(np.float32),
        "model.layers.0.self_attn.k_proj.weight": rng.standard_normal((32, 64)).astype(np.float32),
        "model.norm.weight": rng.uniform(0.5, 1.5, 64).astype(np.float32),
        "lm_head.weight": rng.standard_normal((50, 64)).astype(np.float32),
        "position_ids": np.arange(16, dtype=np.int64).reshape(1, 16),
    }
    _write_st(folder / "model.safetensors", t)
    (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (folder / "tokenizer.json").write_text("{}")
    (folder / "1_Pooling").mkdir()  # sentence-transformers module config: on the allowlist
    (folder / "1_Pooling" / "config.json").write_text("{}")
    return folder


MIXED_RULES = [
    {"match": "*.q_proj.weight", "format": "int4:g32:asym"},
    {"match": "*.up_proj.weight", "format": "nf4:dq"},
    {"match": "*.down_proj.weight", "format": "mxfp4"},
    {"match": "*.gate_proj.weight", "format": "fp8_e4m3:ch", "activations": "int8"},
    {"match": "*.o_proj.weight", "format": "int3:g16:bf16", "scale_method": "mse"},
    {"match": "lm_head.weight", "format": "bf16"},
]


def test_round_trip_is_exact(tmp_path: Path, mixed_folder: Path) -> None:
    """Every quantized tensor loads back bit for bit as QuantizedTensor.dequantize() of an
    independent quantization; kept tensors keep dtype and bits; casts are exact casts."""
    plan = PrecisionPlan.uniform("int8", rules=MIXED_RULES)
    out = tmp_path / "q"
    result = quantize_model(mixed_folder, plan, out, progress=False, max_shard_size=8000)
    assert is_lowbit_checkpoint(out) and result["bytes"] > 0
    ckpt = LowbitCheckpoint(out)
    assert len(ckpt.manifest["files"]) > 2  # sharded
    assert (out / "tokenizer.json").read_text() == "{}"
    assert (out / "1_Pooling" / "config.json").exists() and (out / "config.json").exists()
    src = open_checkpoint(mixed_folder)
    applied = plan.apply([(n, src.shape(n), src.dtype(n), src.info(n).nbytes) for n in src.names()])
    loaded = lowbit.load(out)
    assert list(loaded) == src.names()
    for t in applied:
        got = loaded[t.name]
        if t.action == "quantize":
            qt = lowbit.quantize(src.get(t.name), t.scheme)
            np.testing.assert_array_equal(_bits(got), _bits(qt.dequantize()))
            stored = ckpt.quantized(t.name)
            np.testing.assert_array_equal(stored.unpack(), qt.unpack())
            assert stored.scheme == t.scheme == qt.scheme
            assert ckpt.info(t.name).nbytes == qt.nbytes == t.nbytes
        elif t.action == "cast":
            assert got.dtype == ml_dtypes.bfloat16
            np.testing.assert_array_equal(
                _bits(got), _bits(src.get(t.name).astype(ml_dtypes.bfloat16))
            )
        else:
            assert got.dtype == src.get(t.name).dtype
            np.testing.assert_array_equal(_bits(got), _bits(src.get(t.name)))
    assert ckpt.activations() == {"model.layers.0.mlp.gate_proj.weight": "int8"}
    assert ckpt.plan == plan
    torch = pytest.importorskip("torch")
    as_torch = lowbit.load(out, ["model.layers.0.mlp.down_proj.weight"], framework="torch")
    assert isinstance(as_torch["model.layers.0.mlp.down_proj.weight"], torch.Tensor)


@settings(max_examples=30, deadline=None)
@given(
    shape=st.lists(st.integers(1, 70), min_size=1, max_size=3).map(tuple),
    spec=st.sampled_from(
        [
            "int8:ch",
            "int4:g32:asym",
            "nf4:dq",
            "mxfp6",
            "fp8_e5m2:t",
            "int2:g8:fp16",
            "mxint8",
            "fp6_e3m2:g16:bf16",
            "nf4:g16",
            "int5:ch:asym",
        ]
    ),
)
def test_layout_is_known_before_quantizing(shape: tuple, spec: str) -> None:
    """quantized_arrays predicts exactly the arrays (dtype, size) to_arrays gives, any shape."""
    scheme = parse_action(spec)
    if len(shape) < 2 and scheme.granularity.value != "tensor":
        scheme = Scheme.from_dict({**scheme.to_dict(), "axis": -1}) if scheme.axis != -1 else scheme
    x = np.random.default_rng(sum(shape)).standard_normal(shape).astype(np.float32)
    qt = lowbit.quantize(x, scheme)
    arrays, _ = qt.to_arrays("t:")
    specs = quantized_arrays(shape, scheme)
    assert [f"t:{s.suffix}" for s in specs] == list(arrays)
    for s in specs:
        a = arrays[f"t:{s.suffix}"]
        assert a.dtype == s.dtype and a.size == np.prod(s.shape)
    assert sum(s.nbytes for s in specs) == qt.nbytes


def test_bad_manifests(tmp_path: Path, mixed_folder: Path) -> None:
    """A damaged checkpoint is a LowbitError naming the folder and the problem."""
    out = tmp_path / "q"
    quantize_model(mixed_folder, PrecisionPlan.uniform("int8"), out, progress=False)
    manifest = json.loads((out / "lowbit.json").read_text())
    (out / "lowbit.json").write_text(json.dumps({**manifest, "version": 99}))
    with pytest.raises(LowbitError, match="version 99"):
        LowbitCheckpoint(out)
    (out / "lowbit.json").write_text("{not json")
    with pytest.raises(LowbitError, match="not valid JSON"):
        lowbit.load(out)
    entries = manifest["tensors"]
    name = next(n for n, e in entries.items() if e.get("kind") == "quantized")
    w4a4 = {**entries, name: {**entries[name], "activations": "nvfp4"}}
    (out / "lowbit.json").write_text(json.dumps({**manifest, "tensors": w4a4}))
    with pytest.raises(LowbitError, match=r"per-token activations \(int8, fp8\) only"):
        LowbitCheckpoint(out, verify=False)  # past the checksum, the schema refuses it
    (out / "lowbit.json").write_text(json.dumps(manifest))
    (out / "model.safetensors").rename(out / "gone.safetensors")
    with pytest.raises(LowbitError, match=r"shard model\.safetensors is missing"):
        LowbitCheckpoint(out)
    with pytest.raises(LowbitError, match="not a lowbit checkpoint"):
        LowbitCheckpoint(mixed_folder)
    (out / "gone.safetensors").rename(out / "model.safetensors")
    with pytest.raises(LowbitError, match="close names"):
        LowbitCheckpoint(out).get("model.layers.0.mlp.up_proj.weigth")
    with pytest.raises(LowbitError, match="kept, not quantized"):
        LowbitCheckpoint(out).quantized("model.norm.weight")


# --------------------------------------------------------------------- models (torch)


def test_gguf_source_keeps_raw_blocks_and_loads_the_model(tmp_path: Path) -> None:
    """From a GGUF source, the Q8_0 embedding is kept byte for byte, the metadata travels, and
    load_model gives the model build_model makes from the dequantized weights (same logits)."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    pytest.importorskip("gguf")
    from lowbit.models.build import build_model
    from tiny_models import save_gguf, tiny_llama

    src = save_gguf(tiny_llama(), tmp_path / "tiny.gguf")
    out = tmp_path / "q"
    plan = PrecisionPlan.uniform("int4", group_size=32)
    quantize_model(src, plan, out, progress=False)
    ckpt = LowbitCheckpoint(out)
    reader = open_checkpoint(src)
    assert ckpt.entry("token_embd.weight")["encoding"] == "gguf:Q8_0"
    assert ckpt.info("token_embd.weight").nbytes == reader.info("token_embd.weight").nbytes
    np.testing.assert_array_equal(ckpt.get("token_embd.weight"), reader.get("token_embd.weight"))
    assert ckpt.metadata["llama.block_count"] == 2 and ckpt.config == reader.config
    weights = {
        n: lowbit.quantize(reader.get(n), plan.default).dequantize()
        for n in reader.names()
        if ckpt.entry(n)["kind"] == "quantized"
    }
    assert len(weights) == 14
    expected = build_model(reader, weights=weights, progress=False)
    model = lowbit.load_model(out, progress=False)
    ids = torch.tensor([[1, 5, 9, 33, 2, 7, 63, 0, 12, 40]])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, expected(ids).logits)
    assert model.lowbit_activations == {}


def test_load_model_simulates_planned_activations(tmp_path: Path) -> None:
    """Activations the plan asks for are fake-quantized per token on exactly those layers."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from lowbit.models.activations import simulate_activations
    from tiny_models import save_hf_folder, tiny_llama

    src = save_hf_folder(tiny_llama(), tmp_path / "src")
    out = tmp_path / "q"
    plan = PrecisionPlan.uniform("int8", activations="int8")
    quantize_model(src, plan, out, progress=False)
    model = lowbit.load_model(out, progress=False)
    assert len(model.lowbit_activations) == 14 and "lm_head" not in model.lowbit_activations
    assert set(model.lowbit_activations.values()) == {"int8"}
    weight_only = lowbit.load_model(out, activations=False, progress=False)
    ids = torch.tensor([[1, 5, 9, 33, 2, 7, 63, 0, 12, 40]])
    with torch.no_grad():
        with simulate_activations(weight_only, "int8"):  # every linear but lm_head
            want = weight_only(ids).logits
        got = model(ids).logits
        assert torch.equal(got, want)
        assert not torch.equal(got, weight_only(ids).logits)
