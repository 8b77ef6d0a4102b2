"""A Hugging Face folder's tensor shapes against its ``config.json``, before any route uses them.

A folder whose tensors contradict its config (a projection of another width, a transposed
MLP matrix, an embedding of another vocabulary, a mixture missing an expert or with one of
another shape) was quantized and written by some routes (lowbit, compressed-tensors, MLX and
GGUF outputs that transformers, vLLM or llama.cpp then refuse), stacked into a traceback by
others, and refused only after the whole model was allocated by ``lowbit eval`` (issue 41).
:func:`check_tensor_shapes` compares every tensor whose shape the config fixes with that
shape, and a mixture's experts with the expert count, in one ``LowbitError`` line naming the
tensor, its shape and the config's, before anything is read or allocated.

It covers the families lowbit converts and builds (llama, mistral, mixtral, qwen2, qwen3,
qwen2_moe, qwen3_moe, gemma, gemma2, gemma3_text, phi3), their unprefixed transformers names
and float tensors (quantized or packed tensors have their own shapes, checked by their
readers); other tensors and families are left alone.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from lowbit.checkpoints.config_checks import check_config
from lowbit.errors import LowbitError

__all__ = ["check_checkpoint_shapes", "check_tensor_shapes"]

_FAMILIES = {"llama", "mistral", "mixtral", "qwen2", "qwen3", "qwen2_moe", "qwen3_moe",
             "gemma", "gemma2", "gemma3_text", "phi3"}  # fmt: skip
_LAYER = re.compile(r"^model\.layers\.(\d{1,6})\.(.+)$")
_EXPERT = re.compile(r"^(block_sparse_moe|mlp)\.experts\.(\d{1,6})\.(\w+)\.weight$")
_EXPERT_PARTS = {"block_sparse_moe": ("w1", "w2", "w3"),
                 "mlp": ("gate_proj", "up_proj", "down_proj")}  # fmt: skip


def _int(cfg: Mapping[str, Any], *keys: str) -> int | None:
    for k in keys:
        v = cfg.get(k)
        if type(v) is int and v > 0:
            return v
    return None


def _expected(cfg: Mapping[str, Any]) -> tuple[dict[str, tuple[int, ...]], dict[str, Any]]:
    """Shapes the config fixes: top-level names, and per-layer names (after ``layers.N.``);
    the experts' shapes by part name."""
    h, v = _int(cfg, "hidden_size"), _int(cfg, "vocab_size")
    nh = _int(cfg, "num_attention_heads")
    kv = _int(cfg, "num_key_value_heads") or nh
    hd = _int(cfg, "head_dim") or (h // nh if h and nh and h % nh == 0 else None)
    inter = _int(cfg, "intermediate_size")
    moe = _int(cfg, "moe_intermediate_size") or inter
    shared = _int(cfg, "shared_expert_intermediate_size")
    n_exp = _int(cfg, "num_local_experts", "num_experts")
    top: dict[str, tuple[int, ...]] = {}
    layer: dict[str, tuple[int, ...]] = {}
    if h and v:
        top["model.embed_tokens.weight"] = top["lm_head.weight"] = (v, h)
    if h:
        top["model.norm.weight"] = (h,)
        for n in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                  "post_feedforward_layernorm"):  # fmt: skip
            layer[f"{n}.weight"] = (h,)
    if h and nh and kv and hd:
        q, k = nh * hd, kv * hd
        layer |= {"self_attn.q_proj.weight": (q, h), "self_attn.k_proj.weight": (k, h),
                  "self_attn.v_proj.weight": (k, h), "self_attn.o_proj.weight": (h, q),
                  "self_attn.q_proj.bias": (q,), "self_attn.k_proj.bias": (k,),
                  "self_attn.v_proj.bias": (k,), "self_attn.qkv_proj.weight": (q + 2 * k, h)}  # fmt: skip
    if h and inter:
        layer |= {"mlp.gate_proj.weight": (inter, h), "mlp.up_proj.weight": (inter, h),
                  "mlp.down_proj.weight": (h, inter), "mlp.gate_up_proj.weight": (2 * inter, h)}  # fmt: skip
    if h and shared:
        layer |= {"mlp.shared_expert.gate_proj.weight": (shared, h),
                  "mlp.shared_expert.up_proj.weight": (shared, h),
                  "mlp.shared_expert.down_proj.weight": (h, shared),
                  "mlp.shared_expert_gate.weight": (1, h)}  # fmt: skip
    experts: dict[str, Any] = {"count": n_exp}
    if h and n_exp:
        layer["block_sparse_moe.gate.weight"] = layer["mlp.gate.weight"] = (n_exp, h)
    if h and inter:
        experts |= {"w1": (inter, h), "w3": (inter, h), "w2": (h, inter)}
    if h and moe:
        experts |= {"gate_proj": (moe, h), "up_proj": (moe, h), "down_proj": (h, moe)}
    return {**top, **{f"layer:{k}": s for k, s in layer.items()}}, experts


def check_tensor_shapes(
    cfg: Mapping[str, Any] | None,
    tensors: Iterable[tuple[str, tuple[int, ...], str]],
    where: str,
) -> None:
    """Refuse tensors whose shapes contradict the config, and a mixture missing experts.

    Args:
        cfg: the folder's config (None or another family: nothing is checked).
        tensors: ``(name, shape, dtype)`` of each tensor (GGUF-style dtype names: ``F32``...).
        where: the folder, for messages.

    Raises:
        LowbitError: one line naming the first tensor that contradicts the config.
    """
    if not isinstance(cfg, Mapping) or cfg.get("model_type") not in _FAMILIES:
        return
    want, experts = _expected(cfg)
    seen: dict[tuple[int, str], set[str]] = {}  # (layer, prefix) -> "expert.part" seen
    for name, shape, dtype in tensors:
        if not str(dtype).upper().startswith(("F", "BF")):
            continue  # packed or integer-coded: its reader checks its own shape
        key = name
        if m := _LAYER.match(name):
            rest = m.group(2)
            key = f"layer:{rest}"
            if e := _EXPERT.match(rest):
                prefix, idx, part = e.group(1), int(e.group(2)), e.group(3)
                seen.setdefault((int(m.group(1)), prefix), set()).add(f"{idx}.{part}")
                count = experts.get("count")
                if count is not None and idx >= count:
                    raise LowbitError(f"{where}: tensor {name!r} is expert {idx}, but config.json "
                                      f"has {count} experts")  # fmt: skip
                expected = experts.get(part)
                if expected is not None:
                    _compare(where, name, tuple(shape), expected)
                continue
        expected = want.get(key)
        if expected is not None:
            _compare(where, name, tuple(shape), expected)
    count = experts.get("count")
    for (layer, prefix), parts in seen.items():
        for idx in range(count or 0):
            for part in _EXPERT_PARTS[prefix]:
                if f"{idx}.{part}" not in parts:
                    raise LowbitError(
                        f"{where}: layer {layer} lacks expert {idx}'s {part} "
                        f"(model.layers.{layer}.{prefix}.experts.{idx}.{part}.weight); "
                        f"config.json has {count} experts"
                    )


def check_checkpoint_shapes(checkpoint: Any) -> None:
    """:func:`check_tensor_shapes` on an open Hugging Face or compressed-tensors checkpoint
    (GGUF, MLX and lowbit checkpoints name and lay out tensors their own way: skipped).

    Raises:
        LowbitError: as :func:`check_tensor_shapes`.
    """
    if getattr(checkpoint, "format", None) not in ("safetensors", "huggingface",
                                                   "compressed-tensors"):  # fmt: skip
        return
    cfg = checkpoint.config
    if not isinstance(cfg, Mapping) or cfg.get("model_type") not in _FAMILIES:
        return
    infos = [checkpoint.info(n) for n in checkpoint.names()]
    # the fields first (a vocab_size of 10^8 is named as such, not as an embedding's shape)
    check_config(cfg, str(Path(checkpoint.path) / "config.json"),
                 tensors=((i.name, tuple(i.shape)) for i in infos))  # fmt: skip
    check_tensor_shapes(
        cfg, ((i.name, tuple(i.shape), str(i.dtype)) for i in infos), str(checkpoint.path)
    )


def _compare(where: str, name: str, shape: tuple[int, ...], expected: tuple[int, ...]) -> None:
    if shape != expected:
        hint = " (transposed)" if shape == expected[::-1] else ""
        raise LowbitError(
            f"{where}: tensor {name!r} has shape {list(shape)}{hint}, but config.json makes it "
            f"{list(expected)}"
        )
