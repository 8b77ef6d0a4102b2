"""lowbit quantize --method gptq and lowbit eval --methods rtn,gptq, in-process."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.torch

from lowbit.calibration.data import Calibration  # noqa: E402
from lowbit.calibration.gptq import gptq_weights  # noqa: E402
from lowbit.checkpoints.lowbit_format.checkpoint import LowbitCheckpoint  # noqa: E402
from lowbit.cli import main  # noqa: E402
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
    said = "GPTQ (static act-order, damp 0.01, layers-sequential) of 14 tensors"
    assert said in capsys.readouterr().out
    ckpt = LowbitCheckpoint(out)
    method = ckpt.manifest["method"]
    assert method["method"] == "gptq" and method["calibration"]["tokens"] == 150
    assert method["sequential"] == "layers"
    assert len(method["layers"]) == 14
    assert all(e["gptq"] < e["rtn"] for e in method["layers"].values())
    run = gptq_weights(
        folder, "int4:g32", Calibration(source=str(text), samples=3, length=50), progress=False
    )
    for name, qt in run.weights.items():
        assert ckpt.entry(name)["method"] == "gptq"
        np.testing.assert_array_equal(ckpt.get(name), qt.dequantize())
    bad = [*argv[:-3], "--out", str(tmp_path / "q.gguf"), "--out-format", "gguf"]
    assert main(bad) == 2
    assert "gguf" in capsys.readouterr().err.lower()
    # --sequential blocks: the two-pass order, recorded, and other codes than layers'
    two = tmp_path / "blocks"
    assert main([*argv[:-3], "--out", str(two), "--no-progress", "--sequential", "blocks"]) == 0
    assert "blocks-sequential" in capsys.readouterr().out
    blocks = LowbitCheckpoint(two)
    assert blocks.manifest["method"]["sequential"] == "blocks"
    assert any(not np.array_equal(blocks.get(n), ckpt.get(n)) for n in run.weights)


def _ct_dequantize(folder: Path) -> dict[str, np.ndarray]:
    """compressed-tensors' own model-free decompression of every tensor of a folder."""
    from compressed_tensors.entrypoints.convert.converters.ct_dequantizer import (
        CompressedTensorsDequantizer,
    )
    from safetensors import safe_open

    raw = {}
    for f in sorted(folder.glob("*.safetensors")):
        with safe_open(f, framework="pt") as sf:
            raw.update({k: sf.get_tensor(k) for k in sf.keys()})
    res = CompressedTensorsDequantizer(folder, dtype=torch.float32).process(raw)
    return {k: v.numpy() for k, v in res.items()}


@pytest.mark.parametrize("source", ["folder", "gguf"])
@pytest.mark.parametrize("spec", ["int4:g32", "int4:g32:asym"])
def test_gptq_to_compressed_tensors(
    setup: tuple[Path, Path], tmp_path: Path, source: str, spec: str,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """--method gptq --out-format compressed-tensors: compressed-tensors' own decompressor and
    transformers give exactly GPTQ's dequantized weights (a GGUF source's q/k rows put back in
    the transformers order), which differ from round-to-nearest's; --json's seconds are the
    whole command's, calibration and GPTQ's solve among its parts."""
    pytest.importorskip("compressed_tensors")
    from transformers.utils.quantization_config import CompressedTensorsConfig

    from lowbit.checkpoints import open_checkpoint
    from lowbit.checkpoints.gguf.names import gguf_to_hf_name, unpermute_qk
    from lowbit.quant.scheme_text import parse_scheme
    from lowbit.quant.tensor import quantize
    from tiny_models import save_gguf

    folder, text = setup
    model = folder if source == "folder" else save_gguf(tiny_llama(), tmp_path / "tiny.gguf")
    out = tmp_path / "ct"
    argv = ["quantize", str(model), "--to", spec, "--method", "gptq", "--calib", str(text),
            "--calib-samples", "3", "--calib-len", "50", "--out", str(out), "--no-progress",
            "--out-format", "compressed-tensors", "--json"]  # fmt: skip
    assert main(argv) == 0
    sec = json.loads(capsys.readouterr().out)["seconds"]  # the whole command, by part
    assert {"total", "calibration", "solve", "quantize", "write", "other"} <= set(sec)
    assert sum(v for k, v in sec.items() if k != "total") == pytest.approx(sec["total"])
    assert sec["calibration"] > 0 and sec["solve"] > 0
    calib = Calibration(source=str(text), samples=3, length=50)
    run = gptq_weights(model, spec, calib, progress=False)
    assert sum(m == "gptq" for m in run.methods.values()) == 14
    got = _ct_dequantize(out)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # transformers: "You passed quantization_config ..."
        sd = transformers.AutoModelForCausalLM.from_pretrained(
            out, dtype=torch.float32, quantization_config=CompressedTensorsConfig(dequantize=True)
        ).state_dict()
    heads = {"q_proj": 4, "k_proj": 2}
    original = open_checkpoint(str(folder))
    moved = 0
    for name, qt in run.weights.items():
        hf = name if source == "folder" else gguf_to_hf_name(name)
        want = qt.dequantize()
        kind = hf.split(".")[-2]
        if source == "gguf" and kind in heads:
            want = unpermute_qk(want, heads[kind])
        np.testing.assert_array_equal(got[hf], want, err_msg=hf)
        np.testing.assert_array_equal(sd[hf].numpy(), want, err_msg=hf)
        rtn = quantize(np.asarray(original.get(hf), np.float32), parse_scheme(spec)).dequantize()
        moved += not np.array_equal(want, rtn)
    assert moved == 14  # GPTQ's weights, not round-to-nearest's


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


@pytest.mark.parametrize("spec", ["q4_0", "q8_0"])
def test_gptq_to_gguf(setup: tuple[Path, Path], tmp_path: Path, spec: str) -> None:
    """--method gptq --out-format gguf: llama.cpp's block types with GPTQ's codes; the gguf
    package's reader, lowbit.open_checkpoint and lowbit.load give exactly GPTQ's dequantized
    weights (llama.cpp's
    grid and rounding rule inside the loop), not llama.cpp's own rounding."""
    gguf = pytest.importorskip("gguf")
    import lowbit
    from lowbit.ggml.legacy import quantize as ggml_quantize
    from tiny_models import save_gguf

    _, text = setup
    src = save_gguf(tiny_llama(), tmp_path / "tiny.gguf")
    out = tmp_path / f"tiny.{spec}.gguf"
    argv = ["quantize", str(src), "--to", spec, "--method", "gptq", "--calib", str(text),
            "--calib-samples", "3", "--calib-len", "50", "--out", str(out), "--no-progress",
            "--out-format", "gguf", "--json"]  # fmt: skip
    assert main(argv) == 0
    run = gptq_weights(
        src, spec, Calibration(source=str(text), samples=3, length=50), progress=False
    )
    assert sum(m == "gptq" for m in run.methods.values()) == 14
    reader = gguf.GGUFReader(str(out))
    stored = {t.name: t for t in reader.tensors}
    source = lowbit.open_checkpoint(str(src))
    back = lowbit.open_checkpoint(str(out))
    loaded = lowbit.load(str(out))
    for name, qt in run.weights.items():
        t = stored[name]
        assert t.tensor_type.name == spec.upper()
        deq = gguf.quants.dequantize(t.data, t.tensor_type).reshape(qt.shape)
        np.testing.assert_array_equal(deq, qt.dequantize(), err_msg=name)
        np.testing.assert_array_equal(np.asarray(back.get(name)), qt.dequantize(), err_msg=name)
        np.testing.assert_array_equal(np.asarray(loaded[name]), qt.dequantize(), err_msg=name)
        own = ggml_quantize(np.asarray(source.get(name), np.float32), spec.upper())
        assert not np.array_equal(np.asarray(t.data).reshape(own.shape), own), name


@pytest.mark.parametrize("method", ["gptq", "awq"])
def test_quantize_threads(
    setup: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch, method: str,
) -> None:  # fmt: skip
    """``--threads N`` reaches the calibrated method (its torch thread count) and leaves the
    result as it is; ``--threads 0`` is one error line before any work."""
    import lowbit.calibration.calibrated as calibrated

    folder, text = setup
    seen: list[int] = []
    real = calibrated.calibrated_weights

    def spy(*args: object, **kwargs: object) -> object:
        seen.append(kwargs["threads"])  # type: ignore[arg-type]
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr("lowbit.jobs.quantize.calibrated_weights", spy)
    argv = ["quantize", str(folder), "--to", "int4:g32", "--method", method, "--calib", str(text),
            "--calib-samples", "3", "--calib-len", "50", "--no-progress"]  # fmt: skip
    assert main([*argv, "--threads", "1", "--out", str(tmp_path / "one")]) == 0
    assert seen[0] == 1
    assert main([*argv, "--out", str(tmp_path / "default")]) == 0
    assert seen[1] is None
    one, default = LowbitCheckpoint(tmp_path / "one"), LowbitCheckpoint(tmp_path / "default")
    for name in one.manifest["tensors"]:
        np.testing.assert_array_equal(one.get(name), default.get(name))
    capsys.readouterr()
    assert main([*argv, "--threads", "0", "--out", str(tmp_path / "zero")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--threads must be >= 1" in err[0]
    assert not (tmp_path / "zero").exists()
