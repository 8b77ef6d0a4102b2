"""Activation quantizers of ``lowbit eval --act`` (torch), and the same on numpy rows.

The grouped and per-token modes are fake-quantized as vLLM's reference paths compute them
(``lowbit.evaluation.act_modes`` documents each mode and hooks them into models);
:func:`fake_quantize_rows` runs them on numpy rows for searches that weigh activation error
(SmoothQuant's, ``lowbit.calibration``). They live in the models layer so calibration can use
them; evaluation imports them from here."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from lowbit._progress import progress_bar
from lowbit.errors import LowbitError
from lowbit.models.activations import fake_quantize_per_token

__all__ = [
    "ACT_MODES",
    "FP8_MAX",
    "act_mode",
    "fake_quantize_activation",
    "fake_quantize_rows",
    "input_global_scale",
    "observe_input_amax",
]

#: The activation modes of ``lowbit eval --act`` and their group sizes (None: per token).
ACT_MODES: dict[str, int | None] = {
    "int8": None, "fp8_token": None, "fp8_block": 128, "mxfp4": 32, "nvfp4": 16,
}  # fmt: skip

_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
#: E4M3's largest finite value (OCP OFP8 v1.0), the FP8 scales' divisor.
FP8_MAX = 448.0


def act_mode(name: str) -> str:
    """The canonical mode for ``name`` (``fp8`` is ``fp8_token``).

    Raises:
        LowbitError: an unknown mode (the message lists them).
    """
    key = str(name).strip().lower()
    key = {"fp8": "fp8_token", "fp8_e4m3": "fp8_token", "w8a8": "int8"}.get(key, key)
    if key not in ACT_MODES:
        raise LowbitError(f"unknown activation mode {name!r}; allowed: {', '.join(ACT_MODES)}")
    return key


def _e2m1(t: Any) -> Any:
    """The nearest E2M1 value of float32 ``t`` (ties to the even code), saturating at ±6."""
    import torch

    values = torch.tensor(_E2M1, dtype=torch.float32)
    mids = (values[:-1] + values[1:]) / 2
    a = t.abs().clamp(max=6.0)
    idx = torch.bucketize(a, mids)  # how many midpoints lie below a (a tie stays below)
    tie = (idx < len(mids)) & (a == mids[idx.clamp(max=len(mids) - 1)])
    idx = torch.where(tie & (idx % 2 == 1), idx + 1, idx)
    return torch.where(t < 0, -values[idx], values[idx])


def input_global_scale(amax: Any) -> Any:
    """``448 * 6 / amax`` in float32 as compressed-tensors' ``generate_gparam`` computes it
    (``amax.reciprocal() * 2688``); 1.0 where that is not finite (an all-zero input)."""
    import torch

    a = torch.as_tensor(amax, dtype=torch.float32).clamp(min=torch.finfo(torch.float32).tiny)
    g = a.reciprocal() * (FP8_MAX * 6.0)
    return torch.nan_to_num(g, nan=1.0, posinf=1.0, neginf=1.0)


def observe_input_amax(
    model: Any,
    batches: Sequence[Any],
    layers: Sequence[tuple[str, Any]],
    *,
    progress: bool | None = None,
) -> dict[str, Any]:
    """The largest ``|x|`` of each layer's input over forward passes of ``batches`` (token id
    sequences, one window per forward), as llm-compressor's ``static_minmax`` observer keeps
    it for NVFP4's ``input_global_scale`` (:func:`input_global_scale` of it).

    Args:
        model: a causal LM taking ``input_ids``.
        batches: token id sequences.
        layers: ``(name, module)`` of the layers to observe.
        progress: a bar over the windows (``None``: only on a terminal).

    Returns:
        name -> float32 scalar tensor, for every layer that saw an input.
    """
    import torch

    amax: dict[str, Any] = {}
    handles = []
    for name, module in layers:

        def hook(_m: Any, args: tuple[Any, ...], name: str = name) -> None:
            a = args[0].detach().abs().amax().to(torch.float32)
            amax[name] = a if name not in amax else torch.maximum(amax[name], a)

        handles.append(module.register_forward_pre_hook(hook))
    bar = progress_bar(len(batches), progress, "input scales", "window")
    try:
        with torch.no_grad():
            for ids in batches:
                model(input_ids=torch.as_tensor(ids).reshape(1, -1))
                bar.update(1)
    finally:
        bar.close()
        for h in handles:
            h.remove()
    return amax


def fake_quantize_activation(x: Any, mode: str, global_scale: Any = None) -> Any:
    """``x`` quantized and dequantized as ``mode`` (see the module docstring).

    Args:
        x: a float torch tensor ``[..., K]``.
        mode: one of :data:`ACT_MODES`.
        global_scale: NVFP4's static float32 input scale (encode direction); None: ``x``'s own.

    Returns:
        A tensor of ``x``'s shape and dtype.

    Raises:
        LowbitError: an unknown mode, or ``K`` not a multiple of the mode's group.
    """
    import torch

    mode = act_mode(mode)
    group = ACT_MODES[mode]
    if group is None:
        return fake_quantize_per_token(x, "int8" if mode == "int8" else "fp8_e4m3")
    k = x.shape[-1]
    if k % group:
        raise LowbitError(
            f"{mode} activations come in groups of {group}, but this input has {k} values per "
            f"token; exclude the layer or use per-token activations (int8, fp8_token)"
        )
    v = x.detach().to(torch.float32).reshape(*x.shape[:-1], k // group, group)
    amax = v.abs().amax(dim=-1, keepdim=True)
    if mode == "fp8_block":
        s = amax.clamp(min=1e-10) / FP8_MAX
        q = (v / s).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).to(torch.float32)
        out = q * s
    elif mode == "mxfp4":
        _, e = torch.frexp(amax)  # amax = m * 2**e, m in [0.5, 1)
        exp = e - 1 + (amax / torch.ldexp(torch.ones_like(amax), e - 1) >= 1.75).to(e.dtype) - 2
        exp = torch.where(amax > 0, exp, torch.full_like(exp, -127)).clamp(-127, 127)
        s = torch.ldexp(torch.ones_like(amax), exp)
        out = _e2m1(v / s) * s
    else:  # nvfp4
        g = input_global_scale(v.abs().amax()) if global_scale is None else global_scale
        g = torch.as_tensor(g, dtype=torch.float32)
        sixth = torch.tensor(1.0 / 6.0, dtype=torch.float32)
        s = (g * (amax * sixth)).clamp(max=FP8_MAX).to(torch.float8_e4m3fn).to(torch.float32)
        per = s * g.reciprocal()
        inv = torch.where(per == 0, torch.zeros_like(per), per.reciprocal())
        out = _e2m1((v * inv).clamp(-6.0, 6.0)) * (s / g)
    return out.reshape(x.shape).to(x.dtype)


def fake_quantize_rows(x: np.ndarray, mode: str) -> np.ndarray:
    """float32 rows ``x [n, K]`` quantized and dequantized as ``--act`` ``mode`` runs a
    layer's input (NVFP4's global scale from these rows' maximum, as a static scale
    calibrated on them is), or per token in a per-token format (``int8``, ``fp8_e4m3``).

    Raises:
        LowbitError: an unknown mode or format, ``K`` not a multiple of the mode's group.
    """
    import torch

    t = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))
    key = str(mode).strip().lower()
    if key in ACT_MODES:
        return np.asarray(fake_quantize_activation(t, key).numpy())
    return np.asarray(fake_quantize_per_token(t, key).numpy())
