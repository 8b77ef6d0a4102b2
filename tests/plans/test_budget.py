"""The bits-budget solver (multiple-choice knapsack) against brute force."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lowbit.errors import LowbitError
from lowbit.plans.budget import lagrangian_bound, solve, solve_budget


@st.composite
def instances(draw: st.DrawFn) -> tuple[list[list[int]], list[list[float]], int]:
    n = draw(st.integers(1, 6))
    costs, damages = [], []
    for _ in range(n):
        k = draw(st.integers(1, 4))
        costs.append(draw(st.lists(st.integers(0, 40), min_size=k, max_size=k)))
        damages.append(draw(st.lists(st.floats(0, 100, allow_nan=False), min_size=k, max_size=k)))
    lo = sum(min(c) for c in costs)
    hi = sum(max(c) for c in costs)
    return costs, damages, draw(st.integers(lo, hi + 5))


def _brute(costs: list[list[int]], damages: list[list[float]], budget: int) -> float:
    best = math.inf
    for choice in itertools.product(*(range(len(c)) for c in costs)):
        if sum(c[j] for c, j in zip(costs, choice, strict=True)) <= budget:
            best = min(best, sum(d[j] for d, j in zip(damages, choice, strict=True)))
    return best


@settings(max_examples=300, deadline=None)
@given(instances())
def test_exact_when_unit_is_one_bit(inst: tuple[list[list[int]], list[list[float]], int]) -> None:
    """With a one-bit unit the DP finds the brute-force optimum, within the budget."""
    costs, damages, budget = inst
    a = solve(costs, damages, budget, resolution=max(1, budget))
    assert a.unit == (math.gcd(*(x for c in costs for x in c)) or 1)
    assert a.cost <= budget
    assert a.cost == sum(c[j] for c, j in zip(costs, a.choice, strict=True))
    assert a.damage == pytest.approx(_brute(costs, damages, budget), rel=1e-12, abs=1e-9)
    assert a.bound <= a.damage + 1e-9


@settings(max_examples=300, deadline=None)
@given(instances(), st.integers(1, 8))
def test_coarse_units_never_exceed_budget(
    inst: tuple[list[list[int]], list[list[float]], int], resolution: int
) -> None:
    """Coarse units may lose optimality but never the budget; the dual bound stays below."""
    costs, damages, budget = inst
    opt = _brute(costs, damages, budget)
    try:
        a = solve(costs, damages, budget, resolution=resolution)
    except LowbitError as e:
        assert "raise the resolution" in str(e)
        return
    assert a.cost <= budget
    assert a.damage >= opt - 1e-9
    assert a.bound <= opt + 1e-9
    assert a.gap >= a.damage - opt - 1e-9


@settings(max_examples=200, deadline=None)
@given(instances())
def test_common_divisor_of_costs_is_exact(
    inst: tuple[list[list[int]], list[list[float]], int],
) -> None:
    """Costs in whole bytes (multiples of 8 bits): a unit of 8 bits loses nothing, so a budget
    of budget/8 units is enough for the optimum."""
    costs, damages, budget = inst
    costs = [[8 * x for x in c] for c in costs]
    budget = 8 * budget + 7  # the 7 spare bits cannot be used by whole bytes
    a = solve(costs, damages, budget, resolution=max(1, budget // 8))
    assert a.cost <= budget
    assert a.unit % 8 == 0 or not any(x for c in costs for x in c)
    assert a.damage == pytest.approx(_brute(costs, damages, budget), rel=1e-12, abs=1e-9)


def test_bound_is_tight_on_a_convex_instance() -> None:
    """When the LP relaxation is integral the Lagrangian bound equals the optimum."""
    costs = [[4, 8], [4, 8]]
    damages = [[10.0, 1.0], [10.0, 1.0]]
    assert lagrangian_bound(costs, damages, 16) == pytest.approx(2.0)
    assert lagrangian_bound(costs, damages, 8) == pytest.approx(20.0)
    a = solve(costs, damages, 12)
    assert a.damage == pytest.approx(11.0)
    assert a.bound <= 11.0


def test_budget_below_cheapest_plan_is_an_error() -> None:
    """A budget no plan fits is one clear error naming the cheapest plan."""
    with pytest.raises(LowbitError, match=r"cheapest plan \(8 bits"):
        solve([[4, 8], [4, 8]], [[1.0, 0.0], [1.0, 0.0]], 7)


@pytest.mark.parametrize(
    ("costs", "damages"),
    [([[1, 2]], [[1.0]]), ([[1]], [[math.nan]]), ([[-1]], [[0.0]]), ([[]], [[]])],
)
def test_bad_inputs(costs: list[list[int]], damages: list[list[float]]) -> None:
    """Mismatched, empty, negative or NaN inputs are refused."""
    with pytest.raises(LowbitError):
        solve(costs, damages, 10)


def test_solve_budget_by_name() -> None:
    """Named options: a size budget counts the fixed bits, a bits-per-weight one does not;
    the choice is returned by option name and equals solve's on the same numbers."""
    costs = {"a": {"lo": 16, "hi": 32}, "b": {"lo": 8, "hi": 24}}
    damages = {"a": {"lo": 5.0, "hi": 1.0}, "b": {"lo": 3.0, "hi": 0.0}, "c": {"x": 9.0}}
    # 10 bytes = 80 bits, 40 of them fixed: 40 left, room for one upgrade (a: saves more)
    by_size = solve_budget(costs, damages, weights=8, fixed=40, size=10)
    assert by_size.chosen == {"a": "hi", "b": "lo"}
    assert by_size.budget == {"kind": "size", "value": 10}
    assert by_size.allocation.choice == solve([[16, 32], [8, 24]], [[5, 1], [3, 0]], 40).choice
    # 7 bits per weight x 8 weights = 56 bits; the fixed 40 bits do not count
    by_bits = solve_budget(costs, damages, weights=8, fixed=40, bits_per_weight=7.0)
    assert by_bits.chosen == {"a": "hi", "b": "hi"}
    assert by_bits.budget == {"kind": "bits_per_weight", "value": 7.0}


def test_solve_budget_refusals() -> None:
    """One budget, bits per weight in range, a budget below the smallest options (saying what
    they need, in the caller's words), every damage measured."""
    costs = {"a": {"lo": 16, "hi": 32}}
    damages = {"a": {"lo": 5.0, "hi": 1.0}}
    with pytest.raises(LowbitError, match=r"^give one budget: bits per weight \(--budget\)"):
        solve_budget(costs, damages, weights=8)
    with pytest.raises(LowbitError, match=r"^give one budget"):
        solve_budget(costs, damages, weights=8, size=10, bits_per_weight=4.0)
    with pytest.raises(LowbitError, match=r"^bits per weight must be between 0 and 64, got 64"):
        solve_budget(costs, damages, weights=8, bits_per_weight=64)
    with pytest.raises(LowbitError, match=r"needs 1,002 bytes \(all at their least\)$"):
        solve_budget(
            costs, damages, weights=8, fixed=8000, size=1001, needs="bytes (all at their least)"
        )
    with pytest.raises(LowbitError, match=r"^the budget is below .*: needs 2\.0000 bits/weight$"):
        solve_budget(costs, damages, weights=8, bits_per_weight=1.9)
    with pytest.raises(LowbitError, match=r"^no measured damage for 'hi'$"):
        solve_budget(costs, {"a": {"lo": 5.0}}, weights=8, bits_per_weight=4.0)
