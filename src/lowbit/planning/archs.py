"""How many parameters a model has, where they sit, and what shape the attention is.

Three ways in, one result (:class:`~lowbit.planning.modelspec.ModelSpec`: named tensors plus the
architecture numbers the planner needs for the KV cache and activations):

- a Hugging Face ``config.json`` (:func:`spec_from_config`): the tensors are built from the
  architecture, with the names ``transformers`` gives them, for llama, mistral, mixtral, qwen2,
  qwen2_moe, qwen3, qwen3_moe, gemma, gemma2, gemma3_text, phi3, granite, phi, gpt2, gpt_neox,
  bert, roberta, xlm-roberta and distilbert; an unknown ``model_type`` that has the llama
  fields is counted as a llama-style decoder (with a warning), else the error names the
  missing fields;
- a checkpoint (:func:`spec_from_checkpoint`): a safetensors file or folder, or a GGUF file,
  counted from the headers (:mod:`lowbit.checkpoints.headers`; no tensor data is read), with the
  architecture numbers from a ``config.json`` beside it or the GGUF metadata;
- a bare count (:func:`spec_from_params`, ``"7B"``, ``"135M"``): one anonymous tensor.

:func:`load_spec` takes any of these (and the shipped model names ``smollm2``, ``minilm``).
"""

from __future__ import annotations

import json
import re
import warnings
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from lowbit.checkpoints.headers import read_gguf_header, read_safetensors_header
from lowbit.errors import LowbitError
from lowbit.planning.modelspec import (
    COMPONENTS,
    ModelSpec,
    TensorInfo,
    _with_use,
    classify,
    parse_params,
    spec_from_params,
)

__all__ = [
    "COMPONENTS",
    "KNOWN_ARCHITECTURES",
    "ModelSpec",
    "TensorInfo",
    "classify",
    "load_config",
    "load_spec",
    "parse_params",
    "read_gguf_header",
    "read_safetensors_header",
    "spec_from_checkpoint",
    "spec_from_config",
    "spec_from_params",
]


# ---------------------------------------------------------------------------------------
# config.json
# ---------------------------------------------------------------------------------------

_LLAMA_LIKE = {
    "llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "gemma",
    "gemma2", "gemma3_text", "phi3", "granite", "smollm3",
}  # fmt: skip
_TIED_DEFAULT = {"gemma": True, "gemma2": True, "gemma3_text": True, "gpt2": True, "bert": True}
_ENCODERS = {"bert", "roberta", "xlm-roberta", "distilbert"}
KNOWN_ARCHITECTURES = tuple(sorted(_LLAMA_LIKE | _ENCODERS | {"gpt2", "gpt_neox", "phi"}))
_LLAMA_FIELDS = (
    "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size",
)  # fmt: skip


def load_config(path: str | Path) -> dict[str, Any]:
    """Read a ``config.json`` (or a folder holding one) as a dict.

    Raises:
        LowbitError: not JSON, or not a JSON object.
    """
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    try:
        cfg = json.loads(p.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise LowbitError(f"malformed config {p}: not valid JSON ({exc})") from None
    if not isinstance(cfg, dict):
        raise LowbitError(f"malformed config {p}: expected a JSON object, got {type(cfg).__name__}")
    return cfg


class _Cfg:
    """Typed access to config fields that records every missing or bad field at once."""

    def __init__(self, cfg: Mapping[str, Any], arch: str) -> None:
        self.cfg, self.arch, self.missing = cfg, arch, []

    def int(self, *keys: str, default: int | None = None, required: bool = True) -> int:
        for k in keys:
            v = self.cfg.get(k)
            if v is not None:
                if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                    raise LowbitError(
                        f"malformed config: {k} must be a non-negative integer, got {v!r}"
                    )
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


def spec_from_config(config: Mapping[str, Any] | str | Path, name: str | None = None) -> ModelSpec:
    """Count a model's parameters from its Hugging Face config.

    Args:
        config: the parsed ``config.json`` dict, or a path to it (or to its folder).
        name: a display name (default: the config's ``_name_or_path`` or the file name).

    Returns:
        The tensors ``transformers`` would create (base model plus LM head for decoders;
        for encoders the base model with pooler, as ``AutoModel`` loads it).

    Raises:
        LowbitError: malformed config, or an unknown architecture lacking the fields of a
            llama-style decoder (the message lists the missing fields).
    """
    path = None
    if not isinstance(config, Mapping):
        path = Path(config)
        config = load_config(path)
        name = name or (path.parent.name if path.name == "config.json" else path.stem)
    cfg = dict(config)
    arch = str(cfg.get("model_type") or "").lower()
    name = name or str(cfg.get("_name_or_path") or arch or "model")
    notes: list[str] = []
    if arch in _LLAMA_LIKE:
        spec = _llama_like(cfg, arch)
    elif arch == "gpt2":
        spec = _gpt2(cfg)
    elif arch == "gpt_neox":
        spec = _gpt_neox(cfg)
    elif arch == "phi":
        spec = _phi(cfg)
    elif arch in ("bert", "roberta", "xlm-roberta"):
        spec = _bert(cfg, arch)
    elif arch == "distilbert":
        spec = _distilbert(cfg)
    else:
        missing = [k for k in _LLAMA_FIELDS if cfg.get(k) is None]
        if missing:
            raise LowbitError(
                f"unknown architecture {arch or '(no model_type)'!r}; known: "
                f"{', '.join(KNOWN_ARCHITECTURES)}. To count it as a llama-style decoder the "
                f"config needs {', '.join(missing)}; or give a checkpoint to count its tensors"
            )
        note = f"unknown architecture {arch!r} counted as a llama-style decoder"
        warnings.warn(note, stacklevel=2)
        notes.append(note)
        spec = _llama_like(cfg, "llama")
    if cfg.get("quantization_config"):
        notes.append("config has a quantization_config: counts are of the unquantized model")
    return replace(
        spec,
        name=name,
        architecture=arch or spec.architecture,
        path=str(path) if path else None,
        notes=tuple(notes),
    )


class _Builder:
    """Collects tensors with their components."""

    def __init__(self) -> None:
        self.tensors: list[TensorInfo] = []

    def add(self, name: str, *shape: int, bias: bool = False) -> None:
        self.tensors.append(TensorInfo(name, tuple(shape), classify(name, len(shape))))
        if bias:
            b = name.rsplit(".", 1)[0] + ".bias"
            self.tensors.append(TensorInfo(b, (shape[0],), classify(b, 1)))

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
    kv_heads = c.int("num_key_value_heads", default=n_heads)
    head_dim = c.int("head_dim", default=h // n_heads)
    q_dim, kv_dim = n_heads * head_dim, kv_heads * head_dim
    tied = c.flag("tie_word_embeddings", _TIED_DEFAULT.get(arch, False))
    attn_bias = c.flag("attention_bias", False)
    qkv_bias = attn_bias or arch in ("qwen2", "qwen2_moe")
    mlp_bias = c.flag("mlp_bias", False)
    top_k = c.int("num_experts_per_tok", default=2 if moe_experts else 0) if moe_experts else 0
    sparse_step = c.int("decoder_sparse_step", default=1) or 1
    mlp_only = set(cfg.get("mlp_only_layers") or [])
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


# ---------------------------------------------------------------------------------------
# Checkpoints
# ---------------------------------------------------------------------------------------


def _gguf_spec(path: Path) -> ModelSpec:
    tensors, meta = read_gguf_header(path)
    arch = str(meta.get("general.architecture", "")) or None

    def m(key: str) -> int | None:
        v = meta.get(f"{arch}.{key}")
        if isinstance(v, list):  # per-layer values (some archs): take the first
            v = v[0] if v else None
        return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None

    h, n_heads = m("embedding_length"), m("attention.head_count")
    kv_heads = m("attention.head_count_kv") or n_heads
    head_dim = m("attention.key_length") or (h // n_heads if h and n_heads else None)
    vocab = m("vocab_size") or meta.get("tokenizer.ggml.tokens")
    n_exp, k_exp = m("expert_count"), m("expert_used_count")
    names = {t.name for t in tensors}
    tied = "output.weight" not in names
    is_decoder = arch not in ("bert", "nomic-bert", "jina-bert-v2", "t5encoder")
    inter = m("feed_forward_length") or m("expert_feed_forward_length")
    notes = []
    if tied and is_decoder:
        notes.append("no output.weight: lm_head tied to token_embd")
    return ModelSpec(
        name=str(meta.get("general.name") or path.stem),
        source="gguf",
        tensors=_with_use(tensors, tied=tied, is_decoder=is_decoder,
                          expert_use=(k_exp / n_exp) if n_exp and k_exp else None),
        architecture=arch,
        n_layers=m("block_count"),
        hidden_size=h,
        n_heads=n_heads,
        n_kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=inter,
        active_intermediate=(k_exp * inter if n_exp and k_exp and inter else inter),
        vocab_size=int(vocab) if isinstance(vocab, int) else None,
        gated_mlp=any(".ffn_gate" in n for n in names),
        is_decoder=is_decoder,
        tied_embeddings=tied,
        n_experts=n_exp,
        n_active_experts=k_exp,
        path=str(path),
        notes=tuple(notes),
    )  # fmt: skip


def _shard_files(folder: Path) -> list[Path]:
    """The shards an index names (a folder may also hold e.g. consolidated.safetensors)."""
    index = folder / "model.safetensors.index.json"
    if not index.exists():
        return sorted(folder.glob("*.safetensors"))
    try:
        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        names = sorted(set(weight_map.values()))
    except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
        raise LowbitError(f"malformed {index}: {exc!r}") from None
    missing = [n for n in names if not (folder / n).exists()]
    if missing:
        raise LowbitError(f"{index} names shards that are not there: {', '.join(missing)}")
    return [folder / n for n in names]


def _safetensors_spec(path: Path) -> ModelSpec:
    files = _shard_files(path) if path.is_dir() else [path]
    if not files:
        raise LowbitError(f"no *.safetensors files in {path}")
    tensors: list[TensorInfo] = []
    for f in files:
        tensors.extend(read_safetensors_header(f)[0])
    folder = path if path.is_dir() else path.parent
    notes: list[str] = []
    base: ModelSpec | None = None
    if (folder / "config.json").exists():
        try:
            base = spec_from_config(folder / "config.json")
        except LowbitError as exc:
            notes.append(f"config.json not used ({exc}); counted from the tensors")
    name = folder.name if path.is_dir() else path.stem
    if base is None:
        layers = {int(m.group(1)) for t in tensors if (m := re.search(r"layers?\.(\d+)\.", t.name))}
        tied = not any(t.component == "lm_head" for t in tensors)
        if not (folder / "config.json").exists():
            notes.append("no config.json: no KV cache or activation estimate")
        return ModelSpec(
            name=name,
            source="safetensors",
            tensors=_with_use(tensors, tied=tied, is_decoder=True, expert_use=None),
            n_layers=max(layers) + 1 if layers else None,
            tied_embeddings=tied,
            path=str(path),
            notes=tuple(notes),
        )
    expert_use = (
        base.n_active_experts / base.n_experts if base.n_experts and base.n_active_experts else None
    )
    counted = sum(t.numel for t in tensors if t.component != "buffer")
    if counted != base.params:
        notes.append(
            f"the tensors hold {counted:,} parameters, the config describes {base.params:,}: "
            "the tensors are used"
        )
    return replace(
        base,
        name=name,
        source="safetensors",
        tensors=_with_use(
            tensors,
            tied=bool(base.tied_embeddings),
            is_decoder=base.is_decoder,
            expert_use=expert_use,
        ),
        path=str(path),
        notes=base.notes + tuple(notes),
    )


def spec_from_checkpoint(path: str | Path) -> ModelSpec:
    """Count a checkpoint's parameters from its header(s): safetensors file or folder, GGUF.

    A ``config.json`` beside safetensors supplies the architecture numbers (layers, heads,
    KV heads); the parameter count always comes from the tensors. An unknown architecture in
    that config is noted and the tensors are used alone.

    Raises:
        LowbitError: not a checkpoint, or a malformed header.
        FileNotFoundError: the path does not exist.
    """
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(2, "No such file or directory", str(p))
    if p.is_dir():
        ggufs = sorted(p.glob("*.gguf"))
        if not list(p.glob("*.safetensors")) and len(ggufs) == 1:
            return _gguf_spec(ggufs[0])
        return _safetensors_spec(p)
    with open(p, "rb") as f:
        magic = f.read(4)
    if magic == b"GGUF":
        return _gguf_spec(p)
    if p.suffix == ".safetensors":
        return _safetensors_spec(p)
    raise LowbitError(f"{p} is not a checkpoint lowbit can count (safetensors or GGUF)")


def load_spec(model: Any, name: str | None = None) -> ModelSpec:
    """Turn anything :func:`lowbit.plan` accepts into a :class:`ModelSpec`.

    Accepts a :class:`ModelSpec`; a count (``7e9``, ``"7B"``); a config dict; a shipped model
    name (``"smollm2"``, ``"minilm"``); or a path to a ``config.json``, a safetensors file or
    folder, or a ``.gguf`` file.
    """
    from lowbit.checkpoints.shipped import DEFAULT_MODELS, default_model_key, default_model_path

    if isinstance(model, ModelSpec):
        return model
    if isinstance(model, Mapping):
        return spec_from_config(model, name)
    if isinstance(model, (int, float)) and not isinstance(model, bool):
        return spec_from_params(model, name)
    if isinstance(model, str) and re.fullmatch(
        r"\s*[0-9][0-9_,.]*(e[0-9]+)?\s*[kmbgt]?\s*", model, re.I
    ):
        return spec_from_params(model, name)
    if isinstance(model, str) and default_model_key(model) and not Path(model).exists():
        key = default_model_key(model)
        name = name or DEFAULT_MODELS[key].title  # type: ignore[index]
        model = default_model_path(model)
    if not isinstance(model, (str, Path)):
        raise LowbitError(f"cannot plan a {type(model).__name__}: give a path, a config or a count")
    p = Path(model)
    if p.is_file() and p.suffix == ".json":
        spec = spec_from_config(p, name)
    elif p.is_dir() and not any(p.glob("*.safetensors")) and not any(p.glob("*.gguf")):
        if not (p / "config.json").exists():
            raise LowbitError(f"{p} holds no config.json, *.safetensors or *.gguf")
        spec = spec_from_config(p / "config.json", name or p.name)
    else:
        spec = spec_from_checkpoint(p)
    return replace(spec, name=name) if name else spec
