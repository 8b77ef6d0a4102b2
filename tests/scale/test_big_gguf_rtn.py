"""benchmarks/big_gguf_rtn.py: its I/O floor writes exactly the bytes asked for, its runs count
disk beyond the output, and a lowbit part runs end to end on a tiny generated folder (no
llama.cpp needed), with nothing on disk beyond lowbit's output."""

from __future__ import annotations

import importlib.util
import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def _load(name: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.syspath_prepend(str(BENCH))  # its imports of _machine, bench_hf_direct
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)
    spec.loader.exec_module(module)
    return module


def test_io_floor_writes_exactly_the_bytes_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The floor reads every shard and writes ``nbytes`` (fewer, equal or more than the
    source's), whatever the piece size; the bytes it writes are bytes it read."""
    m = _load("big_gguf_rtn", monkeypatch)
    monkeypatch.setattr(m, "PIECE", 1000)
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.safetensors").write_bytes(b"\x01" * 2500)
    (src / "b.safetensors").write_bytes(b"\x02" * 1700)
    (src / "config.json").write_text("{}")  # not read
    assert m.read_source(src) == 4200
    for n in (0, 1, 999, 2100, 4200, 9001):
        out = tmp_path / f"out{n}"
        m.io_floor(src, out, n)
        data = out.read_bytes()
        assert len(data) == n
        assert set(data) <= {1, 2}


def test_run_counts_disk_beyond_the_output(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A step that leaves an intermediate (removed after, as llama.cpp's bf16 GGUF is) shows
    it as extra disk; its seconds and peak RSS are the steps'."""
    m = _load("big_gguf_rtn", monkeypatch)
    out, tmp = tmp_path / "out.bin", tmp_path / "tmp.bin"

    def step() -> tuple[float, int | None, float]:
        tmp.write_bytes(b"x" * 300_000)
        time.sleep(0.3)  # the disk is polled every 10 ms
        out.write_bytes(b"y" * 1000)
        return 0.5, 123, 0.125

    row = m.run("two", tmp_path, [step, lambda: (0.25, None, 0.25)], out, [tmp])
    assert not tmp.exists()
    assert row["output_bytes"] == 1000
    assert row["extra_disk"] == 300_000
    assert row["step_seconds"] == [0.5, 0.25] and row["cpu_seconds"] == 0.38  # 0.375 rounded
    assert row["peak_rss"] == 123 and row["step_peak_rss"] == [123, None]


def test_int4_part_end_to_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--parts int4`` on a tiny generated folder: lowbit's child ran (positive peak RSS),
    wrote its output and nothing beside it, and the floor wrote as many bytes."""
    pytest.importorskip("tokenizers")
    make = _load("make_big_checkpoints", monkeypatch)
    tiny = ["--layers", "1", "--hidden", "128", "--intermediate", "256", "--heads", "2",
            "--kv-heads", "1", "--head-dim", "64", "--vocab", "512", "--model", "llama-8b",
            "--tokenizer", "random"]  # fmt: skip
    assert make.main([str(tmp_path / "m"), *tiny]) == 0
    m = _load("big_gguf_rtn", monkeypatch)
    work = tmp_path / "work"
    argv = [str(tmp_path / "m" / "llama-8b"), "--work", str(work), "--parts", "int4", "--json"]
    assert m.main(argv) == 0
    res = json.loads(capsys.readouterr().out)
    mine, floor = res["int4"]["lowbit"], res["int4"]["baseline"]
    # the run's lock file (tens of bytes) may be polled beside the finished output for an
    # instant before it is removed; a copy of a tensor or the source would be megabytes
    assert mine["peak_rss"] > 0 and mine["cpu_seconds"] > 0 and mine["extra_disk"] < 4096
    assert floor["output_bytes"] == mine["output_bytes"] > 0
    assert floor["peak_rss"] is None
    assert res["source_bytes"] == (tmp_path / "m" / "llama-8b" / "model.safetensors").stat().st_size
    assert sorted(p.name for p in work.iterdir()) == ["logs"]  # outputs removed after each run
