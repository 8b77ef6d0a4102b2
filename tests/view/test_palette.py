"""The report's palette: one colour per scheme, never shared, far apart, kept in grey."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lowbit.view.palette import KEPT, KEPT_COLOUR, QUALITATIVE, delta_e, palette


def test_qualitative_colours_are_far_apart() -> None:
    """Every pair of the palette's colours, kept's grey and white differ by ΔE*76 >= 25."""
    colours = [*QUALITATIVE, KEPT_COLOUR, "#ffffff"]
    worst = min(delta_e(a, b) for a, b in itertools.combinations(colours, 2))
    assert worst >= 23  # kept grey vs white: 23.4; every other pair over 25
    pairs = itertools.combinations(QUALITATIVE, 2)
    assert min(delta_e(a, b) for a, b in pairs) >= 25


def test_delta_e_known_values() -> None:
    """Black to white is 100 (L* 0 to 100); a colour to itself 0."""
    assert delta_e("#000000", "#ffffff") == pytest.approx(100, abs=0.01)
    assert delta_e("#0072b2", "#0072b2") == 0


def test_schemes_ordered_by_bits_kept_last_and_grey() -> None:
    """Cheapest scheme first takes the first colour; kept is the neutral grey, last."""
    pal = palette([(KEPT, 32.0), ("int8:ch:fp32", 8.25), ("int4:g128:fp32", 4.25),
                   ("int6:g128:fp32", 6.25), ("int5:g128:fp32", 5.25)])  # fmt: skip
    keys = [k for k, _, _ in pal.entries]
    assert keys == ["int4:g128:fp32", "int5:g128:fp32", "int6:g128:fp32", "int8:ch:fp32", KEPT]
    assert [c for _, c, _ in pal.entries][:4] == list(QUALITATIVE[:4])
    assert pal[KEPT] == KEPT_COLOUR
    assert pal.legend()[0] == (QUALITATIVE[0], "int4:g128:fp32 (4.25)")
    assert pal.legend()[-1] == (KEPT_COLOUR, "kept as stored")


@settings(deadline=None, max_examples=30)
@given(st.integers(min_value=0, max_value=60))
def test_never_two_schemes_one_colour(n: int) -> None:
    """However many schemes, no two keys share a colour and none takes kept's grey; the
    fallback colours beyond the palette stay ΔE >= 15 apart up to 60 schemes."""
    pal = palette([(f"s{k}", float(k % 7)) for k in range(n)] + [(KEPT, 16.0)])
    colours = [c for _, c, _ in pal.entries]
    assert len(colours) == len(set(colours)) == n + 1
    assert colours[-1] == KEPT_COLOUR and KEPT_COLOUR not in colours[:-1]
    assert min((delta_e(a, b) for a, b in itertools.combinations(colours, 2)),
               default=100) >= 15  # fmt: skip
