"""The precision of a model's matrix products in lowbit's model work: ``fp32``, ``bf16`` or ``auto``.

``fp32`` runs models as they are (float32 weights and activations: lowbit's numbers as
they always were). ``bf16`` runs their matrix products (linear layers, matmuls, attention)
in bfloat16 under ``torch.autocast("cpu")``, which keeps normalisations, softmax and the
log-probabilities in float32; on CPUs with bfloat16 units that is several times faster.
``auto`` is ``bf16`` where :func:`fast_bf16` finds bfloat16 products faster, and exactly
``fp32`` elsewhere. A CPU flag is not enough to say so: AVX512-BF16 made torch's products
2.3-2.6x faster on an AMD EPYC and 2x *slower* on an Intel Xeon guest that shows no AMX
flags (docs/benchmarks.md). So on a CPU flagged ``amx_bf16`` or ``avx512_bf16`` the first
``auto`` times one product both ways (:data:`SHAPE`, torch's current thread count, best of
five interleaved rounds) and takes bf16 only if it is at least :data:`MIN_SPEEDUP` times
faster; the verdict is cached per machine (CPU model and flags, torch and lowbit versions,
thread count) in ``compute_paths.json`` beside the codecs' ``codec_paths.json``
(``lowbit.codecs._path_choice``). CPUs without those flags are ``fp32`` without timing.

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
from lowbit._version import __version__
from lowbit.codecs._path_choice import PathChoice, cache_file, cpu_key, time_pair
from lowbit.errors import LowbitError

__all__ = [
    "COMPUTES",
    "bf16_units",
    "check_compute",
    "compute_context",
    "exact",
    "fast_bf16",
    "resolve_compute",
]

COMPUTES = ("fp32", "bf16", "auto")

#: CPU flags (``/proc/cpuinfo``) of units that can multiply bfloat16 matrices faster than
#: float32: AMX (Intel Sapphire Rapids on: about 6x in torch at 2048^2 on issue 28's Xeon)
#: and AVX512-BF16 (2.3-2.6x on docs/benchmarks.md's AMD EPYC, 0.5x on its Intel Xeon).
#: Only CPUs with one of them are timed; the timing decides (:func:`fast_bf16`).
FAST_BF16_FLAGS = ("amx_bf16", "avx512_bf16")

#: The product ``auto`` times: (tokens, in features, out features) of one linear layer,
#: float32 input and weight, the weight cast under autocast as in a model's forward.
SHAPE = (256, 1024, 2048)

#: How much faster bf16 products must be for ``auto`` to take them (bf16 costs accuracy).
MIN_SPEEDUP = 1.2

CACHE_NAME = "compute_paths.json"


def _threads() -> int:
    import torch

    return int(torch.get_num_threads())


def _key() -> str:
    import torch

    return f"{cpu_key()} | torch {torch.__version__} | threads {_threads()} | lowbit {__version__}"


_choice = PathChoice(
    file=lambda: cache_file().with_name(CACHE_NAME),
    key=_key,
    paths=("bf16", "fp32"),
    fields=("bf16_ns", "fp32_ns"),
    margin=MIN_SPEEDUP,
    detail=lambda: {"shape": list(SHAPE), "threads": _threads()},
)


def bf16_units() -> bool:
    """Whether the CPU is flagged with bfloat16 matrix units (:data:`FAST_BF16_FLAGS`)."""
    flags = cpu_flags()
    return any(f in flags for f in FAST_BF16_FLAGS)


def _time_products() -> tuple[float, float]:
    """Best seconds of one :data:`SHAPE` linear in bf16 (autocast) and in float32."""
    import torch

    m, k, n = SHAPE
    gen = torch.Generator().manual_seed(0)
    x, w = torch.randn(m, k, generator=gen), torch.randn(n, k, generator=gen)

    def bf16() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            torch.nn.functional.linear(x, w)

    with torch.no_grad():
        return time_pair(bf16, lambda: torch.nn.functional.linear(x, w))


def fast_bf16() -> bool:
    """Whether bfloat16 products are the faster choice on this machine: the CPU has
    bfloat16 units (:func:`bf16_units`) and they were timed at least :data:`MIN_SPEEDUP`
    times faster than float32 (once per machine and thread count, then cached)."""
    return bf16_units() and _choice.first_wins("linear", _time_products)


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
    where :func:`fast_bf16` measured it faster, else ``fp32``)."""
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
