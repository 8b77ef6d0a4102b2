"""The model families lowbit moves between Hugging Face and GGUF: tensor names both ways, and
the layout conventions of each (llama.cpp's ``convert_hf_to_gguf.py`` and ``llama-model.cpp``).

One table per GGUF architecture, read in both directions: the converter
(:mod:`lowbit.checkpoints.gguf.convert`) renames Hugging Face tensors with it, and the model
builder (:mod:`lowbit.models.build`) renames a GGUF's tensors back. What else differs:

- llama (also Mistral and Mixtral, which llama.cpp stores as ``llama``): q/k rows reordered for
  llama.cpp's interleaved rotary pairs (:func:`permute_qk`, undone by
  :func:`lowbit.checkpoints.gguf.names.unpermute_qk`); Mixtral's experts stacked into one
  ``ffn_*_exps`` tensor per projection, ``[experts, rows, cols]``.
- gemma2 / gemma3: every ``*norm.weight`` is stored as ``w + 1`` (Gemma's RMSNorm multiplies by
  ``1 + w``, llama.cpp's by the stored weight), in float32. The embedding scale
  (``sqrt(hidden)``) and soft-capping are applied at run time by both sides, never stored.
- qwen2 (biases on q/k/v) and qwen3 (per-head q/k norms): names only, no reordering (NEOX rope).
- qwen2moe / qwen3moe: Qwen2 / Qwen3 attention; the router ``mlp.gate`` is ``ffn_gate_inp``,
  the experts ``mlp.experts.E.{gate,up,down}_proj`` are stacked like Mixtral's, and Qwen2-MoE's
  shared expert is ``ffn_{gate,up,down}_shexp`` with its sigmoid gate ``mlp.shared_expert_gate``
  (``[1, hidden]``) as ``ffn_gate_inp_shexp``. Every layer must be a mixture (llama.cpp's
  loader wants experts in each block), so :func:`check_moe_config` refuses dense layers.
- phi3: transformers' own fused ``qkv_proj`` and ``gate_up_proj`` are llama.cpp's
  ``attn_qkv`` and ``ffn_up``: names only.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from lowbit.errors import LowbitError

__all__ = [
    "FAMILIES",
    "GGUF_ARCHS",
    "Family",
    "check_moe_config",
    "family_config",
    "family_for",
    "gguf_family",
    "permute_qk",
]

# (transformers name inside ``model.layers.N.``, llama.cpp name inside ``blk.N.``)
_ATTN = [
    ("input_layernorm.weight", "attn_norm.weight"),
    ("self_attn.q_proj.weight", "attn_q.weight"),
    ("self_attn.k_proj.weight", "attn_k.weight"),
    ("self_attn.v_proj.weight", "attn_v.weight"),
    ("self_attn.o_proj.weight", "attn_output.weight"),
]
_MLP = [
    ("mlp.gate_proj.weight", "ffn_gate.weight"),
    ("mlp.up_proj.weight", "ffn_up.weight"),
    ("mlp.down_proj.weight", "ffn_down.weight"),
]
_LLAMA = [*_ATTN, ("post_attention_layernorm.weight", "ffn_norm.weight"), *_MLP]
_BIASES = [
    ("self_attn.q_proj.bias", "attn_q.bias"),
    ("self_attn.k_proj.bias", "attn_k.bias"),
    ("self_attn.v_proj.bias", "attn_v.bias"),
    ("self_attn.o_proj.bias", "attn_output.bias"),
]
_QK_NORM = [
    ("self_attn.q_norm.weight", "attn_q_norm.weight"),
    ("self_attn.k_norm.weight", "attn_k_norm.weight"),
]
_GEMMA = [
    *_ATTN,
    ("post_attention_layernorm.weight", "post_attention_norm.weight"),
    ("pre_feedforward_layernorm.weight", "ffn_norm.weight"),
    ("post_feedforward_layernorm.weight", "post_ffw_norm.weight"),
    *_MLP,
]
_PHI3 = [
    ("input_layernorm.weight", "attn_norm.weight"),
    ("self_attn.qkv_proj.weight", "attn_qkv.weight"),
    ("self_attn.o_proj.weight", "attn_output.weight"),
    ("post_attention_layernorm.weight", "ffn_norm.weight"),
    ("mlp.gate_up_proj.weight", "ffn_up.weight"),
    ("mlp.down_proj.weight", "ffn_down.weight"),
]
_MOE = [("block_sparse_moe.gate.weight", "ffn_gate_inp.weight")]
_QWEN_MOE = [("mlp.gate.weight", "ffn_gate_inp.weight")]
_SHARED_EXPERT = [
    ("mlp.shared_expert.gate_proj.weight", "ffn_gate_shexp.weight"),
    ("mlp.shared_expert.up_proj.weight", "ffn_up_shexp.weight"),
    ("mlp.shared_expert.down_proj.weight", "ffn_down_shexp.weight"),
    ("mlp.shared_expert_gate.weight", "ffn_gate_inp_shexp.weight"),
]
_NORM2 = [("post_attention_layernorm.weight", "ffn_norm.weight")]
# (projection of ``<prefix>.E.<projection>.weight``, GGUF stack in a block), in the order the
# converter writes a block's stacks once it has every expert of the block
_MIXTRAL_EXPERTS = (("w1", "ffn_gate_exps.weight"), ("w2", "ffn_down_exps.weight"),
                    ("w3", "ffn_up_exps.weight"))  # fmt: skip
_QWEN_EXPERTS = (("down_proj", "ffn_down_exps.weight"), ("gate_proj", "ffn_gate_exps.weight"),
                 ("up_proj", "ffn_up_exps.weight"))  # fmt: skip
#: Whether llama.cpp renormalises a Qwen mixture's top-k routing weights (``build_moe_ffn``'s
#: ``norm_w``, fixed per architecture; transformers' ``norm_topk_prob``).
QWEN_MOE_NORM_TOPK = {"qwen2moe": False, "qwen3moe": True}
_TOP = [
    ("model.embed_tokens.weight", "token_embd.weight"),
    ("model.norm.weight", "output_norm.weight"),
    ("lm_head.weight", "output.weight"),
]


@dataclass(frozen=True)
class Family:
    """One Hugging Face model family as llama.cpp stores it.

    Attributes:
        arch: the GGUF ``general.architecture``.
        hf_class: the transformers class a GGUF of this architecture builds.
        hf_model_type: its config's ``model_type``.
        layers: ``(transformers name in a layer, GGUF name in a block)`` pairs.
        permute_qk: q/k rows reordered for llama.cpp's rotary pairs.
        norm_shift: added to every ``*norm.weight`` when written (Gemma: 1).
        expert_prefix: where a layer's per-expert tensors live (``<prefix>.E.<projection>``).
        experts: ``(projection, GGUF stack name)`` pairs, in the order llama.cpp writes a
            block's stacks (each stack ``[experts, rows, cols]``); empty for dense families.
    """

    arch: str
    hf_class: str
    hf_model_type: str
    layers: tuple[tuple[str, str], ...]
    permute_qk: bool = False
    norm_shift: float = 0.0
    expert_prefix: str = ""
    experts: tuple[tuple[str, str], ...] = ()

    def expert_of(self, name: str) -> tuple[int, int, str] | None:
        """``(layer, expert, GGUF stack name)`` of a per-expert transformers tensor, else None."""
        if not self.experts:
            return None
        m = re.fullmatch(rf"model\.layers\.(\d+)\.{re.escape(self.expert_prefix)}\.(\d+)\.(\w+)"
                         r"\.weight", name)  # fmt: skip
        stack = dict(self.experts).get(m.group(3)) if m else None
        return None if m is None or stack is None else (int(m.group(1)), int(m.group(2)), stack)

    def expert_names(self, name: str, n_experts: int) -> list[str] | None:
        """The per-expert transformers names of a GGUF expert stack (``blk.L.ffn_up_exps.weight``
        -> ``model.layers.L.mlp.experts.E.up_proj.weight`` for each expert), else None."""
        m = re.fullmatch(r"blk\.(\d+)\.(.+)", name)
        proj = {gg: hf for hf, gg in self.experts}.get(m.group(2)) if m else None
        if m is None or proj is None:
            return None
        head = f"model.layers.{m.group(1)}.{self.expert_prefix}"
        return [f"{head}.{e}.{proj}.weight" for e in range(n_experts)]

    def to_gguf(self, name: str) -> str | None:
        """The GGUF name of a transformers tensor, or None for one with no counterpart."""
        for hf, gg in _TOP:
            if name == hf:
                return gg
        m = re.fullmatch(r"model\.layers\.(\d+)\.(.+)", name)
        if m:
            for hf, gg in self.layers:
                if m.group(2) == hf:
                    return f"blk.{m.group(1)}.{gg}"
        return None

    def to_hf(self, name: str) -> str | None:
        """The transformers name of a GGUF tensor, or None for one with no counterpart."""
        for hf, gg in _TOP:
            if name == gg:
                return hf
        m = re.fullmatch(r"blk\.(\d+)\.(.+)", name)
        if m:
            for hf, gg in self.layers:
                if m.group(2) == gg:
                    return f"model.layers.{m.group(1)}.{hf}"
        return None


_LLAMA_FAMILY = Family("llama", "LlamaForCausalLM", "llama", (*_LLAMA, *_BIASES), permute_qk=True)
#: transformers ``model_type`` -> its family (the converter's side).
FAMILIES: dict[str, Family] = {
    "llama": _LLAMA_FAMILY,
    "mistral": _LLAMA_FAMILY,  # llama.cpp stores Mistral as llama
    "mixtral": Family("llama", "MixtralForCausalLM", "mixtral", (*_ATTN, *_NORM2, *_MOE),
                      permute_qk=True, expert_prefix="block_sparse_moe.experts",
                      experts=_MIXTRAL_EXPERTS),
    "qwen2": Family("qwen2", "Qwen2ForCausalLM", "qwen2", tuple(_LLAMA + _BIASES)),
    "qwen3": Family("qwen3", "Qwen3ForCausalLM", "qwen3", tuple(_LLAMA + _QK_NORM)),
    "qwen2_moe": Family("qwen2moe", "Qwen2MoeForCausalLM", "qwen2_moe",
                        (*_ATTN, *_NORM2, *_QWEN_MOE, *_SHARED_EXPERT, *_BIASES),
                        expert_prefix="mlp.experts", experts=_QWEN_EXPERTS),
    "qwen3_moe": Family("qwen3moe", "Qwen3MoeForCausalLM", "qwen3_moe",
                        (*_ATTN, *_NORM2, *_QWEN_MOE, *_QK_NORM),
                        expert_prefix="mlp.experts", experts=_QWEN_EXPERTS),
    "gemma2": Family("gemma2", "Gemma2ForCausalLM", "gemma2", tuple(_GEMMA), norm_shift=1.0),
    "gemma3_text": Family("gemma3", "Gemma3ForCausalLM", "gemma3_text",
                          tuple(_GEMMA + _QK_NORM), norm_shift=1.0),
    "phi3": Family("phi3", "Phi3ForCausalLM", "phi3", tuple(_PHI3)),
}  # fmt: skip
FAMILIES["gemma3"] = FAMILIES["gemma3_text"]

#: GGUF architecture -> the family a model is built from (a ``llama`` file with experts is
#: Mixtral: :func:`gguf_family`).
GGUF_ARCHS: dict[str, Family] = {
    f.arch: f for f in FAMILIES.values() if f.hf_model_type not in ("mistral", "mixtral")
}


def gguf_family(arch: str, metadata: Mapping[str, Any]) -> Family | None:
    """The family a GGUF file is built as: its architecture's, or Mixtral for a ``llama``
    file with experts (llama.cpp stores Mixtral as llama); None for one lowbit does not build."""
    n = metadata.get("llama.expert_count")
    if arch == "llama" and n is not None and type(n) is not int:  # llama.cpp reads one value
        raise LowbitError(f"llama.expert_count is {str(n)[:40]}; lowbit expects an integer")
    if arch == "llama" and type(n) is int and n > 0:
        return FAMILIES["mixtral"]
    return GGUF_ARCHS.get(arch)


def family_for(model_type: str | None, *, what: str = "Hugging Face model_type") -> Family:
    """The family of a transformers ``model_type``.

    Raises:
        LowbitError: a type lowbit does not convert (the message lists those it does).
    """
    fam = FAMILIES.get(str(model_type))
    if fam is None:
        raise LowbitError(
            f"{what} {model_type!r} has no GGUF conversion in lowbit; supported: "
            f"{', '.join(sorted(set(FAMILIES) - {'gemma3_text'}))}"
        )
    return fam


def check_moe_config(fam: Family, cfg: Mapping[str, Any]) -> int:
    """The expert count of a mixture's config, after checking llama.cpp can run its GGUF
    (0 for a dense family).

    Raises:
        LowbitError: no expert count, or (Qwen mixtures) dense layers among the experts'
            (``decoder_sparse_step`` other than 1, or ``mlp_only_layers``): llama.cpp's
            qwen2moe / qwen3moe blocks all hold experts; or a ``norm_topk_prob`` (absent:
            transformers' default, false) other than llama.cpp's fixed choice (qwen2moe:
            the routed weights are not renormalised, qwen3moe: they are), which would make
            the GGUF compute another model.
    """
    if not fam.experts:
        return 0
    n = cfg.get("num_local_experts") or cfg.get("num_experts")
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise LowbitError(
            f"{fam.hf_model_type} config: num_experts / num_local_experts is {n!r}, "
            f"not a positive integer"
        )
    if fam.expert_prefix == "mlp.experts":
        step, dense = cfg.get("decoder_sparse_step", 1), cfg.get("mlp_only_layers") or []
        if step != 1 or dense:
            raise LowbitError(
                f"{fam.hf_model_type} config: dense layers among the experts' "
                f"(decoder_sparse_step {step!r}, mlp_only_layers {dense!r}) have no GGUF form "
                f"llama.cpp runs; lowbit converts mixtures with experts in every layer"
            )
        norm = bool(cfg.get("norm_topk_prob", False))
        if norm != QWEN_MOE_NORM_TOPK[fam.arch]:
            raise LowbitError(
                f"{fam.hf_model_type} config: norm_topk_prob {norm} (absent: false), but "
                f"llama.cpp's {fam.arch} always computes it as "
                f"{QWEN_MOE_NORM_TOPK[fam.arch]}; its GGUF would be another model"
            )
    return n


def permute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """Reorder q/k projection rows as llama.cpp's converter does (inverse of
    :func:`lowbit.checkpoints.gguf.names.unpermute_qk`).

    Each head's rows ``[r_0 .. r_{d/2-1}, s_0 .. s_{d/2-1}]`` (transformers' ``rotate_half``
    pairs ``r_i`` with ``s_i``) become ``[r_0, s_0, r_1, s_1, ...]`` (llama.cpp pairs rows 2i
    and 2i+1). Works on weights ``(rows, cols)`` and biases ``(rows,)``.
    """
    rows = w.shape[0]
    if rows % (2 * n_head):
        raise LowbitError(f"cannot split {rows} q/k rows into {n_head} heads of rotary pairs")
    half = rows // n_head // 2
    return w.reshape(n_head, 2, half, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _ints(*values: Any) -> bool:
    """Whether every value is a positive integer (not an array of one per layer)."""
    return all(type(v) is int and v > 0 for v in values)


def family_config(arch: str, metadata: Mapping[str, Any], cfg: dict[str, Any]) -> None:
    """Complete a config derived from a GGUF's metadata for transformers' class of its family
    (in place): ``model_type``, ``architectures`` and what llama.cpp keeps elsewhere.

    - gemma2 / gemma3: the attention scale llama.cpp uses (``1/sqrt(head_dim)``, and
      ``1/sqrt(hidden/heads)`` for the 27B models' 46 / 62 layers) as ``query_pre_attn_scalar``;
      sliding window, soft-capping, the local layers' rope base;
    - phi3: the original context length, the sliding window (0: none), the rotary fraction.

    - the mixtures: expert count, experts per token, the experts' and shared expert's widths,
      and what llama.cpp fixes for qwen2moe / qwen3moe (experts in every layer, its
      ``norm_topk_prob``).

    An architecture outside :data:`GGUF_ARCHS` is left as it is (``model_type`` = ``arch``).
    """
    fam = gguf_family(arch, metadata)
    if fam is None:
        return
    cfg["model_type"] = fam.hf_model_type
    cfg["architectures"] = [fam.hf_class]

    def get(key: str) -> Any:
        return metadata.get(f"{arch}.{key}")

    if fam.experts:
        for key, hf_key in (
            ("expert_count", "num_experts"),
            ("expert_used_count", "num_experts_per_tok"),
            ("expert_feed_forward_length", "moe_intermediate_size"),
            ("expert_shared_feed_forward_length", "shared_expert_intermediate_size"),
        ):
            if get(key) is not None:
                cfg[hf_key] = get(key)
    if arch in QWEN_MOE_NORM_TOPK:
        cfg["norm_topk_prob"] = QWEN_MOE_NORM_TOPK[arch]
        cfg["decoder_sparse_step"] = 1
        cfg["mlp_only_layers"] = []

    if arch in ("gemma2", "gemma3"):
        head_dim = cfg.get("head_dim")
        big = cfg.get("num_hidden_layers") in (46, 62)  # llama.cpp's 27B rule
        if big and _ints(cfg.get("hidden_size"), cfg.get("num_attention_heads")):
            cfg["query_pre_attn_scalar"] = cfg["hidden_size"] // cfg["num_attention_heads"]
        elif head_dim:
            cfg["query_pre_attn_scalar"] = head_dim
        if get("attention.sliding_window") is not None:
            cfg["sliding_window"] = get("attention.sliding_window")
        cfg["final_logit_softcapping"] = get("final_logit_softcapping")
        cfg["attn_logit_softcapping"] = get("attn_logit_softcapping")
        if arch == "gemma3" and get("rope.freq_base_swa") is not None:
            cfg["rope_local_base_freq"] = get("rope.freq_base_swa")
        if arch == "gemma3" and get("rope.scaling.type") == "linear":
            cfg["rope_scaling"] = {"rope_type": "linear", "factor": get("rope.scaling.factor")}
    if arch == "phi3":
        orig = get("rope.scaling.original_context_length")
        if orig is not None:
            cfg["original_max_position_embeddings"] = orig
        cfg["sliding_window"] = get("attention.sliding_window") or None
        # per-layer arrays or zeros are left for check_config to refuse in one line
        if _ints(cfg.get("hidden_size"), cfg.get("num_attention_heads")):
            cfg["head_dim"] = cfg["hidden_size"] // cfg["num_attention_heads"]
        rope_dim = get("rope.dimension_count")
        if _ints(rope_dim, cfg.get("hidden_size"), cfg.get("num_attention_heads")):
            cfg["partial_rotary_factor"] = (
                rope_dim * cfg["num_attention_heads"] / cfg["hidden_size"]
            )
