"""Activations as llama.cpp's CPU backend rounds them before a matrix product
(``lowbit eval --act llamacpp``).

llama.cpp never multiplies a quantized weight by float32 activations: ``ggml_compute_forward_mul_mat``
first converts the input rows to the weight type's ``vec_dot_type`` (ggml-cpu.c's
``type_traits_cpu``) and the dot product then runs on those codes. Which type, per weight type:

- ``Q8_0`` (blocks of 32) for Q4_0, Q5_0, Q8_0, IQ4_NL, MXFP4, NVFP4; ``Q8_1`` (the same codes,
  plus a block sum) for Q4_1, Q5_1 — x86's ``quantize_row_q8_0``/``q8_1``:
  ``amax`` of the block, ``id = 127 / amax`` in float32 (0 for an all-zero block), codes
  ``round_half_even(x * id)``, the scale stored as ``fp16(amax / 127)``; so the value the dot
  product sees is ``code * fp16(amax / 127)``. (Q8_1's block sum, rounded to fp16 and used
  with Q4_1/Q5_1's minimums, is not modelled: its rounding is a few parts in 10⁴ of one term.)
- ``Q8_K`` (blocks of 256) for Q2_K .. Q6_K, IQ4_XS, the IQ2/IQ3/IQ1 types and TQ1_0/TQ2_0 —
  ``quantize_row_q8_K_ref`` (x86 uses it unchanged; the repacked 4x8 path computes the same):
  ``iscale = -127 / max`` (``max`` the signed value of largest magnitude), codes
  ``min(127, round_half_even(iscale * x))``, scale ``1 / iscale`` kept in float32. Rounding is
  odd-symmetric, so this equals codes of ``x * (127 / amax)`` times ``1 / (127 / amax)``.
- ``F16`` for F16 weights and ``BF16`` for BF16 weights (the input rounded to that type, ties
  to even); F32 weights multiply float32 inputs unchanged.

Token embeddings are row lookups (no product) and are left alone; an output layer tied to the
token embedding multiplies by the embedding's type, as llama.cpp does when a GGUF has no
``output.weight``. What remains different from llama.cpp's numbers is summation order and
attention (llama.cpp's default F16 KV cache and its float16 accumulation; see
``lowbit.evaluation.act_modes.simulate_llamacpp_activations``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lowbit.checkpoints.gguf.names import gguf_expert_names, gguf_to_hf_name
from lowbit.errors import LowbitError
from lowbit.models.moe import checkpoint_rename

__all__ = ["VEC_DOT_TYPE", "fake_quantize_ggml", "gguf_linear_types", "vec_dot_type"]

_Q8_0 = ("Q4_0", "Q5_0", "Q8_0", "IQ4_NL", "MXFP4", "NVFP4", "Q1_0", "Q2_0")
_Q8_1 = ("Q4_1", "Q5_1")
_Q8_K = (
    "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS",
    "IQ3_S", "IQ1_S", "IQ1_M", "TQ1_0", "TQ2_0",
)  # fmt: skip

#: GGUF weight type -> the type llama.cpp's CPU backend converts a product's input to
#: (``type_traits_cpu[...].vec_dot_type`` at llama.cpp 0c1e570).
VEC_DOT_TYPE: Mapping[str, str] = {
    "F32": "F32",
    "F16": "F16",
    "BF16": "BF16",
    **dict.fromkeys(_Q8_0, "Q8_0"),
    **dict.fromkeys(_Q8_1, "Q8_1"),
    **dict.fromkeys(_Q8_K, "Q8_K"),
}

_BLOCK = {"Q8_0": 32, "Q8_1": 32, "Q8_K": 256}


def vec_dot_type(weight_type: str) -> str:
    """The activation type llama.cpp's CPU backend multiplies a ``weight_type`` weight with.

    Raises:
        LowbitError: a GGUF type with no matrix product on llama.cpp's CPU backend.
    """
    kind = VEC_DOT_TYPE.get(str(weight_type).upper())
    if kind is None:
        raise LowbitError(
            f"GGUF type {weight_type!r} has no llama.cpp CPU matrix product lowbit models; "
            f"known: {', '.join(VEC_DOT_TYPE)}"
        )
    return kind


def fake_quantize_ggml(x: Any, kind: str) -> Any:
    """``x [..., K]`` as llama.cpp's CPU backend hands it to a dot product of ``kind``
    (a :data:`VEC_DOT_TYPE` value; see the module docstring), dequantized to float32.

    Args:
        x: a float torch tensor.
        kind: ``F32``, ``F16``, ``BF16``, ``Q8_0``, ``Q8_1`` or ``Q8_K``.

    Returns:
        A tensor of ``x``'s shape and dtype.

    Raises:
        LowbitError: an unknown kind, or ``K`` not a multiple of the kind's block (32 or 256).
    """
    import torch

    if kind == "F32":
        return x
    if kind in ("F16", "BF16"):
        half = torch.float16 if kind == "F16" else torch.bfloat16
        return x.detach().to(torch.float32).to(half).to(x.dtype)
    block = _BLOCK.get(kind)
    if block is None:
        raise LowbitError(f"unknown llama.cpp activation type {kind!r}; allowed: F32, F16, BF16, "
                          f"{', '.join(_BLOCK)}")  # fmt: skip
    k = x.shape[-1]
    if k % block:
        raise LowbitError(
            f"{kind} activations come in blocks of {block}, but this input has {k} values "
            "per token (llama.cpp refuses such a weight for this type)"
        )
    v = x.detach().to(torch.float32).reshape(*x.shape[:-1], k // block, block)
    amax = v.abs().amax(dim=-1, keepdim=True)
    nonzero = amax != 0
    # true float32 divisions: torch computes `127.0 / t` and `t / 127.0` through a reciprocal
    c127 = torch.full_like(amax, 127.0)
    inv = torch.where(nonzero, torch.div(c127, torch.where(nonzero, amax, 1.0)), 0.0)
    # ties to even, as _mm256_round_ps and nearest_int; + 0.0: integer codes have no -0
    codes = torch.round(v * inv) + 0.0
    if kind == "Q8_K":
        codes = codes.clamp(-127.0, 127.0)  # never reached: |x * inv| <= 127 (1 + 2^-24)
        one = torch.ones_like(amax)
        scale = torch.where(nonzero, torch.div(one, torch.where(nonzero, inv, 1.0)), 0.0)
    else:
        scale = torch.div(amax, c127).to(torch.float16).to(torch.float32)
    return (codes * scale).reshape(x.shape).to(x.dtype)


def gguf_linear_types(model: Any, checkpoint: Any) -> dict[str, str]:
    """``{module name: GGUF type}`` of the model's linear layers whose weights ``checkpoint``
    (a GGUF, as ``open_checkpoint`` reads it) stores — a mixture's expert stack gives each
    expert's layer the stack's type; an output layer tied to the token embedding takes the
    embedding's type (llama.cpp multiplies by ``token_embd.weight``)."""
    import torch

    modules = dict(model.named_modules())
    base = getattr(model, "base_model_prefix", "") or ""

    def module_of(key: str) -> str | None:
        key = key.removesuffix(".weight")
        for k in (key, f"{base}.{key}", key.removeprefix(f"{base}.")):
            if isinstance(modules.get(k), torch.nn.Linear):
                return k
        return None

    rename = checkpoint_rename(getattr(getattr(model, "config", None), "model_type", None))
    cfg = getattr(checkpoint, "config", None)
    out: dict[str, str] = {}
    for name in checkpoint.names():
        if not name.endswith(".weight"):
            continue
        shape = checkpoint.info(name).shape
        try:  # an expert stack: one linear layer per expert, all of the stack's type
            keys = gguf_expert_names(name, shape[0], cfg) if len(shape) == 3 else None
            keys = keys or [gguf_to_hf_name(name, cfg)]
        except LowbitError:
            continue
        for key in keys:
            found = module_of(rename(key))
            if found is not None:
                out[found] = str(checkpoint.dtype(name)).upper()
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    head_name = next((n for n, m in modules.items() if head is not None and m is head), None)
    if head_name and head_name not in out and "token_embd.weight" in checkpoint.names():
        out[head_name] = str(checkpoint.dtype("token_embd.weight")).upper()
    return out
