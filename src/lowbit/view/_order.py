"""The order of a transformer block's tensors as data flows through it, from their names:
attention in (q, k, v), attention out (o), the MoE router, MLP in (gate, up), MLP out (down),
anything unknown, then the norms.

Tensor kinds are the part of a name after the layer index (``self_attn.q_proj``, ``ffn_up``,
``attention.self.query.bias``, ``block_sparse_moe.experts.3.w1``). Works on the names of
llama.cpp/GGUF (``attn_q``, ``attn_output``, ``ffn_gate``, ``ffn_down``, ``ffn_gate_exps``,
``ffn_gate_inp``, ``ffn_up_shexp``, ``attn_norm``, ``ffn_norm``), Hugging Face Llama, Qwen,
Mistral, Gemma (``self_attn.q_proj``, ``mlp.down_proj``, ``input_layernorm``,
``post_attention_layernorm``), BERT (``attention.self.query``, ``attention.output.dense``,
``intermediate.dense``, ``output.dense``, ``output.LayerNorm``), GPT-2 and NeoX (``attn.c_attn``,
``mlp.c_fc``, ``attention.query_key_value``, ``mlp.dense_4h_to_h``) and mixture-of-experts
checkpoints (Mixtral's ``block_sparse_moe.experts.N.w1/w2/w3`` and router ``gate``, Qwen-MoE's
``mlp.experts.N.gate_proj``, ``mlp.gate``, ``mlp.shared_expert.*``). A kind it does not know
keeps its place among the unknown ones, after the MLP and before the norms.

One expert's tensors (``experts.N.``) are grouped: :func:`split_expert` names the group
(``block_sparse_moe.experts.*.w1``) and the expert, so a page can draw one grid per expert kind.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

__all__ = ["block_order", "block_rank", "expert_groups", "split_expert"]

_EXPERT = re.compile(r"(^|\.)experts\.(\d+)\.")
_NORM = re.compile(r"(norm|layernorm|(^|[._])ln(_\d+|_f)?$)", re.IGNORECASE)

# sections of a block, in data-flow order
_ATTN_IN, _ATTN_OUT, _MLP, _OTHER, _NORMS = range(5)
# families within the MLP section: the router, the (dense or routed-expert) MLP, shared experts
_ROUTER, _FFN, _SHARED = range(3)

# leaf names (the last part of a kind, lower case) -> slot
_Q = {"q_proj", "attn_q", "query", "wq", "q", "q_lin"}
_K = {"k_proj", "attn_k", "key", "wk", "k", "k_lin"}
_V = {"v_proj", "attn_v", "value", "wv", "v", "v_lin"}
_QKV = {"qkv_proj", "attn_qkv", "query_key_value", "c_attn", "wqkv", "qkv"}
_O = {"o_proj", "attn_output", "out_proj", "wo", "o", "out_lin"}
_GATE = {"gate_proj", "ffn_gate", "ffn_gate_exps", "ffn_gate_shexp", "w1", "gate_up_proj"}
_UP = {"up_proj", "ffn_up", "ffn_up_exps", "ffn_up_shexp", "w3", "fc1", "c_fc", "lin1",
       "dense_h_to_4h", "fc_in"}  # fmt: skip
_DOWN = {"down_proj", "ffn_down", "ffn_down_exps", "ffn_down_shexp", "w2", "fc2", "lin2",
         "dense_4h_to_h", "fc_out"}  # fmt: skip
_ROUTERS = {"gate", "router", "ffn_gate_inp", "ffn_gate_inp_shexp", "shared_expert_gate"}
# norms in block order: before attention, on q/k, after attention, before the MLP, after it
_NORM_SLOTS = (
    ("input_layernorm", "attn_norm", "ln_1", "attention_norm", "layer_norm1"),
    ("q_norm", "k_norm", "attn_q_norm", "attn_k_norm", "q_layernorm", "k_layernorm"),
    ("post_attention_layernorm", "attn_post_norm", "attn_output_norm", "attention.output",
     "sa_layer_norm"),
    ("pre_feedforward_layernorm", "ffn_norm", "ln_2", "layer_norm2"),
    ("post_feedforward_layernorm", "ffn_post_norm", "layer_output_norm", "output.layernorm",
     "output_layer_norm"),
)  # fmt: skip


def split_expert(kind: str) -> tuple[str, int] | None:
    """``(group, expert)`` for one expert's tensor (``block_sparse_moe.experts.3.w1`` ->
    ``("block_sparse_moe.experts.*.w1", 3)``), None for any other kind (GGUF's stacked
    ``ffn_gate_exps`` holds every expert in one tensor: it is an ordinary kind)."""
    m = _EXPERT.search(kind)
    if m is None:
        return None
    return kind[: m.start(2)] + "*" + kind[m.end(2) :], int(m.group(2))


def _norm_slot(kind: str) -> tuple[int, int]:
    """(slot, which name of the slot): q_norm before k_norm."""
    low = kind.lower()
    for slot, names in enumerate(_NORM_SLOTS):
        for k, n in enumerate(names):
            if n in low:
                return slot, k
    return len(_NORM_SLOTS), 0


def block_rank(kind: str) -> tuple[int, int, int, int]:
    """The sort key of a tensor kind in its block: ``(section, family, slot, bias)``.

    Sections: attention in, attention out, MLP (router, then the MLP or routed experts, then
    shared experts; gate, up, down in each), unknown, norms. A bias sorts right after its
    weight.
    """
    bias = 1 if kind.endswith(".bias") else 0
    base = kind.removesuffix(".bias").removesuffix(".weight")
    parts = base.split(".")
    leaf = parts[-1].lower()
    context = ".".join(parts[:-1]).lower()
    if _NORM.search(leaf) or "layernorm" in base.lower():
        return (_NORMS, *_norm_slot(base), bias)
    attention = any(a in context for a in ("attn", "attention"))
    if leaf in _Q or leaf in _QKV:  # a fused q/k/v projection takes q's place
        return (_ATTN_IN, 0, 0, bias)
    if leaf in _K:
        return (_ATTN_IN, 0, 1, bias)
    if leaf in _V:
        return (_ATTN_IN, 0, 2, bias)
    if leaf in _O or (attention and leaf in ("dense", "c_proj")):
        return (_ATTN_OUT, 0, 0, bias)
    if leaf in _ROUTERS:  # the routed experts' router before the shared expert's gate
        return (_MLP, _ROUTER, int("shexp" in leaf or leaf.startswith("shared")), bias)
    family = _SHARED if ("shared_expert" in context or leaf.endswith("_shexp")) else _FFN
    if leaf in _GATE:
        return (_MLP, family, 0, bias)
    if leaf in _UP or base.lower().endswith("intermediate.dense"):
        return (_MLP, family, 1, bias)
    if leaf in _DOWN or (leaf == "c_proj" and "mlp" in context) or base.endswith("output.dense"):
        return (_MLP, family, 2, bias)
    return (_OTHER, 0, 0, bias)


def block_order(kinds: Iterable[str]) -> list[str]:
    """Tensor kinds in the order data flows through a block (:func:`block_rank`); kinds of one
    rank (unknown ones, say) keep the order they came in; duplicates are dropped.

    >>> block_order(["ffn_down", "attn_norm", "ffn_up", "attn_q", "ffn_gate", "attn_output"])
    ['attn_q', 'attn_output', 'ffn_gate', 'ffn_up', 'ffn_down', 'attn_norm']
    """
    return sorted(dict.fromkeys(kinds), key=block_rank)


def expert_groups(kinds: Iterable[str]) -> list[tuple[str, list[int]]]:
    """The expert groups among ``kinds`` in block order, each with its experts ascending
    (``[("mlp.experts.*.gate_proj", [0, 1, ...]), ("mlp.experts.*.up_proj", ...), ...]``)."""
    found: dict[str, set[int]] = {}
    for kind in kinds:
        s = split_expert(kind)
        if s is not None:
            found.setdefault(s[0], set()).add(s[1])
    return [(g, sorted(found[g])) for g in block_order(found)]
