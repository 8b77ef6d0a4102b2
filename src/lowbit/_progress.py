"""The one progress bar of lowbit: tqdm on stderr, which the caller can turn off.

Every function that takes ``progress`` means the same by it: ``True`` shows a bar, ``False``
never does, ``None`` shows one only when stderr is a terminal (tqdm's ``disable=None``). tqdm is
optional (``pip install tqdm``, in the ``lowbit[models]`` extra): without it, and whenever the
bar is off, a silent stand-in with the same ``update``/``close``/``with`` interface is used, so
a missing bar never stops the work.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

__all__ = ["progress_bar", "progress_iter"]

T = TypeVar("T")


class _Silent:
    """What ``progress_bar`` gives when no bar is shown: it only counts, as tqdm's ``n``."""

    def __init__(self) -> None:
        self.n: float = 0

    def update(self, n: float = 1) -> None:
        """Count ``n`` more units (a bar would advance by them)."""
        self.n += n

    def close(self) -> None:
        """Do nothing."""

    def __enter__(self) -> _Silent:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


def _tqdm() -> Any:
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return None
    return tqdm


def progress_bar(
    total: int | None,
    progress: bool | None,
    desc: str,
    unit: str = "it",
    *,
    unit_scale: bool = False,
) -> Any:
    """A progress bar over ``total`` units, to advance with ``update(n)`` and ``close()``.

    Args:
        total: the units to expect (None: unknown).
        progress: ``True`` shows the bar, ``False`` never, ``None`` only on a terminal.
        desc: the label in front of the bar.
        unit: what one unit is (``"tensor"``, ``"tok"``, ``"B"`` ...).
        unit_scale: show large counts as k/M/G (for bytes).

    Returns:
        A tqdm bar, or a silent stand-in with the same interface (``update``, ``close``, ``n``) when the bar is off or tqdm
        is not installed. Both work as context managers.
    """
    tqdm = None if progress is False else _tqdm()
    if tqdm is None:
        return _Silent()
    disable = None if progress is None else False
    return tqdm(total=total, desc=desc, unit=unit, unit_scale=unit_scale, disable=disable)


def progress_iter(
    items: Iterable[T], progress: bool | None, desc: str, unit: str = "it"
) -> Iterator[T]:
    """``items``, with a progress bar advancing once per item (see :func:`progress_bar`).

    Args:
        items: what to iterate over (its ``len`` is the bar's total when it has one).
        progress: ``True`` shows the bar, ``False`` never, ``None`` only on a terminal.
        desc: the label in front of the bar.
        unit: what one item is.

    Returns:
        An iterator over ``items``.
    """
    total = len(items) if hasattr(items, "__len__") else None  # type: ignore[arg-type]
    with progress_bar(total, progress, desc, unit) as bar:
        for item in items:
            yield item
            bar.update(1)
