"""Checkpoint readers: safetensors files, Hugging Face folders, GGUF files, and bad input."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest

from lowbit.checkpoints import load, open_checkpoint
from lowbit.errors import LowbitError
from lowbit.planning.headers import read_gguf_header, read_safetensors_header
from tiny_models import shipped_path

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")
gguf = pytest.importorskip("gguf")
from safetensors import safe_open  # noqa: E402

GQT = gguf.GGMLQuantizationType


def _tensors(rng: np.random.Generator) -> dict[str, torch.Tensor]:
    return {
        "w32": torch.from_numpy(rng.standard_normal((8, 12)).astype(np.float32)),
        "w16": torch.from_numpy(rng.standard_normal((3, 5)).astype(np.float16)),
        "wbf": torch.from_numpy(rng.standard_normal((4, 6)).astype(np.float32)).bfloat16(),
        "w8": torch.from_numpy(rng.standard_normal(16).astype(np.float32)).to(torch.float8_e4m3fn),
        "w52": torch.from_numpy(rng.standard_normal(7).astype(np.float32)).to(torch.float8_e5m2),
        "ids": torch.arange(10, dtype=torch.int64).reshape(1, 10),
        "scalar": torch.tensor(2.5),
        "empty": torch.zeros((0, 3)),
    }


def _as_torch_bits(arr: np.ndarray) -> torch.Tensor:
    """The bytes of a numpy array (ml_dtypes included) as a torch uint8 tensor."""
    return torch.from_numpy(np.ascontiguousarray(arr).view(np.uint8).copy())


def _assert_same(arr: np.ndarray, ref: torch.Tensor) -> None:
    assert tuple(arr.shape) == tuple(ref.shape)
    ref_bytes = ref.reshape(-1).view(torch.uint8).numpy()
    assert np.array_equal(_as_torch_bits(arr).numpy().ravel(), ref_bytes)


@pytest.fixture
def st_file(tmp_path: Path, rng: np.random.Generator) -> tuple[Path, dict[str, torch.Tensor]]:
    tensors = _tensors(rng)
    path = tmp_path / "one.safetensors"
    safetensors_torch.save_file(tensors, str(path), metadata={"made_by": "test"})
    return path, tensors


# ------------------------------------------------------------------- safetensors file


def test_safetensors_file_matches_safetensors_package(st_file) -> None:
    """Every tensor reads back bit for bit as the safetensors package reads it."""
    path, tensors = st_file
    ckpt = open_checkpoint(path)
    assert ckpt.format == "safetensors"
    assert sorted(ckpt.names()) == sorted(tensors)
    assert ckpt.metadata == {"made_by": "test"}
    assert ckpt.config is None
    with safe_open(str(path), framework="pt") as f:
        for name in f.keys():
            _assert_same(ckpt.get(name), f.get_tensor(name))


def test_safetensors_dtypes_and_shapes(st_file) -> None:
    """dtype() names the stored type; get() gives ml_dtypes for bfloat16/float8."""
    path, _ = st_file
    ckpt = open_checkpoint(path)
    assert ckpt.dtype("wbf") == "BF16" and ckpt.get("wbf").dtype.name == "bfloat16"
    assert ckpt.dtype("w8") == "F8_E4M3" and ckpt.get("w8").dtype.name == "float8_e4m3fn"
    assert ckpt.shape("scalar") == () and ckpt.get("scalar") == 2.5
    assert ckpt.shape("empty") == (0, 3)
    assert ckpt.get("wbf", np.float32).dtype == np.float32


def test_safetensors_get_is_readonly_memory_map(st_file) -> None:
    """Arrays come back read-only and backed by the file, not copied."""
    path, _ = st_file
    arr = open_checkpoint(path).get("w32")
    assert not arr.flags.writeable and not arr.flags.owndata
    with pytest.raises(ValueError):
        arr[0, 0] = 1.0


def test_unknown_name_suggests_close_names(st_file) -> None:
    """A wrong tensor name is a LowbitError listing close names."""
    path, _ = st_file
    with pytest.raises(LowbitError, match="close names: w32"):
        open_checkpoint(path).get("w33")
    assert "w33" not in open_checkpoint(path)


def test_items_progress_off_and_on(st_file, capsys) -> None:
    """items() yields every tensor once; progress=False writes nothing, True writes a bar."""
    path, _ = st_file
    ckpt = open_checkpoint(path)
    assert [n for n, _ in ckpt.items(progress=False)] == ckpt.names()
    assert capsys.readouterr().err == ""
    list(ckpt.items(["w32"], progress=True))
    assert "reading one.safetensors" in capsys.readouterr().err


def test_load_numpy_and_torch(st_file) -> None:
    """load() copies every tensor out; framework='torch' gives torch tensors of the same bits."""
    path, tensors = st_file
    arrays = load(path)
    assert arrays["w32"].flags.writeable
    as_torch = load(path, framework="torch", progress=False)
    for name, ref in tensors.items():
        assert as_torch[name].dtype == ref.dtype
        assert torch.equal(
            as_torch[name].reshape(-1).view(torch.uint8), ref.reshape(-1).view(torch.uint8)
        )
    with pytest.raises(LowbitError, match="framework"):
        load(path, framework="jax")


# ------------------------------------------------------------- Hugging Face folders


def _write_sharded(folder: Path, tensors: dict[str, torch.Tensor]) -> None:
    folder.mkdir(exist_ok=True)
    names = list(tensors)
    half = len(names) // 2
    shards = {
        "model-00001-of-00002.safetensors": names[:half],
        "model-00002-of-00002.safetensors": names[half:],
    }
    weight_map = {}
    for shard, part in shards.items():
        safetensors_torch.save_file({n: tensors[n] for n in part}, str(folder / shard))
        weight_map.update(dict.fromkeys(part, shard))
    index = {"metadata": {"total_size": 1}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    (folder / "config.json").write_text(json.dumps({"model_type": "toy", "hidden_size": 4}))


def test_sharded_folder_reads_all_shards(tmp_path: Path, rng: np.random.Generator) -> None:
    """A folder with an index reads every tensor from its shard, with config and metadata."""
    tensors = _tensors(rng)
    _write_sharded(tmp_path / "m", tensors)
    ckpt = open_checkpoint(tmp_path / "m")
    assert ckpt.format == "huggingface"
    assert ckpt.config == {"model_type": "toy", "hidden_size": 4}
    assert ckpt.metadata["total_size"] == 1
    assert sorted(ckpt.names()) == sorted(tensors)
    assert len({ckpt.info(n).file for n in ckpt.names()}) == 2
    for name, ref in tensors.items():
        _assert_same(ckpt.get(name), ref)
    # the index file itself opens the folder too
    assert sorted(open_checkpoint(tmp_path / "m" / "model.safetensors.index.json")) == sorted(
        tensors
    )


def test_folder_without_index_reads_single_file(tmp_path: Path, rng: np.random.Generator) -> None:
    """A folder with config.json and model.safetensors opens as a Hugging Face folder."""
    tensors = _tensors(rng)
    safetensors_torch.save_file(tensors, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text('{"model_type": "toy"}')
    ckpt = open_checkpoint(tmp_path)
    assert ckpt.config == {"model_type": "toy"} and len(ckpt) == len(tensors)
    assert ckpt.numel == sum(t.numel() for t in tensors.values())


def test_missing_shard_names_the_shard(tmp_path: Path, rng: np.random.Generator) -> None:
    """A shard the index lists but the folder lacks is a LowbitError naming it."""
    _write_sharded(tmp_path / "m", _tensors(rng))
    (tmp_path / "m" / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(LowbitError, match=r"shard model-00002-of-00002\.safetensors is missing"):
        open_checkpoint(tmp_path / "m")


def test_index_naming_absent_tensor(tmp_path: Path, rng: np.random.Generator) -> None:
    """An index placing a tensor in a shard that lacks it is a LowbitError naming the tensor."""
    _write_sharded(tmp_path / "m", _tensors(rng))
    index_path = tmp_path / "m" / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    index["weight_map"]["ghost"] = "model-00001-of-00002.safetensors"
    index_path.write_text(json.dumps(index))
    with pytest.raises(LowbitError, match="'ghost'"):
        open_checkpoint(tmp_path / "m")


def test_pickle_only_folder_is_refused(tmp_path: Path) -> None:
    """A folder with only pytorch_model.bin is refused without unpickling anything."""
    (tmp_path / "pytorch_model.bin").write_bytes(b"not a pickle either")
    with pytest.raises(LowbitError, match="never loads pickles"):
        open_checkpoint(tmp_path)
    with pytest.raises(LowbitError, match="pickle"):
        open_checkpoint(tmp_path / "pytorch_model.bin")
    with pytest.raises(LowbitError, match="no such file"):
        open_checkpoint(tmp_path / "nothing.safetensors")


# --------------------------------------------------------------- lying safetensors


def _raw_safetensors(path: Path, header: dict, data: bytes) -> Path:
    blob = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(blob)) + blob + data)
    return path


def test_truncated_safetensors(st_file) -> None:
    """A file cut short is a LowbitError naming the file and the tensor past its end."""
    path, _ = st_file
    raw = path.read_bytes()
    cut = path.with_name("cut.safetensors")
    cut.write_bytes(raw[: len(raw) - 10])
    with pytest.raises(LowbitError, match=r"cut\.safetensors.*ends at data byte"):
        open_checkpoint(cut)
    cut.write_bytes(raw[:20])
    with pytest.raises(LowbitError, match="header claims"):
        open_checkpoint(cut)
    cut.write_bytes(raw[:5])
    with pytest.raises(LowbitError, match="truncated"):
        open_checkpoint(cut)


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"dtype": "F32", "shape": [4, 4], "data_offsets": [0, 32]}, "lies about sizes"),
        ({"dtype": "F32", "shape": [2], "data_offsets": [64, 72]}, "ends at data byte 72"),
        ({"dtype": "F33", "shape": [2], "data_offsets": [0, 8]}, "dtype 'F33'"),
        ({"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}, "malformed shape"),
        ({"dtype": "F32", "shape": [2.0], "data_offsets": [0, 8]}, "malformed shape"),
        ({"dtype": "F32", "shape": [2]}, "needs dtype, shape and data_offsets"),
        ({"dtype": "F4", "shape": [3], "data_offsets": [0, 2]}, "12 bits, not whole bytes"),
    ],
)
def test_lying_safetensors_header(tmp_path: Path, entry: dict, message: str) -> None:
    """Shapes, dtypes and offsets that disagree are refused alike by reader and planner."""
    path = _raw_safetensors(tmp_path / "bad.safetensors", {"t": entry}, bytes(32))
    for read in (open_checkpoint, read_safetensors_header):
        with pytest.raises(LowbitError, match=message):
            read(path)


def test_sub_byte_safetensors_counted_not_read(tmp_path: Path) -> None:
    """An F4 tensor is counted from the header but refused by the reader (no numpy type)."""
    entry = {"dtype": "F4", "shape": [2, 3], "data_offsets": [0, 3]}
    path = _raw_safetensors(tmp_path / "f4.safetensors", {"t": entry}, bytes(3))
    ((info,), _) = read_safetensors_header(path)
    assert (info.dtype, info.shape, info.nbytes, info.offset) == ("F4", (2, 3), 3, 0)
    with pytest.raises(LowbitError, match="dtype 'F4', which lowbit cannot read"):
        open_checkpoint(path)


def test_overlapping_safetensors_tensors(tmp_path: Path) -> None:
    """Two tensors claiming the same bytes are refused."""
    header = {
        "a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
        "b": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]},
    }
    path = _raw_safetensors(tmp_path / "o.safetensors", header, bytes(24))
    for read in (open_checkpoint, read_safetensors_header):
        with pytest.raises(LowbitError, match="overlap"):
            read(path)


def test_safetensors_header_not_json(tmp_path: Path) -> None:
    """A header of garbage bytes is a LowbitError, not a JSON traceback."""
    path = tmp_path / "g.safetensors"
    path.write_bytes(struct.pack("<Q", 4) + b"\xff{[(" + bytes(8))
    with pytest.raises(LowbitError, match="not valid JSON"):
        open_checkpoint(path)


# ---------------------------------------------------------------------------- GGUF


def _write_gguf(path: Path, tensors: dict[str, tuple[np.ndarray, object]]) -> Path:
    """Write a GGUF with the gguf package; tensors map name -> (raw array, GGML type or None)."""
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    w.add_uint32("llama.embedding_length", 64)
    w.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)
    w.add_array("tokenizer.ggml.tokens", ["a", "b", "ab"])
    for name, (arr, qtype) in tensors.items():
        w.add_tensor(name, arr, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture
def gguf_file(tmp_path: Path, rng: np.random.Generator) -> tuple[Path, dict[str, np.ndarray]]:
    x = rng.standard_normal((4, 64)).astype(np.float32)
    raw = {
        "q8": (gguf.quants.quantize(x, GQT.Q8_0), GQT.Q8_0),
        "q4_0": (gguf.quants.quantize(x, GQT.Q4_0), GQT.Q4_0),
        "q4_1": (gguf.quants.quantize(x, GQT.Q4_1), GQT.Q4_1),
        "q5_0": (gguf.quants.quantize(x, GQT.Q5_0), GQT.Q5_0),
        "q5_1": (gguf.quants.quantize(x, GQT.Q5_1), GQT.Q5_1),
        # K-quants: the gguf package cannot quantize to them, so any bytes will do
        "q4_k": (rng.integers(0, 256, (2, 144), dtype=np.uint8), GQT.Q4_K),
        "q6_k": (rng.integers(0, 256, (1, 210), dtype=np.uint8), GQT.Q6_K),
        "bf16": (gguf.quants.quantize(x, GQT.BF16), GQT.BF16),
        "f16": (x.astype(np.float16), None),
        "f32": (x[0], None),
    }
    path = _write_gguf(tmp_path / "t.gguf", raw)
    return path, {n: gguf.quants.dequantize(a, q) if q else a for n, (a, q) in raw.items()}


def test_gguf_matches_gguf_package(gguf_file) -> None:
    """Every type dequantizes exactly as the gguf package's own reader + dequantize do."""
    path, expected = gguf_file
    ckpt = open_checkpoint(path)
    assert ckpt.format == "gguf" and ckpt.names() == list(expected)
    reader = gguf.GGUFReader(str(path))
    for t in reader.tensors:
        got = ckpt.get(t.name, np.float32)
        ref = gguf.quants.dequantize(t.data, t.tensor_type)
        np.testing.assert_array_equal(got, ref.astype(np.float32).reshape(got.shape))
        np.testing.assert_array_equal(got, np.asarray(expected[t.name], np.float32))
        assert ckpt.info(t.name).offset == t.data_offset
        assert ckpt.dtype(t.name) == t.tensor_type.name


def test_gguf_dequantizes_in_bands_as_the_package(
    gguf_file, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Block types decode in bands of rows (here one row each) by the gguf package's own
    row decoder, bit for bit what ``gguf.quants.dequantize`` gives for the whole tensor."""
    from lowbit.checkpoints.io import gguf_file as _gguf

    monkeypatch.setattr(_gguf, "_DEQUANT_VALUES", 1)
    path, expected = gguf_file
    ckpt = open_checkpoint(path)
    for name in ("q8", "q4_0", "q4_1", "q5_0", "q5_1", "q4_k", "q6_k"):
        got = ckpt.get(name, np.float32)
        want = np.asarray(expected[name], np.float32).reshape(got.shape)
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), name


@pytest.mark.parametrize("name", ["Q4_0", "Q4_1", "Q8_0", "Q5_1"])
def test_gguf_block_decoding_any_bytes(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Random block bytes (NaN, infinite and subnormal float16 scales among them) decode to
    the bits ``gguf.quants.dequantize`` gives, with lowbit's table decoders for Q4_0/Q4_1 and
    gguf's own for the rest, in one band or many."""
    from lowbit.checkpoints.io import gguf_file as _gguf

    kind = getattr(gguf.quants, name)
    raw = np.random.default_rng(5).integers(0, 256, (300, kind.type_size * 8), dtype=np.uint8)
    for row, scale in enumerate((0x7C00, 0xFC00, 0x7E01, 0xFD55, 0x0001, 0x8000)):
        raw[row, 0:2] = (scale & 255, scale >> 8)  # ±inf, NaNs with payloads, tiny, -0
        raw[row + 6, 2:4] = (scale & 255, scale >> 8)  # Q4_1/Q5_1: the minimum
    with np.errstate(all="ignore"):
        want = gguf.quants.dequantize(raw, GQT[name]).reshape(-1)
        for values in (1 << 18, 100):
            monkeypatch.setattr(_gguf, "_DEQUANT_VALUES", values)
            got = _gguf._dequantize_rows(kind, raw, want.size)
            assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), (name, values)
    assert np.isnan(want).any() and np.isinf(want).any()


def test_gguf_metadata_copy_reuses_the_parse(gguf_file, monkeypatch: pytest.MonkeyPatch) -> None:
    """raw_metadata after opening a file takes the value spans of that parse (no second
    parse); once the file changes it parses again, and the bytes are the file's."""
    from lowbit.checkpoints.io import gguf_file as _gguf

    path, _ = gguf_file
    open_checkpoint(path)
    calls = []
    real = _gguf._parse_buffer
    monkeypatch.setattr(_gguf, "_parse_buffer", lambda *a: calls.append(1) or real(*a))
    first = _gguf.raw_metadata(path)
    assert calls == []
    data = path.read_bytes()
    assert first["tokenizer.ggml.tokens"][0] == 9  # an array, its bytes as stored
    assert first["tokenizer.ggml.tokens"][1] in data
    path.write_bytes(data + b"\0" * 32)  # another size: another file
    assert _gguf.raw_metadata(path) == first and calls == [1]


def test_gguf_shapes_and_metadata(gguf_file) -> None:
    """Shapes are numpy order; metadata and a derived config come from the key/values."""
    path, _ = gguf_file
    ckpt = open_checkpoint(path)
    assert ckpt.shape("q8") == (4, 64) and ckpt.shape("q4_k") == (2, 256)
    assert ckpt.get("f16").dtype == np.float16 and ckpt.get("bf16").dtype.name == "bfloat16"
    assert ckpt.metadata["tokenizer.ggml.tokens"] == ["a", "b", "ab"]
    assert ckpt.metadata["general.architecture"] == "llama"
    assert ckpt.config["num_hidden_layers"] == 1 and ckpt.config["hidden_size"] == 64
    assert ckpt.config["rms_norm_eps"] == 1e-5 and ckpt.config["vocab_size"] == 3


def test_gguf_folder_with_one_file(gguf_file) -> None:
    """A folder holding a single .gguf opens that file."""
    path, _ = gguf_file
    assert open_checkpoint(path.parent).path == path


def _tensor_info_pos(raw: bytes, name: str) -> int:
    """Byte position of a tensor's info record in a GGUF header (at its name's length)."""
    pos = raw.index(struct.pack("<Q", len(name)) + name.encode())
    return pos + 8 + len(name)


def test_gguf_truncated(gguf_file) -> None:
    """A GGUF cut short names the tensor that no longer fits."""
    path, _ = gguf_file
    raw = path.read_bytes()
    cut = path.with_name("cut.gguf")
    cut.write_bytes(raw[:-100])
    with pytest.raises(LowbitError, match=r"cut\.gguf: tensor 'f32'.*truncated"):
        open_checkpoint(cut)
    header_end = _tensor_info_pos(raw, "f32")  # the last tensor's info record
    cut.write_bytes(raw[:header_end])
    with pytest.raises(LowbitError, match="header is truncated"):
        open_checkpoint(cut)


def test_gguf_lying_offset(gguf_file) -> None:
    """A tensor offset pointing past the end of the file, or into another tensor, is refused."""
    path, _ = gguf_file
    raw = bytearray(path.read_bytes())
    pos = _tensor_info_pos(bytes(raw), "q8") + 4 + 2 * 8 + 4  # n_dims, 2 dims, type
    struct.pack_into("<Q", raw, pos, 1 << 40)
    path.write_bytes(bytes(raw))
    with pytest.raises(LowbitError, match=r"'q8'.*header lies"):
        open_checkpoint(path)
    q4_offset = struct.unpack_from("<Q", raw, _tensor_info_pos(bytes(raw), "q4_0") + 24)[0]
    struct.pack_into("<Q", raw, pos, q4_offset)
    path.write_bytes(bytes(raw))
    for read in (open_checkpoint, read_gguf_header):
        with pytest.raises(LowbitError, match="overlap"):
            read(path)


def test_gguf_dimensions_do_not_wrap(gguf_file) -> None:
    """Dimensions whose product passes 2**64 are refused, not wrapped to a small size."""
    path, _ = gguf_file
    raw = bytearray(path.read_bytes())
    struct.pack_into("<QQ", raw, _tensor_info_pos(bytes(raw), "q8") + 4, 2**32, 2**32)
    path.write_bytes(bytes(raw))
    for read in (open_checkpoint, read_gguf_header):
        with pytest.raises(LowbitError, match=r"'q8'.*header lies"):
            read(path)


def test_gguf_unknown_type_code(gguf_file) -> None:
    """A type code gguf does not know (removed Q4_2 = 4) names the tensor."""
    path, _ = gguf_file
    raw = bytearray(path.read_bytes())
    struct.pack_into("<I", raw, _tensor_info_pos(bytes(raw), "q8") + 4 + 16, 4)
    path.write_bytes(bytes(raw))
    with pytest.raises(LowbitError, match="tensor 'q8' has GGUF type 4"):
        open_checkpoint(path)


def test_gguf_type_without_dequantizer(tmp_path: Path) -> None:
    """A known type the gguf package cannot dequantize (Q8_K) fails on get(), naming it."""
    block, size = gguf.GGML_QUANT_SIZES[GQT.Q8_K]
    path = _write_gguf(tmp_path / "k.gguf", {"t": (np.zeros((1, size), np.uint8), GQT.Q8_K)})
    ckpt = open_checkpoint(path)
    assert ckpt.shape("t") == (1, block)
    with pytest.raises(LowbitError, match="'t' has GGUF type Q8_K"):
        ckpt.get("t")


def test_gguf_bad_magic_and_version(tmp_path: Path) -> None:
    """Wrong magic or an unsupported version is a clear error."""
    bad = tmp_path / "x.gguf"
    bad.write_bytes(b"GGUX" + bytes(40))
    with pytest.raises(LowbitError, match="not a GGUF file"):
        open_checkpoint(bad)
    bad.write_bytes(b"GGUF" + struct.pack("<IQQ", 7, 0, 0) + bytes(16))
    with pytest.raises(LowbitError, match="version 7"):
        open_checkpoint(bad)
    bad.write_bytes(b"GGUF" + struct.pack(">IQQ", 3, 0, 0) + bytes(16))
    for read in (open_checkpoint, read_gguf_header):
        with pytest.raises(LowbitError, match="big-endian"):
            read(bad)


# ------------------------------------------------------------ the shipped checkpoints


def _smollm2_path() -> Path:
    return shipped_path("smollm2")


def _minilm_path() -> Path:
    return shipped_path("minilm")


def test_smollm2_header() -> None:
    """The shipped SmolLM2 GGUF: 272 tensors, 134,515,008 values, 210 Q4_1 + 1 Q8_0 + 61 F32."""
    ckpt = open_checkpoint(_smollm2_path())
    assert len(ckpt) == 272 and ckpt.numel == 134_515_008
    types = [ckpt.dtype(n) for n in ckpt.names()]
    assert (types.count("Q4_1"), types.count("Q8_0"), types.count("F32")) == (210, 1, 61)
    assert ckpt.config["num_hidden_layers"] == 30 and ckpt.config["tie_word_embeddings"]
    assert ckpt.shape("token_embd.weight") == (49152, 576)


@pytest.mark.slow
def test_smollm2_tensor_matches_gguf_reader() -> None:
    """One Q4_1 tensor and the metadata agree with the gguf package's GGUFReader."""
    path = _smollm2_path()
    ckpt = open_checkpoint(path)
    reader = gguf.GGUFReader(str(path))
    t = next(t for t in reader.tensors if t.name == "blk.3.attn_q.weight")
    np.testing.assert_array_equal(ckpt.get(t.name), gguf.quants.dequantize(t.data, t.tensor_type))
    for key, field in reader.fields.items():
        if not key.startswith("GGUF."):
            assert ckpt.metadata[key] == field.contents(), key


def test_minilm_folder() -> None:
    """The shipped all-MiniLM-L6-v2 folder: a BERT config and 22,713,216 float32 weights."""
    ckpt = open_checkpoint(_minilm_path())
    assert ckpt.format == "huggingface" and ckpt.config["model_type"] == "bert"
    floats = [n for n in ckpt.names() if ckpt.dtype(n) == "F32"]
    assert sum(ckpt.info(n).numel for n in floats) == 22_713_216
