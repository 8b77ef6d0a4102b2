"""benchmarks/mixed_gptq_scan.py: a scan whose trials use GPTQ's weights (the experiment the
MiniLM rows of docs/quantize-models.md cite)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from lowbit.calibration.data import Calibration
from lowbit.calibration.gptq import gptq_weights
from lowbit.checkpoints import open_checkpoint
from lowbit.evaluation import sensitivity as sens
from lowbit.methods.gptq import GPTQ
from lowbit.quant.tensor import quantize
from tiny_models import save_hf_folder, tiny_bert

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "mixed_gptq_scan.py"


def _script() -> Any:
    spec = importlib.util.spec_from_file_location("mixed_gptq_scan", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_trials_use_gptq_weights(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every exact trial puts GPTQ's weight of its own tensor into the model (not the rounded
    one), the result file covers every tensor, and the scan is the plain one afterwards."""
    folder = save_hf_folder(tiny_bert(seed=1), tmp_path / "bert")
    seen: dict[str, np.ndarray] = {}
    damage = sens._Scan._damage

    def record(self: Any, t: Any, w_hat: np.ndarray, cached: bool) -> float:
        seen[t.name] = np.array(w_hat, copy=True)
        return damage(self, t, w_hat, cached)

    monkeypatch.setattr(sens._Scan, "_damage", record)
    plain = (sens.quantize, sens._Scan._quantized)
    out = tmp_path / "scan.json"
    argv = [str(folder), "--schemes", "int4:g32", "--calib-samples", "4", "--gptq-samples", "4"]
    assert _script().main([*argv, "--out", str(out)]) == 0
    assert (sens.quantize, sens._Scan._quantized) == plain

    run = gptq_weights(folder, "int4:g32", Calibration(samples=4), GPTQ(), threads=1,
                       progress=False)  # fmt: skip
    doc = json.loads(out.read_text(encoding="utf-8"))
    assert sorted(e["tensor"] for e in doc["entries"]) == sorted(run.weights)
    assert sorted(seen) == sorted(run.weights)
    source = open_checkpoint(folder)
    moved = 0
    for name, qt in run.weights.items():
        np.testing.assert_array_equal(seen[name], qt.dequantize(np.float32))
        rounded = quantize(np.asarray(source.get(name), dtype=np.float32), qt.scheme)
        moved += not np.array_equal(seen[name], rounded.dequantize(np.float32))
    assert moved > 0  # GPTQ's codes are not rounding to nearest's
