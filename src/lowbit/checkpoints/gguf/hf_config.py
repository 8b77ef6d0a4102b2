"""A Hugging Face ``config.json`` as llama.cpp's ``convert_hf_to_gguf.py`` sees it.

The converter reads configs through transformers' ``AutoConfig(...).to_dict()``, so a key absent
from the file still reaches it with the config class's default, and the rope settings arrive
standardised into one ``rope_parameters`` dict. This module repeats both for the families lowbit
converts, without importing transformers: the defaults are a table (checked against transformers'
own config classes by the tests), the standardisation is transformers 5's
``RotaryEmbeddingConfigMixin.standardize_rope_params`` followed by the converter's
``TextModel.__init__`` mirroring (transformers 5.24.0, the version the fixtures were made with).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["DEFAULTS", "converter_config"]

_HEADS = "num_attention_heads"  # a default equal to the config's own head count
_HEAD_DIM = "hidden_size // num_attention_heads"  # a default derived from the config
_LLAMA = {
    "num_hidden_layers": 32, "max_position_embeddings": 2048, "hidden_size": 4096,
    "intermediate_size": 11008, "num_attention_heads": 32, "num_key_value_heads": _HEADS,
    "rms_norm_eps": 1e-6, "head_dim": _HEAD_DIM, "vocab_size": 32000, "rope_theta": 10000.0,
}  # fmt: skip
_QWEN2 = {
    "num_hidden_layers": 32, "max_position_embeddings": 32768, "hidden_size": 4096,
    "intermediate_size": 22016, "num_attention_heads": 32, "num_key_value_heads": 32,
    "rms_norm_eps": 1e-6, "vocab_size": 151936, "rope_theta": 10000.0,
}  # fmt: skip
#: transformers ``model_type`` -> the defaults its config class gives the keys the converter
#: reads for that family (transformers 5.24.0). A string value is derived from other keys.
DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": _LLAMA,
    "mistral": {**_LLAMA, "max_position_embeddings": 131072, "intermediate_size": 14336,
                "num_key_value_heads": 8, "sliding_window": 4096},
    "mixtral": {**_LLAMA, "max_position_embeddings": 131072, "intermediate_size": 14336,
                "num_key_value_heads": 8, "rms_norm_eps": 1e-5, "head_dim": None,
                "rope_theta": 1e6, "num_local_experts": 8, "num_experts_per_tok": 2},
    "qwen2": _QWEN2,
    "qwen3": {**_QWEN2, "head_dim": 128},
    "qwen2_moe": {**_QWEN2, "num_hidden_layers": 24, "hidden_size": 2048,
                  "intermediate_size": 5632, "num_attention_heads": 16,
                  "num_key_value_heads": 16, "num_experts": 60, "num_experts_per_tok": 4,
                  "moe_intermediate_size": 1408, "shared_expert_intermediate_size": 5632},
    "qwen3_moe": {**_QWEN2, "num_hidden_layers": 24, "hidden_size": 2048,
                  "intermediate_size": 6144, "num_attention_heads": 32, "num_key_value_heads": 4,
                  "num_local_experts": 128, "num_experts_per_tok": 8,
                  "moe_intermediate_size": 768},
    "gemma2": {"num_hidden_layers": 26, "max_position_embeddings": 8192, "hidden_size": 2304,
               "intermediate_size": 9216, "num_attention_heads": 8, "num_key_value_heads": 4,
               "rms_norm_eps": 1e-6, "head_dim": 256, "vocab_size": 256000,
               "sliding_window": 4096, "attn_logit_softcapping": 50.0,
               "final_logit_softcapping": 30.0, "rope_theta": 10000.0},
    "gemma3_text": {"num_hidden_layers": 26, "max_position_embeddings": 131072,
                    "hidden_size": 2304, "intermediate_size": 9216, "num_attention_heads": 8,
                    "num_key_value_heads": 4, "rms_norm_eps": 1e-6, "head_dim": 256,
                    "vocab_size": 262208, "sliding_window": 4096},
    "phi3": {"num_hidden_layers": 32, "max_position_embeddings": 4096, "hidden_size": 3072,
             "intermediate_size": 8192, "num_attention_heads": 32, "num_key_value_heads": _HEADS,
             "rms_norm_eps": 1e-5, "vocab_size": 32064, "rope_theta": 10000.0,
             "original_max_position_embeddings": 4096},
}  # fmt: skip
DEFAULTS["gemma3"] = DEFAULTS["gemma3_text"]
# where transformers keeps the original context length as a config attribute, it overrides the
# one inside the rope settings (Phi-3); elsewhere a top-level one is not moved there
_ORIG_ATTRIBUTE = {"phi3"}
# defaults transformers puts inside rope_parameters only
_ROPE_DEFAULTS = {"phi3": {"partial_rotary_factor": 1.0}}
# the expert count's name in transformers 5's Qwen3-MoE config (the converter reads either)
_RENAMED = {"qwen3_moe": {"num_experts": "num_local_experts"}}


def converter_config(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The hparams ``convert_hf_to_gguf.py`` works from: ``cfg`` with transformers' defaults for
    absent (or null, where the class replaces null) keys and a standardised, flat
    ``rope_parameters`` (``rope_type``, ``rope_theta``, and for llama3 / yarn / longrope the
    ``original_max_position_embeddings``). Gemma 3's per-layer-kind rope settings are left as
    they are. A model type outside :data:`DEFAULTS` gets ``cfg`` back unchanged (copied).
    """
    out = dict(cfg)
    model_type = str(cfg.get("model_type"))
    defaults = DEFAULTS.get(model_type)
    if defaults is None:
        return out
    for old, new in _RENAMED.get(model_type, {}).items():
        if old in out:
            out[new] = out.pop(old)
    for key, value in defaults.items():
        derived = value in (_HEADS, _HEAD_DIM)
        if key in out and (out[key] is not None or not derived):  # a null stays null...
            continue
        if value == _HEADS:  # ... unless the class derives it
            value = out.get("num_attention_heads")
        elif value == _HEAD_DIM:
            h, n = out.get("hidden_size"), out.get("num_attention_heads")
            value = h // n if isinstance(h, int) and isinstance(n, int) and n else None
        out[key] = value
    if model_type not in ("gemma3", "gemma3_text"):
        out["rope_parameters"] = _standard_rope(out, model_type)
        out.pop("rope_scaling", None)  # transformers 5 keeps neither beside rope_parameters
        out.pop("rope_theta", None)
    return out


def _standard_rope(cfg: Mapping[str, Any], model_type: str) -> dict[str, Any]:
    rp = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    rp = dict(rp) if isinstance(rp, Mapping) else {}
    rp.setdefault("rope_theta", cfg.get("rope_theta"))
    if cfg.get("partial_rotary_factor") is not None:
        rp.setdefault("partial_rotary_factor", cfg["partial_rotary_factor"])
    for key, value in _ROPE_DEFAULTS.get(model_type, {}).items():
        rp.setdefault(key, value)
    rp.setdefault("rope_type", rp.get("type", "default"))
    orig = cfg.get("original_max_position_embeddings")
    if rp["rope_type"] in ("llama3", "yarn", "longrope"):
        if model_type in _ORIG_ATTRIBUTE:
            rp["original_max_position_embeddings"] = orig
        else:
            rp.setdefault("original_max_position_embeddings", cfg.get("max_position_embeddings"))
    if orig is not None:  # the converter's own mirroring of top-level keys
        rp.setdefault("original_max_position_embeddings", orig)
    return rp
