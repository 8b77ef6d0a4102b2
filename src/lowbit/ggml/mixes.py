"""llama-quantize's mixes: the GGML type of every tensor of a model for a mix name (Q4_K_M, ...).

A pure function of the architecture, the tensors' names, shapes and stored types, a few
hyperparameters and the user's overrides, following llama.cpp's ``src/llama-quant.cpp``
(``llama_tensor_get_type`` and its helpers) at the commit of ``tests/fixtures/llamacpp``:

- which tensors are quantized at all (2-D and up, names ending in ``weight``, no norms, no MoE
  router ``ffn_gate_inp``, no position/token-type embeddings, ...); the rest keep their type;
- ``output.weight`` (and ``token_embd.weight`` when the model ties them) gets Q8_0 when its rows
  do not fit the mix's block, else Q6_K (Q5_K for the 1-2 bit i-quant mixes);
- attn_v / ffn_down get more bits in some layers (``use_more_bits``: the first and last eighth
  and every third layer between), depending on the mix, GQA (``n_head / n_head_kv >= 4``),
  experts (8-expert models) and Falcon;
- ``--tensor-type PATTERN=TYPE`` (first regex that matches wins, and skips the mix's rules),
  ``--output-tensor-type``, ``--token-embedding-type`` (these two skip the fallback) and
  ``--pure``;
- the fallback when a row is not a multiple of the chosen type's block: Q2_K/Q3_K/TQ*_0 to
  Q4_0, Q4_K to Q5_0, Q5_K to Q5_1, Q6_K to Q8_0, IQ*_* to IQ4_NL, and F16 when even that
  does not fit.

Tensors are visited in llama.cpp's order (by layer number, then by name), which the counters
of the attn_v rule depend on.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from lowbit.errors import LowbitError

__all__ = ["MIXES", "Mix", "TensorSpec", "choose_types", "mix", "requires_imatrix"]

_BLOCK = {
    "Q4_0": 32, "Q4_1": 32, "Q5_0": 32, "Q5_1": 32, "Q8_0": 32, "Q2_K": 256, "Q3_K": 256,
    "Q4_K": 256, "Q5_K": 256, "Q6_K": 256, "IQ2_XXS": 256, "IQ2_XS": 256, "IQ2_S": 256,
    "IQ3_XXS": 256, "IQ3_S": 256, "IQ1_S": 256, "IQ1_M": 256, "IQ4_NL": 32, "IQ4_XS": 256,
    "TQ1_0": 256, "TQ2_0": 256, "MXFP4": 32, "NVFP4": 64, "F32": 1, "F16": 1, "BF16": 1,
}  # fmt: skip
_FLOAT = {"F32", "F16", "BF16"}


@dataclass(frozen=True)
class Mix:
    """One llama-quantize type name: its ``general.file_type`` value and default tensor type."""

    name: str
    file_type: int
    default: str


MIXES: dict[str, Mix] = {
    m.name: m
    for m in [
        Mix("F32", 0, "F32"), Mix("F16", 1, "F16"), Mix("Q4_0", 2, "Q4_0"), Mix("Q4_1", 3, "Q4_1"),
        Mix("Q8_0", 7, "Q8_0"), Mix("Q5_0", 8, "Q5_0"), Mix("Q5_1", 9, "Q5_1"),
        Mix("Q2_K", 10, "Q2_K"), Mix("Q3_K_S", 11, "Q3_K"), Mix("Q3_K_M", 12, "Q3_K"),
        Mix("Q3_K_L", 13, "Q3_K"), Mix("Q4_K_S", 14, "Q4_K"), Mix("Q4_K_M", 15, "Q4_K"),
        Mix("Q5_K_S", 16, "Q5_K"), Mix("Q5_K_M", 17, "Q5_K"), Mix("Q6_K", 18, "Q6_K"),
        Mix("IQ2_XXS", 19, "IQ2_XXS"), Mix("IQ2_XS", 20, "IQ2_XS"), Mix("Q2_K_S", 21, "Q2_K"),
        Mix("IQ3_XS", 22, "IQ3_S"), Mix("IQ3_XXS", 23, "IQ3_XXS"), Mix("IQ1_S", 24, "IQ1_S"),
        Mix("IQ4_NL", 25, "IQ4_NL"), Mix("IQ3_S", 26, "IQ3_S"), Mix("IQ3_M", 27, "IQ3_S"),
        Mix("IQ2_S", 28, "IQ2_XS"), Mix("IQ2_M", 29, "IQ2_S"), Mix("IQ4_XS", 30, "IQ4_XS"),
        Mix("IQ1_M", 31, "IQ1_M"), Mix("BF16", 32, "BF16"), Mix("TQ1_0", 36, "TQ1_0"),
        Mix("TQ2_0", 37, "TQ2_0"), Mix("MXFP4_MOE", 38, "MXFP4"), Mix("NVFP4", 39, "NVFP4"),
    ]
}  # fmt: skip
"""llama-quantize's type names (``LLAMA_FTYPE_MOSTLY_*``), by name."""

_ALIASES = {"Q3_K": "Q3_K_M", "Q4_K": "Q4_K_M", "Q5_K": "Q5_K_M"}
_IQ12 = {"IQ2_XXS", "IQ2_XS", "IQ1_S", "IQ2_S", "IQ2_M", "IQ1_M"}


_NEED_IMATRIX = {"IQ3_XXS", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ1_M", "IQ1_S"}


def requires_imatrix(name: str, qtype: str, mix_name: str) -> bool:
    """Whether llama-quantize refuses to write tensor ``name`` as ``qtype`` without an
    importance vector (``tensor_requires_imatrix``: the 1-3 bit i-quants, and Q2_K in a Q2_K_S
    file; never the token embeddings or ``output.weight``)."""
    if name in ("token_embd.weight", "per_layer_token_embd.weight", "output.weight"):
        return False
    if qtype in _NEED_IMATRIX:
        return True
    return qtype == "Q2_K" and mix(mix_name).name == "Q2_K_S"


def mix(name: str) -> Mix:
    """Look up a mix by llama-quantize's name (any case; Q3_K/Q4_K/Q5_K mean the _M mixes).

    Raises:
        LowbitError: an unknown mix name (the message lists the known ones).
    """
    key = str(name).upper()
    key = _ALIASES.get(key, key)
    if key not in MIXES:
        raise LowbitError(f"unknown llama.cpp mix {name!r}; known: {', '.join(MIXES)}")
    return MIXES[key]


@dataclass(frozen=True)
class TensorSpec:
    """A tensor as the mix rules see it: GGUF name, numpy shape (rows last), stored type."""

    name: str
    shape: tuple[int, ...]
    type: str = "F32"


def _category(name: str) -> str:
    if name == "output.weight":
        return "output"
    if name in ("token_embd.weight", "per_layer_token_embd.weight"):
        return "token_embd"
    for key, cat in (
        ("attn_qkv.weight", "attn_qkv"), ("attn_kv_b.weight", "attn_kv_b"),
        ("attn_v.weight", "attn_v"), ("attn_k.weight", "attn_k"), ("attn_q.weight", "attn_q"),
        ("attn_output.weight", "attn_output"), ("ffn_up", "ffn_up"), ("ffn_gate", "ffn_gate"),
        ("ffn_down", "ffn_down"),
    ):  # fmt: skip
        if key in name:
            return cat
    return "other"


_NO_QUANT = (
    "_norm.weight", "ffn_gate_inp.weight", "ffn_gate_tid2eid.weight", "altup", "laurel",
    "per_layer_model_proj", "ssm_conv1d", "shortconv.conv.weight", "indexer.k_proj.weight",
    "indexer.q_proj.weight", "time_mix_first.weight", "time_mix_w0.weight", "time_mix_w1.weight",
    "time_mix_w2.weight", "time_mix_v0.weight", "time_mix_v1.weight", "time_mix_v2.weight",
    "time_mix_a0.weight", "time_mix_a1.weight", "time_mix_a2.weight", "time_mix_g1.weight",
    "time_mix_g2.weight", "time_mix_decay_w1.weight", "time_mix_decay_w2.weight",
    "time_mix_lerp_fused.weight", "attn_rel_b.weight", ".position_embd", "sam.pos_embd",
    "sam.neck.", "sam.net_", ".rel_pos", ".patch_embd", ".patch_merger", "a.rvq.codebook",
    "mm.a.code_embd",
)  # fmt: skip


def _n_dims(shape: tuple[int, ...]) -> int:
    dims = list(shape)
    while len(dims) > 1 and dims[0] == 1:
        dims.pop(0)
    return len(dims)


def _allows_quantization(t: TensorSpec, quantize_output: bool) -> bool:
    if _n_dims(t.shape) < 2 or not t.name.endswith("weight"):
        return False
    if t.name == "output.weight" and not quantize_output:
        return False
    if t.name in ("position_embd.weight", "token_types.weight"):
        return False
    return not any(key in t.name for key in _NO_QUANT)


def _layer(name: str) -> int:
    m = re.match(r"blk\.(-?\d+)\.", name)
    return int(m.group(1)) if m else -1


def _more_bits(i: int, n: int) -> bool:
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def _fallback(t: TensorSpec, new: str) -> str:
    ncols = t.shape[-1]
    if ncols % _BLOCK[new] == 0:
        return new
    if new in ("IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ4_XS"):
        ret = "IQ4_NL"
    elif new in ("Q2_K", "Q3_K", "TQ1_0", "TQ2_0"):
        ret = "Q4_0"
    elif new in ("Q4_K", "Q5_K", "Q6_K"):
        ret = {"Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0"}[new]
    else:
        raise LowbitError(
            f"{t.name}: rows of {ncols} values do not fit {new} (blocks of {_BLOCK[new]}) and "
            "llama.cpp defines no fallback for it"
        )
    return ret if ncols % _BLOCK[ret] == 0 else "F16"


@dataclass
class _State:
    arch: str
    ftype: str
    n_layer: int
    n_gqa: int
    n_expert: int
    has_imatrix: bool
    tied: bool
    n_attn_v: int
    output_type: str | None
    is_70b: bool
    i_attn_v: int = 0
    i_ffn_down: int = 0
    i_ffn_gate: int = 0
    i_ffn_up: int = 0


def _layer_info(s: _State, counter: int, name: str) -> tuple[int, int]:
    if s.n_expert > 1:
        i = _layer(name)
        if not 0 <= i < s.n_layer:
            raise LowbitError(f"{name}: cannot tell its layer (0..{s.n_layer - 1})")
        return i, s.n_layer
    return counter, s.n_layer


def _impl(s: _State, new: str, t: TensorSpec, cat: str) -> str:
    f, arch, gqa, nexp = s.ftype, s.arch, s.n_gqa, s.n_expert
    attn_v_like = cat in ("attn_v", "attn_qkv", "attn_kv_b")
    if cat == "output" or (s.tied and cat == "token_embd"):
        if s.output_type is not None:
            return s.output_type
        if f == "MXFP4_MOE" or arch == "falcon" or t.shape[-1] % _BLOCK[new]:
            return "Q8_0"
        if f in ("IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ1_S", "IQ2_S", "IQ2_M", "IQ1_M"):
            return "Q5_K"
        return "Q6_K" if new != "Q8_0" else new
    if f == "MXFP4_MOE":
        return "MXFP4" if len(t.shape) >= 3 and t.shape[-3] > 1 else "Q8_0"
    if cat == "token_embd":
        if f in ("IQ2_XXS", "IQ2_XS", "IQ1_S", "IQ1_M"):
            return "Q2_K"
        if f in ("IQ2_S", "IQ2_M", "IQ3_XXS"):
            return "IQ3_S"
        if f in ("TQ1_0", "TQ2_0"):
            return "Q4_K"
        return new
    if f in _IQ12:
        iq3 = f in ("IQ2_S", "IQ2_M")
        if attn_v_like:
            new = "Q4_K" if gqa >= 4 or nexp >= 4 else ("IQ3_S" if iq3 else "Q2_K")
            s.i_attn_v += 1
        elif nexp == 8 and cat == "attn_k":
            new = "Q4_K"
        elif cat == "ffn_down":
            if s.i_ffn_down < s.n_layer // 8:
                new = "IQ3_S" if iq3 else "Q2_K"
            s.i_ffn_down += 1
        elif cat == "attn_output":
            if nexp == 8:
                new = "Q5_K"
            elif f in ("IQ1_S", "IQ1_M"):
                new = "IQ2_XXS"
            elif iq3:
                new = "IQ3_S"
        return new
    if attn_v_like:
        if f == "Q2_K":
            new = "Q4_K" if gqa >= 4 else "Q3_K"
        elif f == "Q2_K_S" and gqa >= 4:
            new = "Q4_K"
        elif f == "IQ3_XXS":
            new = "Q4_K" if gqa >= 4 else ("IQ3_S" if not s.has_imatrix else "IQ3_XXS")
        elif f in ("IQ3_XS", "IQ3_S") and gqa >= 4:
            new = "Q4_K"
        elif f == "IQ3_M":
            new = "Q4_K"
        elif f == "Q3_K_M":
            new = "Q5_K" if s.i_attn_v < 2 else "Q4_K"
        elif f == "Q3_K_L":
            new = "Q5_K"
        elif f in ("IQ4_NL", "IQ4_XS") and gqa >= 4:
            new = "Q5_K"
        elif f in ("Q4_K_M", "Q5_K_M") and _more_bits(s.i_attn_v, s.n_attn_v):
            new = "Q6_K"
        elif f == "Q4_K_S" and s.i_attn_v < 4:
            new = "Q5_K"
        if s.is_70b and new in ("Q3_K", "Q4_K"):
            new = "Q5_K"
        if nexp == 8:
            new = "Q8_0"
        s.i_attn_v += 1
    elif cat == "attn_k":
        if nexp == 8:
            new = "Q8_0"
        elif f == "IQ3_XS":
            new = "IQ3_XXS"
        elif f == "IQ3_XXS":
            new = "IQ2_S"
    elif cat == "attn_q":
        if f == "IQ3_XS":
            new = "IQ3_XXS"
        elif f == "IQ3_XXS":
            new = "IQ2_S"
    elif cat == "ffn_down":
        i, n = _layer_info(s, s.i_ffn_down, t.name)
        falcon = arch == "falcon"
        if f == "Q2_K":
            new = "Q3_K"
        elif f == "Q2_K_S":
            if i < n // 8:
                new = "Q4_K"
        elif f == "IQ3_XXS" and not s.has_imatrix:
            new = "Q4_K" if i < n // 8 else "Q3_K"
        elif f == "Q3_K_M":
            new = "Q5_K" if i < n // 16 else "Q4_K" if not falcon or _more_bits(i, n) else "Q3_K"
        elif f == "IQ3_M" and (i < n // 8 or (nexp == 8 and _more_bits(i, n))):
            new = "Q4_K"
        elif f == "Q3_K_L":
            new = "Q4_K" if falcon else "Q5_K"
        elif f == "Q4_K_M":
            if falcon:
                new = "Q6_K" if i < n // 16 else "Q5_K" if _more_bits(i, n) else "Q4_K"
            elif _more_bits(i, n):
                new = "Q6_K"
        elif i < n // 8 and f in ("IQ4_NL", "IQ4_XS") and not s.has_imatrix:
            new = "Q5_K"
        elif f == "Q5_K_M" and _more_bits(i, n):
            new = "Q6_K"
        elif f == "Q4_K_S" and not falcon and i < n // 8:
            new = "Q5_K"
        elif f in ("Q4_0", "Q5_0") and s.has_imatrix and i < n // 8:
            new = "Q4_1" if f == "Q4_0" else "Q5_1"
        s.i_ffn_down += 1
    elif cat == "attn_output":
        if arch != "falcon":
            if nexp == 8:
                if f in (
                    "Q2_K", "IQ3_XS", "IQ3_XXS", "Q3_K_S", "Q3_K_M", "IQ4_NL", "Q4_K_S",
                    "Q4_K_M", "IQ3_S", "IQ3_M", "IQ4_XS",
                ):  # fmt: skip
                    new = "Q5_K"
            else:
                new = {
                    "Q2_K": "Q3_K", "IQ3_XXS": "IQ3_S", "Q3_K_M": "Q4_K", "Q3_K_L": "Q5_K",
                    "IQ3_M": "Q4_K",
                }.get(f, new)  # fmt: skip
        elif f == "Q3_K_L":
            new = "Q4_K"
    elif cat in ("ffn_gate", "ffn_up"):
        counter = s.i_ffn_gate if cat == "ffn_gate" else s.i_ffn_up
        i, n = _layer_info(s, counter, t.name)
        if f == "IQ3_XS" and n // 8 <= i < 7 * n // 8:
            new = "IQ3_XXS"
        if cat == "ffn_gate":
            s.i_ffn_gate += 1
        else:
            s.i_ffn_up += 1
    return new


def _type_name(name: str, what: str) -> str:
    key = str(name).upper()
    if key not in _BLOCK:
        raise LowbitError(f"unknown GGML type {name!r} for {what}; known: {', '.join(_BLOCK)}")
    return key


def choose_types(
    arch: str,
    tensors: Iterable[TensorSpec],
    mix_name: str,
    *,
    n_layer: int | None = None,
    n_gqa: int | None = None,
    n_expert: int | None = None,
    has_imatrix: bool = False,
    tensor_types: Mapping[str, str] | Iterable[tuple[str, str]] = (),
    output_tensor_type: str | None = None,
    token_embedding_type: str | None = None,
    pure: bool = False,
    leave_output_tensor: bool = False,
) -> dict[str, str]:
    """The GGML type llama-quantize gives each tensor for ``mix_name`` (e.g. "Q4_K_M").

    Args:
        arch: ``general.architecture`` (only "falcon" and llama's 80-layer 70B change rules).
        tensors: every tensor of the model (order does not matter).
        mix_name: a llama-quantize type name (:data:`MIXES`).
        n_layer: ``{arch}.block_count``; default: one more than the largest ``blk.N``.
        n_gqa: ``head_count / head_count_kv``; default: attn_q rows / attn_k rows of block 0.
        n_expert: ``{arch}.expert_count``; default: the experts axis of ``*_exps`` tensors.
        has_imatrix: whether an importance matrix is given (a few rules depend on it).
        tensor_types: ``--tensor-type`` overrides, ``(regex, type)`` in order (first match).
        output_tensor_type / token_embedding_type: ``--output-tensor-type`` /
            ``--token-embedding-type``.
        pure: ``--pure``: the mix's default type everywhere (fallbacks still apply).
        leave_output_tensor: ``--leave-output-tensor``: keep ``output.weight`` as it is.

    Returns:
        ``{tensor name: type name}`` with upper-case ggml names ("Q4_K", "Q8_0", "F32", ...).

    Raises:
        LowbitError: unknown mix or type names, a bad regex, or a row no type can hold.
    """
    m = mix(mix_name)
    specs = sorted(tensors, key=lambda t: (_layer(t.name), t.name))
    overrides = list(tensor_types.items()) if isinstance(tensor_types, Mapping) else tensor_types
    patterns = []
    for pat, typ in overrides:
        try:
            patterns.append((re.compile(pat), _type_name(typ, f"--tensor-type {pat}")))
        except re.error as exc:
            raise LowbitError(
                f"--tensor-type pattern {pat!r} is not a valid regex: {exc}"
            ) from None
    out_t = None if output_tensor_type is None else _type_name(output_tensor_type, "the output")
    emb_t = None if token_embedding_type is None else _type_name(token_embedding_type, "token_embd")
    names = [t.name for t in specs]
    layers = [_layer(n) for n in names if _layer(n) >= 0]
    by_name = {t.name: t for t in specs}
    if n_layer is None:
        n_layer = max(layers) + 1 if layers else 0
    if n_gqa is None:
        q, k = by_name.get("blk.0.attn_q.weight"), by_name.get("blk.0.attn_k.weight")
        n_gqa = q.shape[-2] // k.shape[-2] if q is not None and k is not None else 1
    if n_expert is None:
        exps = [t.shape[-3] for t in specs if "_exps." in t.name and len(t.shape) >= 3]
        n_expert = max(exps) if exps else 0
    state = _State(
        arch=arch, ftype=m.name, n_layer=n_layer, n_gqa=n_gqa, n_expert=n_expert,
        has_imatrix=has_imatrix, tied="output.weight" not in by_name,
        n_attn_v=sum(_category(n) in ("attn_v", "attn_qkv", "attn_kv_b") for n in names),
        output_type=out_t, is_70b=arch == "llama" and n_layer == 80 and n_gqa > 1,
    )  # fmt: skip
    result: dict[str, str] = {}
    for t in specs:
        cat = _category(t.name)
        if not _allows_quantization(t, not leave_output_tensor):
            result[t.name] = t.type.upper()
            continue
        if emb_t is not None and cat == "token_embd":
            result[t.name] = emb_t
            continue
        if out_t is not None and cat == "output":
            result[t.name] = out_t
            continue
        new = m.default
        if new not in _FLOAT:
            manual = False
            for pat, typ in patterns:
                if pat.search(t.name):
                    new, manual = typ, True
                    break
            if not manual and not pure:
                new = _impl(state, new, t, cat)
            new = _fallback(t, new) if new not in _FLOAT else new
        result[t.name] = new
    return result
