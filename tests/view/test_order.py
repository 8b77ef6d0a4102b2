"""The block order of tensor kinds: every family's names come out as data flows through a
block (attention in, attention out, router, MLP in, MLP out, unknown, norms)."""

from __future__ import annotations

import random

import pytest

from lowbit.view._order import block_order, block_rank, expert_groups, split_expert
from lowbit.view.report import layer_and_kind

# each family's kinds in the order its block computes them
FAMILIES = {
    "llama-gguf": ["attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up",
                   "ffn_down", "attn_norm", "ffn_norm"],
    "llama-hf": ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                 "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj", "input_layernorm",
                 "post_attention_layernorm"],
    "qwen2-bias": ["self_attn.q_proj", "self_attn.q_proj.bias", "self_attn.k_proj",
                   "self_attn.k_proj.bias", "self_attn.v_proj", "self_attn.v_proj.bias",
                   "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj",
                   "input_layernorm", "post_attention_layernorm"],
    "qwen3-qk-norm": ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                      "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj",
                      "input_layernorm", "self_attn.q_norm", "self_attn.k_norm",
                      "post_attention_layernorm"],
    "gemma2": ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
               "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj", "input_layernorm",
               "post_attention_layernorm", "pre_feedforward_layernorm",
               "post_feedforward_layernorm"],
    "bert-hf": ["attention.self.query", "attention.self.query.bias", "attention.self.key",
                "attention.self.key.bias", "attention.self.value", "attention.self.value.bias",
                "attention.output.dense", "attention.output.dense.bias", "intermediate.dense",
                "intermediate.dense.bias", "output.dense", "output.dense.bias",
                "attention.output.LayerNorm", "attention.output.LayerNorm.bias",
                "output.LayerNorm", "output.LayerNorm.bias"],
    "bert-gguf": ["attn_q", "attn_k", "attn_v", "attn_output", "ffn_up", "ffn_down",
                  "attn_output_norm", "layer_output_norm"],
    "gpt2": ["attn.c_attn", "attn.c_attn.bias", "attn.c_proj", "mlp.c_fc", "mlp.c_proj",
             "ln_1", "ln_2"],
    "neox": ["attention.query_key_value", "attention.dense", "mlp.dense_h_to_4h",
             "mlp.dense_4h_to_h", "input_layernorm", "post_attention_layernorm"],
    "phi3": ["self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj",
             "input_layernorm", "post_attention_layernorm"],
    "mixtral-hf": ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                   "self_attn.o_proj", "block_sparse_moe.gate",
                   "block_sparse_moe.experts.*.w1", "block_sparse_moe.experts.*.w3",
                   "block_sparse_moe.experts.*.w2", "input_layernorm",
                   "post_attention_layernorm"],
    "qwen-moe-hf": ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                    "self_attn.o_proj", "mlp.gate", "mlp.shared_expert_gate",
                    "mlp.experts.*.gate_proj", "mlp.experts.*.up_proj",
                    "mlp.experts.*.down_proj", "mlp.shared_expert.gate_proj",
                    "mlp.shared_expert.up_proj", "mlp.shared_expert.down_proj",
                    "input_layernorm", "post_attention_layernorm"],
    "moe-gguf": ["attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate_inp",
                 "ffn_gate_inp_shexp", "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps",
                 "ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp", "attn_norm", "ffn_norm"],
}  # fmt: skip


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_block_order_is_the_architectures(family: str) -> None:
    """Whatever order the names come in (alphabetical, reversed, shuffled), each family's
    kinds come out in its block's order."""
    want = FAMILIES[family]
    assert len({block_rank(k) for k in want}) == len(want)  # no ties: the order is derived
    rng = random.Random(0)
    for given in (sorted(want), sorted(want, reverse=True), rng.sample(want, len(want))):
        assert block_order(given) == want


def test_unknown_kinds_keep_their_order_between_mlp_and_norms() -> None:
    """Unknown kinds stay in the order given, after the MLP and before the norms."""
    got = block_order(["zeta", "attn_norm", "alpha", "ffn_down", "attn_q", "zeta"])
    assert got == ["attn_q", "ffn_down", "zeta", "alpha", "attn_norm"]


def test_split_expert_and_groups() -> None:
    """One expert's tensors name their group and index; groups come in block order (gate,
    up, down) with experts ascending numerically; GGUF's stacked experts are plain kinds."""
    assert split_expert("block_sparse_moe.experts.12.w1") == ("block_sparse_moe.experts.*.w1", 12)
    assert split_expert("mlp.experts.3.down_proj.bias") == ("mlp.experts.*.down_proj.bias", 3)
    assert split_expert("ffn_gate_exps") is None and split_expert("mlp.gate") is None
    kinds = [f"block_sparse_moe.experts.{e}.{w}" for w in ("w2", "w1", "w3") for e in (10, 2, 0)]
    assert expert_groups(kinds) == [
        ("block_sparse_moe.experts.*.w1", [0, 2, 10]),
        ("block_sparse_moe.experts.*.w3", [0, 2, 10]),
        ("block_sparse_moe.experts.*.w2", [0, 2, 10]),
    ]


def test_full_names_through_layer_and_kind() -> None:
    """Whole checkpoint names (HF Mixtral, Qwen-MoE, BERT, GGUF) reach the order through
    ``layer_and_kind`` with their layer and the kinds above."""
    assert layer_and_kind("model.layers.7.block_sparse_moe.experts.3.w2.weight") == (
        7, "block_sparse_moe.experts.3.w2")  # fmt: skip
    assert layer_and_kind("model.layers.0.mlp.experts.59.gate_proj.weight") == (
        0, "mlp.experts.59.gate_proj")  # fmt: skip
    assert layer_and_kind("encoder.layer.2.attention.self.query.bias") == (
        2, "attention.self.query.bias")  # fmt: skip
    assert layer_and_kind("blk.5.ffn_gate_exps.weight") == (5, "ffn_gate_exps")
