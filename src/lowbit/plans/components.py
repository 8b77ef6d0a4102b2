"""Which part of a model a tensor belongs to, from its name: embeddings, attention, MLP, norms,
LM head, the router of a mixture of experts, other (or a non-parameter buffer).

Works on ``transformers`` and GGUF names alike. Precision-plan rules select tensors by
component (``lowbit.plans.rules``), and the planner counts parameters by component
(``lowbit.planning.modelspec``).
"""

from __future__ import annotations

import re

__all__ = ["COMPONENTS", "classify", "is_token_embedding"]

#: The components :func:`classify` names (besides ``"buffer"`` for non-parameters).
COMPONENTS = ("embeddings", "attention", "mlp", "norms", "lm_head", "router", "other")

_BUFFER = re.compile(r"(position_ids|inv_freq|\.attn\.(masked_)?bias|_float_tensor)$")
_NORM = re.compile(r"(norm|(^|\.)ln_?[a-z0-9]*(\.|$)|layernorm)", re.IGNORECASE)
_TOKEN_EMBED = re.compile(
    r"(embed_tokens|(^|\.)wte\.|word_embeddings|token_embd|embed_in|tok_embeddings)"
)
_EMBED = re.compile(r"(embed|(^|\.)wpe\.|position_embeddings|token_type_embeddings)")
_LM_HEAD = re.compile(r"(^|\.)(lm_head|embed_out|output)\.(weight|bias)$|cls\.predictions")
_ATTN = re.compile(r"(attn|attention|\.(q|k|v|o|qkv)_(proj|lin)|out_lin)")
# a mixture of experts' router (Mixtral's block_sparse_moe.gate, Qwen-MoE's mlp.gate and
# shared_expert_gate, DeepSeek's e_score_correction_bias, gpt-oss's router, GGUF's ffn_gate_inp)
_ROUTER = re.compile(
    r"((^|\.)(block_sparse_moe|mlp|moe|feed_forward)\.(gate|router)\.(weight|bias|"
    r"e_score_correction_bias)$|shared_experts?_gate\.|ffn_gate_inp(_shexp)?\.|\.router\.)"
)
_MLP = re.compile(r"(mlp|ffn|feed_forward|intermediate|experts|moe|(^|\.)output\.dense|lin[12])")


def classify(name: str, ndim: int = 2) -> str:
    """The component a tensor name belongs to (see :data:`COMPONENTS`), or ``"buffer"``."""
    if _BUFFER.search(name):
        return "buffer"
    if _NORM.search(name) and ndim <= 1:
        return "norms"
    if _LM_HEAD.search(name):
        return "lm_head"
    if _ROUTER.search(name):
        return "router"
    if _EMBED.search(name) or _TOKEN_EMBED.search(name):
        return "embeddings"
    if _ATTN.search(name):
        return "attention"
    if _MLP.search(name):
        return "mlp"
    if _NORM.search(name):
        return "norms"
    return "other"


def is_token_embedding(name: str) -> bool:
    """Whether a tensor name is a token-embedding table (``embed_tokens``, ``token_embd``...)."""
    return bool(_TOKEN_EMBED.search(name))
