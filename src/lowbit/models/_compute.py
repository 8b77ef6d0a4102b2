"""The precision of a model's matrix products in lowbit's model work: ``fp32``, ``bf16`` or ``auto``.

``fp32`` runs models as they are (float32 weights and activations: lowbit's numbers as
they always were). ``bf16`` runs their matrix products (linear layers, matmuls, attention)
in bfloat16 under ``torch.autocast("cpu")``, which keeps normalisations, softmax and the
log-probabilities in float32; on CPUs with bfloat16 units that is several times faster.
``auto`` is ``bf16`` where :func:`fast_bf16` says the CPU has such units (AMX, or
AVX512-BF16) and exactly ``fp32`` elsewhere.

What decides codes never runs in bfloat16: lowbit's quantization is numpy, GPTQ's solve is
float64 numpy, and Hessian and activation statistics are summed in float32 with autocast
off (:func:`exact`) from the activations the forward passes produce. docs/benchmarks.md
("Compute precision") measures what bf16 changes: perplexity, KL, GPTQ's codes and the
sensitivity ranking against float32, on the machine named there.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from lowbit._cpu import cpu_flags
from lowbit.errors import LowbitError

__all__ = ["COMPUTES", "check_compute", "compute_context", "exact", "fast_bf16", "resolve_compute"]

COMPUTES = ("fp32", "bf16", "auto")

#: CPU flags (``/proc/cpuinfo``) of units that multiply bfloat16 matrices faster than
#: float32. AMX (Intel Sapphire Rapids on): about 6x in torch at 2048^2 (issue 28's Xeon);
#: AVX512-BF16 (AMD Zen 4, Intel Cooper Lake): 2.3-2.6x on the AMD EPYC of
#: docs/benchmarks.md (2048^2, one and two threads).
FAST_BF16_FLAGS = ("amx_bf16", "avx512_bf16")


def fast_bf16() -> bool:
    """Whether this CPU has bfloat16 matrix units (:data:`FAST_BF16_FLAGS`)."""
    flags = cpu_flags()
    return any(f in flags for f in FAST_BF16_FLAGS)


def check_compute(compute: Any) -> str:
    """``compute`` as one of :data:`COMPUTES` (case-insensitive).

    Raises:
        LowbitError: any other value.
    """
    value = compute.strip().lower() if isinstance(compute, str) else compute
    if value not in COMPUTES:
        raise LowbitError(f"compute must be one of {', '.join(COMPUTES)}; got {compute!r}")
    return str(value)


def resolve_compute(compute: Any) -> str:
    """``fp32`` or ``bf16``: what ``compute`` means on this machine (``auto``: ``bf16``
    where :func:`fast_bf16`, else ``fp32``)."""
    value = check_compute(compute)
    if value == "auto":
        return "bf16" if fast_bf16() else "fp32"
    return value


@contextlib.contextmanager
def compute_context(compute: Any) -> Iterator[str]:
    """Run the block's model forwards in ``compute`` precision; yields ``fp32`` or ``bf16``.

    ``fp32`` changes nothing (no autocast is entered); ``bf16`` enters
    ``torch.autocast("cpu", dtype=torch.bfloat16)`` on the calling thread.
    """
    value = resolve_compute(compute)
    if value == "fp32":
        yield value
        return
    import torch

    with torch.autocast("cpu", dtype=torch.bfloat16):
        yield value


def exact() -> contextlib.AbstractContextManager[Any]:
    """A block whose torch arithmetic is float32 whatever the caller's compute precision
    (autocast off): Hessian and statistics sums, searches whose result decides codes."""
    import torch

    return torch.autocast("cpu", enabled=False)
