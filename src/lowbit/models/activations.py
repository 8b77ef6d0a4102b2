"""Simulated activation quantization (W8A8 and friends) for evaluating torch models.

``simulate_activations(model, "int8")`` makes every ``nn.Linear`` see its input quantized per
token and dequantized again, the way a W8A8 kernel would see it, so perplexity can be measured
with activations in INT8 or FP8 as well as with weights alone.

Semantics match lowbit's own codec (``lowbit.quantize_dynamic(x, fmt)`` then ``dequantize``):

- one scale per token (per row of the last dimension): ``scale = float32(amax / qmax)`` with
  ``amax = max |x|`` over the row and ``qmax`` the format's largest value (127 for int8, 448 for
  FP8 E4M3; OCP OFP8 v1.0 Table 1); an all-zero row gets scale 1;
- ``t = x / scale`` rounded once to the nearest representable value, ties to even (IEEE
  754-2019 §4.3.1), saturating at the format's range (integers clamp to [min, max] =
  [-128, 127] for int8); the quotient is taken in float32 and redone in float64 where float32
  lands on a midpoint, so no false tie is rounded;
- the result ``q * scale`` in float32.

Float rounding is done arithmetically (quantum ``2**(max(e, emin) - mbits)`` for a value in
binade ``e``), which rounds once from float64 and so agrees with lowbit's exact encoder, where a
cast through float32 (as torch and ml_dtypes do) would round twice.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from lowbit.errors import LowbitError
from lowbit.formats.catalog import format as get_format

__all__ = ["fake_quantize_per_token", "simulate_activations"]


def _resolve(fmt: Any) -> Any:
    f = get_format(fmt) if isinstance(fmt, str) else fmt
    kind = getattr(f, "kind", None)
    if kind == "int" and f.bits <= 16:
        return f
    if kind == "float" and f.signed and f.subnormals:
        return f
    raise LowbitError(
        f"activation simulation supports signed integer formats and signed float formats with "
        f"subnormals (int8, fp8_e4m3, fp8_e5m2, fp6, fp4, ...), not {getattr(f, 'name', fmt)!r}"
    )


def fake_quantize_per_token(x: Any, fmt: Any = "int8") -> Any:
    """Quantize and dequantize a tensor with one absmax scale per row of the last dimension.

    Args:
        x: a float torch tensor ``[..., hidden]``.
        fmt: a lowbit format name or object: an integer format (``"int8"``) or a signed float
            format with subnormals (``"fp8_e4m3"``, ``"fp8_e5m2"``, ``"fp4"``).

    Returns:
        A tensor of ``x``'s shape and dtype holding the dequantized values.

    Raises:
        LowbitError: a format this simulation does not support (value sets such as nf4,
            unsigned formats).
    """
    import torch

    f = _resolve(fmt)
    qmax = float(f.max)
    x32 = x.detach().to(torch.float32)
    amax = x32.abs().amax(dim=-1, keepdim=True).to(torch.float64)
    scale = torch.where(amax > 0, amax / qmax, torch.ones_like(amax)).to(torch.float32)
    # float32 quotients round where the exact ones do, except that one may land exactly on a
    # midpoint of the (much coarser) target grid: those few are redone in float64, as lowbit's
    # codec does
    q, tie = _to_grid(x32 / scale, f)
    if tie.any():
        exact = x32.to(torch.float64)[tie] / scale.to(torch.float64).expand_as(x32)[tie]
        q[tie] = _to_grid(exact, f)[0].to(torch.float32)
    return (q * scale).to(x.dtype)


def _to_grid(t: Any, f: Any) -> tuple[Any, Any]:
    """(t rounded to the format's grid, ties to even, saturated; mask of exact ties)."""
    import torch

    qmax = float(f.max)
    if f.kind == "int":
        r = torch.round(t)
        tie = (t - r).abs() == 0.5
        return torch.clamp(r, float(f.min), qmax) + 0.0, tie  # + 0.0: integers have no -0
    _, e = torch.frexp(t)  # |t| = m * 2**e with m in [0.5, 1): binade e - 1
    quantum = torch.ldexp(torch.ones_like(t), torch.clamp(e - 1, min=f.emin) - f.mbits)
    v = t / quantum  # exact: a power-of-two scaling
    r = torch.round(v)
    tie = (v - r).abs() == 0.5
    return torch.clamp(r * quantum, -qmax, qmax), tie


@contextmanager
def simulate_activations(
    model: Any, fmt: Any = "int8", *, exclude: Sequence[str] = ("lm_head", "*.lm_head")
) -> Iterator[list[str]]:
    """Within the ``with`` block, every ``nn.Linear`` input is fake-quantized per token.

    Args:
        model: a torch module.
        fmt: as for :func:`fake_quantize_per_token` (``"int8"``, ``"fp8_e4m3"`` ...).
        exclude: glob patterns of module names left in full precision (default: the LM head).

    Yields:
        The names of the linear layers that were hooked.

    Raises:
        LowbitError: an unsupported format, or no linear layer left to hook.
    """
    import torch

    f = _resolve(fmt)

    def hook(_module: Any, args: tuple[Any, ...]) -> tuple[Any, ...]:
        return (fake_quantize_per_token(args[0], f), *args[1:])

    handles = []
    names = []
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and not any(
            fnmatch.fnmatchcase(name, pat) for pat in exclude
        ):
            handles.append(module.register_forward_pre_hook(hook))
            names.append(name)
    if not names:
        raise LowbitError("the model has no nn.Linear layers to simulate activations for")
    try:
        yield names
    finally:
        for h in handles:
            h.remove()
