"""Tensor names across checkpoint kinds: llama.cpp GGUF names to transformers names (per family),
the q/k row order and Gemma's norm offset llama.cpp's converter uses.

Readers, writers and the model builder (``lowbit.models.build``) all use these, so they
live with the checkpoints.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from lowbit.checkpoints.gguf.arch import FAMILIES, GGUF_ARCHS, Family
from lowbit.errors import LowbitError

__all__ = [
    "gguf_expert_names",
    "gguf_to_hf_array",
    "gguf_to_hf_experts",
    "gguf_to_hf_name",
    "unpermute_qk",
]


def _family(config: Mapping[str, Any] | None) -> Family:
    """The family of a GGUF checkpoint's derived config (None: llama)."""
    if not config:
        return GGUF_ARCHS["llama"]
    model_type = str(config.get("model_type", "llama"))
    fam = FAMILIES.get(model_type) or GGUF_ARCHS.get(model_type)
    if fam is None:
        raise LowbitError(
            f"GGUF architecture {model_type!r}: lowbit maps names for "
            f"{', '.join(GGUF_ARCHS)} only (reading its tensors works)"
        )
    return fam


def gguf_to_hf_name(name: str, config: Mapping[str, Any] | None = None) -> str:
    """The transformers name of a llama.cpp GGUF tensor.

    Args:
        name: the GGUF tensor name (``blk.0.attn_q.weight``).
        config: the GGUF checkpoint's config (``Checkpoint.config``), whose ``model_type``
            names the family (:mod:`lowbit.checkpoints.gguf.arch`); None: llama.

    Raises:
        LowbitError: a tensor with no counterpart (e.g. ``rope_freqs.weight``).
    """
    fam = _family(config)
    hf = fam.to_hf(name)
    if hf is None:
        raise LowbitError(
            f"GGUF tensor {name!r} has no counterpart in a transformers {fam.hf_class} model"
        )
    return hf


def gguf_expert_names(
    name: str, n_experts: int, config: Mapping[str, Any] | None
) -> list[str] | None:
    """The transformers checkpoint's per-expert names of a GGUF expert stack of ``n_experts``
    (``blk.L.ffn_up_exps.weight``), in expert order; None for any other tensor."""
    return _family(config).expert_names(name, n_experts)


def gguf_to_hf_experts(
    name: str, arr: np.ndarray, config: Mapping[str, Any] | None
) -> list[tuple[str, np.ndarray]] | None:
    """A GGUF expert stack (``blk.L.ffn_gate_exps.weight``, ``[experts, rows, cols]``) as the
    transformers checkpoint's per-expert tensors ``(name, [rows, cols])``, in expert order;
    None for any other tensor.

    Raises:
        LowbitError: a stack that is not 3-D.
    """
    names = gguf_expert_names(name, arr.shape[0] if arr.ndim else 0, config)
    if names is None:
        return None
    if arr.ndim != 3:
        raise LowbitError(f"GGUF expert stack {name!r} has shape {arr.shape}, not 3-D")
    return [(n, arr[e]) for e, n in enumerate(names)]


def gguf_to_hf_array(hf_name: str, arr: np.ndarray, config: Mapping[str, Any] | None) -> np.ndarray:
    """A GGUF tensor's values in the transformers layout (``hf_name`` from
    :func:`gguf_to_hf_name`): llama's q/k rows un-permuted, Gemma's stored ``w + 1`` norms
    back to ``w`` (float32)."""
    fam = _family(config)
    cfg = config or {}
    if fam.permute_qk and hf_name.endswith(("q_proj.weight", "q_proj.bias")):
        return unpermute_qk(arr, cfg["num_attention_heads"])
    if fam.permute_qk and hf_name.endswith(("k_proj.weight", "k_proj.bias")):
        return unpermute_qk(arr, cfg.get("num_key_value_heads") or cfg["num_attention_heads"])
    if fam.norm_shift and hf_name.endswith("norm.weight"):
        return np.asarray(arr, dtype=np.float32) - np.float32(fam.norm_shift)
    return arr


def unpermute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's reordering of q/k projection rows (convert_hf_to_gguf.py ``permute``).

    Hugging Face's rotary embedding pairs row i with row i + d/2 of each head (``rotate_half``);
    llama.cpp pairs rows 2i and 2i+1. The converter reorders each head's rows from
    [r_0 .. r_{d/2-1}, s_0 .. s_{d/2-1}] to [r_0, s_0, r_1, s_1, ...]; this puts them back.
    Works on weights (rows, cols) and biases (rows,).
    """
    rows = w.shape[0]
    if rows % (2 * n_head):
        raise LowbitError(f"cannot split {rows} q/k rows into {n_head} heads of rotary pairs")
    half = rows // n_head // 2
    return w.reshape(n_head, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
