"""compressed-tensors export: layouts, config, and compressed-tensors' own decompression."""

from __future__ import annotations

import json
import warnings
import weakref
from collections.abc import Mapping
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from lowbit.errors import LowbitError

torch = pytest.importorskip("torch")
ct = pytest.importorskip("compressed_tensors")
pytest.importorskip("safetensors")
from compressed_tensors.compressors.format import infer_module_format  # noqa: E402
from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32  # noqa: E402
from compressed_tensors.entrypoints.convert.converters.ct_dequantizer import (  # noqa: E402
    CompressedTensorsDequantizer,
)
from compressed_tensors.quantization import QuantizationConfig  # noqa: E402
from safetensors import safe_open  # noqa: E402

import lowbit.checkpoints.compressed_tensors.tensor as ct_tensor  # noqa: E402
import lowbit.checkpoints.compressed_tensors.writer as lct  # noqa: E402
from lowbit.checkpoints.compressed_tensors.writer import (  # noqa: E402
    CTTensor,
    from_quantized,
    pack_int32,
    write_compressed_tensors,
)

pytestmark = pytest.mark.torch
torch.set_num_threads(1)

OUT, IN = 48, 256


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def _load(folder: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a checkpoint folder, through safetensors' own reader."""
    out = {}
    for f in sorted(folder.glob("*.safetensors")):
        with safe_open(f, framework="pt") as sf:
            assert sf.metadata()["format"] == "pt"  # plus lowbit.* marks
            out.update({k: sf.get_tensor(k) for k in sf.keys()})
    return out


def _ct_dequantize(folder: Path, dtype: torch.dtype = torch.float32) -> dict[str, np.ndarray]:
    """compressed-tensors' model-free path: its config parser and each scheme's decompressor."""
    res = CompressedTensorsDequantizer(folder, dtype=dtype).process(_load(folder))
    return {
        k: v.float().numpy() if v.dtype == torch.bfloat16 else v.numpy() for k, v in res.items()
    }


def _fp8_codes(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    c = rng.integers(0, 256, size=shape).astype(np.uint8)
    c[(c & 0x7F) == 0x7F] = 0x38  # no NaN codes
    return c


def _synthetic(rng: np.random.Generator) -> dict[str, CTTensor]:
    """One CTTensor per scheme compressed-tensors defines here, random codes and scales."""
    s_g = rng.uniform(0.01, 0.1, size=(OUT, IN // 128)).astype(np.float32)
    s_c = rng.uniform(0.01, 0.1, size=OUT).astype(np.float32)
    i4 = rng.integers(-8, 8, size=(OUT, IN))
    i8 = rng.integers(-128, 128, size=(OUT, IN))
    return {
        "int4_g128": CTTensor(i4, s_g, num_bits=4, group_size=128),
        "int4_g128_asym": CTTensor(
            i4, s_g, num_bits=4, group_size=128, zero_point=rng.integers(-8, 8, size=s_g.shape)
        ),
        "int4_channel_asym": CTTensor(i4, s_c, num_bits=4, zero_point=rng.integers(-8, 8, OUT)),
        "int3_g64": CTTensor(
            rng.integers(-4, 4, size=(OUT, IN)),
            np.repeat(s_g, 2, axis=1),
            num_bits=3,
            group_size=64,
        ),
        "int8_channel": CTTensor(i8, s_c, num_bits=8),
        "int8_tensor_asym": CTTensor(i8 // 2, s_c[:1], num_bits=8, zero_point=np.int8([5])),
        "w8a8_int8": CTTensor(i8, s_c, num_bits=8, activations="int8"),
        "fp8_channel": CTTensor(_fp8_codes(rng, (OUT, IN)), s_c, kind="float"),
        "fp8_tensor_a8": CTTensor(
            _fp8_codes(rng, (OUT, IN)).view(ml_dtypes.float8_e4m3fn),
            np.float32(0.37),
            kind="float",
            activations="fp8",
        ),
    }


# ---- pack_int32 --------------------------------------------------------------------------


@pytest.mark.parametrize("bits", range(1, 9))
@pytest.mark.parametrize("axis", [1, 0])
def test_pack_int32_matches_compressed_tensors(
    bits: int, axis: int, rng: np.random.Generator
) -> None:
    """pack_int32 gives compressed-tensors' pack_to_int32 words for every width, odd lengths."""
    lo = -(1 << (bits - 1))
    codes = rng.integers(lo, -lo, size=(9, 75)).astype(np.int8)
    ref = pack_to_int32(torch.from_numpy(codes), bits, packed_dim=axis).numpy()
    mine = pack_int32(codes, bits, axis=axis)
    assert mine.dtype == np.int32
    np.testing.assert_array_equal(mine, ref)


def test_pack_int32_in_row_chunks(
    rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Packing a few rows at a time (bounded memory) gives the same words."""
    codes = rng.integers(-8, 8, size=(11, 40)).astype(np.int8)
    whole = pack_int32(codes, 4)
    monkeypatch.setattr(ct_tensor, "_PACK_CHUNK", 90)  # two rows per step
    np.testing.assert_array_equal(pack_int32(codes, 4), whole)
    np.testing.assert_array_equal(whole, pack_to_int32(torch.from_numpy(codes), 4).numpy())


def test_pack_int32_codes_outside_their_bits() -> None:
    """Codes outside the width (a caller's error) pack as shift-and-add always did: the
    word is the sum of the shifted offsets, modulo 2**32."""
    codes = np.array([[9, -8, 7, 0, -9, 3, 1, 2, 5]], dtype=np.int8)  # 9 and -9: not int4
    u = (codes.astype(np.int64) + 8).reshape(-1)
    u = np.concatenate([u, np.zeros(7, dtype=np.int64)])
    want = [int(sum(int(v) << (4 * i) for i, v in enumerate(u[w * 8 : w * 8 + 8])) % 2**32)
            for w in range(2)]  # fmt: skip
    assert pack_int32(codes, 4).view(np.uint32).tolist() == [want]


def test_pack_int32_golden_int4() -> None:
    """int4 codes -8, -7, 0, 7 (nibbles 0, 1, 8, 15) fill word 0 from its lowest bits up."""
    codes = np.zeros((1, 8), np.int8)
    codes[0, :4] = [-8, -7, 0, 7]
    assert pack_int32(codes, 4).view(np.uint32).tolist() == [[0x8888F810]]


# ---- write_compressed_tensors + compressed-tensors' decompression -----------------------


def test_synthetic_schemes_decompress_exactly(tmp_path: Path, rng: np.random.Generator) -> None:
    """Every scheme, decompressed by compressed-tensors, equals CTTensor.dequantize() bit for bit."""
    weights = _synthetic(rng)
    tensors: dict[str, object] = {f"model.{k}.weight": v for k, v in weights.items()}
    tensors["model.norm.weight"] = np.ones(IN, np.float32)
    tensors["lm_head.weight"] = torch.randn(5, IN, dtype=torch.bfloat16)
    out = write_compressed_tensors(
        tmp_path / "ckpt", tensors, {"model_type": "llama"}, progress=False
    )
    got = _ct_dequantize(out)
    assert set(got) == set(tensors)
    for name, t in weights.items():
        np.testing.assert_array_equal(
            _bits(got[f"model.{name}.weight"]), _bits(t.dequantize()), err_msg=name
        )
    np.testing.assert_array_equal(got["model.norm.weight"], tensors["model.norm.weight"])
    assert _load(out)["lm_head.weight"].dtype == torch.bfloat16
    assert torch.equal(_load(out)["lm_head.weight"], tensors["lm_head.weight"])


def test_config_matches_compressed_tensors_schema(tmp_path: Path, rng: np.random.Generator) -> None:
    """quantization_config validates, and each group's format is the one compressed-tensors infers."""
    weights = _synthetic(rng)
    out = write_compressed_tensors(
        tmp_path / "c", {f"m.{k}.weight": v for k, v in weights.items()}, {"a": 1}, progress=False
    )
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["a"] == 1
    q = cfg["quantization_config"]
    assert (q["quant_method"], q["quantization_status"], q["format"]) == (
        "compressed-tensors", "compressed", "mixed-precision",
    )  # fmt: skip
    parsed = QuantizationConfig.model_validate(q)
    formats = {}
    for scheme in parsed.config_groups.values():
        assert scheme.format == infer_module_format(torch.nn.Linear, scheme).value
        for target in scheme.targets:
            formats[target] = scheme.format
    assert formats["m.int4_g128"] == "pack-quantized"
    assert formats["m.w8a8_int8"] == "int-quantized"
    assert formats["m.fp8_tensor_a8"] == "float-quantized"
    assert formats["m.fp8_channel"] == "naive-quantized"


def test_targets_use_layer_regex_only_when_exact(tmp_path: Path, rng: np.random.Generator) -> None:
    """Same-scheme layers share a re: target; a pattern that would catch other layers is not used."""
    a = CTTensor(
        rng.integers(-8, 8, size=(4, 128)), np.ones((4, 1), np.float32), num_bits=4, group_size=128
    )
    b = CTTensor(rng.integers(-8, 8, size=(4, 128)), np.ones(4, np.float32), num_bits=8)
    tensors = {f"model.layers.{i}.mlp.up_proj.weight": a for i in range(3)}
    tensors |= {"model.layers.0.mlp.down_proj.weight": a, "model.layers.1.mlp.down_proj.weight": b}
    tensors["model.layers.2.mlp.down_proj.weight"] = np.zeros((4, 128), np.float32)
    q = lct.quantization_config(tensors)
    targets = sorted(t for g in q["config_groups"].values() for t in g["targets"])
    assert targets == [
        "model.layers.0.mlp.down_proj",
        "model.layers.1.mlp.down_proj",
        r"re:model\.layers\.\d+\.mlp\.up_proj$",
    ]
    out = write_compressed_tensors(tmp_path / "t", tensors, progress=False)
    got = _ct_dequantize(out)
    for name, t in tensors.items():
        want = t.dequantize() if isinstance(t, CTTensor) else t
        np.testing.assert_array_equal(got[name], want, err_msg=name)


def test_sharded_checkpoint(tmp_path: Path, rng: np.random.Generator) -> None:
    """A small max_shard_size gives shards + index; a weight's tensors stay in one shard."""
    weights = _synthetic(rng)
    tensors = {f"m.{k}.weight": v for k, v in weights.items()}
    out = write_compressed_tensors(tmp_path / "s", tensors, max_shard_size=20_000, progress=False)
    shards = sorted(p.name for p in out.glob("*.safetensors"))
    assert len(shards) > 2 and shards[0] == f"model-00001-of-{len(shards):05d}.safetensors"
    index = json.loads((out / "model.safetensors.index.json").read_text())
    stored = _load(out)
    assert set(index["weight_map"]) == set(stored)
    assert index["metadata"]["total_size"] == sum(
        t.numel() * t.element_size() for t in stored.values()
    )
    for name in weights:
        files = {f for k, f in index["weight_map"].items() if k.startswith(f"m.{name}.")}
        assert len(files) == 1, name
    got = _ct_dequantize(out)
    for name, t in weights.items():
        np.testing.assert_array_equal(_bits(got[f"m.{name}.weight"]), _bits(t.dequantize()))


def test_scale_dtype_bfloat16(tmp_path: Path, rng: np.random.Generator) -> None:
    """bfloat16 scales: compressed-tensors computes in bf16, giving lowbit's values rounded to bf16."""
    s = rng.uniform(0.01, 0.1, size=(OUT, 2)).astype(ml_dtypes.bfloat16).astype(np.float32)
    t = CTTensor(rng.integers(-8, 8, size=(OUT, IN)), s, num_bits=4, group_size=128)
    out = write_compressed_tensors(
        tmp_path / "b", {"m.w.weight": t}, scale_dtype="bfloat16", progress=False
    )
    assert _load(out)["m.w.weight_scale"].dtype == torch.bfloat16
    got = _ct_dequantize(out, dtype=torch.bfloat16)["m.w.weight"]
    np.testing.assert_array_equal(got, t.dequantize().astype(ml_dtypes.bfloat16).astype(np.float32))
    inexact = CTTensor(t.codes, s * np.float32(1 + 2**-12), num_bits=4, group_size=128)
    with pytest.raises(LowbitError, match="not exact in bfloat16"):
        write_compressed_tensors(tmp_path / "x", {"m.w.weight": inexact}, scale_dtype="bfloat16")
    assert not (tmp_path / "x").exists()


def test_copy_files_and_overwrite(tmp_path: Path) -> None:
    """copy_files lands in the folder; overwrite replaces a previous checkpoint completely."""
    tok = tmp_path / "tokenizer.json"
    tok.write_text("{}")
    w = CTTensor(np.ones((2, 32), np.int8), np.ones(2, np.float32), num_bits=8)
    out = write_compressed_tensors(
        tmp_path / "o", {"l.weight": w}, copy_files=[tok], progress=False
    )
    assert sorted(p.name for p in out.iterdir()) == [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
    ]
    with pytest.raises(LowbitError, match="already exists"):
        write_compressed_tensors(out, {"l.weight": w}, progress=False)
    write_compressed_tensors(out, {"x": np.zeros(3, np.float32)}, overwrite=True, progress=False)
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o", "tokenizer.json"]


def test_interrupted_write_leaves_nothing(
    tmp_path: Path, rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failure midway leaves no folder and no temporary; a failed overwrite keeps the old one."""
    weights = _synthetic(rng)
    tensors = {f"m.{k}.weight": v for k, v in weights.items()}
    real = lct.pack_int32
    calls = []

    def failing(*args: object, **kwargs: object) -> np.ndarray:
        calls.append(1)
        if len(calls) == 3:
            raise OSError("disk full (injected)")
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(lct, "pack_int32", failing)
    with pytest.raises(OSError, match="injected"):
        write_compressed_tensors(tmp_path / "ckpt", tensors, max_shard_size=20_000, progress=False)
    assert list(tmp_path.iterdir()) == []
    write_compressed_tensors(tmp_path / "ckpt", {"x": np.zeros(3, np.float32)}, progress=False)
    previous = {p.name: p.read_bytes() for p in (tmp_path / "ckpt").iterdir()}
    calls.clear()
    with pytest.raises(OSError, match="injected"):
        write_compressed_tensors(tmp_path / "ckpt", tensors, overwrite=True, progress=False)
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]
    assert {p.name: p.read_bytes() for p in (tmp_path / "ckpt").iterdir()} == previous


def test_bad_input(tmp_path: Path) -> None:
    """Each invalid weight is a LowbitError naming it; nothing is written."""
    codes = np.zeros((4, 64), np.int8)
    one = np.ones(4, np.float32)
    cases = [
        (CTTensor(codes + 8, one, num_bits=4), "codes must lie in -8..7"),
        (CTTensor(codes, np.ones(3, np.float32)), r"need shape \[4, 1\]"),
        (CTTensor(codes, np.ones((4, 2), np.float32), group_size=48), "does not divide"),
        (CTTensor(codes, -one), "positive and finite"),
        (CTTensor(codes.astype(np.float32), one), "integer dtype"),
        (CTTensor(codes[0], one[:1]), "2-D weight"),
        (CTTensor(codes.astype(np.uint8) | 0x7F, one, kind="float"), "NaN"),
        (CTTensor(codes, one, kind="float", zero_point=np.zeros(4, np.int8)), "no zero point"),
        (CTTensor(codes, one, kind="nf4"), "kind must be"),
        (CTTensor(codes, one, activations="int4"), "activations must be"),
        (CTTensor(codes, one, zero_point=np.full(4, 300)), "zero points must lie"),
    ]
    for t, match in cases:
        with pytest.raises(LowbitError, match=f"'m.w.weight'.*{match}"):
            write_compressed_tensors(tmp_path / "x", {"m.w.weight": t}, progress=False)
    with pytest.raises(LowbitError, match=r"end in '\.weight'"):
        write_compressed_tensors(tmp_path / "x", {"m.w": CTTensor(codes, one)}, progress=False)
    with pytest.raises(LowbitError, match="appears twice"):
        write_compressed_tensors(
            tmp_path / "x",
            {"m.weight": CTTensor(codes, one), "m.weight_scale": one},
            progress=False,
        )
    with pytest.raises(LowbitError, match="scale_dtype"):
        write_compressed_tensors(tmp_path / "x", {}, scale_dtype="float8")
    with pytest.raises(LowbitError, match="does not exist"):
        write_compressed_tensors(tmp_path / "x", {}, copy_files=[tmp_path / "nope"])
    assert list(tmp_path.iterdir()) == []


# ---- from_quantized: lowbit's QuantizedTensor ----------------------------------------------

LOWBIT_SCHEMES = {
    "int4_g128_sym": ("int4", {"axis": -1, "group_size": 128}),
    "int4_g128_asym": ("int4", {"axis": -1, "group_size": 128, "symmetric": False}),
    "int8_channel": ("int8", {"axis": 0}),
    "fp8_channel": ("fp8_e4m3", {"axis": 0}),
    "fp8_tensor": ("fp8_e4m3", {}),
    "uint4_g64_asym": ("uint4", {"axis": -1, "group_size": 64, "symmetric": False}),
}


@pytest.fixture(scope="module")
def lowbit_weights() -> dict[str, object]:
    """lowbit.quantize of one weight in each scheme compressed-tensors holds."""
    quant = pytest.importorskip("lowbit.quant.tensor")
    w = np.random.default_rng(7).standard_normal((OUT, IN)).astype(np.float32)
    return {k: quant.quantize(w, fmt, **kw) for k, (fmt, kw) in LOWBIT_SCHEMES.items()}


def test_lowbit_quantized_decompress_exactly(tmp_path: Path, lowbit_weights: dict) -> None:
    """compressed-tensors' decompression of lowbit's tensors gives exactly qt.dequantize()."""
    tensors = {f"m.{k}.weight": from_quantized(qt) for k, qt in lowbit_weights.items()}
    out = write_compressed_tensors(tmp_path / "l", tensors, progress=False)
    got = _ct_dequantize(out)
    for k, qt in lowbit_weights.items():
        np.testing.assert_array_equal(
            _bits(got[f"m.{k}.weight"]), _bits(qt.dequantize()), err_msg=k
        )


@pytest.mark.parametrize(
    ("fmt", "kw"),
    [
        ("int2", {"axis": -1, "group_size": 64}),
        ("int3", {"axis": -1, "group_size": 64, "symmetric": False}),
        ("int4", {"axis": 0}),
        ("int8", {"axis": -1, "group_size": 128, "symmetric": False}),
        ("uint4", {"axis": -1, "group_size": 64, "symmetric": False}),
        ("uint8", {"axis": 0, "symmetric": False}),
    ],
)
def test_from_quantized_codes_are_the_unpacked_ones(fmt: str, kw: dict) -> None:
    """from_quantized's signed int8 codes and zero points are unpack()'s, shifted to the
    signed range for unsigned formats (what compressed-tensors stores)."""
    quant = pytest.importorskip("lowbit.quant.tensor")
    w = np.random.default_rng(11).standard_normal((OUT, IN)).astype(np.float32) * 3
    qt = quant.quantize(w, fmt, **kw)
    t = from_quantized(qt)
    shift = 0 if qt.format.signed else 1 << (qt.format.bits - 1)
    want = qt.unpack().astype(np.int16) - shift
    assert t.codes.dtype == np.int8 and np.array_equal(t.codes, want)
    if qt.zero_point is None:
        assert t.zero_point is None
    else:
        zp = np.asarray(qt.zero_point).astype(np.int16) - shift
        assert np.array_equal(t.zero_point.reshape(-1), zp.reshape(-1))


def test_from_quantized_refuses_other_schemes(rng: np.random.Generator) -> None:
    """NF4, MX blocks, e5m2, input-axis channels and ragged groups are refused with the reason."""
    quant = pytest.importorskip("lowbit.quant.tensor")
    w = rng.standard_normal((8, 96)).astype(np.float32)
    cases = [
        (quant.quantize(w, "nf4", axis=-1, group_size=32), "no scheme for nf4"),
        (quant.quantize(w, "mxfp6_e2m3", axis=-1), "granularity block"),
        (quant.quantize(w, "fp8_e5m2", axis=0), "no scheme for float8_e5m2"),
        (quant.quantize(w, "int8", axis=1), "granularity channel on axis 1"),
        (quant.quantize(w[0], "int8"), "2-D weights"),
    ]
    for qt, match in cases:
        with pytest.raises(LowbitError, match=match):
            from_quantized(qt)
    with pytest.raises(LowbitError, match="does not divide"):
        from_quantized(quant.quantize(w, "int4", axis=-1, group_size=64))  # a ragged last group


@pytest.mark.slow
def test_transformers_loads_each_scheme(tmp_path: Path, lowbit_weights: dict) -> None:
    """transformers + compressed-tensors load a Llama checkpoint per scheme to lowbit's weights."""
    transformers = pytest.importorskip("transformers")
    from transformers.utils.quantization_config import CompressedTensorsConfig

    cfg = transformers.LlamaConfig(
        vocab_size=32, hidden_size=IN, intermediate_size=IN, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=32,
        tie_word_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(0)
    base = {k: v.numpy() for k, v in transformers.LlamaForCausalLM(cfg).state_dict().items()}
    quant = pytest.importorskip("lowbit.quant.tensor")
    for scheme, (fmt, kw) in LOWBIT_SCHEMES.items():
        qts = {
            k: quant.quantize(v, fmt, **kw)
            for k, v in base.items()
            if v.ndim == 2 and ".layers." in k and v.shape[0] == IN
        }
        act = "int8" if scheme == "int8_channel" else None  # also cover W8A8 int-quantized
        tensors = {
            k: from_quantized(qts[k], activations=act) if k in qts else v for k, v in base.items()
        }
        out = write_compressed_tensors(tmp_path / scheme, tensors, cfg.to_dict(), progress=False)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # transformers: "You passed quantization_config ..."
            model = transformers.AutoModelForCausalLM.from_pretrained(
                out,
                dtype=torch.float32,
                quantization_config=CompressedTensorsConfig(dequantize=True),
            )
        sd = model.state_dict()
        for k, qt in qts.items():
            np.testing.assert_array_equal(
                _bits(sd[k].numpy()), _bits(qt.dequantize()), err_msg=f"{scheme} {k}"
            )
        for k, v in base.items():
            if k not in qts:
                np.testing.assert_array_equal(sd[k].numpy(), v)


class _LazyWeights(Mapping):
    """Makes each CTTensor on access and records how many made values are still alive."""

    def __init__(self, n: int) -> None:
        self.n, self.alive, self.most_alive, self.calls = n, weakref.WeakSet(), 0, 0

    def __getitem__(self, key: str) -> CTTensor:
        # no gc.collect(): values must be freed by reference counting alone
        self.most_alive = max(self.most_alive, len(self.alive))
        self.calls += 1
        i = int(key.split(".")[1])
        rng = np.random.default_rng(i)
        t = CTTensor(
            rng.integers(-8, 8, size=(64, 128)),
            np.ones((64, 1), np.float32),
            num_bits=4,
            group_size=128,
        )
        self.alive.add(t)
        return t

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(f"l.{i}.weight" for i in range(self.n))

    def __len__(self) -> int:
        return self.n


def test_lazy_mapping_keeps_one_value(tmp_path: Path) -> None:
    """A lazy Mapping is read twice per tensor and no made value outlives its write."""
    lazy = _LazyWeights(5)
    out = write_compressed_tensors(tmp_path / "lazy", lazy, progress=False)
    assert lazy.calls == 10 and lazy.most_alive == 0
    got = _ct_dequantize(out)
    np.testing.assert_array_equal(got["l.3.weight"], lazy["l.3.weight"].dequantize())


def test_package_exports_lazily() -> None:
    """lowbit.checkpoints names the writers without importing them up front."""
    import lowbit.checkpoints

    assert lowbit.checkpoints.CTTensor is CTTensor
    assert lowbit.checkpoints.write_compressed_tensors is write_compressed_tensors
    with pytest.raises(AttributeError):
        lowbit.checkpoints.nothing  # noqa: B018
