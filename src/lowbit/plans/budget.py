"""Choose one option per tensor under a bits budget: a multiple-choice knapsack.

Each tensor ``i`` has options ``j`` (say ``int4:g128``, ``nf4``, ``int8:ch``), each with a
storage cost ``c[i][j]`` in bits (codes, scales and zero points) and a measured damage
``d[i][j]`` (the loss in model quality when that tensor alone is quantized that way). The
mixed-precision plan picks one option per tensor minimising ``sum d`` subject to
``sum c <= budget``. Summing per-tensor damages is the usual first-order model of how the
damages combine; what a plan really costs is measured afterwards.

:func:`solve` is exact dynamic programming over a discretised budget: the budget is cut into
``resolution`` units of ``unit = g * ceil(budget / g / resolution)`` bits, where ``g`` is the
greatest common divisor of all costs (stored sizes are whole bytes, so ``g >= 8`` for real
tensors, and a unit of ``g`` bits loses nothing), and every cost is rounded UP to whole units,
so a chosen plan never exceeds the true budget; the bits the rounding left unused are then
spent by swaps that fit the true budget and lower the damage. A coarser unit can only
cost optimality, and by how much is stated: the Lagrangian dual
``max_λ>=0 sum_i min_j (d_ij + λ c_ij) - λ·budget`` is a lower bound on the true optimum, and
``gap = damage - bound`` is reported with every solution. When ``budget / g <= resolution``
the unit is ``g`` and the solution is exactly optimal.

:func:`solve_budget` is the front the file formats' budgets share (GGUF types per tensor, MLX
grids per module): a budget in bytes (``size``) or in bits per weight, the refusal of a budget
below the smallest candidates that says what they need, and the measured damages looked up by
tensor and option name.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from lowbit.errors import LowbitError

__all__ = ["Allocation", "Budgeted", "lagrangian_bound", "solve", "solve_budget"]


@dataclass(frozen=True)
class Allocation:
    """A solution: the option chosen for each item and what it costs.

    Attributes:
        choice: index of the chosen option, one per item.
        cost: total cost in bits (exact, not discretised); never above ``budget``.
        damage: total damage of the chosen options.
        budget: the budget it was solved for, in bits.
        bound: a lower bound on the damage of any plan within the budget (Lagrangian dual).
        unit: bits per unit of the discretised budget (the costs' common divisor: the DP
            was exact).
    """

    choice: tuple[int, ...]
    cost: int
    damage: float
    budget: int
    bound: float
    unit: int

    @property
    def gap(self) -> float:
        """How far the damage can be above the optimum, at most (0 when proven optimal)."""
        return max(0.0, self.damage - self.bound)


def _arrays(
    costs: Sequence[Sequence[int]], damages: Sequence[Sequence[float]]
) -> list[tuple[np.ndarray, np.ndarray]]:
    if len(costs) != len(damages):
        raise LowbitError(f"{len(costs)} cost lists but {len(damages)} damage lists")
    items = []
    for i, (c, d) in enumerate(zip(costs, damages, strict=True)):
        c_arr = np.asarray(c, dtype=np.int64)
        d_arr = np.asarray(d, dtype=np.float64)
        if c_arr.ndim != 1 or c_arr.shape != d_arr.shape or c_arr.size == 0:
            raise LowbitError(f"item {i}: needs one or more options with one cost and one damage")
        if (c_arr < 0).any() or not np.isfinite(d_arr).all():
            raise LowbitError(f"item {i}: costs must be >= 0 and damages finite")
        items.append((c_arr, d_arr))
    return items


def lagrangian_bound(
    costs: Sequence[Sequence[int]], damages: Sequence[Sequence[float]], budget: int
) -> float:
    """Lower bound on the least total damage within ``budget`` (the Lagrangian dual).

    ``g(λ) = sum_i min_j (d_ij + λ c_ij) - λ·budget`` is concave and piecewise linear in λ;
    its maximum over λ >= 0 is found exactly by walking its breakpoints.
    """
    items = _arrays(costs, damages)

    def g(lam: float) -> float:
        return sum(float(np.min(d + lam * c)) for c, d in items) - lam * budget

    # Breakpoints: λ where two options of one item exchange places.
    lams = {0.0}
    for c, d in items:
        for a in range(c.size):
            for b in range(a + 1, c.size):
                if c[a] != c[b]:
                    lam = (d[b] - d[a]) / (c[a] - c[b])
                    if lam > 0 and math.isfinite(lam):
                        lams.add(float(lam))
    return max(g(lam) for lam in lams)


def _fill(items: list[tuple[np.ndarray, np.ndarray]], choice: list[int], budget: int) -> None:
    """Spend what the rounded-up units left unused: while one item's swap to another option
    fits the true budget and lowers the damage, make the swap that saves the most damage per
    extra bit (a swap that costs nothing more and saves damage first). Never over budget."""
    left = budget - sum(int(items[i][0][j]) for i, j in enumerate(choice))
    while True:
        best = None
        for i, (c, d) in enumerate(items):
            j0 = choice[i]
            for j in range(c.size):
                extra = int(c[j] - c[j0])
                saved = float(d[j0] - d[j])
                if saved <= 0 or extra > left:
                    continue
                rate = math.inf if extra <= 0 else saved / extra
                if best is None or (rate, saved) > (best[0], best[1]):
                    best = (rate, saved, i, j, extra)
        if best is None:
            return
        _, _, i, j, extra = best
        choice[i] = j
        left -= extra


def solve(
    costs: Sequence[Sequence[int]],
    damages: Sequence[Sequence[float]],
    budget: int,
    *,
    resolution: int = 8192,
) -> Allocation:
    """The least-damage choice of one option per item with total cost at most ``budget``.

    Args:
        costs: per item, the cost in bits of each option (integers >= 0).
        damages: per item, the damage of each option (same shape as ``costs``).
        budget: total bits allowed.
        resolution: number of units the budget is cut into (more: closer to optimal, slower;
            the work is ``items x options x resolution``).

    Returns:
        The :class:`Allocation` (choice per item, exact cost and damage, the dual bound).

    Raises:
        LowbitError: mismatched inputs, or a budget below the cheapest plan (the message says
            how many bits the cheapest plan needs).
    """
    items = _arrays(costs, damages)
    budget = int(budget)
    cheapest = sum(int(c.min()) for c, _ in items)
    if cheapest > budget:
        raise LowbitError(
            f"the budget of {budget:,} bits is below the cheapest plan ({cheapest:,} bits)"
        )
    if resolution < 1:
        raise LowbitError(f"resolution must be >= 1, got {resolution}")
    g = math.gcd(*(int(x) for c, _ in items for x in c)) or 1
    unit = g * max(1, -(-(budget // g) // resolution))
    cap = budget // unit
    inf = np.inf
    best = np.full(cap + 1, inf)
    best[0] = 0.0
    picks = np.empty((len(items), cap + 1), dtype=np.int16)
    for i, (c, d) in enumerate(items):
        units = -(-c // unit)  # rounded up: a plan within the units is within the budget
        nxt = np.full(cap + 1, inf)
        pick = np.zeros(cap + 1, dtype=np.int16)
        for j in range(c.size):
            u = int(units[j])
            if u > cap:
                continue
            cand = np.full(cap + 1, inf)
            cand[u:] = best[: cap + 1 - u] + d[j]
            better = cand < nxt
            nxt[better] = cand[better]
            pick[better] = j
        best, picks[i] = nxt, pick
    end = int(np.argmin(best))
    if not math.isfinite(best[end]):
        raise LowbitError(
            f"no plan fits {budget:,} bits at resolution {resolution} (unit {unit} bits); "
            "raise the resolution"
        )
    choice = [0] * len(items)
    at = end
    for i in range(len(items) - 1, -1, -1):
        j = int(picks[i, at])
        choice[i] = j
        at -= int(-(-items[i][0][j] // unit))
    _fill(items, choice, budget)
    cost = sum(int(items[i][0][j]) for i, j in enumerate(choice))
    damage = float(sum(items[i][1][j] for i, j in enumerate(choice)))
    assert cost <= budget, (cost, budget)
    bound = lagrangian_bound(costs, damages, budget)
    return Allocation(tuple(choice), cost, damage, budget, min(bound, damage), unit)


@dataclass(frozen=True)
class Budgeted:
    """What :func:`solve_budget` chose.

    Attributes:
        chosen: item -> the name of its chosen option.
        allocation: the solver's result (its ``choice`` indexes each item's options in order).
        budget: ``{"kind": "size" | "bits_per_weight", "value"}``.
    """

    chosen: dict[str, str]
    allocation: Allocation
    budget: dict[str, Any]


def solve_budget(
    costs: Mapping[str, Mapping[str, int]],
    damages: Mapping[str, Mapping[str, float]],
    *,
    weights: int,
    fixed: int = 0,
    size: int | None = None,
    bits_per_weight: float | None = None,
    needs: str = "bytes",
    resolution: int = 8192,
) -> Budgeted:
    """The least summed damage choice of one named option per item within a byte or bits
    per weight budget.

    Args:
        costs: ``{item: {option: bits}}``: what each option of each item stores, in order.
        damages: ``{item: {option: damage}}`` for every option of ``costs`` (more is ignored).
        weights: the items' weights (a ``bits_per_weight`` budget is ``bits_per_weight x
            weights`` bits).
        fixed: bits stored whatever is chosen (the rest of the file), counted against a
            ``size`` budget only.
        size: the bytes at most (the options' and ``fixed``); or
        bits_per_weight: the items' stored bits per weight at most.
        needs: what a ``size`` budget below the smallest choice is told it needs, after the
            byte count (``"bytes (the file with every tensor at its smallest candidate)"``).
        resolution: :func:`solve`'s budget units.

    Raises:
        LowbitError: not exactly one budget, bits per weight outside (0, 64), a budget below
            the smallest options' total (the message gives what they need), a damage missing.
    """
    if (size is None) == (bits_per_weight is None):
        raise LowbitError("give one budget: bits per weight (--budget) or a size (--size)")
    if size is not None:
        total = 8 * int(size)
        budget: dict[str, Any] = {"kind": "size", "value": int(size)}
    else:
        if not 0 < bits_per_weight < 64:  # type: ignore[operator]
            raise LowbitError(f"bits per weight must be between 0 and 64, got {bits_per_weight}")
        fixed = 0
        total = math.floor(bits_per_weight * weights)  # type: ignore[operator]
        budget = {"kind": "bits_per_weight", "value": bits_per_weight}
    items = list(costs)
    labels = [list(costs[n]) for n in items]
    bits = [[int(costs[n][t]) for t in ts] for n, ts in zip(items, labels, strict=True)]
    cheapest = fixed + sum(min(c) for c in bits)
    if cheapest > total:
        need = (f"{cheapest // 8:,} {needs}"
                if size is not None else f"{cheapest / weights:.4f} bits/weight")  # fmt: skip
        raise LowbitError(f"the budget is below the smallest candidates' total: needs {need}")
    try:
        dmg = [[float(damages[n][t]) for t in ts] for n, ts in zip(items, labels, strict=True)]
    except KeyError as exc:
        raise LowbitError(f"no measured damage for {exc.args[0]!r}") from None
    alloc = solve(bits, dmg, total - fixed, resolution=resolution)
    chosen = {n: ts[j] for n, ts, j in zip(items, labels, alloc.choice, strict=True)}
    return Budgeted(chosen, alloc, budget)
