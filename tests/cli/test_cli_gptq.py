"""lowbit quantize --method gptq and lowbit eval --methods rtn,gptq, in-process."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.torch

from lowbit.checkpoints.lowbit_format import LowbitCheckpoint  # noqa: E402
from lowbit.cli import main  # noqa: E402
from lowbit.evaluation.calibration import Calibration  # noqa: E402
from lowbit.evaluation.gptq_model import gptq_weights  # noqa: E402
from tiny_models import save_hf_folder, tiny_llama  # noqa: E402


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("cli_gptq")
    text = d / "calib.txt"
    text.write_text(" ".join(f"Sentence {i} says {i * 7 % 13} things." for i in range(40)))
    return save_hf_folder(tiny_llama(), d / "llama"), text


def test_quantize_method_gptq(
    setup: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The checkpoint holds GPTQ's codes (as gptq_weights makes them) and says how they were
    made; it loads like any lowbit checkpoint."""
    folder, text = setup
    out = tmp_path / "q"
    argv = ["quantize", str(folder), "--to", "int4:g32", "--method", "gptq", "--calib", str(text),
            "--calib-samples", "3", "--calib-len", "50", "--out", str(out), "--no-progress"]  # fmt: skip
    assert main(argv) == 0
    assert "GPTQ (static act-order, damp 0.01) of 14 tensors" in capsys.readouterr().out
    ckpt = LowbitCheckpoint(out)
    method = ckpt.manifest["method"]
    assert method["method"] == "gptq" and method["calibration"]["tokens"] == 150
    assert len(method["layers"]) == 14
    assert all(e["gptq"] < e["rtn"] for e in method["layers"].values())
    run = gptq_weights(
        folder, "int4:g32", Calibration(source=str(text), samples=3, length=50), progress=False
    )
    for name, qt in run.weights.items():
        assert ckpt.entry(name)["method"] == "gptq"
        np.testing.assert_array_equal(ckpt.get(name), qt.dequantize())
    bad = [*argv[:-3], "--out", str(tmp_path / "ct"), "--out-format", "compressed-tensors"]
    assert main(bad) == 2
    assert "--method gptq writes lowbit checkpoints" in capsys.readouterr().err


def test_eval_methods_side_by_side(
    setup: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """One table, RTN and GPTQ rows of each scheme, GPTQ closer to the original."""
    folder, text = setup
    argv = ["eval", str(folder), "--schemes", "int4:g32", "--methods", "rtn,gptq",
            "--calib", str(text), "--calib-samples", "3", "--calib-len", "50",
            "--tokens", "256", "--window", "64", "--threads", "1", "--json"]  # fmt: skip
    assert main(argv) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)["rows"]}
    assert list(rows) == ["original", "int4:g32", "int4:g32 gptq"]
    assert rows["int4:g32 gptq"]["kl_mean"] < rows["int4:g32"]["kl_mean"]
    assert rows["int4:g32 gptq"]["calibration"]["samples_used"] == 3
