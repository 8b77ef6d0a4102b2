"""A GGUF file's metadata as a model config: the keys lowbit reads, their kinds checked, and the Hugging Face config derived from them."""

from __future__ import annotations

from itertools import repeat
from pathlib import Path
from typing import Any

import numpy as np

from lowbit._json import short_repr
from lowbit.checkpoints.gguf.arch import family_config
from lowbit.errors import LowbitError

# GGUF metadata key (after the "<arch>." prefix) -> Hugging Face config key.
_CONFIG_KEYS = {
    "block_count": "num_hidden_layers",
    "context_length": "max_position_embeddings",
    "embedding_length": "hidden_size",
    "feed_forward_length": "intermediate_size",
    "attention.head_count": "num_attention_heads",
    "attention.head_count_kv": "num_key_value_heads",
    "attention.layer_norm_rms_epsilon": "rms_norm_eps",
    "attention.layer_norm_epsilon": "layer_norm_eps",
    "attention.key_length": "head_dim",
    "rope.freq_base": "rope_theta",
    "vocab_size": "vocab_size",
}


# The kinds of value lowbit needs from the metadata it reads.
_INT = "an integer, or an array of integers (one per layer)"


_NUM = "a number"


_STR = "a UTF-8 string"


_STRS = "an array of strings"


_INTS = "an array of integers"


_ID = "an integer"


_USED = {
    "general.architecture": _STR,
    "general.name": _STR,
    "tokenizer.ggml.model": _STR,
    "tokenizer.ggml.tokens": _STRS,
    "tokenizer.ggml.merges": _STRS,
    "tokenizer.ggml.token_type": _INTS,
    "tokenizer.ggml.bos_token_id": _ID,
    "tokenizer.ggml.eos_token_id": _ID,
    "tokenizer.ggml.unknown_token_id": _ID,
    "tokenizer.ggml.padding_token_id": _ID,
    "tokenizer.chat_template": _STR,
}


#: Keys after the "<arch>." prefix that lowbit reads (config, planner).
_ARCH_USED = {
    **{k: _INT for k in _CONFIG_KEYS},
    "attention.layer_norm_rms_epsilon": _NUM,
    "attention.layer_norm_epsilon": _NUM,
    "rope.freq_base": _NUM,
    "rope.dimension_count": _INT,
    "expert_count": _INT,
    "expert_used_count": _INT,
    "expert_feed_forward_length": _INT,
    "rope.scaling.type": _STR,
    "rope.scaling.factor": _NUM,
    "rope.scaling.original_context_length": _ID,
    "rope.scaling.yarn_attn_factor": _NUM,
    "rope.scaling.yarn_beta_fast": _NUM,
    "rope.scaling.yarn_beta_slow": _NUM,
}

# llama.cpp's yarn keys -> transformers' rope_scaling keys (convert_hf_to_gguf.py writes them
# from these; absent ones take transformers' defaults on both sides)
_YARN = {"yarn_attn_factor": "attention_factor", "yarn_beta_fast": "beta_fast",
         "yarn_beta_slow": "beta_slow"}  # fmt: skip


def _is_int(v: Any) -> bool:
    return type(v) is int


def _utf8(v: Any) -> bool:
    try:
        v.encode("utf-8")  # surrogate escapes (bytes that were not UTF-8) fail here
    except UnicodeEncodeError:
        return False
    return True


def _fits(value: Any, kind: str) -> bool:
    if kind == _INT:
        return _is_int(value) or (
            isinstance(value, list) and bool(value) and all(map(_is_int, value))
        )
    if kind == _ID:
        return _is_int(value)
    if kind == _NUM:
        return type(value) in (int, float)
    if kind == _STR:
        return isinstance(value, str) and _utf8(value)
    if kind == _INTS:
        return isinstance(value, list) and all(map(_is_int, value))
    return isinstance(value, list) and all(map(isinstance, value, repeat(str)))  # _STRS


def _kind_of(value: Any) -> str:
    if isinstance(value, list):
        return f"an array of {len(value)} values" if value else "an empty array"
    if isinstance(value, str):
        return "a string with bytes that are not UTF-8" if not _utf8(value) else "a string"
    return {bool: "a bool", int: "an integer", float: "a float"}.get(type(value), "a value")


def check_metadata(metadata: dict[str, Any], path: Path | str) -> None:
    """Check the type of every metadata value lowbit uses (config, planner, tokenizer).

    Other keys are kept as they are. A byte-level BPE vocabulary (``tokenizer.ggml.model ==
    "gpt2"``) must be valid UTF-8: its tokens are printable by construction, and the tokenizer
    built from them takes only text.

    Raises:
        LowbitError: naming the key, what it holds and what lowbit expects.
    """
    arch = metadata.get("general.architecture")
    used = dict(_USED)
    if isinstance(arch, str):
        used.update({f"{arch}.{k}": kind for k, kind in _ARCH_USED.items()})
    for key, kind in used.items():
        if key in metadata and not _fits(metadata[key], kind):
            raise LowbitError(
                f"{path}: metadata {short_repr(key)} is {_kind_of(metadata[key])}; lowbit "
                f"expects {kind}"
            )
    if metadata.get("tokenizer.ggml.model") == "gpt2":
        for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges"):
            items = metadata.get(key, ())
            if _utf8("".join(items)):  # a surrogate escape in any item fails the whole
                continue
            bad = next((i for i, t in enumerate(items) if not _utf8(t)), None)
            if bad is not None:
                raise LowbitError(
                    f"{path}: metadata {key!r} item {bad} is not valid UTF-8 (a byte-level BPE "
                    f"vocabulary is text)"
                )


def derive_config(metadata: dict[str, Any], tensor_names: set[str]) -> dict[str, Any]:
    """A Hugging Face style config dict from GGUF metadata (llama.cpp's key names).

    ``metadata`` comes from :func:`parse`, which checked the types of the keys read here.
    """
    arch = metadata.get("general.architecture", "")
    cfg: dict[str, Any] = {"model_type": arch}
    for gkey, hkey in _CONFIG_KEYS.items():
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
