"""Activations as vLLM's reference paths compute them: per-token INT8/FP8, FP8 groups of 128,
MXFP4 and NVFP4 (``lowbit eval --act``), the KV cache in FP8, INT8 or F16 (``--kv``), and a
GGUF's activations as llama.cpp's CPU backend rounds them (``--act llamacpp``,
:func:`simulate_llamacpp_activations`).

Every mode fake-quantizes a linear layer's input ``x [..., K]`` (quantize, then dequantize in
float32), each step rounded to float32 as the references round it:

- ``int8`` / ``fp8_token``: one absmax scale per token (``lowbit.models.activations``'s
  per-token codec: int8 ``amax/127``, FP8 E4M3 ``amax/448``), as vLLM's dynamic per-token
  kernels;
- ``fp8_block``: one scale per 128 values of a token (vLLM's ``per_token_group_quant_fp8``,
  compressed-tensors' ``FP8_BLOCK`` inputs): ``s = max(amax, 1e-10) / 448``, codes the
  E4M3 rounding (ties to even) of ``x / s`` clamped to ±448;
- ``mxfp4``: 32 values share a power-of-two scale chosen by compressed-tensors' rule (the
  ``ct`` rule of ``lowbit.quant.scheme.MX_SCALE_RULES``), E2M1 codes of ``x / s``;
- ``nvfp4``: vLLM's ``ref_nvfp4_quant``: a static float32 global scale ``g`` per layer (from
  calibration: ``448 * 6 / amax`` over the calibration inputs; without one, each call's own),
  per 16 values ``s = RNE_E4M3(min(g * (amax * (1/6)), 448))``, codes E2M1 of
  ``x * (1 / (s * (1/g)))`` clamped to ±6, values ``code * (s / g)``.

``K`` must be a multiple of the group (16, 32, 128): a LowbitError says which layer is not.
"""

from __future__ import annotations

import contextlib
import fnmatch
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from lowbit.errors import LowbitError
from lowbit.models.act_quant import (
    ACT_MODES,
    FP8_MAX,
    act_mode,
    fake_quantize_activation,
    input_global_scale,
    observe_input_amax,
)
from lowbit.models.activations import fake_quantize_per_token
from lowbit.models.ggml_act import fake_quantize_ggml, vec_dot_type

__all__ = [
    "ACT_MODES",
    "KV_MODES",
    "LLAMACPP",
    "calibrate_input_scales",
    "fake_quantize_activation",
    "simulate_act_mode",
    "simulate_kv_cache",
    "simulate_llamacpp_activations",
    "simulate_stored_activations",
]

#: ``lowbit eval --act llamacpp``: a GGUF's activations as llama.cpp's CPU backend rounds them.
LLAMACPP = "llamacpp"

#: KV-cache modes of ``lowbit eval --kv``.
KV_MODES = ("fp8", "int8", "f16")


def _linears(model: Any, exclude: Sequence[str]) -> list[tuple[str, Any]]:
    import torch

    out = [
        (name, m)
        for name, m in model.named_modules()
        if isinstance(m, torch.nn.Linear) and not any(fnmatch.fnmatchcase(name, p) for p in exclude)
    ]
    if not out:
        raise LowbitError("the model has no nn.Linear layers to simulate activations for")
    return out


@contextmanager
def simulate_act_mode(
    model: Any,
    mode: str,
    *,
    global_scales: Mapping[str, Any] | None = None,
    exclude: Sequence[str] = ("lm_head", "*.lm_head"),
) -> Iterator[list[str]]:
    """Within the ``with`` block every ``nn.Linear`` input is fake-quantized as ``mode``.

    Args:
        model: a torch module.
        mode: one of :data:`ACT_MODES`.
        global_scales: NVFP4: layer name -> static input scale (:func:`calibrate_input_scales`).
        exclude: glob patterns of layers left in full precision (default: the LM head).

    Yields:
        The names of the layers hooked.
    """
    mode = act_mode(mode)
    group = ACT_MODES[mode]
    layers = _linears(model, exclude)
    for name, module in layers:
        k = getattr(module, "in_features", 0)
        if group and k % group:
            raise LowbitError(
                f"{name}: {mode} activations come in groups of {group}, but its input has {k} "
                "values per token; use per-token activations (int8, fp8_token) for this model"
            )
    handles, names = [], []
    for name, module in layers:
        g = None if global_scales is None else global_scales.get(name)

        def hook(_m: Any, args: tuple[Any, ...], g: Any = g, name: str = name) -> tuple[Any, ...]:
            try:
                return (fake_quantize_activation(args[0], mode, g), *args[1:])
            except LowbitError as exc:
                raise LowbitError(f"{name}: {exc}") from None

        handles.append(module.register_forward_pre_hook(hook))
        names.append(name)
    try:
        yield names
    finally:
        for h in handles:
            h.remove()


@contextmanager
def simulate_stored_activations(
    model: Any, layers: Mapping[str, tuple[str, Any]]
) -> Iterator[list[str]]:
    """Within the ``with`` block each named layer's input is fake-quantized as a folder
    declares it (``CompressedTensorsFolder.input_activations``): ``{layer: (mode, scale)}``,
    mode one of :data:`ACT_MODES`, scale NVFP4's stored ``input_global_scale`` (else None).
    Only those layers are hooked: the folder's unquantized ones (the LM head) run as stored.

    Yields:
        The names of the layers hooked.

    Raises:
        LowbitError: a layer the model does not have.
    """
    modules = dict(model.named_modules())
    with contextlib.ExitStack() as stack:
        for name, (mode, scale) in layers.items():
            if name not in modules:
                raise LowbitError(
                    f"{name}: the folder quantizes its input, the model has no such layer"
                )
            mode = act_mode(mode)

            def hook(
                _m: Any, args: tuple[Any, ...], mode: str = mode, g: Any = scale, name: str = name
            ) -> tuple[Any, ...]:
                try:
                    return (fake_quantize_activation(args[0], mode, g), *args[1:])
                except LowbitError as exc:
                    raise LowbitError(f"{name}: {exc}") from None

            stack.callback(modules[name].register_forward_pre_hook(hook).remove)
        yield list(layers)


@contextmanager
def simulate_llamacpp_activations(model: Any, *, cache: bool = True) -> Iterator[dict[str, str]]:
    """Within the ``with`` block the model's matrix products with GGUF weights compute as
    llama.cpp's CPU backend computes them (``lowbit eval --act llamacpp``): every linear layer
    whose weight a GGUF stores rounds its input to the weight type's ``vec_dot_type`` (Q8_0,
    Q8_1, Q8_K blocks, F16, BF16; ``lowbit.models.ggml_act``), and attention reads keys and
    values rounded to float16, as llama.cpp's default F16 cache holds them.

    Queries stay float32 and the attention arithmetic too: for a batch of prompt tokens (what
    llama-perplexity runs) the CPU flash-attention kernel takes its tiled path, which widens
    the F16 keys and values to float32 and computes the scores, the softmax and the weighted
    sum of values in float32 (ggml-cpu's ``ggml_compute_forward_flash_attn_ext_tiled``). Its
    one-query path (generation, one token at a time) rounds the query to F16 and accumulates
    values in F16 instead; that path is not modelled.

    Args:
        model: built from a GGUF (``build_model``/``load_model`` record the weight types in
            ``model.lowbit_gguf_types``).
        cache: round keys and values to float16 (default); False where another ``--kv`` cache
            is simulated instead.

    Yields:
        ``{layer name: activation type}`` of the layers whose inputs are rounded.

    Raises:
        LowbitError: a model not built from a GGUF's own weights.
    """
    types = getattr(model, "lowbit_gguf_types", None)
    if not types:
        raise LowbitError(
            "--act llamacpp rounds activations by each layer's GGUF weight type; this model's "
            "weights do not come from a GGUF file (give GGUF files and --schemes none)"
        )
    modules = dict(model.named_modules())
    kinds = {name: vec_dot_type(wtype) for name, wtype in types.items()}
    with contextlib.ExitStack() as stack:
        for name, kind in kinds.items():
            if kind == "F32":
                continue

            def hook(_m: Any, args: tuple[Any, ...], kind: str = kind, name: str = name) -> Any:
                try:
                    return (fake_quantize_ggml(args[0], kind), *args[1:])
                except LowbitError as exc:
                    raise LowbitError(f"{name}: {exc}") from None

            stack.callback(modules[name].register_forward_pre_hook(hook).remove)
        if cache:
            stack.enter_context(simulate_kv_cache(model, "f16"))
        yield {n: k for n, k in kinds.items() if k != "F32"}


def calibrate_input_scales(
    model: Any, batches: Sequence[Any], *, exclude: Sequence[str] = ("lm_head", "*.lm_head")
) -> dict[str, Any]:
    """NVFP4's static input scales: every linear layer's ``448 * 6 / amax`` over its inputs in
    forward passes of ``batches`` (token id tensors), as llm-compressor's ``static_minmax``
    observer and ``generate_gparam`` make ``input_global_scale``."""
    amax = observe_input_amax(model, batches, _linears(model, exclude), progress=False)
    return {n: input_global_scale(a) for n, a in amax.items()}


@contextmanager
def simulate_kv_cache(model: Any, mode: str) -> Iterator[str]:
    """Within the ``with`` block attention reads keys and values through a ``mode`` cache:
    ``fp8`` casts them to E4M3 with scale 1 (vLLM's fp8 KV cache without calibrated scales:
    values beyond ±448 saturate); ``int8`` keeps one absmax scale per token and head (``amax /
    127``); ``f16`` rounds them to float16 (llama.cpp's default cache). Keys are quantized
    after the rotary embedding, as the cache holds them; queries are not (llama.cpp's batched
    CPU attention reads them in float32).

    Raises:
        LowbitError: an unknown mode, or a model whose attention lowbit cannot wrap.
    """
    import torch
    from transformers import AttentionInterface
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    key = str(mode).strip().lower()
    if key not in KV_MODES:
        raise LowbitError(f"unknown KV-cache mode {mode!r}; allowed: {', '.join(KV_MODES)}")
    config = getattr(model, "config", None)
    orig = getattr(config, "_attn_implementation", None)
    if orig is None:
        raise LowbitError("this model does not say how it computes attention; --kv needs that")
    if orig == "eager":
        from transformers.models.llama.modeling_llama import eager_attention_forward as inner
    else:
        inner = ALL_ATTENTION_FUNCTIONS[orig]

    def q(t: Any) -> Any:
        t32 = t.to(torch.float32)
        if key == "fp8":
            return t32.clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).to(t.dtype)
        if key == "f16":
            return t32.to(torch.float16).to(t.dtype)
        return fake_quantize_per_token(t32, "int8").to(t.dtype)

    def attention(module: Any, qs: Any, k: Any, v: Any, *args: Any, **kwargs: Any) -> Any:
        return inner(module, qs, q(k), q(v), *args, **kwargs)

    name = f"lowbit_kv_{key}_{orig}"
    AttentionInterface.register(name, attention)
    config._attn_implementation = name
    try:
        yield name
    finally:
        config._attn_implementation = orig
