"""MLX folders within a budget: each module's affine grid (bits x group size) from measured damage.

The MLX counterpart of :mod:`lowbit.checkpoints.gguf.budget`. Every module the MLX output
quantizes may take any candidate grid whose groups divide its rows (default
:data:`DEFAULT_CANDIDATES`, spelled ``<bits>bit-g<group>`` as lowbit's default MLX folder names
are); each candidate is priced in the exact bytes the folder stores for it: ``rows * in * b / 32``
uint32 words plus ``rows * in / g`` scales and as many biases in the model dtype. The damages
(``lowbit.evaluation.gguf_sensitivity``'s trials, with MLX's rounding) and the budget give one
grid per module (:func:`lowbit.plans.budget.solve`), written as per-module entries of
config.json's ``quantization`` (as mlx-lm's own recipes write them).

The budget is ``bits_per_weight`` (stored bits of the quantized modules over their weights) or
``size``: the bytes of every tensor the folder stores (``model.safetensors.index.json``'s
``total_size``: quantized modules and the tensors kept in the model dtype; the safetensors
headers, a few kilobytes, come on top).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from lowbit.checkpoints.mlx.params import MLXParams
from lowbit.checkpoints.mlx.writer import _entries, _is_float, _Plan
from lowbit.errors import LowbitError
from lowbit.plans.budget import Allocation, solve_budget

__all__ = [
    "DEFAULT_CANDIDATES",
    "MLXBudgetPlan",
    "budget_options",
    "module_bytes",
    "parse_candidates",
    "solve_mlx",
    "tag",
]

#: the grids tried by default: every bit width mlx-lm's recipes use at group 64, and 3/4 bits
#: at groups 32 and 128 (18 grids would double the trials for little: the solver mostly trades
#: bits)
DEFAULT_CANDIDATES = ("2bit-g64", "3bit-g32", "3bit-g64", "4bit-g32", "4bit-g64", "4bit-g128",
                      "5bit-g64", "6bit-g64", "8bit-g64")  # fmt: skip

_TAG = re.compile(r"^(\d+)bit-g(\d+)$")


def tag(p: MLXParams) -> str:
    """A grid's candidate name: ``4bit-g64``."""
    return f"{p.bits}bit-g{p.group_size}"


def parse_candidates(names: Iterable[str]) -> tuple[MLXParams, ...]:
    """Candidate grids from their names (``3bit-g32``), in the order given, without repeats.

    Raises:
        LowbitError: a name that is not ``<bits>bit-g<group>``, or a grid MLX cannot hold.
    """
    out: list[MLXParams] = []
    for raw in names:
        m = _TAG.match(raw.strip().lower())
        if m is None:
            raise LowbitError(
                f"MLX candidate {raw!r}: spell grids <bits>bit-g<group>, e.g. "
                f"{','.join(DEFAULT_CANDIDATES[:3])}"
            )
        try:
            p = MLXParams(bits=int(m.group(1)), group_size=int(m.group(2)))
        except LowbitError as exc:
            raise LowbitError(f"MLX candidate {raw!r}: {exc}") from None
        if p not in out:
            out.append(p)
    if not out:
        raise LowbitError("no MLX candidate grids given")
    return tuple(out)


def module_bytes(shape: tuple[int, ...], p: MLXParams, dtype: Any) -> int:
    """The bytes an MLX folder stores for a module of weight ``shape`` on grid ``p``: its
    uint32 words, scales and biases (the last two in ``dtype``)."""
    *lead, n = shape
    rows = math.prod(lead)
    item = np.dtype(dtype).itemsize
    return rows * (n * p.bits // 32) * 4 + 2 * rows * (n // p.group_size) * item  # type: ignore[operator]


def budget_options(
    ckpt: Any, candidates: Iterable[MLXParams]
) -> dict[str, dict[str, tuple[str, MLXParams]]]:
    """Each module the MLX output quantizes: ``{source tensor: {candidate name: (module path,
    params)}}``, the candidates whose groups divide its rows (a module none fits is kept in
    the model dtype, as mlx-lm keeps it).

    Raises:
        LowbitError: a mixture of experts (its stacks are not priced yet), or a family the MLX
            output does not write.
    """
    cands = tuple(candidates)
    plan = _Plan(ckpt, cands[0], {})
    if plan.stacks:
        raise LowbitError(
            "--budget/--size with --out-format mlx: stacked experts (switch_mlp) are not priced "
            "yet; give --q-bits/--q-group-size or a recipe (--to mixed_3_6)"
        )
    out: dict[str, dict[str, tuple[str, MLXParams]]] = {}
    for hf, src, _ in plan.entries:
        shape = tuple(int(v) for v in ckpt.info(src).shape)
        if not hf.endswith(".weight") or len(shape) != 2 or not _is_float(ckpt, src):
            continue
        fits = {tag(p): (hf[: -len(".weight")], p) for p in cands
                if shape[-1] % p.group_size == 0}  # type: ignore[operator]  # fmt: skip
        if fits:
            out[src] = fits
    return out


@dataclass(frozen=True)
class MLXBudgetPlan:
    """The grids a budget chose and what they cost.

    Attributes:
        modules: module path -> its chosen :class:`MLXParams` (every quantized module).
        default: the most chosen grid (config.json's top-level ``quantization``).
        tensor_bytes: every tensor the folder stores, in bytes (``total_size``), exactly.
        quantized_bytes: the quantized modules' words, scales and biases.
        weights: the quantized modules' weights.
        damage: the summed measured damage of the choice.
        allocation: the solver's result (its ``bound``: no choice within the budget has less
            summed damage).
        budget: ``{"kind": "size" | "bits_per_weight", "value"}``.
    """

    modules: dict[str, MLXParams]
    default: MLXParams
    tensor_bytes: int
    quantized_bytes: int
    weights: int
    damage: float
    allocation: Allocation
    budget: dict[str, Any]

    @property
    def bits_per_weight(self) -> float:
        return 8 * self.quantized_bytes / max(self.weights, 1)

    def to_dict(self) -> dict[str, Any]:
        counts = Counter(tag(p) for p in self.modules.values())
        return {
            "budget": dict(self.budget),
            "default": tag(self.default),
            "modules": {m: tag(p) for m, p in self.modules.items()},
            "counts": dict(sorted(counts.items())),
            "tensor_bytes": self.tensor_bytes,
            "quantized_bytes": self.quantized_bytes,
            "bits_per_weight": self.bits_per_weight,
            "predicted_damage": self.damage,
            "damage_bound": self.allocation.bound,
        }


def tensor_bytes(ckpt: Any, default: MLXParams, modules: Mapping[str, MLXParams], dt: Any) -> int:
    """The bytes of every tensor the writer stores for this choice (no data is made)."""
    plan = _Plan(ckpt, default, dict(modules))
    return sum(e.nbytes for e in _entries(ckpt, plan, np.dtype(dt), {}))


def solve_mlx(
    ckpt: Any,
    options: Mapping[str, Mapping[str, tuple[str, MLXParams]]],
    damages: Mapping[str, Mapping[str, float]],
    dt: Any,
    *,
    size: int | None = None,
    bits_per_weight: float | None = None,
    resolution: int = 1 << 16,
) -> MLXBudgetPlan:
    """The least summed damage choice of one grid per module within the budget.

    Args:
        ckpt: the open source.
        options: :func:`budget_options`.
        damages: ``{source tensor: {candidate name: damage}}`` for every option.
        dt: the model dtype (scales, biases and kept tensors).
        size: the folder's tensor bytes at most; or
        bits_per_weight: the quantized modules' stored bits per weight at most.
        resolution: the solver's budget units.

    Raises:
        LowbitError: not exactly one budget, or one below the cheapest choice (the message says
            what the cheapest needs), a damage missing.
    """
    if not options:
        raise LowbitError("the MLX output quantizes no module of this model: nothing to budget")
    shapes = {n: tuple(int(v) for v in ckpt.info(n).shape) for n in options}
    costs = {n: {t: 8 * module_bytes(shapes[n], p, dt) for t, (_, p) in opts.items()}
             for n, opts in options.items()}  # fmt: skip
    weights = sum(math.prod(shapes[n]) for n in options)
    fixed = 0
    if size is not None:  # what the folder stores beside the modules (kept tensors)
        first = dict(next(iter(opts.values())) for opts in options.values())
        whole = tensor_bytes(ckpt, next(iter(first.values())), first, dt)
        fixed = 8 * whole - sum(next(iter(c.values())) for c in costs.values())
    solved = solve_budget(
        costs,
        damages,
        weights=weights,
        fixed=fixed,
        size=size,
        bits_per_weight=bits_per_weight,
        needs="tensor bytes (every module at its smallest candidate)",
        resolution=resolution,
    )
    modules = dict(options[n][t] for n, t in solved.chosen.items())
    default = Counter(modules.values()).most_common(1)[0][0]
    qbytes = sum(costs[n][t] for n, t in solved.chosen.items()) // 8
    return MLXBudgetPlan(
        modules=modules,
        default=default,
        tensor_bytes=tensor_bytes(ckpt, default, modules, dt),
        quantized_bytes=qbytes,
        weights=weights,
        damage=float(solved.allocation.damage),
        allocation=solved.allocation,
        budget=solved.budget,
    )
