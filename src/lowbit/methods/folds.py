"""Exact scale folds: per-input-channel scales of linear layers moved into the operation before.

A linear layer ``y = x W^T`` computes the same ``y`` from ``x / s`` with ``W * s`` (every input
column ``j`` multiplied by ``s_j``). When ``x`` is the output of an operation whose outputs can
be divided by ``s`` for free, the model's outputs do not change: AWQ (scales that protect the
weights of salient input channels) and SmoothQuant (scales that move activation outliers into
the weights) both rest on this. :data:`FOLDS` lists, per architecture family, every place where
such a fold is *exact*, one :class:`Fold` per group of linears that read the same input:

``llama`` (llama, mistral, qwen2, qwen3 decoders: pre-norm blocks, RMSNorm ``x / rms(x) * w``)
    ``input_layernorm -> q_proj, k_proj, v_proj`` (the norm's weight divided by ``s``; its output
    feeds only the attention, the residual stream is taken before it);
    ``v_proj -> o_proj`` (``v``'s rows divided by ``s``: attention mixes tokens, not channels,
    so the attention output is divided channel for channel; with grouped-query attention each
    ``v`` channel feeds ``num_heads / num_kv_heads`` query heads' channels of ``o_proj``'s
    input, so ``o_proj``'s scales are one per ``v`` channel, repeated per head, see
    :func:`head_repeat`); ``post_attention_layernorm -> gate_proj, up_proj``; ``up_proj ->
    down_proj`` (``down``'s input is ``act(gate) * up``, linear in ``up``'s output).
``moe`` (Mixtral, Qwen2-MoE, Qwen3-MoE, DeepSeek-V2/V3, OLMoE: llama's attention folds, and in
    each expert and shared expert ``up_proj -> down_proj``; the norm before the experts also
    feeds the router, which stays high precision, so that fold is not made)
``bert`` (BERT, RoBERTa encoders: post-norm blocks)
    ``attention.self.value -> attention.output.dense`` only. The LayerNorms of a post-norm block
    feed the residual connection as well as the next linear layers, so dividing them by ``s``
    would change the residual (not exact); ``intermediate.dense -> output.dense`` has a GELU
    between them (``gelu(x / s) != gelu(x) / s``).

Gemma (RMSNorm ``x * (1 + w)``), phi3 (fused ``qkv_proj``), GPT-2 (Conv1D) and others have no
table, so nothing is folded for them. Names are module paths relative to a block of the model's
stack of blocks (``model.layers.N``, ``encoder.layer.N``), as ``transformers`` names them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

import numpy as np

from lowbit.errors import LowbitError

__all__ = [
    "FOLDS",
    "NO_CLIP",
    "Fold",
    "FoldKind",
    "expand_experts",
    "fold_family",
    "fold_scales",
    "head_reduce",
    "head_repeat",
]


class FoldKind(str, Enum):
    """What the operation before the linears is.

    ``norm``: a normalisation whose weight (and bias) multiply its output channel by channel.
    ``linear``: a linear layer whose output rows (and bias) feed the linears' inputs one to one.
    ``heads``: attention's value projection feeding the output projection through the heads
    (one value channel per head-repeated input channel; see :func:`head_repeat`).
    """

    NORM = "norm"
    LINEAR = "linear"
    HEADS = "heads"


@dataclass(frozen=True)
class Fold:
    """One exact fold: scales of ``linears``' input columns divided out of ``prev``'s outputs.

    Attributes:
        prev: the operation before (module path relative to a block).
        linears: the linear layers reading its output (module paths relative to a block).
        kind: what ``prev`` is.
    """

    prev: str
    linears: tuple[str, ...]
    kind: FoldKind


_LLAMA = (
    Fold("input_layernorm", ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
         FoldKind.NORM),
    Fold("self_attn.v_proj", ("self_attn.o_proj",), FoldKind.HEADS),
    Fold("post_attention_layernorm", ("mlp.gate_proj", "mlp.up_proj"), FoldKind.NORM),
    Fold("mlp.up_proj", ("mlp.down_proj",), FoldKind.LINEAR),
)  # fmt: skip
_BERT = (Fold("attention.self.value", ("attention.output.dense",), FoldKind.HEADS),)
_MOE = (
    *_LLAMA,  # the attention's; the MLP's where a layer is dense (first_k_dense, mlp_only)
    Fold("mlp.experts.{e}.up_proj", ("mlp.experts.{e}.down_proj",), FoldKind.LINEAR),
    Fold("mlp.shared_expert.up_proj", ("mlp.shared_expert.down_proj",), FoldKind.LINEAR),
    Fold("mlp.shared_experts.up_proj", ("mlp.shared_experts.down_proj",), FoldKind.LINEAR),
)

#: Architecture family -> its exact folds, in the order a block computes them (``{e}``: one
#: fold per expert, see :func:`expand_experts`).
FOLDS: dict[str, tuple[Fold, ...]] = {"llama": _LLAMA, "bert": _BERT, "moe": _MOE}

#: config ``model_type`` -> family of :data:`FOLDS`.
_FAMILY = {
    "llama": "llama",
    "mistral": "llama",
    "qwen2": "llama",
    "qwen3": "llama",
    "mixtral": "moe",
    "qwen2_moe": "moe",
    "qwen3_moe": "moe",
    "deepseek_v2": "moe",
    "deepseek_v3": "moe",
    "olmoe": "moe",
    "bert": "bert",
    "roberta": "bert",
    "xlm-roberta": "bert",
}

#: Suffixes of layers whose weights are never clipped (attention scores are sensitive to q/k;
#: AWQ's reference code makes the same exception).
NO_CLIP = ("q_proj", "k_proj", "attention.self.query", "attention.self.key")


def fold_family(model_type: str | None) -> str | None:
    """The :data:`FOLDS` family of a config ``model_type`` (None: no exact folds known)."""
    return _FAMILY.get(str(model_type or "").lower())


def expand_experts(folds: tuple[Fold, ...], experts: int) -> tuple[Fold, ...]:
    """``folds`` with each fold naming ``{e}`` repeated for experts ``0 .. experts - 1``."""
    out: list[Fold] = []
    for f in folds:
        if "{e}" not in f.prev and not any("{e}" in lin for lin in f.linears):
            out.append(f)
            continue
        for e in range(experts):
            out.append(
                Fold(
                    f.prev.replace("{e}", str(e)),
                    tuple(lin.replace("{e}", str(e)) for lin in f.linears),
                    f.kind,
                )
            )
    return tuple(out)


def head_repeat(s: np.ndarray, width: int, head_dim: int) -> np.ndarray:
    """Scales of the value channels, repeated as grouped-query attention repeats heads.

    Query head ``h`` reads value head ``h // (n_heads / n_kv_heads)``, and the output
    projection's input channel ``h * head_dim + d`` is that head's channel ``d``.

    Args:
        s: one scale per value channel (``n_kv_heads * head_dim``).
        width: the output projection's input width (``n_heads * head_dim``).
        head_dim: channels per head.

    Raises:
        LowbitError: widths that are not whole heads, or heads that do not divide evenly.
    """
    kv = s.shape[0]
    if head_dim < 1 or kv % head_dim or width % head_dim or width % kv:
        raise LowbitError(
            f"value width {kv} and output-projection width {width} are not whole heads of "
            f"{head_dim} channels in equal groups"
        )
    rep = width // kv
    return np.repeat(s.reshape(kv // head_dim, 1, head_dim), rep, axis=1).reshape(width)


def head_reduce(v: np.ndarray, kv: int, head_dim: int, how: str) -> np.ndarray:
    """Per-channel statistics of the output projection's input, reduced onto the value channels
    (``how``: ``mean`` or ``max`` over the query heads sharing a value head)."""
    width = v.shape[0]
    head_repeat(np.ones(kv), width, head_dim)  # the same checks
    g = v.reshape(kv // head_dim, width // kv, head_dim)
    return (g.mean(axis=1) if how == "mean" else g.max(axis=1)).reshape(kv)


def fold_scales(
    prev: Mapping[str, Any], linears: Mapping[str, Any], s_prev: np.ndarray, s_in: np.ndarray
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Fold scales: ``prev``'s outputs divided by ``s_prev``, ``linears``' input columns times
    ``s_in`` (``s_in`` is ``s_prev`` or, for heads, its :func:`head_repeat`).

    Args:
        prev: ``{"weight": w, "bias": b}`` (either may be absent) of the operation before: a
            1-D norm weight ``[c]`` or a linear weight ``[c, in]``, and a bias ``[c]``.
        linears: name -> weight ``[out, len(s_in)]``.
        s_prev: ``[c]`` positive scales.
        s_in: ``[in]`` positive scales.

    Returns:
        ``(new prev arrays, new linear weights)`` in float64.

    Raises:
        LowbitError: non-positive or non-finite scales, shapes that do not match.
    """
    for s in (s_prev, s_in):
        if not (np.all(np.isfinite(s)) and np.all(s > 0)):
            raise LowbitError("fold scales must be finite and positive")
    out_prev = {}
    for key, arr in prev.items():
        a = np.asarray(arr, dtype=np.float64)
        if a.shape[0] != s_prev.shape[0]:
            raise LowbitError(f"{key} of shape {a.shape} does not match {s_prev.shape[0]} scales")
        out_prev[key] = a / s_prev.reshape((-1,) + (1,) * (a.ndim - 1))
    out_lin = {}
    for name, w in linears.items():
        a = np.asarray(w, dtype=np.float64)
        if a.ndim != 2 or a.shape[1] != s_in.shape[0]:
            raise LowbitError(f"{name} of shape {a.shape} does not match {s_in.shape[0]} scales")
        out_lin[name] = a * s_in[None, :]
    return out_prev, out_lin
