"""lowbit.models._threads: the torch threads an evaluation uses."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.torch


def test_default_threads_follow_idle_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without threads=, an evaluation uses the usable cores that are idle (at least one,
    at most the affinity); where idle time cannot be read, or OpenMP's waiting threads
    sleep (OMP_WAIT_POLICY=PASSIVE), every usable core."""
    from lowbit.models import _threads as ppl

    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.setattr(ppl, "_cores", lambda: 4)
    for idle, want in ((4.0, 4), (3.6, 4), (2.4, 2), (1.0, 1), (0.2, 1), (0.0, 1)):
        monkeypatch.setattr(ppl, "_idle_cores", lambda cores, idle=idle: min(cores, idle))
        assert ppl.default_threads() == want, idle
    monkeypatch.setattr(ppl, "_idle_cores", lambda cores: None)
    assert ppl.default_threads() == 4
    monkeypatch.setattr(ppl, "_idle_cores", lambda cores: 0.0)
    monkeypatch.setenv("OMP_WAIT_POLICY", "passive")  # waiting threads sleep: every core
    assert ppl.default_threads() == 4
    monkeypatch.delenv("OMP_WAIT_POLICY")
    monkeypatch.setattr(ppl, "_idle_cores", lambda cores: 1.0)
    before = torch.get_num_threads()
    with ppl._threads(None) as used:
        assert used == 1 and torch.get_num_threads() == 1
    assert torch.get_num_threads() == before


def test_idle_cores_reads_proc_stat() -> None:
    """The idle-core sample is a number of cores between 0 and the cap (Linux), or None."""
    from lowbit.models import _threads as ppl

    idle = ppl._idle_cores(2, sample=0.05)
    assert idle is None or 0.0 <= idle <= 2.0
