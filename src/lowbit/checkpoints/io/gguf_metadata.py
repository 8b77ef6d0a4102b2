"""GGUF metadata checked before use: the keys lowbit reads, the kind each may hold, and their
values' bounds (used by the output-safety checks and by the model config).
"""

from __future__ import annotations

from itertools import repeat
from pathlib import Path
from typing import Any

from lowbit._json import short_repr
from lowbit.errors import LowbitError

# GGUF metadata key (after the "<arch>." prefix) -> Hugging Face config key.
CONFIG_KEYS = {
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
    **{k: _INT for k in CONFIG_KEYS},
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
    # read into the config by family_config (a list or string reached transformers' rope)
    "rope.freq_base_swa": _NUM,
    "attention.sliding_window": _INT,
    "attn_logit_softcapping": _NUM,
    "final_logit_softcapping": _NUM,
    "expert_shared_feed_forward_length": _INT,
}


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
