"""lowbit._progress: the one progress bar, which the caller can turn off."""

from __future__ import annotations

import subprocess
import sys

import pytest

from lowbit._progress import progress_bar, progress_iter


def test_off_is_silent_and_never_imports_tqdm() -> None:
    """progress=False gives the silent stand-in, without importing tqdm."""
    code = (
        "import sys; from lowbit._progress import progress_bar, progress_iter;"
        "b = progress_bar(3, False, 'x'); b.update(2); b.close(); assert b.n == 2;"
        "assert list(progress_iter([1, 2], False, 'x')) == [1, 2];"
        "print(type(b).__name__, 'tqdm' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["_Silent", "False"]


def test_on_and_terminal_only_are_tqdm_bars() -> None:
    """True shows a tqdm bar (disable=False); None leaves the choice to the terminal test."""
    tqdm = pytest.importorskip("tqdm")
    with progress_bar(10, True, "on", "B", unit_scale=True) as bar:
        assert isinstance(bar, tqdm.tqdm) and not bar.disable
        bar.update(4)
        assert bar.n == 4 and bar.total == 10 and bar.unit == "B"
    with progress_bar(10, None, "auto") as bar:  # stderr is captured here, not a terminal
        assert isinstance(bar, tqdm.tqdm) and bar.disable


@pytest.mark.parametrize("progress", [True, False, None])
def test_iter_yields_every_item_in_order(progress: bool | None) -> None:
    """progress_iter gives every item once, in order, whatever the setting."""
    items = list(range(7))
    assert list(progress_iter(items, progress, "items")) == items
    assert list(progress_iter(iter(items), progress, "no len")) == items


def test_auto_shows_in_a_jupyter_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """None shows the bar in a Jupyter kernel (its stderr is no terminal), not elsewhere."""
    import types

    tqdm = pytest.importorskip("tqdm")

    class ZMQInteractiveShell:  # the kernel's shell class, by name
        pass

    fake = types.ModuleType("IPython")
    fake.get_ipython = ZMQInteractiveShell  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "IPython", fake)
    monkeypatch.setitem(sys.modules, "ipykernel", types.ModuleType("ipykernel"))
    with progress_bar(3, None, "kernel") as bar:
        assert isinstance(bar, tqdm.tqdm) and not bar.disable
    fake.get_ipython = lambda: None  # type: ignore[attr-defined]  # IPython, not a kernel
    with progress_bar(3, None, "terminal?") as bar:
        assert bar.disable


def test_step_reporter() -> None:
    """A callable passes through; True advances a bar to each reported count; False is no
    callback; anything else is one LowbitError."""
    from lowbit._progress import step_reporter
    from lowbit.errors import LowbitError

    def mine(done: int, total: int) -> None:
        pass

    assert step_reporter(mine, "x")[0] is mine
    assert step_reporter(False, "x")[0] is None
    pytest.importorskip("tqdm")
    report, close = step_reporter(True, "steps")
    assert report is not None
    report(2, 5)
    report(5, 5)
    close()
    with pytest.raises(LowbitError, match="got 'yes'"):
        step_reporter("yes", "x")
