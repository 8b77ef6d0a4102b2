"""The one progress bar of lowbit: tqdm on stderr, which the caller can turn off.

Every function that takes ``progress`` means the same by it: ``True`` shows a bar, ``False``
never does, ``None`` shows one when stderr is a terminal or the code runs in a Jupyter kernel
(``tqdm.auto`` draws it as a notebook widget there). Functions that report steps may also take a
callable, called as ``progress(done, total)`` (:func:`step_reporter`). tqdm is
optional (``pip install tqdm``, in the ``lowbit[models]`` extra): without it, and whenever the
bar is off, a silent stand-in with the same ``update``/``close``/``with`` interface is used, so
a missing bar never stops the work.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

from lowbit.errors import LowbitError

__all__ = ["Progress", "progress_bar", "progress_iter", "step_reporter"]

#: What ``progress=`` takes: a bar on (True), off (False), automatic (None), or, where steps are
#: reported, a callable ``progress(done, total)``.
Progress = bool | None | Callable[[int, int], None]

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
        progress: ``True`` shows the bar, ``False`` never, ``None`` on a terminal or in Jupyter.
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
    disable = False if progress or _in_notebook() else None
    return tqdm(total=total, desc=desc, unit=unit, unit_scale=unit_scale, disable=disable)


def _in_notebook() -> bool:
    """Whether this runs in a Jupyter kernel (whose stderr is not a terminal, yet shows bars)."""
    ipython = sys.modules.get("IPython")
    if ipython is None or "ipykernel" not in sys.modules:
        return False
    try:
        shell = ipython.get_ipython()
    except Exception:  # an IPython without get_ipython: not a kernel we know
        return False
    return shell is not None and type(shell).__name__ == "ZMQInteractiveShell"


def step_reporter(
    progress: Any, desc: str, unit: str = "it"
) -> tuple[Callable[[int, int], None] | None, Callable[[], None]]:
    """A ``progress(done, total)`` callback for ``progress=`` as a function takes it, and the
    function that closes its bar.

    Args:
        progress: a callable (returned as is), or ``True``/``False``/``None`` as for
            :func:`progress_bar` (a bar that the callback advances, opened on its first call,
            when ``total`` is known).
        desc: the bar's label.
        unit: what one step is.

    Returns:
        ``(callback or None, close)``.

    Raises:
        LowbitError: a ``progress`` that is neither a bool, None nor callable.
    """
    if callable(progress):
        return progress, lambda: None
    if progress is not None and not isinstance(progress, bool):
        raise LowbitError(
            f"progress must be True, False, None or a callable(done, total), got {progress!r}"
        )
    if progress is False:
        return None, lambda: None
    bars: list[Any] = []

    def report(done: int, total: int) -> None:
        if not bars:
            bars.append(progress_bar(total, progress, desc, unit))
        bar = bars[0]
        bar.update(done - bar.n)

    def close() -> None:
        for bar in bars:
            bar.close()

    return report, close


def progress_iter(
    items: Iterable[T], progress: bool | None, desc: str, unit: str = "it"
) -> Iterator[T]:
    """``items``, with a progress bar advancing once per item (see :func:`progress_bar`).

    Args:
        items: what to iterate over (its ``len`` is the bar's total when it has one).
        progress: ``True`` shows the bar, ``False`` never, ``None`` on a terminal or in Jupyter.
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
