"""Parameter counting: configs (published counts), checkpoint headers (the shipped files)."""

from __future__ import annotations

import itertools
import json
import shutil
import struct
from pathlib import Path

import pytest

from lowbit.checkpoints.shipped import default_model_path
from lowbit.errors import LowbitError
from lowbit.planning import archs
from lowbit.planning.headers import read_gguf_header, read_safetensors_header
from lowbit.planning.modelspec import parse_params
from lowbit.plans.components import classify

CONFIGS = Path(__file__).parents[1] / "fixtures" / "configs"

# Published parameter counts (sources in tests/fixtures/configs/README.md).
PUBLISHED = {
    "llama-2-7b-hf.json": 6_738_415_616,
    "meta-llama-3-8b.json": 8_030_261_248,
    "mistral-7b-v0.1.json": 7_241_732_096,
    "qwen2.5-0.5b.json": 494_032_768,
    "gemma-2b.json": 2_506_172_416,
    "gpt2.json": 124_439_808,
    "bert-base-uncased.json": 109_482_240,
    "tinyllama-1.1b.json": 1_100_048_384,
    "smollm2-135m.json": 134_515_008,
    "phi-3-mini-4k-instruct.json": 3_821_079_552,
    "pythia-160m.json": 162_322_944,
    "mixtral-8x7b-v0.1.json": 46_702_792_704,
}


@pytest.fixture(scope="module")
def smollm2_gguf() -> Path:
    return default_model_path("smollm2")


@pytest.fixture(scope="module")
def smollm2_spec(smollm2_gguf: Path) -> archs.ModelSpec:
    return archs.spec_from_checkpoint(smollm2_gguf)


@pytest.fixture(scope="module")
def minilm_dir() -> Path:
    return default_model_path("minilm")


# ---- spec_from_config ------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_config_counts_match_published(name: str) -> None:
    """Counting a public config.json reproduces the model's published parameter count."""
    assert archs.spec_from_config(CONFIGS / name).params == PUBLISHED[name]


def test_every_fixture_has_a_published_count() -> None:
    """Every fixture config is pinned to a published count (and listed in the README)."""
    files = {p.name for p in CONFIGS.glob("*.json")}
    assert files == set(PUBLISHED)
    readme = (CONFIGS / "README.md").read_text()
    for name in files:
        assert name in readme


def test_smollm2_components_by_hand() -> None:
    """SmolLM2-135M splits as hand-computed: 30 layers of GQA attention (9 q, 3 kv heads)."""
    spec = archs.spec_from_config(CONFIGS / "smollm2-135m.json")
    h, kv, inter = 576, 3 * 64, 1536
    assert spec.components == {
        "embeddings": 49152 * h,
        "attention": 30 * (2 * h * h + 2 * h * kv),
        "mlp": 30 * 3 * h * inter,
        "norms": 30 * 2 * h + h,
        "lm_head": 0,
        "router": 0,
        "other": 0,
    }
    assert (spec.n_layers, spec.n_heads, spec.n_kv_heads, spec.head_dim) == (30, 9, 3, 64)
    assert spec.kv_elements_per_token == 2 * 30 * 3 * 64
    assert spec.tied_embeddings and spec.params_per_token == spec.params  # tied: head reads it


def test_untied_embedding_lookup_is_not_read_per_token() -> None:
    """An untied input embedding is looked up (not read whole): params per token exclude it."""
    spec = archs.spec_from_config(CONFIGS / "llama-2-7b-hf.json")
    assert spec.params - spec.params_per_token == 32000 * 4096
    assert spec.components["lm_head"] == 32000 * 4096


def test_gqa_kv_elements() -> None:
    """KV values per token follow the KV heads: Llama-3-8B caches 1/4 of Llama-2-7B's."""
    l2 = archs.spec_from_config(CONFIGS / "llama-2-7b-hf.json").kv_elements_per_token
    l3 = archs.spec_from_config(CONFIGS / "meta-llama-3-8b.json").kv_elements_per_token
    assert (l2, l3) == (2 * 32 * 32 * 128, 2 * 32 * 8 * 128)


def test_mixtral_active_parameters() -> None:
    """Mixtral 8x7B: 2 of 8 experts per token give the published ~12.9B active parameters."""
    spec = archs.spec_from_config(CONFIGS / "mixtral-8x7b-v0.1.json")
    expert = 3 * 4096 * 14336
    assert spec.params - spec.params_per_token == 32 * 6 * expert + 32000 * 4096
    assert abs(spec.params_per_token + 32000 * 4096 - 12.9e9) < 0.05e9
    assert spec.active_intermediate == 2 * 14336


def test_encoder_has_no_kv_cache() -> None:
    """BERT is an encoder: no KV cache; its pooler is counted (as AutoModel loads it)."""
    spec = archs.spec_from_config(CONFIGS / "bert-base-uncased.json")
    assert not spec.is_decoder and spec.kv_elements_per_token is None
    assert spec.components["other"] == 768 * 768 + 768  # pooler


def test_unknown_architecture_names_missing_fields() -> None:
    """An unknown model_type without the llama fields is an error naming the missing ones."""
    with pytest.raises(LowbitError, match=r"unknown architecture 'foo'.*intermediate_size"):
        archs.spec_from_config({"model_type": "foo", "hidden_size": 64, "num_hidden_layers": 2})


def test_unknown_architecture_with_llama_fields_warns() -> None:
    """An unknown model_type with the llama fields is counted as llama, with a warning."""
    cfg = json.loads((CONFIGS / "tinyllama-1.1b.json").read_text())
    cfg["model_type"] = "my_llama"
    with pytest.warns(UserWarning, match="llama-style"):
        spec = archs.spec_from_config(cfg)
    assert spec.params == PUBLISHED["tinyllama-1.1b.json"]


def test_known_architecture_missing_fields() -> None:
    """A known architecture lacking fields says which ones."""
    with pytest.raises(LowbitError, match="lacks the fields num_hidden_layers, vocab_size"):
        archs.spec_from_config({"model_type": "llama", "hidden_size": 64,
                                "num_attention_heads": 4, "intermediate_size": 128})  # fmt: skip


@pytest.mark.parametrize(
    ("text", "match"),
    [("{not json", "not valid JSON"), ("[1, 2]", "expected a JSON object")],
)
def test_malformed_config(tmp_path: Path, text: str, match: str) -> None:
    """A config that is not a JSON object is a clear LowbitError."""
    p = tmp_path / "config.json"
    p.write_text(text)
    with pytest.raises(LowbitError, match=match):
        archs.spec_from_config(p)


def test_bad_field_type() -> None:
    """A non-integer dimension is reported by name."""
    cfg = json.loads((CONFIGS / "gpt2.json").read_text())
    cfg["n_embd"] = "768"
    with pytest.raises(LowbitError, match="n_embd must be a non-negative integer"):
        archs.spec_from_config(cfg)


# ---- parse_params / classify -----------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "n"),
    [("7B", 7 * 10**9), ("1.5b", 1_500_000_000), ("135M", 135 * 10**6), ("7e9", 7 * 10**9),
     ("1,000", 1000), ("2T", 2 * 10**12), (22_713_216, 22_713_216), ("64k", 64_000)],
)  # fmt: skip
def test_parse_params(text: str, n: int) -> None:
    """Counts take K/M/B/T decimal suffixes, exponents and separators."""
    assert parse_params(text) == n


@pytest.mark.parametrize("text", ["seven", "0", "-3B", "1.5Q", ""])
def test_parse_params_rejects(text: str) -> None:
    """Anything that is not a positive count is an error."""
    with pytest.raises(LowbitError):
        parse_params(text)


@pytest.mark.parametrize(
    ("name", "ndim", "component"),
    [("model.embed_tokens.weight", 2, "embeddings"), ("lm_head.weight", 2, "lm_head"),
     ("model.layers.3.self_attn.k_proj.weight", 2, "attention"),
     ("model.layers.3.mlp.down_proj.weight", 2, "mlp"),
     ("model.layers.3.input_layernorm.weight", 1, "norms"), ("token_embd.weight", 2, "embeddings"),
     ("output.weight", 2, "lm_head"), ("output_norm.weight", 1, "norms"),
     ("blk.0.attn_v.weight", 2, "attention"), ("blk.0.ffn_up.weight", 2, "mlp"),
     ("encoder.layer.0.output.dense.weight", 2, "mlp"),
     ("encoder.layer.0.attention.output.dense.bias", 1, "attention"),
     ("encoder.layer.0.attention.output.LayerNorm.weight", 1, "norms"),
     ("embeddings.position_ids", 2, "buffer"), ("transformer.h.0.attn.bias", 4, "buffer"),
     ("transformer.h.0.attn.c_attn.bias", 1, "attention"), ("pooler.dense.weight", 2, "other")],
)  # fmt: skip
def test_classify(name: str, ndim: int, component: str) -> None:
    """Tensor names from transformers and GGUF map to their components."""
    assert classify(name, ndim) == component


# ---- checkpoints: the shipped models ---------------------------------------------------


def test_shipped_gguf_counts(smollm2_spec: archs.ModelSpec) -> None:
    """SmolLM2 GGUF: 134,515,008 parameters; 210 Q4_1 + 1 Q8_0 + 61 F32 tensors; tied head."""
    spec = smollm2_spec
    assert spec.params == 134_515_008
    types = [t.dtype for t in spec.tensors]
    assert (types.count("Q4_1"), types.count("Q8_0"), types.count("F32")) == (210, 1, 61)
    assert (spec.n_layers, spec.n_heads, spec.n_kv_heads, spec.head_dim) == (30, 9, 3, 64)
    assert spec.tied_embeddings and spec.architecture == "llama"
    embd = next(t for t in spec.tensors if t.name == "token_embd.weight")
    assert embd.shape == (49152, 576)  # row-major: GGUF's [576, 49152] reversed


def test_shipped_gguf_bytes_from_block_sizes(smollm2_gguf: Path) -> None:
    """Bytes computed from GGML block sizes tile the data section the header's offsets lay out.

    (gguf.GGUFReader gives the same 96,576,768 bytes; it is not called here because it
    takes ~5 s on this file.)
    """
    tensors, meta = read_gguf_header(smollm2_gguf)
    by_type = {"Q4_1": (32, 20), "Q8_0": (32, 34), "F32": (1, 4)}  # ggml-common.h layouts
    for t in tensors:
        block, size = by_type[t.dtype]
        assert t.nbytes == t.numel // block * size
    align = meta["__alignment__"]
    ordered = sorted(tensors, key=lambda t: t.offset)
    for a, b in itertools.pairwise(ordered):
        assert b.offset == -(-(a.offset + a.nbytes) // align) * align
    end = meta["__data_offset__"] + ordered[-1].offset + ordered[-1].nbytes
    assert end == smollm2_gguf.stat().st_size
    assert sum(t.nbytes for t in tensors) == 96_576_768


def test_shipped_safetensors_counts(minilm_dir: Path) -> None:
    """all-MiniLM-L6-v2: 22,713,216 parameters in FP32 (position_ids is a buffer, not counted)."""
    spec = archs.spec_from_checkpoint(minilm_dir)
    assert spec.params == 22_713_216
    assert spec.stored_bytes == 4 * 22_713_216
    assert [t.name for t in spec.tensors if t.component == "buffer"] == ["embeddings.position_ids"]
    assert spec.architecture == "bert" and not spec.is_decoder


def test_shipped_safetensors_header_tiles_file(minilm_dir: Path) -> None:
    """8 + header length + every tensor's bytes (buffers too) is exactly the file size."""
    f = minilm_dir / "model.safetensors"
    tensors, meta = read_safetensors_header(f)
    with open(f, "rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
    assert 8 + n + sum(t.nbytes for t in tensors) == f.stat().st_size
    assert meta == {"format": "pt"}


def test_config_and_checkpoint_agree(minilm_dir: Path) -> None:
    """The BERT tensors built from config.json have the checkpoint's names and shapes."""
    from_cfg = archs.spec_from_config(minilm_dir / "config.json")
    from_ckpt = archs.spec_from_checkpoint(minilm_dir)
    assert {(t.name, t.shape) for t in from_cfg.parameters} == {
        (t.name, t.shape) for t in from_ckpt.parameters
    }


def test_smollm2_config_matches_gguf(smollm2_spec: archs.ModelSpec) -> None:
    """The published SmolLM2 config and the shipped GGUF describe the same model."""
    cfg = archs.spec_from_config(CONFIGS / "smollm2-135m.json")
    ck = smollm2_spec
    assert cfg.params == ck.params
    assert cfg.components == ck.components
    keys = ("n_layers", "hidden_size", "n_heads", "n_kv_heads", "head_dim", "vocab_size")
    assert [getattr(cfg, k) for k in keys] == [getattr(ck, k) for k in keys]


def test_load_spec_names(smollm2_gguf: Path) -> None:
    """load_spec takes counts, shipped names, config paths and checkpoints."""
    assert archs.load_spec("7B").params == 7 * 10**9
    assert archs.load_spec(1e6).source == "params"
    assert archs.load_spec(str(CONFIGS / "gpt2.json")).params == 124_439_808
    spec = archs.load_spec("smollm2")
    assert (spec.params, spec.source, spec.path) == (134_515_008, "gguf", str(smollm2_gguf))
    assert spec.name.startswith("SmolLM2-135M-Instruct")


# ---- checkpoints: bad input ------------------------------------------------------------


def _safetensors(path: Path, header: bytes, data: bytes = b"", length: int | None = None) -> Path:
    path.write_bytes(struct.pack("<Q", len(header) if length is None else length) + header + data)
    return path


@pytest.mark.parametrize(
    ("header", "data", "length", "match"),
    [(b"{}", b"", 10**6, "header length"),
     (b"not json", b"", None, "not JSON"),
     (b'{"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}', b"\0" * 8, None,
      "spans 4 bytes, expected 8"),
     (b'{"a": {"dtype": "F99", "shape": [2], "data_offsets": [0, 8]}}', b"\0" * 8, None,
      "bad entry"),
     (b'{"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}', b"\0" * 8, None,
      "bad entry")],
)  # fmt: skip
def test_malformed_safetensors(
    tmp_path: Path, header: bytes, data: bytes, length: int | None, match: str
) -> None:
    """Bad lengths, non-JSON headers, offsets off the shape or past the file are errors."""
    p = _safetensors(tmp_path / "m.safetensors", header, data, length)
    with pytest.raises(LowbitError, match=match):
        archs.spec_from_checkpoint(p)


def test_safetensors_unknown_arch_falls_back_to_tensors(tmp_path: Path) -> None:
    """An unknown architecture in config.json: the tensors are counted, with a note."""
    header = json.dumps(
        {"w.weight": {"dtype": "BF16", "shape": [3, 4], "data_offsets": [0, 24]},
         "layers.0.norm.weight": {"dtype": "F32", "shape": [4], "data_offsets": [24, 40]}}
    ).encode()  # fmt: skip
    _safetensors(tmp_path / "model.safetensors", header, b"\0" * 40)
    (tmp_path / "config.json").write_text('{"model_type": "mystery", "hidden_size": 4}')
    spec = archs.spec_from_checkpoint(tmp_path)
    assert spec.params == 16 and spec.stored_bytes == 40
    assert any("unknown architecture 'mystery'" in n for n in spec.notes)
    assert spec.kv_elements_per_token is None


def test_sharded_folder_uses_the_index(tmp_path: Path) -> None:
    """A folder with an index counts the shards it names, not other .safetensors files."""
    one = json.dumps({"a.weight": {"dtype": "F16", "shape": [2, 3], "data_offsets": [0, 12]}})
    two = json.dumps({"b.weight": {"dtype": "F16", "shape": [5], "data_offsets": [0, 10]}})
    _safetensors(tmp_path / "model-00001-of-00002.safetensors", one.encode(), b"\0" * 12)
    _safetensors(tmp_path / "model-00002-of-00002.safetensors", two.encode(), b"\0" * 10)
    _safetensors(tmp_path / "consolidated.safetensors", one.encode(), b"\0" * 12)
    assert archs.spec_from_checkpoint(tmp_path).params == 6 + 5 + 6
    index = {"metadata": {"total_size": 22}, "weight_map": {
        "a.weight": "model-00001-of-00002.safetensors",
        "b.weight": "model-00002-of-00002.safetensors"}}  # fmt: skip
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    spec = archs.spec_from_checkpoint(tmp_path)
    assert (spec.params, spec.stored_bytes) == (11, 22)
    index["weight_map"]["c.weight"] = "model-00003-of-00003.safetensors"
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(LowbitError, match="names shards that are not there"):
        archs.spec_from_checkpoint(tmp_path)


def test_malformed_gguf(tmp_path: Path, smollm2_gguf: Path) -> None:
    """Wrong magic, a truncated header or an unknown version is a clear error."""
    bad = tmp_path / "x.gguf"
    bad.write_bytes(b"GGUX" + b"\0" * 100)
    with pytest.raises(LowbitError, match="not a checkpoint"):
        archs.spec_from_checkpoint(bad)
    with pytest.raises(LowbitError, match="not a GGUF file"):
        read_gguf_header(bad)
    with open(smollm2_gguf, "rb") as f:
        head = f.read(4096)
    bad.write_bytes(head)
    with pytest.raises(LowbitError, match="past the end of the file"):
        archs.spec_from_checkpoint(bad)
    bad.write_bytes(b"GGUF" + struct.pack("<I", 9) + b"\0" * 40)
    with pytest.raises(LowbitError, match="unsupported GGUF version 9"):
        archs.spec_from_checkpoint(bad)


def test_not_a_checkpoint(tmp_path: Path) -> None:
    """A file that is neither safetensors nor GGUF, or an empty folder, is an error."""
    p = tmp_path / "weights.bin"
    p.write_bytes(b"\0" * 64)
    with pytest.raises(LowbitError, match="not a checkpoint"):
        archs.load_spec(p)
    with pytest.raises(LowbitError, match=r"no config\.json"):
        archs.load_spec(tmp_path)


def test_gguf_folder(tmp_path: Path, smollm2_gguf: Path) -> None:
    """A folder holding one .gguf is read as that file."""
    link = tmp_path / smollm2_gguf.name
    try:
        link.symlink_to(smollm2_gguf)
    except OSError:  # pragma: no cover - filesystems without symlinks
        shutil.copy(smollm2_gguf, link)
    spec = archs.load_spec(tmp_path)
    assert (spec.params, spec.stored_bytes) == (134_515_008, 96_576_768)
