"""One colour per scheme for every figure of a report (page and PNGs): a qualitative palette,
with tensors kept at source precision in a neutral grey of their own.

Bits per weight are categories here, not a continuous quantity: a ramp from 4 to 32 bits makes
every 4-, 5-, 6- and 8-bit tensor the same pale colour beside 32-bit norms. So each scheme a
page shows gets its own colour, in order of its bits per weight (cheapest first), and tensors
kept as stored are "kept", never a point on the same scale.

The palette: the seven colours of Okabe and Ito (2008, "Color Universal Design", distinguishable
with the common colour-vision deficiencies; their black left out) followed by five that stay
at least 25 CIELAB units (ΔE*76) from every earlier one, from the grey of "kept" and from
white. A page with more schemes than that takes further colours from a fixed sequence of hues
(golden-angle steps at three lightnesses), each accepted only when it lies at least ``ΔE`` from
every colour already given, starting at ΔE 20 and lowering the bar only when no hue of the
sequence passes; a colour is never given twice on one page.
"""

from __future__ import annotations

import colorsys
import functools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

__all__ = ["KEPT", "KEPT_COLOUR", "QUALITATIVE", "Palette", "delta_e", "palette"]

#: The palette key of every tensor kept at source precision.
KEPT = "kept"
#: Its colour: a neutral grey that is no scheme's.
KEPT_COLOUR = "#bdbdbd"
#: The qualitative colours, in the order schemes (cheapest first) take them.
QUALITATIVE = (
    "#0072b2",  # blue (Okabe-Ito)
    "#e69f00",  # orange
    "#009e73",  # bluish green
    "#cc79a7",  # reddish purple
    "#d55e00",  # vermillion
    "#56b4e9",  # sky blue
    "#f0e442",  # yellow
    "#8c564b",  # brown
    "#332288",  # indigo (Tol)
    "#999933",  # olive (Tol)
    "#882255",  # wine (Tol)
    "#b2df8a",  # light green
)
_WHITE = "#ffffff"


@functools.cache
def _lab(colour: str) -> tuple[float, float, float]:
    """CIELAB (D65) of an ``#rrggbb`` sRGB colour."""
    r, g, b = (int(colour[i : i + 2], 16) / 255 for i in (1, 3, 5))

    def lin(c: float) -> float:
        return c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4

    r, g, b = lin(r), lin(g), lin(b)
    x = (0.4124 * r + 0.3576 * g + 0.1805 * b) / 0.95047
    y = 0.2126 * r + 0.7152 * g + 0.0722 * b
    z = (0.0193 * r + 0.1192 * g + 0.9505 * b) / 1.08883

    def f(t: float) -> float:
        return t ** (1 / 3) if t > 216 / 24389 else (24389 / 27 * t + 16) / 116

    fx, fy, fz = f(x), f(y), f(z)
    return 116 * fy - 16, 500 * (fx - fy), 200 * (fy - fz)


def delta_e(a: str, b: str) -> float:
    """The CIE76 colour difference ΔE*ab of two ``#rrggbb`` colours (about 2.3: just
    noticeable; over 20: different colours at a glance)."""
    return math.dist(_lab(a), _lab(b))


def _hues() -> Iterable[str]:
    """The fallback sequence: golden-angle hue steps at three lightnesses."""
    for k in range(1080):
        h = (k * 0.381966) % 1.0
        light = (0.42, 0.62, 0.30)[k % 3]
        r, g, b = colorsys.hls_to_rgb(h, light, 0.70)
        yield f"#{round(r * 255):02x}{round(g * 255):02x}{round(b * 255):02x}"


def _more(used: list[str]) -> str:
    """The next fallback colour: the first of the sequence at least ΔE from every used one,
    the bar lowered by 4 each time no colour passes; never one already used."""
    bar = 20.0
    while True:
        for c in _hues():
            if c not in used and all(delta_e(c, u) >= bar for u in used):
                return c
        if bar <= 0:  # every hue used: a page of over a thousand schemes
            k = len(used)
            while (c := f"#{(k * 2654435761) % 0x1000000:06x}") in used:
                k += 1
            return c
        bar -= 4.0


@dataclass(frozen=True)
class Palette:
    """The colours of one page: ``entries`` are ``(key, colour, bits per weight)`` in legend
    order (cheapest scheme first, ``kept`` last)."""

    entries: tuple[tuple[str, str, float], ...]

    def __getitem__(self, key: str) -> str:
        for k, c, _ in self.entries:
            if k == key:
                return c
        raise KeyError(key)

    def __contains__(self, key: object) -> bool:
        return any(k == key for k, _, _ in self.entries)

    def get(self, key: str, default: str = "#ffffff") -> str:
        """The colour of ``key``, or ``default`` when the page has no such scheme."""
        try:
            return self[key]
        except KeyError:
            return default

    def legend(self) -> list[tuple[str, str]]:
        """``(colour, label)`` per entry: the scheme with its bits per weight
        (``int4:g128:fp32 (4.25)``), or ``kept as stored``."""
        return [
            (c, "kept as stored" if k == KEPT else f"{k} ({b:.2f})" if math.isfinite(b) else k)
            for k, c, b in self.entries
        ]


def palette(schemes: Sequence[tuple[str, float]]) -> Palette:
    """Give each scheme its colour.

    Args:
        schemes: ``(key, bits per weight)``; a key is a scheme label (``int4:g128:fp32``), a
            stored dtype or :data:`KEPT`. A key given twice keeps its first bits.

    Returns:
        The :class:`Palette`: schemes ordered by bits per weight, then by name, take
        :data:`QUALITATIVE` in turn and then the fallback colours (module docstring);
        ``kept`` is :data:`KEPT_COLOUR` and comes last. No two keys share a colour.
    """
    bits: dict[str, float] = {}
    for key, b in schemes:
        bits.setdefault(key, float(b))
    order = sorted(
        (k for k in bits if k != KEPT),
        key=lambda k: (bits[k] if math.isfinite(bits[k]) else math.inf, k),
    )
    used: list[str] = [KEPT_COLOUR, _WHITE]
    entries = []
    for k, key in enumerate(order):
        colour = QUALITATIVE[k] if k < len(QUALITATIVE) else _more(used)
        used.append(colour)
        entries.append((key, colour, bits[key]))
    if KEPT in bits:
        entries.append((KEPT, KEPT_COLOUR, bits[KEPT]))
    return Palette(tuple(entries))
