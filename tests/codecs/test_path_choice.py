"""_path_choice: the per-machine choice between the compiled kernels and the numpy path
(measured once, cached per machine, never changing a result)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import lowbit
from lowbit.codecs import _numba as _fast
from lowbit.codecs import _path_choice as pc


def test_choose_takes_the_numpy_path_only_when_it_was_faster() -> None:
    """Ties and slower numpy timings keep the kernels; a faster numpy path wins."""
    assert pc.choose(2.37e-9, 1.46e-9) == "numpy"  # issue 28's Intel Xeon encode
    assert pc.choose(0.52e-3, 1.64e-3) == "kernels"  # this AMD EPYC's
    assert pc.choose(1.0, 1.0) == "kernels"
    assert pc.choose(1.0, np.nextafter(1.0, 0.0)) == "numpy"


def test_choose_with_other_paths_and_a_margin() -> None:
    """Any pair of ways: the first unless the second took less than margin x its time."""
    paths = ("bf16", "fp32")
    assert pc.choose(1.0, 2.5, paths, 1.2) == "bf16"
    assert pc.choose(1.0, 1.2, paths, 1.2) == "bf16"
    assert pc.choose(1.0, 1.1, paths, 1.2) == "fp32"
    assert pc.choose(2.0, 1.0, paths, 1.2) == "fp32"


def test_a_choice_between_other_paths_keeps_its_own_fields(tmp_path: Path) -> None:
    """Another pair's verdicts are stored under its own names, with its detail, and an
    entry of the codecs' shape is not valid for it (measured again)."""
    file = tmp_path / "other.json"
    file.write_text(
        '{"version": 1, "machines": {"m": {"k": {"path": "kernels", "kernel_ns": 1, "numpy_ns": 2}}}}'
    )
    c = pc.PathChoice(
        file=lambda: file, key=lambda: "m", paths=("bf16", "fp32"),
        fields=("bf16_ns", "fp32_ns"), margin=1.2, detail=lambda: {"shape": [1, 2, 3]},
    )  # fmt: skip
    assert c.first_wins("k", lambda: (2e-3, 1e-3)) is False
    entry = json.loads(file.read_text())["machines"]["m"]["k"]
    assert entry == {"path": "fp32", "bf16_ns": 2000000, "fp32_ns": 1000000, "shape": [1, 2, 3]}


def test_time_pair_interleaves_and_keeps_the_best_of_each() -> None:
    """One warm-up call each, then rounds of kernel, numpy; the minimum per path."""
    calls: list[str] = []
    ticks = iter([0, 5, 10, 13, 20, 22, 30, 34])  # kernel 5, 2; numpy 3, 4
    k = pc.time_pair(lambda: calls.append("k"), lambda: calls.append("n"), 2, lambda: next(ticks))
    assert k == (2, 3)
    assert calls == ["k", "n", "k", "n", "k", "n"]


def _choice(tmp_path: Path, key: str = "machine A") -> pc.PathChoice:
    return pc.PathChoice(file=lambda: tmp_path / "codec_paths.json", key=lambda: key)


def test_a_verdict_is_measured_once_and_cached_per_machine(tmp_path: Path) -> None:
    """The first process measures and writes; the next reads without measuring; another
    machine's key measures again and both machines' entries are kept."""
    measured: list[str] = []

    def fake(kernel: float, numpy: float, who: str) -> object:
        return lambda: measured.append(who) or (kernel, numpy)

    a = _choice(tmp_path)
    assert a.kernels_win("encode 32", fake(2.37e-3, 1.46e-3, "a")) is False
    assert a.kernels_win("encode 32", fake(0, 1, "again")) is False  # memory
    assert a.kernels_win("decode", fake(1e-3, 2e-3, "a2")) is True
    assert measured == ["a", "a2"]
    fresh = _choice(tmp_path)
    assert fresh.kernels_win("encode 32", fake(0, 1, "file")) is False  # from the file
    assert measured == ["a", "a2"]
    b = _choice(tmp_path, "machine B")
    assert b.kernels_win("encode 32", fake(1e-3, 2e-3, "b")) is True
    assert measured == ["a", "a2", "b"]
    data = json.loads((tmp_path / "codec_paths.json").read_text())
    assert data["version"] == pc.CACHE_VERSION
    assert data["machines"]["machine A"]["encode 32"] == {
        "path": "numpy", "kernel_ns": 2370000, "numpy_ns": 1460000, "values": pc.SAMPLE_VALUES
    }  # fmt: skip
    assert data["machines"]["machine B"]["encode 32"]["path"] == "kernels"


@pytest.mark.parametrize(
    "content",
    [
        b"\x00\xff not json",
        b"[1, 2, 3]",
        b'{"version": 99, "machines": {"machine A": {"k": {"path": "numpy"}}}}',
        b'{"version": 1, "machines": ["machine A"]}',
        b'{"version": 1, "machines": {"machine A": 7}}',
        b'{"version": 1, "machines": {"machine A": {"k": {"path": "gpu", "kernel_ns": 1, "numpy_ns": 2}}}}',
        b'{"version": 1, "machines": {"machine A": {"k": {"path": "numpy", "kernel_ns": "x"}}}}',
        b'{"version": 1, "machines": {"machine B": {"k": {"path": "numpy", "kernel_ns": 2, "numpy_ns": 1, "values": 1}}}}',
    ],
    ids=[
        "binary",
        "list",
        "version",
        "machines-list",
        "entry-int",
        "bad-path",
        "bad-ns",
        "foreign",
    ],
)
def test_a_corrupt_or_foreign_cache_is_ignored(tmp_path: Path, content: bytes) -> None:
    """Garbage, another version, malformed entries or another machine's verdicts: measured
    afresh (no exception), and the file rewritten as lowbit's."""
    (tmp_path / "codec_paths.json").write_bytes(content)
    measured: list[int] = []
    c = _choice(tmp_path)
    assert c.kernels_win("k", lambda: measured.append(1) or (1.0, 2.0)) is True
    assert measured == [1]
    data = json.loads((tmp_path / "codec_paths.json").read_text())
    assert data["machines"]["machine A"]["k"]["path"] == "kernels"


def test_an_unwritable_cache_is_left_alone(tmp_path: Path) -> None:
    """A cache path whose directory cannot be made: the verdict holds for the process."""
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    c = pc.PathChoice(file=lambda: blocker / "sub" / "codec_paths.json", key=lambda: "m")
    assert c.kernels_win("k", lambda: (2.0, 1.0)) is False
    assert c.kernels_win("k", lambda: (1.0, 2.0)) is False  # remembered in memory
    assert blocker.read_text() == "not a directory"


def test_cache_file_and_machine_key(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """LOWBIT_CACHE_DIR wins; else XDG_CACHE_HOME/lowbit; the key names CPU and versions."""
    monkeypatch.setenv("LOWBIT_CACHE_DIR", str(tmp_path))
    assert pc.cache_file() == tmp_path / "codec_paths.json"
    monkeypatch.delenv("LOWBIT_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert pc.cache_file() == tmp_path / "xdg" / "lowbit" / "codec_paths.json"
    key = pc.machine_key()
    assert f"numpy {np.__version__}" in key and f"lowbit {lowbit.__version__}" in key


@pytest.mark.skipif(not _fast.HAVE_NUMBA, reason="numba is not installed")
@pytest.mark.parametrize("winner", ["kernels", "numpy"])
@pytest.mark.parametrize("name", ["float8_e4m3fn", "float4_e2m1fn", "bfloat16", "float16"])
def test_either_verdict_gives_the_same_bits(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, name: str, winner: str
) -> None:
    """Whichever path the machine's verdict picks, codes and decoded values are the bits
    of the numpy path (and of the kernels), and the verdict is consulted for large arrays."""
    choice = _choice(tmp_path)
    asked: list[str] = []
    timings = (1.0, 2.0) if winner == "kernels" else (2.0, 1.0)
    real = choice.kernels_win
    monkeypatch.setattr(
        choice, "kernels_win", lambda k, m: asked.append(k) or real(k, lambda: timings)
    )
    monkeypatch.setattr(_fast, "_choice", choice)
    monkeypatch.setattr(_fast._kernels_always, "on", False)
    monkeypatch.setattr(_fast._rental, "bought", True)
    fmt = lowbit.format(name)
    x = np.random.default_rng(28).standard_normal(_fast.MIN_KERNEL_SIZE * 2, dtype=np.float32)
    x[::97] *= 1e4  # overflow, too
    x[5] = np.nan
    kw = {} if fmt.has_nan else {"nan": "zero"}
    with np.errstate(all="ignore"):
        codes = fmt.encode(x, **kw)
        values = fmt.decode(codes)
        with _fast.numpy_only():
            ref = fmt.encode(x, **kw)
            ref_values = fmt.decode(ref)
        with _fast.kernels_always():
            forced = fmt.encode(x, **kw)
    assert np.array_equal(codes, ref) and np.array_equal(forced, ref)
    assert np.array_equal(values.view(np.uint32), ref_values.view(np.uint32))
    assert any(k.startswith("encode") for k in asked) and any(k.startswith("decode") for k in asked)
    assert {e["path"] for e in choice.known.values()} == {winner}
