"""The ``<arch>.*`` hyperparameter keys llama.cpp's ``convert_hf_to_gguf.py`` writes for each
family lowbit converts, read from the checkpoint's ``config.json``.

Transformers 4 and 5 style configs both work (``rope_theta`` at the top or inside
``rope_parameters``). The config is first completed as the converter sees it through
transformers' ``AutoConfig`` (:func:`lowbit.checkpoints.gguf.hf_config.converter_config`:
the class defaults of absent keys, the rope settings standardised), and keys are looked up as
its ``find_hparam`` does (the first of its names present, even when null).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from lowbit.checkpoints.gguf.arch import Family
from lowbit.checkpoints.gguf.hf_config import converter_config
from lowbit.errors import LowbitError

__all__ = ["add_hparams", "phi3_rope_factors", "rope_factors"]


def _find(cfg: Mapping[str, Any], *keys: str) -> Any:
    """The converter's ``find_hparam(keys, optional=True)``: the first key present wins."""
    return next((cfg[k] for k in keys if k in cfg), None)


def _rope_params(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The rope settings, wherever this transformers version keeps them."""
    rp = cfg.get("rope_parameters")
    out = dict(rp) if isinstance(rp, Mapping) else {}
    if isinstance(out.get("full_attention"), Mapping):  # Gemma 3: one entry per layer kind
        out = {**out, **out["full_attention"]}
    if cfg.get("rope_theta") is not None:
        out.setdefault("rope_theta", cfg["rope_theta"])
    rs = cfg.get("rope_scaling")
    if isinstance(rs, Mapping):
        out.update({k: v for k, v in rs.items() if k not in out or k != "rope_theta"})
    return out


def _rope_scaling(w: Any, cfg: Mapping[str, Any]) -> None:
    """The converter's ``TextModel`` rope keys: linear and yarn with their factors (yarn's
    original length and optional extrapolation / attention factors and betas), longrope as the
    type alone; dynamic writes nothing (llama.cpp has no dynamic NTK), llama3 is the
    ``rope_freqs`` tensor (:func:`rope_factors`)."""
    import gguf

    rp = _rope_params(cfg)
    kind = rp.get("rope_type", rp.get("type"))
    factor = rp.get("factor")
    if kind in (None, "default", "llama3", "dynamic") or (
        kind in ("linear", "yarn") and factor is None
    ):
        return
    if kind == "linear":
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(factor)
    elif kind == "yarn":
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(factor)
        orig = rp.get("original_max_position_embeddings", cfg.get("max_position_embeddings"))
        w.add_rope_scaling_orig_ctx_len(orig)
        if (v := rp.get("extrapolation_factor")) is not None:
            w.add_rope_scaling_yarn_ext_factor(v)
        if (v := rp.get("attention_factor", rp.get("attn_factor"))) is not None:
            w.add_rope_scaling_yarn_attn_factor(v)
        if (v := rp.get("beta_fast")) is not None:
            w.add_rope_scaling_yarn_beta_fast(v)
        if (v := rp.get("beta_slow")) is not None:
            w.add_rope_scaling_yarn_beta_slow(v)
    elif kind in ("longrope", "su"):
        w.add_rope_scaling_type(gguf.RopeScalingType.LONGROPE)
    else:
        raise LowbitError(
            f"rope scaling {kind!r} is not converted to GGUF by lowbit (linear, yarn, longrope, "
            f"dynamic and llama3 are)"
        )


def _base(w: Any, cfg: Mapping[str, Any]) -> None:
    """The keys every text model gets (the converter's ``TextModel.set_gguf_parameters``)."""
    w.add_block_count(int(_find(cfg, "n_layers", "num_hidden_layers", "n_layer", "num_layers")))
    ctx = ("max_position_embeddings", "n_ctx", "n_positions", "max_length",
           "max_sequence_length", "model_max_length")  # fmt: skip
    if (n := _find(cfg, *ctx)) is not None:
        w.add_context_length(n)
    if (n := _find(cfg, "hidden_size", "n_embd", "dim")) is not None:
        w.add_embedding_length(n)
    ff = ("prefix_dense_intermediate_size", "dense_intermediate_size", "intermediate_size",
          "n_inner", "hidden_dim")  # fmt: skip
    if (n := _find(cfg, *ff)) is not None:
        w.add_feed_forward_length(n)
    if (n := _find(cfg, "num_attention_heads", "n_head", "n_heads")) is not None:
        w.add_head_count(n)
    if (n := _find(cfg, "num_key_value_heads", "n_kv_heads")) is not None:
        w.add_head_count_kv(n)
    if cfg.get("is_causal") is False:
        w.add_causal_attention(False)
    _rope_scaling(w, cfg)
    if (theta := _rope_params(cfg).get("rope_theta")) is not None:
        w.add_rope_freq_base(theta)
    if (eps := _find(cfg, "rms_norm_eps", "norm_eps")) is not None:
        w.add_layer_norm_rms_eps(eps)
    if (eps := _find(cfg, "layer_norm_eps", "layer_norm_epsilon", "norm_epsilon")) is not None:
        w.add_layer_norm_eps(eps)
    if (n := _find(cfg, "num_local_experts", "num_experts", "n_routed_experts")) is not None:
        w.add_expert_count(n)
    if (
        n := _find(cfg, "num_experts_per_tok", "num_experts_per_token", "top_k_experts")
    ) is not None:
        w.add_expert_used_count(n)
    if (n := cfg.get("head_dim")) is not None:
        w.add_key_length(n)
        w.add_value_length(n)


def _llama(w: Any, cfg: Mapping[str, Any]) -> None:
    _base(w, cfg)
    w.add_vocab_size(cfg["vocab_size"])
    rope_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    w.add_rope_dimension_count(rope_dim)


def _qwen(w: Any, cfg: Mapping[str, Any]) -> None:
    _base(w, cfg)


def _qwen_moe(w: Any, cfg: Mapping[str, Any]) -> None:
    """Qwen2-MoE / Qwen3-MoE: Qwen's keys and the experts' (and shared expert's) widths."""
    _qwen(w, cfg)
    if (n := cfg.get("moe_intermediate_size")) is not None:
        w.add_expert_feed_forward_length(n)
    if (n := cfg.get("shared_expert_intermediate_size")) is not None:
        w.add_expert_shared_feed_forward_length(n)


def _gemma3(w: Any, cfg: Mapping[str, Any]) -> None:
    _base(w, cfg)
    rp = cfg.get("rope_parameters")
    swa = None
    if isinstance(rp, Mapping) and isinstance(rp.get("sliding_attention"), Mapping):
        swa = rp["sliding_attention"].get("rope_theta")
    w.add_rope_freq_base_swa(swa if swa is not None else cfg.get("rope_local_base_freq", 10000.0))
    if cfg.get("final_logit_softcapping"):
        w.add_final_logit_softcapping(cfg["final_logit_softcapping"])
    if cfg.get("sliding_window_pattern") != 1:
        w.add_sliding_window(cfg["sliding_window"])


def _gemma2(w: Any, cfg: Mapping[str, Any]) -> None:
    # the converter writes Gemma 2's keys itself (no rope base: llama.cpp's is Gemma's 10000)
    w.add_context_length(cfg.get("max_position_embeddings", 8192))
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg.get("num_key_value_heads", cfg["num_attention_heads"]))
    w.add_layer_norm_rms_eps(cfg.get("rms_norm_eps", 1e-6))
    w.add_key_length(cfg["head_dim"])
    w.add_value_length(cfg["head_dim"])
    w.add_attn_logit_softcapping(cfg.get("attn_logit_softcapping", 50.0))
    w.add_final_logit_softcapping(cfg.get("final_logit_softcapping", 30.0))
    w.add_sliding_window(cfg.get("sliding_window", 4096))


def _phi3(w: Any, cfg: Mapping[str, Any]) -> None:
    """Phi-3's own keys (no rope scaling type; long-context models: the attention factor here,
    the factors as tensors, :func:`phi3_rope_factors`)."""
    rp = _rope_params(cfg)
    n_embd, n_head = cfg["hidden_size"], cfg["num_attention_heads"]
    if (found := phi3_rope_factors(cfg)) is not None:
        w.add_rope_scaling_attn_factors(found[0])
    w.add_context_length(_find(cfg, "n_positions", "max_position_embeddings"))
    w.add_rope_scaling_orig_ctx_len(rp["original_max_position_embeddings"])
    w.add_embedding_length(n_embd)
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_head_count(n_head)
    w.add_head_count_kv(cfg.get("num_key_value_heads", n_head))
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_rope_dimension_count(_phi3_rope_dims(cfg))
    w.add_rope_freq_base(rp["rope_theta"])
    w.add_sliding_window(cfg.get("sliding_window") or 0)


def _phi3_rope_dims(cfg: Mapping[str, Any]) -> int:
    rot = _rope_params(cfg).get("partial_rotary_factor", 1.0)
    return int(rot * cfg["hidden_size"]) // cfg["num_attention_heads"]


def phi3_rope_factors(cfg: Mapping[str, Any]) -> tuple[float, np.ndarray, np.ndarray] | None:
    """A long-context Phi-3's rope as the converter writes it: the attention factor and the
    ``rope_factors_long`` / ``rope_factors_short`` tensors (float32, one per rotary pair);
    None without ``long_factor``. The factor is ``sqrt(1 + ln(s) / ln(original))`` for
    longrope (``su``), ``0.1 ln(s) + 1`` for yarn, 1 when ``s = context / original <= 1``.

    Raises:
        LowbitError: another rope type, a missing ``short_factor``, or factor lists whose
            length is not half the rotary dimension (the converter refuses these too).
    """
    cfg = converter_config(cfg)
    rp = _rope_params(cfg)
    long, short = rp.get("long_factor"), rp.get("short_factor")
    if not long:
        return None
    orig = rp.get("original_max_position_embeddings")
    ctx = _find(cfg, "n_positions", "max_position_embeddings")
    if not (type(orig) is int and orig > 1 and type(ctx) is int and ctx > 0):
        raise LowbitError(
            f"Phi-3 long-context rope needs whole context lengths (original > 1): got original "
            f"{orig!r}, context {ctx!r}"
        )
    scale = ctx / orig
    kind = str(rp.get("rope_type") or "").lower()
    if kind in ("su", "longrope"):
        attn = math.sqrt(1 + math.log(scale) / math.log(orig)) if scale > 1.0 else 1.0
    elif kind == "yarn":
        attn = 0.1 * math.log(scale) + 1.0 if scale > 1.0 else 1.0
    else:
        raise LowbitError(f"Phi-3 rope scaling {kind!r} with long_factor has no GGUF form")
    half = _phi3_rope_dims(cfg) / 2
    if short is None or len(long) != len(short) or len(long) != half:
        raise LowbitError(
            f"Phi-3 rope long_factor / short_factor must both hold {half:g} factors "
            f"(one per rotary pair), not {len(long)} / {None if short is None else len(short)}"
        )
    return attn, np.asarray(long, dtype=np.float32), np.asarray(short, dtype=np.float32)


_BY_ARCH = {
    "llama": _llama,
    "qwen2": _qwen,
    "qwen3": _qwen,
    "qwen2moe": _qwen_moe,
    "qwen3moe": _qwen_moe,
    "gemma2": _gemma2,
    "gemma3": _gemma3,
    "phi3": _phi3,
}


def add_hparams(writer: Any, fam: Family, cfg: Mapping[str, Any]) -> None:
    """Add a family's hyperparameter keys to a ``gguf.GGUFWriter``.

    Raises:
        LowbitError: a config missing a key the family needs, or rope scaling lowbit does not
            convert.
    """
    try:
        _BY_ARCH[fam.arch](writer, converter_config(cfg))
    except (KeyError, TypeError) as exc:
        raise LowbitError(f"config.json lacks what a {fam.arch} GGUF needs ({exc})") from None


def rope_factors(cfg: Mapping[str, Any]) -> np.ndarray | None:
    """Llama 3's rope scaling as llama.cpp stores it: the ``rope_freqs.weight`` tensor, one
    float32 divisor per rotary frequency (None for other scalings).

    Each frequency ``f = base ** (-2i / dim)`` of wavelength ``w = 2 pi / f`` keeps its value
    (factor 1) when ``w`` is below ``original / high_freq_factor``, is divided by ``factor``
    when above ``original / low_freq_factor``, and in between by
    ``1 / ((1 - s) / factor + s)`` with ``s = (original / w - low) / (high - low)``; every step
    in float32 as the converter computes it. ``original`` is the rope settings'
    ``original_max_position_embeddings`` (transformers gives the context length when absent).
    """
    cfg = converter_config(cfg)
    rp = _rope_params(cfg)
    if str(rp.get("rope_type", rp.get("type")) or "").lower() != "llama3":
        return None
    f32 = np.float32
    base = rp.get("rope_theta", 10000.0)
    dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    freqs = f32(1.0) / (f32(base) ** (np.arange(0, dim, 2, dtype=f32) / f32(dim)))
    factor = f32(rp.get("factor", 8.0))
    low, high = f32(rp.get("low_freq_factor", 1.0)), f32(rp.get("high_freq_factor", 4.0))
    old = f32(rp.get("original_max_position_embeddings", 8192))
    low_wave, high_wave = old / low, old / high
    out = []
    for freq in freqs:
        wave = f32(2 * math.pi) / freq
        if wave < high_wave:
            out.append(f32(1.0))
        elif wave > low_wave:
            out.append(factor)
        else:
            s = (old / wave - low) / (high - low)
            out.append(f32(1.0) / ((f32(1.0) - s) / factor + s))
    return np.asarray(out, dtype=f32)
