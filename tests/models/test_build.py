"""Building runnable models from checkpoints: GGUF llama, Hugging Face folders, replaced weights."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from lowbit.checkpoints import load_model, open_checkpoint
from lowbit.errors import LowbitError

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")
safetensors_torch = pytest.importorskip("safetensors.torch")
from lowbit.checkpoints.gguf.names import gguf_to_hf_name, unpermute_qk  # noqa: E402
from lowbit.models.build import build_model, hf_tensors  # noqa: E402
from tiny_models import (  # noqa: E402
    gguf_tensors,
    llamacpp_permute,
    shared_shipped_model,
    tiny_llama,
)

pytestmark = pytest.mark.torch


@pytest.mark.parametrize(("rows", "heads"), [(8, 1), (24, 3), (64, 4), (576, 9)])
def test_unpermute_invertsllamacpp_permute(rows: int, heads: int, rng) -> None:
    """unpermute_qk undoes llama.cpp's q/k row permutation for weights and biases."""
    w = rng.standard_normal((rows, 5))
    np.testing.assert_array_equal(unpermute_qk(llamacpp_permute(w, heads), heads), w)
    b = rng.standard_normal(rows)
    np.testing.assert_array_equal(unpermute_qk(llamacpp_permute(b, heads), heads), b)
    assert not np.array_equal(llamacpp_permute(w, heads), w)  # it is a real reordering
    with pytest.raises(LowbitError, match="rotary pairs"):
        unpermute_qk(w[:-1], heads)


def test_gguf_names_map_to_llama() -> None:
    """GGUF tensor names map to transformers' llama names; unknown ones are an error."""
    assert gguf_to_hf_name("token_embd.weight") == "model.embed_tokens.weight"
    assert gguf_to_hf_name("blk.12.attn_q.weight") == "model.layers.12.self_attn.q_proj.weight"
    assert gguf_to_hf_name("blk.0.ffn_down.weight") == "model.layers.0.mlp.down_proj.weight"
    assert (
        gguf_to_hf_name("blk.3.ffn_norm.weight") == "model.layers.3.post_attention_layernorm.weight"
    )
    assert gguf_to_hf_name("output.weight") == "lm_head.weight"
    with pytest.raises(LowbitError, match="rope_freqs"):
        gguf_to_hf_name("rope_freqs.weight")


# ------------------------------------------------------------------- a tiny llama


def _write_tiny_gguf(model: torch.nn.Module, path: Path) -> Path:
    """Write a llama model as llama.cpp's converter would: GGUF names, permuted q/k, F32,
    through the ``gguf`` package's own writer (``tiny_models.save_gguf`` uses lowbit's)."""
    cfg = model.config
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_rope_freq_base(10000.0)
    w.add_rope_dimension_count(cfg.hidden_size // cfg.num_attention_heads)
    w.add_vocab_size(cfg.vocab_size)
    for gname, arr in gguf_tensors(model).items():
        w.add_tensor(gname, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


_IDS = torch.tensor([[1, 5, 9, 33, 2, 7, 63, 0, 12, 40]])


@pytest.mark.parametrize("tie", [False, True])
def test_gguf_llama_rebuilds_the_model(tmp_path: Path, tie: bool) -> None:
    """A llama written as GGUF (permuted q/k) builds back to a model with identical logits."""
    original = tiny_llama(tie=tie)
    ckpt = open_checkpoint(_write_tiny_gguf(original, tmp_path / "tiny.gguf"))
    assert ckpt.config["tie_word_embeddings"] is tie
    rebuilt = build_model(ckpt, progress=False)
    assert not rebuilt.training
    with torch.no_grad():
        assert torch.equal(rebuilt(_IDS).logits, original(_IDS).logits)


@pytest.mark.skipif(importlib.util.find_spec("accelerate") is None, reason="needs accelerate")
@pytest.mark.parametrize("tie", [False, True])
def test_gguf_llama_matches_transformers_gguf_loader(tmp_path: Path, tie: bool) -> None:
    """build_model and transformers' own GGUF loader give bit-identical logits."""
    path = _write_tiny_gguf(tiny_llama(tie=tie), tmp_path / "tiny.gguf")
    ours = build_model(open_checkpoint(path), progress=False)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path, gguf_file=path.name, dtype=torch.float32, local_files_only=True
    ).eval()
    with torch.no_grad():
        assert torch.equal(ours(_IDS).logits, theirs(_IDS).logits)


def test_hf_tensors_yields_hf_names_unpermuted(tmp_path: Path) -> None:
    """hf_tensors gives Hugging Face names and the original (un-permuted) q rows."""
    original = tiny_llama()
    ckpt = open_checkpoint(_write_tiny_gguf(original, tmp_path / "tiny.gguf"))
    tensors = dict(hf_tensors(ckpt, progress=False))
    assert set(tensors) == set(original.state_dict())
    q = original.model.layers[1].self_attn.q_proj.weight.detach().numpy()
    np.testing.assert_array_equal(tensors["model.layers.1.self_attn.q_proj.weight"], q)


def test_replaced_weights_are_used(tmp_path: Path) -> None:
    """Weights passed by checkpoint name replace the file's (before the q/k un-permutation)."""
    original = tiny_llama()
    ckpt = open_checkpoint(_write_tiny_gguf(original, tmp_path / "tiny.gguf"))
    q = ckpt.get("blk.0.attn_q.weight") * 0.5
    model = build_model(ckpt, {"blk.0.attn_q.weight": q}, progress=False)
    want = original.model.layers[0].self_attn.q_proj.weight.detach() * 0.5
    assert torch.equal(model.model.layers[0].self_attn.q_proj.weight, want)
    assert torch.equal(
        model.model.layers[0].self_attn.k_proj.weight,
        original.model.layers[0].self_attn.k_proj.weight,
    )
    with pytest.raises(LowbitError, match="shape"):
        build_model(ckpt, {"blk.0.attn_q.weight": q[:4]}, progress=False)
    with pytest.raises(LowbitError, match=r"close names: blk\.0\.attn_q\.weight"):
        build_model(ckpt, {"blk.0.attn_qq.weight": q}, progress=False)


def _save_folder(model: torch.nn.Module, folder: Path, tensors: dict | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    state = (
        tensors
        if tensors is not None
        else {k: v.contiguous() for k, v in model.state_dict().items()}
    )
    safetensors_torch.save_file(state, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(model.config.to_json_string())
    return folder


def test_folder_builds_the_architecture_named(tmp_path: Path) -> None:
    """A safetensors folder builds the class its config names, with identical logits."""
    original = tiny_llama()
    model = load_model(_save_folder(original, tmp_path / "m"), progress=False)
    assert type(model).__name__ == "LlamaForCausalLM"
    with torch.no_grad():
        assert torch.equal(model(_IDS).logits, original(_IDS).logits)


def _tiny_bert() -> torch.nn.Module:
    cfg = transformers.BertConfig(
        vocab_size=50,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=64,
    )
    cfg.architectures = ["BertModel"]
    torch.manual_seed(1)
    return transformers.BertModel(cfg).eval()


def test_base_model_prefix_is_bridged(tmp_path: Path) -> None:
    """Checkpoint names with the 'bert.' prefix load into a bare BertModel, and back."""
    original = _tiny_bert()
    prefixed = {f"bert.{k}": v.contiguous() for k, v in original.state_dict().items()}
    model = load_model(_save_folder(original, tmp_path / "p", prefixed), progress=False)
    ids = torch.tensor([[2, 7, 9, 3]])
    with torch.no_grad():
        assert torch.equal(model(ids).last_hidden_state, original(ids).last_hidden_state)


def test_strict_names(tmp_path: Path) -> None:
    """A missing parameter or a stray tensor is a LowbitError naming them; strict=False loads."""
    original = _tiny_bert()
    state = {k: v.contiguous() for k, v in original.state_dict().items()}
    state["encoder.layer.0.extra.weight"] = torch.zeros(2)
    del state["pooler.dense.bias"]
    folder = _save_folder(original, tmp_path / "s", state)
    with pytest.raises(LowbitError, match=r"pooler\.dense\.bias.*encoder\.layer\.0\.extra\.weight"):
        load_model(folder, progress=False)
    model = load_model(folder, strict=False, progress=False)
    assert torch.equal(model.pooler.dense.weight, original.pooler.dense.weight)


def test_unbuildable_checkpoints(tmp_path: Path) -> None:
    """No config, or a GGUF architecture other than llama: clear errors."""
    lone = tmp_path / "lone.safetensors"
    safetensors_torch.save_file({"w": torch.zeros(2)}, str(lone))
    with pytest.raises(LowbitError, match=r"no config\.json"):
        build_model(open_checkpoint(lone))
    w = gguf.GGUFWriter(str(tmp_path / "x.gguf"), "mamba")
    w.add_tensor("t", np.zeros(4, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(LowbitError, match="architecture 'mamba'"):
        build_model(open_checkpoint(tmp_path / "x.gguf"))


# ------------------------------------------------------------ the shipped models


@pytest.fixture(scope="module")
def smollm2():
    _, ckpt, model, tok = shared_shipped_model("smollm2")
    return ckpt, model, tok


@pytest.mark.slow
def test_smollm2_answers(smollm2) -> None:
    """The built SmolLM2 completes 'The capital of France is' with ' Paris'."""
    _, model, tok = smollm2
    ids = tok("The capital of France is", add_special_tokens=False, return_tensors="pt")
    with torch.no_grad():
        logits = model(**ids).logits
    assert tok.decode(logits[0, -1].argmax()) == " Paris"
    assert sum(p.numel() for p in model.parameters()) == 134_515_008


@pytest.mark.slow
def test_smollm2_tokenizer_matches_transformers(smollm2) -> None:
    """The hand-built GGUF tokenizer gives transformers' ids where the pre-tokenizers agree
    (text without digits, special tokens); with digits it follows llama.cpp's ``smollm``
    pre-tokenizer (one digit a piece), which transformers' GGUF conversion ignores."""
    from lowbit.evaluation.perplexity import default_text, tokenize

    ckpt, _, tok = smollm2
    ref = transformers.AutoTokenizer.from_pretrained(
        ckpt.path.parent, gguf_file=ckpt.path.name, local_files_only=True
    )
    _, text = default_text()
    no_digits = "".join(c for c in text[:40_000] if not c.isdigit())
    assert tokenize(tok, no_digits) == tokenize(ref, no_digits)
    # the default text's first difference (token 11,659): whitespace before a digit
    assert tok.convert_ids_to_tokens(tokenize(tok, ",))\n   2")) == [",))", "ĊĠĠĠ", "2"]
    assert ref.convert_ids_to_tokens(tokenize(ref, ",))\n   2")) == [",))", "ĊĠĠ", "Ġ", "2"]
    special = "<|im_start|>user\nHi<|im_end|>"
    assert (
        tok(special, add_special_tokens=False)["input_ids"]
        == ref(special, add_special_tokens=False)["input_ids"]
    )


def test_minilm_matches_transformers_loader() -> None:
    """MiniLM built by lowbit gives transformers' BertModel.from_pretrained hidden states."""
    path, _, model, tok = shared_shipped_model("minilm")
    ref = transformers.BertModel.from_pretrained(path, local_files_only=True).eval()
    enc = tok(
        ["Quantization keeps most of the quality.", "A short one."],
        padding=True,
        return_tensors="pt",
    )
    with torch.no_grad():
        assert torch.equal(model(**enc).last_hidden_state, ref(**enc).last_hidden_state)
    assert json.loads((path / "config.json").read_text())["hidden_size"] == 384
