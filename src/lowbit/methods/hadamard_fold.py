"""The block Hadamard rotation folded offline where it cancels exactly: attention's value
projection into its output projection.

Attention mixes tokens, never channels: each query head's output is a softmax-weighted sum of
its value head's rows. So with the block-diagonal Hadamard ``R`` of ``lowbit.methods.hadamard``
(blocks of ``b`` channels, ``b`` dividing the head size, so no block straddles two heads),
storing the value projection as ``R W_v`` (its rows mixed; its bias ``b_v R``) makes every value
head ``v R``, every query head's output ``a R``, and the output projection's input ``a R`` —
which ``W_o R`` (its columns mixed, ``rotate_rows``) turns back into the original output:
``(a R)(W_o R)ᵀ = a W_oᵀ``. The model computes the same function, with no rotation at run time
and in a file any consumer runs unchanged, while the output projection's input, the attention
output, sits in the rotated basis where its scale groups no longer follow one outlier (what
MR-GPTQ and QuaRot get from an online rotation of that input). With grouped-query attention
the same ``R`` serves every query head that reads a value head.

This is the only fold of ``R`` that is exact inside a standard transformer block: the MLP's
down projection reads the output of a nonlinearity, and the residual stream would need
QuaRot's global rotation fused through the norms (a different rotation, out of scope). The
value → output pairs are those of ``lowbit.methods.folds.FOLDS`` (the ``heads`` folds AWQ and
SmoothQuant make), plus Gemma 1-3, whose attention is llama's (q/k norms at most; nothing
touches ``v`` between the two projections) though its norms keep it out of the scale-fold
table. Phi-3's value projection is fused into ``qkv_proj`` and is refused.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from lowbit.errors import LowbitError
from lowbit.methods.folds import _FAMILY, FOLDS, FoldKind, fold_family, head_repeat
from lowbit.methods.hadamard import rotate_rows

__all__ = ["VOPair", "check_fold_block", "fold_v_o", "head_dim_of", "v_o_pairs"]

#: model_type -> the :data:`~lowbit.methods.folds.FOLDS` family whose value -> output fold
#: holds for it as well (Gemma's norms ``x * (1 + w)`` keep it out of the scale-fold table;
#: its attention computes what llama's does between ``v_proj`` and ``o_proj``).
_ATTENTION_ONLY = {"gemma": "llama", "gemma2": "llama", "gemma3_text": "llama"}


@dataclass(frozen=True)
class VOPair:
    """One attention's value and output projections (checkpoint names, transformers' naming).

    Attributes:
        v_weight: the value projection's weight ``[kv_heads * head_dim, in]``.
        v_bias: its bias ``[kv_heads * head_dim]`` (None: it has none).
        o_weight: the output projection's weight ``[out, heads * head_dim]``.
    """

    v_weight: str
    v_bias: str | None
    o_weight: str


def v_o_pairs(names: Iterable[str], model_type: str | None) -> list[VOPair]:
    """Every value -> output projection pair among a checkpoint's tensor names.

    Args:
        names: tensor names as transformers names them (``model.layers.0.self_attn.v_proj.weight``).
        model_type: the config's ``model_type``.

    Raises:
        LowbitError: a family without an exact value -> output fold (one line saying which), or
            one whose checkpoint holds no such pair (DeepSeek's latent attention has no
            ``v_proj``).
    """
    mt = str(model_type or "").lower()
    fam = fold_family(mt) or _ATTENTION_ONLY.get(mt)
    if fam is None:
        why = " (its value projection is fused into qkv_proj)" if mt == "phi3" else ""
        raise LowbitError(
            f"no exact value -> output Hadamard fold is known for model_type {model_type!r}{why}; "
            f"known: {', '.join(_known())}"
        )
    have = set(names)
    out = []
    for f in FOLDS[fam]:
        if f.kind is not FoldKind.HEADS:
            continue
        tail = f".{f.prev}.weight"
        for name in sorted(have):
            if not name.endswith(tail):
                continue
            lead = name[: -len(tail)]
            o = f"{lead}.{f.linears[0]}.weight"
            if o in have:
                b = f"{lead}.{f.prev}.bias"
                out.append(VOPair(name, b if b in have else None, o))
    if not out:
        raise LowbitError(
            f"this {model_type} checkpoint has no value -> output projection pair to fold a "
            "Hadamard rotation into"
        )
    return out


def fold_v_o(
    get: Callable[[str], Any], pairs: Iterable[VOPair], head_dim: int, block: int
) -> dict[str, np.ndarray]:
    """The block Hadamard rotation ``R`` of ``block`` folded into each value -> output pair.

    The value projection's weight becomes ``R W_v`` and its bias ``b_v R``, the output
    projection's weight ``W_o R``: the model computes the same function, the output projection
    reading the attention output rotated, ``a R``.

    Args:
        get: name -> the tensor (array-like, ``[out, in]``).
        pairs: from :func:`v_o_pairs`.
        head_dim: channels per attention head.
        block: the Hadamard block (a power of two; the scale group,
            ``lowbit.methods.hadamard.rotation_block``).

    Returns:
        name -> the folded float32 tensor, for every tensor the fold changes.

    Raises:
        LowbitError: a block that does not divide the head size (a block straddling two heads
            would mix heads that different query heads read), or widths that are not whole
            heads.
    """
    check_fold_block(head_dim, block)
    out: dict[str, np.ndarray] = {}
    for p in pairs:
        wv = np.asarray(get(p.v_weight), dtype=np.float64)
        wo = np.asarray(get(p.o_weight), dtype=np.float64)
        if wv.ndim != 2 or wo.ndim != 2:
            raise LowbitError(f"{p.v_weight} and {p.o_weight} are not both 2-D weights")
        head_repeat(np.ones(wv.shape[0]), wo.shape[1], head_dim)  # whole heads, equal groups
        # R W_v = (W_vᵀ R)ᵀ: R is symmetric
        out[p.v_weight] = np.ascontiguousarray(rotate_rows(wv.T, block).T, dtype=np.float32)
        if p.v_bias is not None:
            bv = np.asarray(get(p.v_bias), dtype=np.float64)
            out[p.v_bias] = rotate_rows(bv, block).astype(np.float32)
        out[p.o_weight] = rotate_rows(wo, block).astype(np.float32)
    return out


def check_fold_block(head_dim: int, block: int) -> None:
    """Refuse a block that does not divide the head size (it would straddle two heads, which
    different query heads read).

    Raises:
        LowbitError: such a block.
    """
    if head_dim < 1 or head_dim % block:
        raise LowbitError(
            f"heads of {head_dim} channels do not split into Hadamard blocks of {block}: the "
            "value -> output fold needs a block that divides the head size"
        )


def head_dim_of(config: Mapping[str, Any] | None) -> int:
    """Channels per attention head from a transformers config (``head_dim``, or the hidden
    size over the heads; a ``text_config`` is looked into).

    Raises:
        LowbitError: a config that says neither.
    """
    cfg = dict(config or {})
    if "hidden_size" not in cfg:
        cfg = {**(cfg.get("text_config") or {}), **cfg}
    hd = cfg.get("head_dim")
    if hd:
        return int(hd)
    try:
        return int(cfg["hidden_size"]) // int(cfg["num_attention_heads"])
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        raise LowbitError(
            "the config gives neither head_dim nor hidden_size and num_attention_heads"
        ) from None


def _known() -> list[str]:
    return sorted({*_FAMILY, *_ATTENTION_ONLY})
