"""Checkpoints for the report's picture tests: a tiny Llama under a mixed plan (int4, int5,
int6, int8 and kept tensors) and a tiny Mixtral-named mixture-of-experts checkpoint written
from named random arrays (the report needs only the names)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from lowbit.cli import main
from tiny_models import save_hf_folder, tiny_llama

#: The mixed plan's rules: one scheme per tensor kind of the tiny Llama (q, k, v, o: int4,
#: int5, int6, int8; the MLP int4 with a bigger group); the norms stay kept.
MIXED_RULES = [
    {"match": "*q_proj*", "format": "int4:g32"},
    {"match": "*k_proj*", "format": "int5:g32"},
    {"match": "*v_proj*", "format": "int6:g32"},
    {"match": "*o_proj*", "format": "int8:ch"},
    {"match": "*gate_proj*", "format": "int4:g64"},
    {"match": "*up_proj*", "format": "int4:g64"},
    {"match": "*down_proj*", "format": "int5:g32"},
]
#: The schemes the mixed checkpoint holds, by tensor kind.
MIXED_SCHEMES = {
    "self_attn.q_proj": "int4:g32:fp32",
    "self_attn.k_proj": "int5:g32:fp32",
    "self_attn.v_proj": "int6:g32:fp32",
    "self_attn.o_proj": "int8:ch:fp32",
    "mlp.gate_proj": "int4:g64:fp32",
    "mlp.up_proj": "int4:g64:fp32",
    "mlp.down_proj": "int5:g32:fp32",
}
#: The tiny Llama's kinds in block order.
LLAMA_ORDER = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
               "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj", "input_layernorm",
               "post_attention_layernorm"]  # fmt: skip

#: The MoE checkpoint: 2 layers, 4 experts of Mixtral's w1/w2/w3, a router, attention, norms.
MOE_LAYERS, MOE_EXPERTS = 2, 4


def mixed_llama(root: Path) -> Path:
    """A lowbit checkpoint of a random tiny Llama under :data:`MIXED_RULES`."""
    root.mkdir(parents=True, exist_ok=True)
    src = save_hf_folder(tiny_llama(seed=3), root / "src")
    plan = root / "plan.json"
    plan.write_text(json.dumps({"rules": MIXED_RULES}), encoding="utf-8")
    out = root / "mixed"
    argv = ["quantize", str(src), "--plan", str(plan), "--out", str(out), "--no-progress"]
    assert main(argv) == 0
    return out


def moe_names(family: str = "mixtral") -> dict[str, tuple[int, ...]]:
    """Tensor names (in a shuffled order, as a file may hold them) and shapes of a tiny
    Mixtral (``block_sparse_moe.experts.N.w1/w2/w3``, router ``block_sparse_moe.gate``) or
    Qwen-MoE (``mlp.experts.N.gate_proj/up_proj/down_proj``, router ``mlp.gate``, a shared
    expert ``mlp.shared_expert.*`` with its ``mlp.shared_expert_gate``)."""
    d, ff = 64, 64
    names: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (32, d)}
    if family == "mixtral":
        moe, router, parts = "block_sparse_moe", "block_sparse_moe.gate", ("w2", "w1", "w3")
    else:
        moe, router, parts = "mlp", "mlp.gate", ("down_proj", "gate_proj", "up_proj")
    for i in range(MOE_LAYERS):
        p = f"model.layers.{i}."
        names[p + "input_layernorm.weight"] = (d,)
        for w in parts:
            for e in range(MOE_EXPERTS):
                shape = (d, ff) if w in ("w2", "down_proj") else (ff, d)
                names[p + f"{moe}.experts.{e}.{w}.weight"] = shape
        if family != "mixtral":
            for w in parts:
                names[p + f"mlp.shared_expert.{w}.weight"] = (
                    (d, ff) if w == "down_proj" else (ff, d)
                )
            names[p + "mlp.shared_expert_gate.weight"] = (1, d)
        names[p + router + ".weight"] = (MOE_EXPERTS, d)
        for t in ("v", "o", "q", "k"):
            names[p + f"self_attn.{t}_proj.weight"] = (d, d)
        names[p + "post_attention_layernorm.weight"] = (d,)
    names["model.norm.weight"] = (d,)
    return names


def moe_checkpoint(root: Path, family: str = "mixtral") -> Path:
    """A lowbit checkpoint of :func:`moe_names` as random arrays: the experts' gate and up
    int4, their down int8, the router, shared expert and attention int6 (the 1-row shared
    expert gate kept), norms and embeddings kept."""
    from safetensors.numpy import save_file

    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    names = moe_names(family)
    arrays = {n: rng.normal(0, 0.05, s).astype(np.float32) for n, s in names.items()}
    src = root / "moe.safetensors"
    save_file(arrays, str(src))
    plan = root / "moe-plan.json"
    rules = [
        {"match": "*embed*", "format": "keep"},
        {"match": ["*experts.*.w2*", "*experts.*.down_proj*"], "format": "int8:ch"},
        {"match": "*.experts.*", "format": "int4:g32"},
        {"match": "*shared_expert_gate*", "format": "keep"},
        {"match": "*", "ndim": 2, "format": "int6:g32"},
    ]
    plan.write_text(json.dumps({"rules": rules}), encoding="utf-8")
    out = root / "moe"
    argv = ["quantize", str(src), "--plan", str(plan), "--out", str(out), "--no-progress"]
    assert main(argv) == 0
    return out
