"""The timing a command reports: the whole command's wall time, split into named parts."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["Stopwatch"]


class Stopwatch:
    """Wall time from construction, with named parts; what no part claims is ``other``
    (opening files, planning, printing), so the parts always sum to the total."""

    def __init__(self) -> None:
        self._start = time.perf_counter()
        self.parts: dict[str, float] = {}

    @contextmanager
    def part(self, name: str) -> Iterator[None]:
        """Time the block as part ``name`` (added to what the part already has)."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - start)

    def add(self, name: str, seconds: float) -> None:
        """Add ``seconds`` to part ``name``."""
        self.parts[name] = self.parts.get(name, 0.0) + max(0.0, seconds)

    def split(self, name: str, into: dict[str, float]) -> None:
        """Divide part ``name`` into the parts ``into`` names, by their seconds (clipped to
        what ``name`` has); the remainder stays under ``name``."""
        left = self.parts.pop(name, 0.0)
        for part, seconds in into.items():
            take = min(left, max(0.0, seconds))
            self.add(part, take)
            left -= take
        if left > 0:
            self.add(name, left)

    def to_dict(self) -> dict[str, float]:
        """``{"total": ..., part: seconds, ..., "other": ...}`` (``--json``'s ``seconds``)."""
        total = time.perf_counter() - self._start
        parts = {k: v for k, v in self.parts.items() if k != "other"}
        return {"total": total, **parts, "other": max(0.0, total - sum(parts.values()))}

    def line(self, d: dict[str, float] | None = None) -> str:
        """``170.3 s (calibration 120.1 s, solve 45.0 s, quantize 3.1 s, write 2.0 s)``:
        parts under 0.05 s are left out of the brackets."""
        d = self.to_dict() if d is None else d
        shown = [f"{k} {v:.1f} s" for k, v in d.items() if k != "total" and v >= 0.05]
        return f"{d['total']:.1f} s" + (f" ({', '.join(shown)})" if shown else "")
