"""A GGUF file's metadata as a model config: the keys lowbit reads, their kinds checked, and the Hugging Face config derived from them."""

from __future__ import annotations

from typing import Any

import numpy as np

from lowbit._json import short_repr
from lowbit.checkpoints.gguf.arch import family_config
from lowbit.checkpoints.io.gguf_metadata import CONFIG_KEYS
from lowbit.errors import LowbitError

# llama.cpp's yarn keys -> transformers' rope_scaling keys (convert_hf_to_gguf.py writes them
# from these; absent ones take transformers' defaults on both sides)
_YARN = {"yarn_attn_factor": "attention_factor", "yarn_beta_fast": "beta_fast",
         "yarn_beta_slow": "beta_slow"}  # fmt: skip


def derive_config(metadata: dict[str, Any], tensor_names: set[str]) -> dict[str, Any]:
    """A Hugging Face style config dict from GGUF metadata (llama.cpp's key names).

    ``metadata`` comes from :func:`parse`, which checked the types of the keys read here.
    """
    arch = metadata.get("general.architecture", "")
    cfg: dict[str, Any] = {"model_type": arch}
    for gkey, hkey in CONFIG_KEYS.items():
        value = metadata.get(f"{arch}.{gkey}")
        if value is not None:
            cfg[hkey] = value
    rope = _rope_scaling(metadata, arch)
    if rope is not None:
        cfg["rope_scaling"] = rope
    if "head_dim" not in cfg and f"{arch}.rope.dimension_count" in metadata:
        cfg["head_dim"] = metadata[f"{arch}.rope.dimension_count"]
    if "vocab_size" not in cfg and "tokenizer.ggml.tokens" in metadata:
        cfg["vocab_size"] = len(metadata["tokenizer.ggml.tokens"])
    if "rms_norm_eps" in cfg:  # stored as float32: give back the decimal it was written from
        cfg["rms_norm_eps"] = float(np.format_float_positional(np.float32(cfg["rms_norm_eps"])))
    for gkey, hkey in (
        ("bos_token_id", "bos_token_id"),
        ("eos_token_id", "eos_token_id"),
        ("padding_token_id", "pad_token_id"),
    ):
        if f"tokenizer.ggml.{gkey}" in metadata:
            cfg[hkey] = metadata[f"tokenizer.ggml.{gkey}"]
    cfg["tie_word_embeddings"] = "output.weight" not in tensor_names
    if "blk.0.attn_q.bias" in tensor_names:  # llama.cpp's converter keeps q/k/v/o biases
        cfg["attention_bias"] = True
    family_config(arch, metadata, cfg)  # model_type, architectures, family keys
    return cfg


def _decimal(v: Any) -> float:
    """A float32 metadata number as the decimal it was written from."""
    return float(np.format_float_positional(np.float32(v)))


def _rope_scaling(metadata: dict[str, Any], arch: str) -> dict[str, Any] | None:
    """transformers' ``rope_scaling`` from llama.cpp's ``rope.scaling.*`` keys (linear and yarn,
    as the converter writes them; None: no scaling). Without it a yarn model's GGUF would build
    a model computing another function (attention scaled and frequencies interpolated by yarn in
    llama.cpp, not here).

    Raises:
        LowbitError: a scaling type lowbit does not rebuild, or a factor that is not positive.
    """
    kind = metadata.get(f"{arch}.rope.scaling.type")
    if kind in (None, "none"):
        return None
    if kind not in ("linear", "yarn"):
        raise LowbitError(
            f"GGUF rope scaling {short_repr(kind)}: lowbit builds models with linear or yarn "
            "rope scaling only"
        )
    factor = metadata.get(f"{arch}.rope.scaling.factor")
    if factor is None or not np.isfinite(factor) or factor <= 0:
        raise LowbitError(
            f"GGUF rope scaling {kind} needs a positive {arch}.rope.scaling.factor; got "
            f"{short_repr(factor)}"
        )
    out: dict[str, Any] = {"rope_type": kind, "factor": _decimal(factor)}
    if kind == "yarn":
        orig = metadata.get(f"{arch}.rope.scaling.original_context_length")
        if orig is not None:
            if orig < 1:
                raise LowbitError(
                    f"GGUF {arch}.rope.scaling.original_context_length is {orig}; yarn needs a "
                    "positive length"
                )
            out["original_max_position_embeddings"] = int(orig)
        for gkey, hkey in _YARN.items():
            if f"{arch}.rope.scaling.{gkey}" in metadata:
                v = metadata[f"{arch}.rope.scaling.{gkey}"]
                if not np.isfinite(v):
                    raise LowbitError(f"GGUF {arch}.rope.scaling.{gkey} is {v}, not finite")
                out[hkey] = _decimal(v)
    return out
