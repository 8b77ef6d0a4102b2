"""What each model-config field may hold, checked before anything is sized from it: one table
for a Hugging Face ``config.json`` converted to GGUF and for the config the model builder gets
(from ``config.json``, or derived from a GGUF file's metadata).

A 1 KB config could ask for ``vocab_size`` 10^8 (3.7 GB of padding tokens), ``head_dim`` 10^8
(a minute of rope factors), ``block_count`` 10^9 for a file of two blocks (terabytes of
layers), zero heads, top-k 100 of 4 experts or NaN rope and softcapping values; some reached
the GGUF writer as ``struct.error`` / ``OverflowError``, others were written into GGUFs whose
metadata contradicts their tensors (issue 41). :func:`check_config` refuses each in one
``LowbitError`` line naming the field (and its GGUF key, for a GGUF source):

- types: counts are integers (not booleans, not 4.0), or arrays of them per layer; real
  values are numbers;
- ranges: each count within :data:`FIELDS` (at most 4,096 layers and experts, 65,536 heads,
  as the planner's ceilings; widths below 2^20 and 2^22; a vocabulary below 2^24; lengths
  within GGUF's uint32), every real value finite and in its range (epsilons in (0, 1], rope
  bases and factors positive, softcapping positive);
- relations: key/value heads divide the heads, the heads divide the width where no
  ``head_dim`` is given, experts used in 1 .. experts, expert groups dividing the experts and
  the groups used at most the groups, rope factor lists of finite numbers (their lengths are
  checked where the factors are built), and against the tensors: as many layers as the
  tensors number, and ``vocab_size`` equal to the token embedding's rows.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from typing import Any

from lowbit._json import short_repr
from lowbit.errors import LowbitError

__all__ = ["FIELDS", "check_config"]

_U32 = 2**32 - 1
#: Hugging Face key -> (GGUF key after "<arch>.", low, high). Counts are integers (or per-layer
#: arrays of them); a None high marks a real value (finite, > low, < high where given).
FIELDS: dict[str, tuple[str | None, float, float | None, bool]] = {
    # name: (gguf key, low, high, integer)
    "num_hidden_layers": ("block_count", 1, 4096, True),
    "hidden_size": ("embedding_length", 1, 2**20, True),
    "intermediate_size": ("feed_forward_length", 0, 2**22, True),
    "num_attention_heads": ("attention.head_count", 1, 65536, True),
    "num_key_value_heads": ("attention.head_count_kv", 1, 65536, True),
    "head_dim": ("attention.key_length", 1, 65536, True),
    "vocab_size": ("vocab_size", 1, 2**24, True),
    "max_position_embeddings": ("context_length", 1, _U32, True),
    # (1 divides by log(1) = 0 in longrope's attention factor)
    "original_max_position_embeddings": ("rope.scaling.original_context_length", 2, _U32, True),
    "num_local_experts": ("expert_count", 0, 4096, True),
    "num_experts": ("expert_count", 0, 4096, True),
    "n_routed_experts": ("expert_count", 0, 4096, True),
    "num_experts_per_tok": ("expert_used_count", 0, 4096, True),
    "moe_intermediate_size": ("expert_feed_forward_length", 1, 2**22, True),
    "shared_expert_intermediate_size": ("expert_shared_feed_forward_length", 0, 2**22, True),
    "n_group": ("expert_group_count", 1, 4096, True),
    "topk_group": ("expert_group_used_count", 1, 4096, True),
    "sliding_window": ("attention.sliding_window", 0, _U32, True),
    "rms_norm_eps": ("attention.layer_norm_rms_epsilon", 0, 1, False),
    "layer_norm_eps": ("attention.layer_norm_epsilon", 0, 1, False),
    # a base of 1 makes every rotary frequency 1 (and divides by log(1) = 0 in yarn)
    "rope_theta": ("rope.freq_base", 1, 1e15, False),
    "rope_local_base_freq": ("rope.freq_base_swa", 1, 1e15, False),
    "attn_logit_softcapping": ("attn_logit_softcapping", 0, 1e9, False),
    "final_logit_softcapping": ("final_logit_softcapping", 0, 1e9, False),
    "partial_rotary_factor": (None, 0, 1, False),
}
#: Real values inside the rope settings (``rope_scaling`` / ``rope_parameters``).
_ROPE_REALS = ("factor", "rope_theta", "attention_factor", "attn_factor", "beta_fast",
               "beta_slow", "extrapolation_factor", "low_freq_factor", "high_freq_factor",
               "mscale", "mscale_all_dim", "partial_rotary_factor")  # fmt: skip
_ROPE_LISTS = ("long_factor", "short_factor")
_MAX_FACTORS = 65536
# the text model's blocks only (a vision tower's encoder layers are counted by their own config)
_LAYER = re.compile(
    r"^(?:blk|(?:model\.|language_model\.model\.|model\.language_model\.)?layers)\.(\d{1,9})\."
)
_EMBED = ("model.embed_tokens.weight", "token_embd.weight", "embed_tokens.weight")


def _name(key: str, gguf_arch: str | None) -> str:
    gkey = FIELDS.get(key, (None,))[0]
    if gguf_arch and gkey:
        return f"{gguf_arch}.{gkey}"
    return key


def _bad(where: str, what: str, value: Any, why: str) -> LowbitError:
    return LowbitError(f"{where}: {what} is {short_repr(value)}; {why}")


def _check_field(where: str, what: str, value: Any, low: float, high: float | None,
                 integer: bool, per_layer: bool = True) -> None:  # fmt: skip
    if integer:
        if isinstance(value, list) and not per_layer:
            raise _bad(where, what, value, "lowbit expects one integer (not one per layer)")
        items = value if isinstance(value, list) else [value]
        if not items or len(items) > 4096:
            raise _bad(where, what, value, "lowbit expects an integer or one per layer")
        for v in items:
            if type(v) is not int:
                raise _bad(where, what, value, "lowbit expects an integer")
            if not low <= v <= (high if high is not None else v):
                raise _bad(where, what, value, f"it must be from {low:g} to {high:,}")
        return
    if type(value) not in (int, float):
        raise _bad(where, what, value, "lowbit expects a number")
    if not math.isfinite(value) or not low < value or (high is not None and value > high):
        raise _bad(where, what, value, f"it must be a finite number above {low:g}"
                   + (f", at most {high:g}" if high is not None else ""))  # fmt: skip


def _most(value: Any) -> int:
    return max(value) if isinstance(value, list) else int(value)


def _rope_settings(cfg: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    found = []
    for key in ("rope_scaling", "rope_parameters"):
        rp = cfg.get(key)
        if isinstance(rp, Mapping):
            found.append((key, rp))
            found += [(f"{key}.{k}", v) for k, v in rp.items() if isinstance(v, Mapping)]
    return found


def check_config(
    cfg: Mapping[str, Any],
    where: str,
    *,
    gguf_arch: str | None = None,
    tensors: Iterable[tuple[str, tuple[int, ...]]] | None = None,
    per_layer: bool = True,
) -> None:
    """Check a model config's fields, their relations and (given ``tensors``, name and shape
    pairs) their agreement with the tensors, before anything is sized from them.

    Args:
        cfg: a Hugging Face style config (``config.json``, or one derived from GGUF metadata).
        where: the file to name.
        gguf_arch: for a GGUF source, its architecture: messages name the GGUF keys.
        tensors: the checkpoint's tensors, for the layer count and the vocabulary's rows.
        per_layer: counts may be lists of one per layer (GGUF metadata arrays); False for a
            config converted to GGUF, whose families take one value each.

    Raises:
        LowbitError: one line naming the first field that is wrong and why.
    """
    present = {k: cfg[k] for k in FIELDS if cfg.get(k) is not None}
    for key, value in present.items():
        _, low, high, integer = FIELDS[key]
        _check_field(where, _name(key, gguf_arch), value, low, high, integer, per_layer)

    def nm(key: str) -> str:
        return _name(key, gguf_arch)

    heads, kv = present.get("num_attention_heads"), present.get("num_key_value_heads")
    if isinstance(heads, int) and isinstance(kv, int) and heads % kv:
        raise LowbitError(
            f"{where}: {nm('num_key_value_heads')} {kv} does not divide "
            f"{nm('num_attention_heads')} {heads}"
        )
    hidden = present.get("hidden_size")
    if (
        isinstance(heads, int)
        and isinstance(hidden, int)
        and present.get("head_dim") is None
        and hidden % heads
    ):
        raise LowbitError(
            f"{where}: {nm('num_attention_heads')} {heads} does not divide "
            f"{nm('hidden_size')} {hidden} (and no head_dim is given)"
        )
    experts = next(
        (present[k] for k in ("num_local_experts", "num_experts", "n_routed_experts")
         if k in present), None,
    )  # fmt: skip
    used = present.get("num_experts_per_tok")
    if experts is not None and used is not None and _most(experts) > 0:
        if not 1 <= _most(used) <= _most(experts):
            raise LowbitError(
                f"{where}: {nm('num_experts_per_tok')} {short_repr(used)} must be from 1 to the "
                f"{_most(experts)} experts"
            )
    groups, topk_group = present.get("n_group"), present.get("topk_group")
    if isinstance(groups, int) and experts is not None and _most(experts) % groups:
        raise LowbitError(f"{where}: {nm('n_group')} {groups} does not divide the experts")
    if isinstance(groups, int) and isinstance(topk_group, int) and topk_group > groups:
        raise LowbitError(
            f"{where}: {nm('topk_group')} {topk_group} exceeds {nm('n_group')} {groups}"
        )
    for key, rp in _rope_settings(cfg):
        if rp.get("original_max_position_embeddings") is not None:
            _check_field(where, f"{key}.original_max_position_embeddings",
                         rp["original_max_position_embeddings"], 2, _U32, True, False)  # fmt: skip
        for k in _ROPE_REALS:
            if rp.get(k) is not None:
                _check_field(where, f"{key}.{k}", rp[k], 0, None, False)
        for k in _ROPE_LISTS:
            v = rp.get(k)
            if v is None:
                continue
            if not isinstance(v, list) or len(v) > _MAX_FACTORS:
                raise _bad(where, f"{key}.{k}", v, "lowbit expects a list of numbers")
            if not all(type(x) in (int, float) and math.isfinite(x) for x in v):
                raise _bad(where, f"{key}.{k}", v, "every factor must be a finite number")
    if tensors is not None:
        _check_tensors(cfg, where, present, tensors, nm)


def _check_tensors(
    cfg: Mapping[str, Any],
    where: str,
    present: Mapping[str, Any],
    tensors: Iterable[tuple[str, tuple[int, ...]]],
    nm: Any,
) -> None:
    layers: set[int] = set()
    rows = None
    for name, shape in tensors:
        if m := _LAYER.search(name):
            layers.add(int(m.group(1)))
        if name in _EMBED and shape:
            rows = shape[0]
    n = present.get("num_hidden_layers")
    if isinstance(n, int) and layers and n != max(layers) + 1:
        raise LowbitError(
            f"{where}: {nm('num_hidden_layers')} is {n:,} but the tensors hold layers "
            f"0..{max(layers)}"
        )
    vocab = present.get("vocab_size")
    if isinstance(vocab, int) and rows is not None and vocab != rows:
        raise LowbitError(
            f"{where}: {nm('vocab_size')} is {vocab:,} but the token embedding has {rows:,} rows"
        )
