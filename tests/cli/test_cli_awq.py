"""lowbit quantize --method awq / --smooth and lowbit eval --methods awq / --smooth, in-process."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.torch

import lowbit  # noqa: E402
from lowbit.calibration.awq import awq_weights  # noqa: E402
from lowbit.calibration.data import Calibration  # noqa: E402
from lowbit.checkpoints.lowbit_format.checkpoint import LowbitCheckpoint  # noqa: E402
from lowbit.cli import main  # noqa: E402
from lowbit.methods.smoothquant import SmoothQuant  # noqa: E402
from tiny_models import save_gguf, save_hf_folder, tiny_llama  # noqa: E402


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    d = tmp_path_factory.mktemp("cli_awq")
    text = d / "calib.txt"
    text.write_text(" ".join(f"Sentence {i} says {i * 7 % 13} things." for i in range(40)))
    model = tiny_llama()
    gguf = save_gguf(model, d / "llama.gguf", embedding="F32")
    return save_hf_folder(model, d / "llama"), gguf, text


CAL = ["--calib-samples", "3", "--calib-len", "50", "--no-progress"]


@pytest.mark.parametrize("source", ["folder", "gguf"])
def test_quantize_method_awq(
    source: str, setup: tuple[Path, Path, Path], tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """The checkpoint holds AWQ's codes and folded norms, says how they were made, passes
    verify, and lowbit.load_model builds the model AWQ quantized."""
    folder, gguf, text = setup
    src = folder if source == "folder" else gguf
    out = tmp_path / "q"
    argv = ["quantize", str(src), "--to", "int4:g32", "--method", "awq", "--calib", str(text),
            *CAL, "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    assert "AWQ of 14 tensors (8 folds)" in capsys.readouterr().out
    assert main(["verify", str(out)]) == 0
    ckpt = LowbitCheckpoint(out)
    method = ckpt.manifest["method"]
    assert method["method"] == "awq" and method["calibration"]["tokens"] == 150
    assert len(method["layers"]) == 14 and len(method["folded_tensors"]) == 4
    run = awq_weights(src, "int4:g32", Calibration(source=str(text), samples=3, length=50),
                      progress=False)  # fmt: skip
    for name, qt in run.weights.items():
        assert ckpt.entry(name)["method"] == "awq"
        np.testing.assert_array_equal(ckpt.get(name), qt.dequantize())
    for name, arr in run.replaced.items():
        assert ckpt.entry(name)["kind"] == "kept"
        np.testing.assert_array_equal(ckpt.get(name), arr)
    model = lowbit.load_model(out)
    want = {n: a for n, a in run.model_weights().items()}
    key = (
        "model.layers.1.input_layernorm.weight" if source == "folder" else "blk.1.attn_norm.weight"
    )
    got = model.model.layers[1].input_layernorm.weight.detach().numpy()
    np.testing.assert_array_equal(got, want[key])


def test_quantize_smooth(setup: tuple[Path, Path, Path], tmp_path: Path,
                         capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    """--smooth with --activations int8: SmoothQuant's folds, per-channel int8 weights, int8
    activations declared; the α given is used everywhere; errors name what is missing."""
    folder, _, text = setup
    out = tmp_path / "sq"
    argv = ["quantize", str(folder), "--to", "int8:ch", "--activations", "int8", "--smooth", "0.5",
            "--calib", str(text), *CAL, "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    assert "SmoothQuant of 14 tensors (8 folds)" in capsys.readouterr().out
    assert main(["verify", str(out)]) == 0
    ckpt = LowbitCheckpoint(out)
    method = ckpt.manifest["method"]
    assert method["method"] == "smoothquant" and method["alpha"] == 0.5
    assert {f["alpha"] for f in method["folds"]} == {0.5}
    assert set(ckpt.activations().values()) == {"int8"}
    model = lowbit.load_model(out)
    assert len(model.lowbit_activations) == 14
    capsys.readouterr()
    no_act = ["quantize", str(folder), "--to", "int8:ch", "--smooth", "--calib", str(text), *CAL,
              "--out", str(tmp_path / "x")]  # fmt: skip
    assert main(no_act) == 2
    assert "--smooth prepares activations for W8A8" in capsys.readouterr().err
    assert main([*no_act, "--activations", "int8", "--method", "awq"]) == 2
    assert "drop --method awq" in capsys.readouterr().err
    assert main([*no_act[:-2], "--activations", "int8", "--smooth", "2"]) == 2
    assert "[0, 1]" in capsys.readouterr().err


def test_quantize_smooth_then_gptq(setup: tuple[Path, Path, Path], tmp_path: Path,
                                   capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    """--smooth --method gptq: SmoothQuant's folds, then GPTQ of the folded model; the codes
    are smoothquant_gptq_weights' bit for bit, the folded norms stored, the record says both."""
    from lowbit.calibration.smooth_gptq import smoothquant_gptq_weights
    from lowbit.methods.gptq import GPTQ

    folder, _, text = setup
    out = tmp_path / "sqg"
    argv = ["quantize", str(folder), "--to", "int4:g32", "--activations", "int8", "--smooth",
            "0.5", "--method", "gptq", "--calib", str(text), *CAL, "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    assert "SmoothQuant (8 folds), then GPTQ" in capsys.readouterr().out
    assert main(["verify", str(out)]) == 0
    ckpt = LowbitCheckpoint(out)
    method = ckpt.manifest["method"]
    assert method["method"] == "gptq" and method["gptq_tensors"] == 14
    assert method["smoothquant"]["alpha"] == 0.5 and len(method["smoothquant"]["folds"]) == 8
    plan = lowbit.PrecisionPlan.uniform("int4:g32", activations="int8")
    cal = Calibration(source=str(text), samples=3, length=50)
    both = smoothquant_gptq_weights(folder, plan, SmoothQuant(alpha=0.5, activations="int8"),
                                    GPTQ(), cal, progress=False)  # fmt: skip
    for name, qt in both.weights.items():
        np.testing.assert_array_equal(ckpt.get(name), qt.dequantize())
    norm = "model.layers.0.input_layernorm.weight"
    np.testing.assert_array_equal(ckpt.get(norm), both.checkpoint.get(norm))
    assert not np.array_equal(ckpt.get(norm), lowbit.open_checkpoint(folder).get(norm))


def test_eval_methods_side_by_side(
    setup: tuple[Path, Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """One table: RTN, GPTQ and AWQ rows of a scheme; with --w8a8 --smooth a SmoothQuant row."""
    folder, _, text = setup
    common = ["--calib", str(text), "--calib-samples", "3", "--calib-len", "50", "--tokens", "256",
              "--window", "64", "--threads", "1"]  # fmt: skip
    assert main(["eval", str(folder), "--schemes", "int4:g32", "--methods", "rtn,gptq,awq",
                 *common, "--json"]) == 0  # fmt: skip
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)["rows"]}
    assert list(rows) == ["original", "int4:g32", "int4:g32 gptq", "int4:g32 awq"]
    assert rows["int4:g32 awq"]["kl_mean"] < rows["int4:g32"]["kl_mean"]
    assert rows["int4:g32 awq"]["method_tensors"] == 14
    assert main(["eval", str(folder), "--schemes", "int8:ch", "--w8a8", "int8", "--smooth",
                 *common]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "int8:ch smoothquant + int8 act" in out
    assert "SmoothQuant (int8 activations) on 3 x 50 tokens" in out
    assert main(["eval", str(folder), "--schemes", "int8:ch", "--smooth", *common]) == 2
    assert "add --w8a8 [int8|fp8] or --act MODE" in capsys.readouterr().err
    # 4-bit activations: SmoothQuant searched against NVFP4 activations, row beside RTN's
    assert main(["eval", str(folder), "--schemes", "nvfp4", "--act", "nvfp4", "--smooth",
                 *common, "--json"]) == 0  # fmt: skip
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)["rows"]}
    assert {"nvfp4 + nvfp4", "nvfp4 smoothquant", "nvfp4 smoothquant + nvfp4"} <= set(rows)
    assert rows["nvfp4 smoothquant"]["method"]["activations"] == "nvfp4"
    assert SmoothQuant().name == "smoothquant"
