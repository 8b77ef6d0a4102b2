"""The command timer: parts and ``other`` sum to the total, a split moves seconds between
parts without creating any."""

from __future__ import annotations

import time

import pytest

from lowbit.jobs.stopwatch import Stopwatch


def test_parts_sum_to_total_and_split() -> None:
    """Timed parts and ``other`` add up to the total; a split moves at most what the part
    had into the named parts (clipped) and keeps the rest under its own name."""
    clock = Stopwatch()
    with clock.part("calibration"):
        time.sleep(0.03)
    with clock.part("write"):
        time.sleep(0.02)
    had = clock.parts["calibration"]
    clock.split("calibration", {"solve": 0.01})
    clock.split("write", {"quantize": 10.0})  # more than it had: all of it, no more
    d = clock.to_dict()
    assert d["solve"] == 0.01 and d["calibration"] == pytest.approx(had - 0.01)
    assert "write" not in d and d["quantize"] >= 0.02
    parts = sum(v for k, v in d.items() if k != "total")
    assert parts == pytest.approx(d["total"]) and d["other"] >= 0


def test_line_names_the_parts() -> None:
    """The summary line: the total, then each part of 0.05 s or more."""
    d = {"total": 7.04, "calibration": 3.0, "solve": 2.0, "quantize": 2.0, "other": 0.04}
    assert Stopwatch().line(d) == "7.0 s (calibration 3.0 s, solve 2.0 s, quantize 2.0 s)"
