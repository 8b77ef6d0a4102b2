"""Tensor names across checkpoint kinds: llama.cpp GGUF names to transformers names, and the
q/k row order llama.cpp's converter uses.

Readers, writers and the model builder (``lowbit.models.build``) all use these, so they
live with the checkpoints.
"""

from __future__ import annotations

import re

import numpy as np

from lowbit.errors import LowbitError

__all__ = ["gguf_to_hf_name", "unpermute_qk"]

# llama.cpp tensor names (gguf-py/gguf/tensor_mapping.py, LLAMA) -> transformers' LlamaModel names
_GGUF_LLAMA_NAMES = [
    (r"token_embd\.weight", "model.embed_tokens.weight"),
    (r"output_norm\.weight", "model.norm.weight"),
    (r"output\.weight", "lm_head.weight"),
    (r"blk\.(\d+)\.attn_norm\.weight", r"model.layers.\1.input_layernorm.weight"),
    (r"blk\.(\d+)\.ffn_norm\.weight", r"model.layers.\1.post_attention_layernorm.weight"),
    (r"blk\.(\d+)\.attn_q\.(weight|bias)", r"model.layers.\1.self_attn.q_proj.\2"),
    (r"blk\.(\d+)\.attn_k\.(weight|bias)", r"model.layers.\1.self_attn.k_proj.\2"),
    (r"blk\.(\d+)\.attn_v\.(weight|bias)", r"model.layers.\1.self_attn.v_proj.\2"),
    (r"blk\.(\d+)\.attn_output\.(weight|bias)", r"model.layers.\1.self_attn.o_proj.\2"),
    (r"blk\.(\d+)\.ffn_gate\.weight", r"model.layers.\1.mlp.gate_proj.weight"),
    (r"blk\.(\d+)\.ffn_up\.weight", r"model.layers.\1.mlp.up_proj.weight"),
    (r"blk\.(\d+)\.ffn_down\.weight", r"model.layers.\1.mlp.down_proj.weight"),
]
_GGUF_ARCHS = ("llama",)


def gguf_to_hf_name(name: str) -> str:
    """The transformers ``LlamaForCausalLM`` name of a llama.cpp GGUF tensor.

    Raises:
        LowbitError: a tensor with no llama counterpart (e.g. ``rope_freqs.weight``).
    """
    for pattern, repl in _GGUF_LLAMA_NAMES:
        if re.fullmatch(pattern, name):
            return re.sub(pattern, repl, name)
    raise LowbitError(f"GGUF tensor {name!r} has no counterpart in a transformers llama model")


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
