"""lowbit.calibration._layer_walk._Stash: a stash over PARK_BYTES waits out the solve in a
temporary file and comes back bit for bit; a GPTQ run that parks every stash writes the same
weights as one that parks none."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.torch

from lowbit.calibration import _layer_walk  # noqa: E402
from lowbit.calibration._layer_walk import _Stash  # noqa: E402
from lowbit.calibration.data import Calibration  # noqa: E402
from lowbit.calibration.gptq import gptq_weights  # noqa: E402
from tiny_models import save_hf_folder, tiny_llama  # noqa: E402


def _fill(stash: _Stash, dtype: torch.dtype, count: int = 3) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    ts = [torch.randn(2, 5, 7, generator=gen).to(dtype) for _ in range(count)]
    stash.start(count)
    for t in ts:
        stash.add(t)
    return ts


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_parked_stash_comes_back_bit_for_bit(
    dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_Stash, "PARK_BYTES", 0)
    stash = _Stash()
    ts = _fill(stash, dtype)
    stash.park()
    assert stash._buf is None and stash._file is not None  # the memory is free
    got = list(stash.kept())
    assert len(got) == len(ts)
    for a, b in zip(got, ts, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert a.view(torch.uint8).numpy().tobytes() == b.view(torch.uint8).numpy().tobytes()
    assert stash._file is None  # read once, closed
    again = _fill(stash, dtype)  # the stash goes on: a new buffer, in memory until parked
    assert [t.tolist() for t in stash.kept()] == [t.tolist() for t in again]


def test_small_or_mixed_stashes_stay_in_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    stash = _Stash()
    _fill(stash, torch.float32)
    stash.park()  # 840 bytes: under PARK_BYTES
    assert stash._file is None and stash._buf is not None
    monkeypatch.setattr(_Stash, "PARK_BYTES", 0)
    stash.start(2)
    stash.add(torch.ones(2, 3))
    stash.add(torch.ones(4, 3, dtype=torch.float64))  # another dtype: kept apart
    stash.park()
    assert stash._file is None
    assert [t.dtype for t in stash.kept()] == [torch.float32, torch.float64]


def test_a_full_disk_keeps_the_stash_in_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_Stash, "PARK_BYTES", 0)
    stash = _Stash()
    ts = _fill(stash, torch.float32)

    def full(*_a: object, **_k: object) -> object:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("tempfile.TemporaryFile", full)
    with pytest.warns(RuntimeWarning, match="stay in memory"):
        stash.park()
    assert stash._file is None
    assert all(torch.equal(a, b) for a, b in zip(stash.kept(), ts, strict=True))


def test_gptq_with_every_stash_parked_writes_the_same_weights(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = save_hf_folder(tiny_llama(), tmp_path / "llama")
    text = tmp_path / "calib.txt"
    text.write_text(" ".join(f"The river {i} keeps stone {i * 7 % 13}." for i in range(60)))
    calib = Calibration(source=str(text), samples=3, length=48)
    parked = []
    park = _Stash.park

    def counting(self: _Stash) -> None:
        park(self)
        parked.append(self._file is not None)

    want = gptq_weights(folder, "int4:g32", calib, progress=False)
    monkeypatch.setattr(_Stash, "PARK_BYTES", 0)
    monkeypatch.setattr(_Stash, "park", counting)
    got = gptq_weights(folder, "int4:g32", calib, progress=False)
    assert parked and all(parked)  # every o_proj and down_proj stash went to disk
    assert set(got.weights) == set(want.weights)
    for name in want.weights:
        a, b = got.weights[name], want.weights[name]
        assert a.codes.tobytes() == b.codes.tobytes(), name
        assert a.scale.tobytes() == b.scale.tobytes(), name
    assert _layer_walk._CHUNK > 0
