"""benchmarks/big_gptq_resume.py: a process it kills is gone with its descendants (the job
runs under ``script``, in a session of its own), one it does not kill reports its exit code,
and peak RSS and CPU seconds are sampled from /proc."""

from __future__ import annotations

import importlib.util
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"

pytestmark = pytest.mark.skipif(
    shutil.which("script") is None or not Path("/proc/self/stat").exists(),
    reason="needs util-linux's script and /proc",
)


def _load(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.syspath_prepend(str(BENCH))
    spec = importlib.util.spec_from_file_location("big_gptq_resume", BENCH / "big_gptq_resume.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "big_gptq_resume", module)
    spec.loader.exec_module(module)
    return module


def test_a_killed_job_is_gone_with_its_children(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    m = _load(monkeypatch)
    marker = tmp_path / "pid"
    code = (
        "import os, time, numpy as np\n"
        f"open({str(marker)!r}, 'w').write(str(os.getpid()))\n"
        "a = np.ones(40_000_000)  # 320 MB touched: a peak the sampler must see\n"
        "while True: a += 1; time.sleep(0.01)\n"
    )
    t0 = time.monotonic()
    run = m._run([sys.executable, "-c", code], tmp_path / "log", kill_after=4.0)
    assert run["killed"] and run["returncode"] is None
    assert time.monotonic() - t0 < 30
    pid = int(marker.read_text())
    time.sleep(0.5)
    stat = Path(f"/proc/{pid}/stat")
    assert not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] in "ZX"
    assert run["peak_rss_gb"] >= 0.3 and run["peak_anon_gb"] >= 0.3
    assert run["cpu_s"] > 0


def test_an_unkilled_job_reports_its_exit_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    m = _load(monkeypatch)
    code = "import sys; print('hello from the job'); sys.exit(3)"
    run = m._run([sys.executable, "-c", code], tmp_path / "log", kill_after=None)
    assert not run["killed"] and run["returncode"] == 3
    assert "hello from the job" in (tmp_path / "log").read_text()
