"""Per-architecture tensor builders: the tensors ``transformers`` creates for one config.

One builder per family (llama-style decoders with their MoE variants, gpt2, gpt_neox, phi,
bert-style encoders, distilbert), each reading its config fields through :class:`_Cfg` (which
reports every missing field at once) and naming tensors as ``transformers`` does.
:func:`lowbit.planning.archs.spec_from_config` picks the builder.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from typing import Any

from lowbit.errors import LowbitError
from lowbit.planning.modelspec import ModelSpec, TensorInfo, _with_use, classify

__all__: list[str] = []

_TIED_DEFAULT = {"gemma": True, "gemma2": True, "gemma3_text": True, "gpt2": True, "bert": True}


#: Stated ceilings on the counts a config gives, checked before any tensor is listed (a
#: 300-byte config.json with num_hidden_layers 10^9 grew ``lowbit plan`` by 1 GB per 30 s).
#: The largest published models have 126 layers, 384 experts and 128 heads.
MAX_LAYERS = 4096
MAX_EXPERTS = 4096
MAX_HEADS = 65536
#: The most tensors one config may describe (a 61-layer, 384-expert model such as Kimi K2
#: lists about 72,000).
MAX_TENSORS = 120_000
_CEILINGS = {
    **dict.fromkeys(("num_hidden_layers", "n_layer", "n_layers"), MAX_LAYERS),
    **dict.fromkeys(
        ("num_local_experts", "num_experts", "num_experts_per_tok", "decoder_sparse_step"),
        MAX_EXPERTS,
    ),
    **dict.fromkeys(("num_attention_heads", "n_head", "n_heads", "num_key_value_heads"), MAX_HEADS),
}
_POSITIVE = {"num_attention_heads", "n_head", "n_heads", "num_key_value_heads"}


class _Cfg:
    """Typed access to config fields that records every missing or bad field at once."""

    def __init__(self, cfg: Mapping[str, Any], arch: str) -> None:
        self.cfg, self.arch, self.missing = cfg, arch, []

    def int(self, *keys: str, default: int | None = None, required: bool = True) -> int:
        for k in keys:
            v = self.cfg.get(k)
            if v is not None:
                if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                    shown = v if isinstance(v, (int, float)) and abs(v) < 1e15 else type(v).__name__
                    raise LowbitError(
                        f"malformed config: {k} must be a non-negative integer, got {shown!r}"
                    )
                ceiling = _CEILINGS.get(k)
                if ceiling is not None and v > ceiling:
                    raise LowbitError(
                        f"config {k} is {v:,}; lowbit plans models of at most {ceiling:,} "
                        f"(a larger count is a damaged or hostile config)"
                    )
                if v == 0 and k in _POSITIVE:
                    raise LowbitError(f"malformed config: {k} is 0")
                return v
        if default is None and required:
            self.missing.append(keys[0])
        return default if default is not None else 0

    def flag(self, key: str, default: bool) -> bool:
        v = self.cfg.get(key, default)
        return default if v is None else bool(v)

    def check(self) -> None:
        if self.missing:
            raise LowbitError(
                f"config for {self.arch!r} lacks the fields {', '.join(self.missing)} "
                "needed to count its parameters"
            )


_NUMBER_SEGMENT = re.compile(r"(?<=\.)\d+(?=\.)")


@functools.lru_cache(maxsize=4096)
def _classify_template(template: str, ndim: int) -> str:
    return classify(template, ndim)


def _classify(name: str, ndim: int) -> str:
    """``classify``, once per name with its layer and expert numbers set to 0 (no component
    pattern looks at a number segment; 70,000 expert tensors classified one by one took s)."""
    return _classify_template(_NUMBER_SEGMENT.sub("0", name), ndim)


class _Builder:
    """Collects tensors with their components."""

    def __init__(self) -> None:
        self.tensors: list[TensorInfo] = []

    def add(self, name: str, *shape: int, bias: bool = False) -> None:
        if len(self.tensors) >= MAX_TENSORS:
            raise LowbitError(
                f"the config describes more than {MAX_TENSORS:,} tensors; lowbit plans models "
                f"of at most that many"
            )
        self.tensors.append(TensorInfo(name, tuple(shape), _classify(name, len(shape))))
        if bias:
            b = name.rsplit(".", 1)[0] + ".bias"
            self.tensors.append(TensorInfo(b, (shape[0],), _classify(b, 1)))

    def norm(self, name: str, size: int, bias: bool = False) -> None:
        self.tensors.append(TensorInfo(name + ".weight", (size,), "norms"))
        if bias:
            self.tensors.append(TensorInfo(name + ".bias", (size,), "norms"))


def _llama_like(cfg: Mapping[str, Any], arch: str) -> ModelSpec:
    c = _Cfg(cfg, arch)
    h = c.int("hidden_size")
    n_layers = c.int("num_hidden_layers")
    n_heads = c.int("num_attention_heads")
    vocab = c.int("vocab_size")
    moe_experts = c.int("num_local_experts", "num_experts", required=False)
    if arch in ("qwen2_moe", "qwen3_moe"):
        inter = c.int("intermediate_size", required=False)
        moe_inter = c.int("moe_intermediate_size")
    else:
        inter = c.int("intermediate_size")
        moe_inter = inter
    c.check()
    if n_heads == 0 or h == 0:
        raise LowbitError("malformed config: hidden_size and num_attention_heads must be positive")
    if n_layers * (3 * moe_experts + 16) > MAX_TENSORS:  # checked before listing any
        raise LowbitError(
            f"config: {n_layers:,} layers of {moe_experts:,} experts are more than the "
            f"{MAX_TENSORS:,} tensors lowbit plans"
        )
    kv_heads = c.int("num_key_value_heads", default=n_heads)
    head_dim = c.int("head_dim", default=h // n_heads)
    q_dim, kv_dim = n_heads * head_dim, kv_heads * head_dim
    tied = c.flag("tie_word_embeddings", _TIED_DEFAULT.get(arch, False))
    attn_bias = c.flag("attention_bias", False)
    qkv_bias = attn_bias or arch in ("qwen2", "qwen2_moe")
    mlp_bias = c.flag("mlp_bias", False)
    top_k = c.int("num_experts_per_tok", default=2 if moe_experts else 0) if moe_experts else 0
    sparse_step = c.int("decoder_sparse_step", default=1) or 1
    mlp_only_list = cfg.get("mlp_only_layers") or []
    if not isinstance(mlp_only_list, list) or not all(type(i) is int for i in mlp_only_list):
        raise LowbitError("malformed config: mlp_only_layers must be a list of layer numbers")
    mlp_only = set(mlp_only_list)
    shared_inter = c.int("shared_expert_intermediate_size", default=0)
    norms = ["input_layernorm", "post_attention_layernorm"]
    if arch in ("gemma2", "gemma3_text"):
        norms += ["pre_feedforward_layernorm", "post_feedforward_layernorm"]
    qk_norm = arch in ("qwen3", "qwen3_moe", "gemma3_text")

    b = _Builder()
    b.add("model.embed_tokens.weight", vocab, h)
    for i in range(n_layers):
        p = f"model.layers.{i}."
        if arch == "phi3":
            b.add(p + "self_attn.qkv_proj.weight", q_dim + 2 * kv_dim, h)
        else:
            b.add(p + "self_attn.q_proj.weight", q_dim, h, bias=qkv_bias)
            b.add(p + "self_attn.k_proj.weight", kv_dim, h, bias=qkv_bias)
            b.add(p + "self_attn.v_proj.weight", kv_dim, h, bias=qkv_bias)
        b.add(p + "self_attn.o_proj.weight", h, q_dim, bias=attn_bias)
        if qk_norm:
            b.norm(p + "self_attn.q_norm", head_dim)
            b.norm(p + "self_attn.k_norm", head_dim)
        sparse = moe_experts > 0 and i not in mlp_only and (i + 1) % sparse_step == 0
        if not sparse:
            if arch == "phi3":
                b.add(p + "mlp.gate_up_proj.weight", 2 * inter, h)
            else:
                for proj in ("gate_proj", "up_proj"):
                    b.add(p + f"mlp.{proj}.weight", inter, h, bias=mlp_bias)
            b.add(p + "mlp.down_proj.weight", h, inter, bias=mlp_bias)
        elif arch == "mixtral":
            b.add(p + "block_sparse_moe.gate.weight", moe_experts, h)
            for e in range(moe_experts):
                q = p + f"block_sparse_moe.experts.{e}."
                b.add(q + "w1.weight", moe_inter, h)
                b.add(q + "w2.weight", h, moe_inter)
                b.add(q + "w3.weight", moe_inter, h)
        else:
            b.add(p + "mlp.gate.weight", moe_experts, h)
            for e in range(moe_experts):
                q = p + f"mlp.experts.{e}."
                b.add(q + "gate_proj.weight", moe_inter, h)
                b.add(q + "up_proj.weight", moe_inter, h)
                b.add(q + "down_proj.weight", h, moe_inter)
            if shared_inter:
                q = p + "mlp.shared_expert."
                b.add(q + "gate_proj.weight", shared_inter, h)
                b.add(q + "up_proj.weight", shared_inter, h)
                b.add(q + "down_proj.weight", h, shared_inter)
                b.add(p + "mlp.shared_expert_gate.weight", 1, h)
        for n in norms:
            b.norm(p + n, h)
    b.norm("model.norm", h)
    if not tied:
        b.add("lm_head.weight", vocab, h)
    expert_use = top_k / moe_experts if moe_experts else None
    active_inter = (top_k * moe_inter + shared_inter) if moe_experts else inter
    return ModelSpec(
        name=arch,
        source="config",
        tensors=_with_use(b.tensors, tied=tied, is_decoder=True, expert_use=expert_use),
        architecture=arch,
        n_layers=n_layers,
        hidden_size=h,
        n_heads=n_heads,
        n_kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=inter or moe_inter,
        active_intermediate=active_inter,
        vocab_size=vocab,
        gated_mlp=True,
        is_decoder=True,
        tied_embeddings=tied,
        n_experts=moe_experts or None,
        n_active_experts=top_k or None,
    )


def _gpt2(cfg: Mapping[str, Any]) -> ModelSpec:
    c = _Cfg(cfg, "gpt2")
    h = c.int("n_embd", "hidden_size")
    n_layers = c.int("n_layer", "num_hidden_layers")
    n_heads = c.int("n_head", "num_attention_heads")
    vocab = c.int("vocab_size")
    positions = c.int("n_positions", "max_position_embeddings")
    c.check()
    inter = c.int("n_inner", default=4 * h)
    tied = c.flag("tie_word_embeddings", True)
    b = _Builder()
    b.add("transformer.wte.weight", vocab, h)
    b.add("transformer.wpe.weight", positions, h)
    for i in range(n_layers):
        p = f"transformer.h.{i}."
        b.norm(p + "ln_1", h, bias=True)
        # GPT-2 uses Conv1D: weights are stored [in, out]
        b.add(p + "attn.c_attn.weight", h, 3 * h)
        b.tensors.append(TensorInfo(p + "attn.c_attn.bias", (3 * h,), "attention"))
        b.add(p + "attn.c_proj.weight", h, h)
        b.tensors.append(TensorInfo(p + "attn.c_proj.bias", (h,), "attention"))
        b.norm(p + "ln_2", h, bias=True)
        b.add(p + "mlp.c_fc.weight", h, inter)
        b.tensors.append(TensorInfo(p + "mlp.c_fc.bias", (inter,), "mlp"))
        b.add(p + "mlp.c_proj.weight", inter, h)
        b.tensors.append(TensorInfo(p + "mlp.c_proj.bias", (h,), "mlp"))
    b.norm("transformer.ln_f", h, bias=True)
    if not tied:
        b.add("lm_head.weight", vocab, h)
    return _decoder_spec(b, "gpt2", n_layers, h, n_heads, n_heads, h // n_heads, inter, vocab,
                         gated=False, tied=tied)  # fmt: skip


def _gpt_neox(cfg: Mapping[str, Any]) -> ModelSpec:
    c = _Cfg(cfg, "gpt_neox")
    h = c.int("hidden_size")
    n_layers = c.int("num_hidden_layers")
    n_heads = c.int("num_attention_heads")
    inter = c.int("intermediate_size")
    vocab = c.int("vocab_size")
    c.check()
    tied = c.flag("tie_word_embeddings", False)
    bias = c.flag("attention_bias", True)
    b = _Builder()
    b.add("gpt_neox.embed_in.weight", vocab, h)
    for i in range(n_layers):
        p = f"gpt_neox.layers.{i}."
        b.norm(p + "input_layernorm", h, bias=True)
        b.norm(p + "post_attention_layernorm", h, bias=True)
        b.add(p + "attention.query_key_value.weight", 3 * h, h, bias=bias)
        b.add(p + "attention.dense.weight", h, h, bias=bias)
        b.add(p + "mlp.dense_h_to_4h.weight", inter, h, bias=True)
        b.add(p + "mlp.dense_4h_to_h.weight", h, inter, bias=True)
    b.norm("gpt_neox.final_layer_norm", h, bias=True)
    if not tied:
        b.add("embed_out.weight", vocab, h)
    return _decoder_spec(b, "gpt_neox", n_layers, h, n_heads, n_heads, h // n_heads, inter,
                         vocab, gated=False, tied=tied)  # fmt: skip


def _phi(cfg: Mapping[str, Any]) -> ModelSpec:
    c = _Cfg(cfg, "phi")
    h = c.int("hidden_size")
    n_layers = c.int("num_hidden_layers")
    n_heads = c.int("num_attention_heads")
    inter = c.int("intermediate_size")
    vocab = c.int("vocab_size")
    c.check()
    kv_heads = c.int("num_key_value_heads", default=n_heads)
    head_dim = h // n_heads
    tied = c.flag("tie_word_embeddings", False)
    qk_ln = c.flag("qk_layernorm", False)
    b = _Builder()
    b.add("model.embed_tokens.weight", vocab, h)
    for i in range(n_layers):
        p = f"model.layers.{i}."
        b.norm(p + "input_layernorm", h, bias=True)
        b.add(p + "self_attn.q_proj.weight", n_heads * head_dim, h, bias=True)
        b.add(p + "self_attn.k_proj.weight", kv_heads * head_dim, h, bias=True)
        b.add(p + "self_attn.v_proj.weight", kv_heads * head_dim, h, bias=True)
        b.add(p + "self_attn.dense.weight", h, n_heads * head_dim, bias=True)
        if qk_ln:
            b.norm(p + "self_attn.q_layernorm", head_dim, bias=True)
            b.norm(p + "self_attn.k_layernorm", head_dim, bias=True)
        b.add(p + "mlp.fc1.weight", inter, h, bias=True)
        b.add(p + "mlp.fc2.weight", h, inter, bias=True)
    b.norm("model.final_layernorm", h, bias=True)
    if not tied:
        b.add("lm_head.weight", vocab, h, bias=True)
    return _decoder_spec(b, "phi", n_layers, h, n_heads, kv_heads, head_dim, inter, vocab,
                         gated=False, tied=tied)  # fmt: skip


def _decoder_spec(
    b: _Builder,
    arch: str,
    n_layers: int,
    h: int,
    n_heads: int,
    kv_heads: int,
    head_dim: int,
    inter: int,
    vocab: int,
    *,
    gated: bool,
    tied: bool,
) -> ModelSpec:
    return ModelSpec(
        name=arch,
        source="config",
        tensors=_with_use(b.tensors, tied=tied, is_decoder=True, expert_use=None),
        architecture=arch,
        n_layers=n_layers,
        hidden_size=h,
        n_heads=n_heads,
        n_kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=inter,
        active_intermediate=inter,
        vocab_size=vocab,
        gated_mlp=gated,
        is_decoder=True,
        tied_embeddings=tied,
    )


def _bert(cfg: Mapping[str, Any], arch: str) -> ModelSpec:
    c = _Cfg(cfg, arch)
    h = c.int("hidden_size")
    n_layers = c.int("num_hidden_layers")
    n_heads = c.int("num_attention_heads")
    inter = c.int("intermediate_size")
    vocab = c.int("vocab_size")
    positions = c.int("max_position_embeddings")
    c.check()
    types = c.int("type_vocab_size", default=2)
    b = _Builder()
    b.add("embeddings.word_embeddings.weight", vocab, h)
    b.add("embeddings.position_embeddings.weight", positions, h)
    if types:
        b.add("embeddings.token_type_embeddings.weight", types, h)
    b.norm("embeddings.LayerNorm", h, bias=True)
    for i in range(n_layers):
        p = f"encoder.layer.{i}."
        for proj in ("query", "key", "value"):
            b.add(p + f"attention.self.{proj}.weight", h, h, bias=True)
        b.add(p + "attention.output.dense.weight", h, h, bias=True)
        b.norm(p + "attention.output.LayerNorm", h, bias=True)
        b.add(p + "intermediate.dense.weight", inter, h, bias=True)
        b.add(p + "output.dense.weight", h, inter, bias=True)
        b.norm(p + "output.LayerNorm", h, bias=True)
    b.add("pooler.dense.weight", h, h, bias=True)
    return _encoder_spec(b, arch, n_layers, h, n_heads, inter, vocab)


def _distilbert(cfg: Mapping[str, Any]) -> ModelSpec:
    c = _Cfg(cfg, "distilbert")
    h = c.int("dim", "hidden_size")
    n_layers = c.int("n_layers", "num_hidden_layers")
    n_heads = c.int("n_heads", "num_attention_heads")
    inter = c.int("hidden_dim", "intermediate_size")
    vocab = c.int("vocab_size")
    positions = c.int("max_position_embeddings")
    c.check()
    b = _Builder()
    b.add("embeddings.word_embeddings.weight", vocab, h)
    b.add("embeddings.position_embeddings.weight", positions, h)
    b.norm("embeddings.LayerNorm", h, bias=True)
    for i in range(n_layers):
        p = f"transformer.layer.{i}."
        for proj in ("q_lin", "k_lin", "v_lin", "out_lin"):
            b.add(p + f"attention.{proj}.weight", h, h, bias=True)
        b.norm(p + "sa_layer_norm", h, bias=True)
        b.add(p + "ffn.lin1.weight", inter, h, bias=True)
        b.add(p + "ffn.lin2.weight", h, inter, bias=True)
        b.norm(p + "output_layer_norm", h, bias=True)
    return _encoder_spec(b, "distilbert", n_layers, h, n_heads, inter, vocab)


def _encoder_spec(
    b: _Builder, arch: str, n_layers: int, h: int, n_heads: int, inter: int, vocab: int
) -> ModelSpec:
    return ModelSpec(
        name=arch,
        source="config",
        tensors=_with_use(b.tensors, tied=False, is_decoder=False, expert_use=None),
        architecture=arch,
        n_layers=n_layers,
        hidden_size=h,
        n_heads=n_heads,
        n_kv_heads=n_heads,
        head_dim=h // n_heads if n_heads else None,
        intermediate_size=inter,
        active_intermediate=inter,
        vocab_size=vocab,
        gated_mlp=False,
        is_decoder=False,
        tied_embeddings=None,
    )
