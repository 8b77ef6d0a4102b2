"""A sensitivity scan's result: one entry per tensor and scheme, its JSON form, and Spearman's
rank correlation between the proxy and the measured damage (:mod:`lowbit.evaluation.sensitivity`
runs the scan)."""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lowbit._results import TableView
from lowbit.errors import LowbitError

__all__ = ["SensitivityEntry", "SensitivityResult", "spearman"]

# What each proxy is (the ``proxy`` of a result names one).
_PROXIES = {
    "input": "sum_j E[x_j^2] * ||W_j - Q(W)_j||^2",
    "fisher": "sum_ij E[g_i^2] * E[x_j^2] * (W - Q(W))_ij^2, g = d loss / d output",
}


def _check_proxy(proxy: str) -> str:
    if proxy not in _PROXIES:
        raise LowbitError(f"proxy must be one of {', '.join(_PROXIES)}, got {proxy!r}")
    return proxy


@dataclass(frozen=True)
class SensitivityEntry:
    """One (tensor, scheme) trial."""

    tensor: str
    scheme: str
    numel: int
    bits: int  # stored bits of codes, scales and zero points
    proxy: float
    damage: float | None  # exact measure; None when only the proxy was asked for

    @property
    def bits_per_weight(self) -> float:
        return self.bits / self.numel

    def to_dict(self) -> dict[str, Any]:
        return {
            "tensor": self.tensor,
            "scheme": self.scheme,
            "numel": self.numel,
            "bits": self.bits,
            "bits_per_weight": self.bits_per_weight,
            "proxy": self.proxy,
            "damage": self.damage,
        }


@dataclass(frozen=True, repr=False)
class SensitivityResult(TableView):
    """Every trial, what was measured, and on what.

    ``repr`` is one line; ``to_dict()``/``to_json()`` hold everything, ``to_pandas()`` and the
    Jupyter table one row per trial (:mod:`lowbit._results`).
    """

    model: str
    kind: str  # "causal" or "encoder"
    measure: str  # "exact" or "proxy"
    metric: str  # what ``damage`` is
    calibration: str
    schemes: tuple[str, ...]
    entries: tuple[SensitivityEntry, ...]
    seconds: dict[str, float] = field(default_factory=dict)
    proxy: str = "input"  # which proxy the entries' ``proxy`` is: "input" or "fisher"

    @property
    def proxy_formula(self) -> str:
        """What the entries' ``proxy`` numbers are, as a formula."""
        return _PROXIES[self.proxy]

    def tensors(self) -> list[str]:
        """Tensor names in model order."""
        seen: dict[str, None] = {}
        for e in self.entries:
            seen.setdefault(e.tensor, None)
        return list(seen)

    def table(self, key: str | None = None) -> dict[str, dict[str, SensitivityEntry]]:
        """``{tensor: {scheme: entry}}``."""
        out: dict[str, dict[str, SensitivityEntry]] = {}
        for e in self.entries:
            out.setdefault(e.tensor, {})[e.scheme] = e
        return out

    def score(self, e: SensitivityEntry) -> float:
        """The number the budget solver minimises: the exact damage; for a trial that only has
        the proxy, the proxy times its tensor's ratio of summed damage to summed proxy over
        the tensor's measured trials (a scan with ``exact_schemes``); else the proxy."""
        if e.damage is not None:
            return e.damage
        ratio = self._ratios.get(e.tensor)
        return e.proxy * ratio if ratio is not None else e.proxy

    @functools.cached_property
    def _ratios(self) -> dict[str, float]:
        sums: dict[str, list[float]] = {}
        for e in self.entries:
            if e.damage is not None:
                acc = sums.setdefault(e.tensor, [0.0, 0.0])
                acc[0] += e.damage
                acc[1] += e.proxy
        return {t: d / p for t, (d, p) in sums.items() if p > 0 and math.isfinite(d / p)}

    def rank_correlation(self) -> float | None:
        """Spearman correlation between proxy and exact damage over all trials (None: proxy only)."""
        pairs = [(e.proxy, e.damage) for e in self.entries if e.damage is not None]
        if len(pairs) < 3:
            return None
        a, b = zip(*pairs, strict=True)
        return spearman(a, b)

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": 1,
            "model": self.model,
            "kind": self.kind,
            "measure": self.measure,
            "metric": self.metric,
            "proxy": self.proxy,
            "proxy_formula": self.proxy_formula,
            "calibration": self.calibration,
            "schemes": list(self.schemes),
            "rank_correlation": self.rank_correlation(),
            "seconds": dict(self.seconds),
            "entries": [e.to_dict() for e in self.entries],
        }

    def _summary(self) -> str:
        took = sum(self.seconds.values())
        return (
            f"{len(self.tensors())} tensors x {len(self.schemes)} schemes "
            f"({', '.join(self.schemes)}), {len(self.entries)} trials, {self.measure} "
            f"({self.kind}), model={self.model!r}" + (f", {took:.1f} s" if took else "")
        )

    def _rows(self) -> list[dict[str, Any]]:
        return [{**e.to_dict(), "score": self.score(e)} for e in self.entries]

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SensitivityResult:
        """Read back :meth:`to_dict` (a ``lowbit sensitivity --json`` file), checking every
        field's type and range (a file is a user's input: ``numel`` 0 divided by zero, a
        list for ``seconds`` had no ``items``).

        Raises:
            LowbitError: naming the first field that is missing or wrong.
        """
        bad = "not a lowbit sensitivity result"
        if not isinstance(d, dict):
            raise LowbitError(f"{bad}: the document is {type(d).__name__}, not an object")

        def field(obj: dict[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
            if key not in obj:
                raise LowbitError(f"{bad}: {where}{key} is missing")
            v = obj[key]
            if isinstance(v, bool) or not isinstance(v, kind):
                raise LowbitError(f"{bad}: {where}{key} is {type(v).__name__}")
            return v

        def count(obj: dict[str, Any], key: str, where: str) -> int:
            v = field(obj, key, (int, float), where)  # 69632.0 is a count; 1e300 or 2.5 not
            if isinstance(v, float) and not (math.isfinite(v) and v.is_integer() and v < 2**62):
                raise LowbitError(f"{bad}: {where}{key} {v!r} is not a whole number")
            return int(v)

        def number(obj: dict[str, Any], key: str, where: str) -> float:
            return float(field(obj, key, (int, float), where))

        raw = field(d, "entries", list, "")
        entries = []
        for i, e in enumerate(raw):
            where = f"entries[{i}]."
            if not isinstance(e, dict):
                raise LowbitError(f"{bad}: entries[{i}] is {type(e).__name__}, not an object")
            numel, bits = count(e, "numel", where), count(e, "bits", where)
            if not 1 <= numel < 2**62 or not 0 <= bits <= 64 * numel:
                raise LowbitError(f"{bad}: {where}numel/bits {numel}/{bits} are out of range")
            damage = e.get("damage")
            entries.append(
                SensitivityEntry(
                    tensor=field(e, "tensor", str, where),
                    scheme=field(e, "scheme", str, where),
                    numel=numel,
                    bits=bits,
                    proxy=number(e, "proxy", where),
                    damage=None if damage is None else number(e, "damage", where),
                )
            )
        schemes = field(d, "schemes", list, "")
        if not all(isinstance(x, str) for x in schemes):
            raise LowbitError(f"{bad}: schemes is not a list of strings")
        seconds = d.get("seconds", {})
        if not isinstance(seconds, dict) or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in seconds.values()
        ):
            raise LowbitError(f"{bad}: seconds is not an object of numbers")
        proxy = d.get("proxy", "input")
        return cls(
            model=field(d, "model", str, ""),
            kind=field(d, "kind", str, ""),
            measure=field(d, "measure", str, ""),
            metric=field(d, "metric", str, ""),
            calibration=field(d, "calibration", str, ""),
            schemes=tuple(schemes),
            entries=tuple(entries),
            seconds={str(k): float(v) for k, v in seconds.items()},
            proxy=_check_proxy(proxy if isinstance(proxy, str) else repr(proxy)[:40]),
        )


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Spearman's rank correlation (average ranks for ties)."""

    def ranks(x: Sequence[float]) -> np.ndarray:
        x = np.asarray(x, dtype=np.float64)
        order = np.argsort(x, kind="stable")
        r = np.empty(len(x))
        r[order] = np.arange(len(x), dtype=np.float64)
        for v in np.unique(x):  # ties share their mean rank
            tie = x == v
            if tie.sum() > 1:
                r[tie] = r[tie].mean()
        return r

    ra, rb = ranks(a), ranks(b)
    ra, rb = ra - ra.mean(), rb - rb.mean()
    denom = math.sqrt(float((ra * ra).sum() * (rb * rb).sum()))
    return float((ra * rb).sum() / denom) if denom else 0.0
