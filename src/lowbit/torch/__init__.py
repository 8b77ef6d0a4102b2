"""Precision emulation for torch: round tensors, matmuls and their gradients through any format.

Numerics are lowbit's own: :func:`round_to` gives exactly the values
``fmt.decode(fmt.encode(x))`` gives (one rounding from the exact input value), tested code by
code against the numpy codecs. It is fast where it can be: torch's native casts where they
are proven identical (float32 to bfloat16, float16, FP8 E4M3/E5M2 and the fnuz pair), a
vectorised ``frexp``/``round`` path for the other float formats and for stochastic
rounding, ``round``/``clamp`` for integers, a bucket search for value-set formats (NF4); the
numpy codec for everything else.

This is emulation on the CPU (or any device): the values are those the low-precision
hardware would hold, the speed is not.

Conventions:
    * a scale divides: ``x_hat = round(x / scale) * scale`` (the QuantizedTensor convention);
    * :class:`EmulatedLinear` treats rounding as the identity in the backward pass (the
      straight-through estimator FP8 training and absmax QAT use: nothing is clipped there);
      :func:`fake_quantize` offers the clipped STE too.

Modules, by job:
    * :mod:`lowbit.torch.rounding`: :func:`round_to`, :func:`random_bits` (exact rounding);
    * :mod:`lowbit.torch.quantizer`: :class:`Quantizer`, :func:`fake_quantize`,
      :func:`pow2_at_least` (scales, fake quantization, counters);
    * :mod:`lowbit.torch.emulation`: :class:`EmulatedLinear`, :class:`EmulatedMatMul`,
      :class:`MatMul`, :func:`emulate`, :func:`emulation_stats` (emulated matmuls in a model).

Needs ``pip install 'lowbit[torch]'``.
"""

from __future__ import annotations

try:
    import torch  # noqa: F401  (the real torch: imports are absolute)
except ImportError as exc:  # pragma: no cover - exercised only without torch
    raise ImportError("lowbit.torch needs torch: pip install 'lowbit[torch]'") from exc

from lowbit.torch.emulation import EmulatedLinear, EmulatedMatMul, MatMul, emulate, emulation_stats
from lowbit.torch.quantizer import Quantizer, fake_quantize, pow2_at_least
from lowbit.torch.rounding import random_bits, round_to

__all__ = [
    "EmulatedLinear",
    "EmulatedMatMul",
    "MatMul",
    "Quantizer",
    "emulate",
    "emulation_stats",
    "fake_quantize",
    "pow2_at_least",
    "random_bits",
    "round_to",
]
