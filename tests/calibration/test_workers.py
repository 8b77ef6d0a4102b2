"""lowbit.calibration._workers: GPTQ and AWQ calibration split by samples over worker
processes and Ray actors gives the one-process output bytes; the collector's parts add up to
the one-process sums bit for bit; bad input is one LowbitError line."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytestmark = pytest.mark.torch

from lowbit.calibration._workers import check_ray_address, shard_range  # noqa: E402
from lowbit.calibration.hessians import HessianCollector, parts_kept  # noqa: E402
from lowbit.cli import main  # noqa: E402
from lowbit.errors import LowbitError  # noqa: E402
from tiny_models import save_hf_folder, tiny_llama  # noqa: E402

WORDS = "river stone cloud garden lantern harbor meadow signal copper violet winter orchard"
# 40 windows of 16 tokens: three windows of 16 samples (the last short), so two workers get
# 16 and 24 samples
CALIB = ["--calib-samples", "40", "--calib-len", "16", "--threads", "1", "--no-progress"]


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("workers")
    w = WORDS.split()
    text = d / "calib.txt"
    text.write_text(" ".join(f"The {w[i % 12]} keeps {w[i * 7 % 12]} {i}." for i in range(900)))
    return save_hf_folder(tiny_llama(seed=3), d / "tiny"), text


def _digests(folder: Path) -> dict[str, str]:
    got = {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.glob("*.safetensors"))
    }
    assert got
    return got


def _quantize(model: tuple[Path, Path], out: Path, method: str, *extra: str) -> None:
    folder, text = model
    argv = ["quantize", str(folder), "--to", "int4:g32", "--method", method, "--calib",
            str(text), *CALIB, "--out", str(out), *extra]  # fmt: skip
    assert main(argv) == 0


@pytest.fixture(scope="module")
def one_gptq(model: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The one-process GPTQ output's digests, which the worker and Ray runs must match."""
    out = tmp_path_factory.mktemp("one-gptq") / "one"
    _quantize(model, out, "gptq")
    return _digests(out)


def test_shard_range() -> None:
    """Shards are consecutive whole windows of 16 samples, the first worker's first."""
    assert [shard_range(40, i, 2) for i in range(2)] == [(0, 16), (16, 40)]
    assert [shard_range(128, i, 3) for i in range(3)] == [(0, 32), (32, 80), (80, 128)]
    assert shard_range(10, 1, 2) == (10, 10)  # one window: the second worker has none
    assert [shard_range(33, i, 3) for i in range(3)] == [(0, 16), (16, 32), (32, 33)]


@pytest.mark.parametrize("cut", [16, 32])
def test_parts_add_up_to_one_collector(cut: int) -> None:
    """Two collectors' parts (samples 0..cut, cut..40), merged, give the one-collector
    Hessian, mean and max |x| bit for bit; a float64 sum of the two totals would not."""
    gen = torch.Generator().manual_seed(0)
    lin = torch.nn.Linear(24, 8)
    xs = [torch.randn(1, 7 + i % 5, 24, generator=gen) * (1 + i) for i in range(40)]
    masks = [None if i % 3 else torch.rand(x.shape[:-1], generator=gen) > 0.3 for i, x in
             enumerate(xs)]  # fmt: skip

    def collect(lo: int, hi: int) -> HessianCollector:
        with HessianCollector({"l": lin}, stats=True) as col:
            for x, m in zip(xs[lo:hi], masks[lo:hi], strict=True):
                col.next_sample(m)
                lin(x)
        return col

    one = collect(0, 40)
    with parts_kept():
        shards = [collect(0, cut).parts(), collect(cut, 40).parts()]
    merged = HessianCollector.merged({"l": lin}, shards)
    assert merged.tokens("l") == one.tokens("l")
    for f in ("hessian", "mean_abs", "max_abs"):
        a, b = getattr(merged, f)("l"), getattr(one, f)("l")
        assert a.dtype == b.dtype and a.tobytes() == b.tobytes(), f


def test_two_workers_gptq_bytes(
    model: tuple[Path, Path],
    one_gptq: dict[str, str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """GPTQ on 2 local worker processes writes the one process's tensor files, byte for
    byte; the record says 2 workers calibrated, 16 and 24 samples."""
    capsys.readouterr()
    _quantize(model, tmp_path / "two", "gptq", "--workers", "2", "--json")
    method = json.loads(capsys.readouterr().out)["method"]
    assert method["seconds"]["workers"] == 2 and method["calibration"]["samples_used"] == 40
    assert _digests(tmp_path / "two") == one_gptq


def test_two_workers_awq_bytes(model: tuple[Path, Path], tmp_path: Path) -> None:
    """AWQ (scale search, clipping, folded norms) on 2 local workers: the same bytes."""
    _quantize(model, tmp_path / "one", "awq")
    _quantize(model, tmp_path / "two", "awq", "--workers", "2")
    assert _digests(tmp_path / "two") == _digests(tmp_path / "one")


def test_bad_workers(
    model: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--workers 0 and an address where no Ray listens: one LowbitError line, nothing
    written."""
    folder, text = model
    base = ["quantize", str(folder), "--to", "int4:g32", "--method", "gptq", "--calib", str(text),
            *CALIB]  # fmt: skip
    assert main([*base, "--workers", "0", "--out", str(tmp_path / "a")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--workers must be a positive integer, got 0" in err[0]
    if importlib.util.find_spec("ray") is not None:
        assert main([*base, "--ray", "127.0.0.1:1", "--out", str(tmp_path / "b")]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "cannot reach a Ray cluster at 127.0.0.1:1" in err[0], err
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_check_ray_address() -> None:
    """Malformed addresses are refused without a connection; ``auto`` is left to Ray."""
    check_ray_address("auto")
    for bad in ("head", "ray://head", "head:port"):
        with pytest.raises(LowbitError, match="HOST:PORT"):
            check_ray_address(bad)


# Ray runs in a process (and session) of its own, as the sensitivity scan's Ray test: a hung
# start cannot hang the suite, and a timeout ends Ray's daemons too.
_RAY_RUN = """
import sys
import ray
from lowbit.cli import main

ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
         object_store_memory=100 * 2**20)
try:
    code = main(sys.argv[1:])
finally:
    ray.shutdown()
sys.exit(code)
"""
_RAY_TIMEOUT = 400  # seconds


@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="ray is not installed")
def test_ray_gptq_bytes(model: tuple[Path, Path], one_gptq: dict[str, str], tmp_path: Path) -> None:
    """GPTQ on a local Ray instance (2 CPUs, 2 actors) writes the one process's bytes."""
    folder, text = model
    argv = ["quantize", str(folder), "--to", "int4:g32", "--method", "gptq", "--calib",
            str(text), *CALIB, "--ray", "--workers", "2", "--out", str(tmp_path / "ray")]  # fmt: skip
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-c", _RAY_RUN, *argv], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)  # fmt: skip
    try:
        log, _ = proc.communicate(timeout=_RAY_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"the Ray calibration did not finish in {_RAY_TIMEOUT} s")
    assert proc.returncode == 0, log.decode(errors="replace")[-4000:]
    assert _digests(tmp_path / "ray") == one_gptq


def test_api_refusals(model: tuple[Path, Path]) -> None:
    """calibrated_weights: workers below 1 and SmoothQuant on workers are refused before any
    model is built."""
    from lowbit.calibration.calibrated import calibrated_weights
    from lowbit.methods.gptq import GPTQ
    from lowbit.methods.smoothquant import SmoothQuant
    from lowbit.plans.plan import PrecisionPlan

    folder, text = model
    plan = PrecisionPlan.uniform("int8:ch", activations="int8")
    with pytest.raises(LowbitError, match="workers must be a positive integer, got 0"):
        calibrated_weights(folder, plan, GPTQ(), str(text), workers=0)
    with pytest.raises(LowbitError, match="SmoothQuant calibrates in one process"):
        calibrated_weights(folder, plan, SmoothQuant(activations="int8"), str(text), workers=2)
