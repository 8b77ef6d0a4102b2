"""lowbit.quantize_model and lowbit.jobs.gguf: one call per job, the same bytes as ``lowbit
quantize`` with the same options, typed results, and one LowbitError line for bad input."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import lowbit
from lowbit.cli import main
from lowbit.errors import LowbitError
from lowbit.jobs.gguf import gguf_budget
from lowbit.jobs.results import GGUFResult, QuantizeResult

pytest.importorskip("transformers")
pytest.importorskip("gguf")

from tiny_models import save_gguf, save_hf_folder, tiny_llama


@pytest.fixture(scope="module")
def model() -> Any:
    return tiny_llama(hidden=256, inter=512)


@pytest.fixture(scope="module")
def folder(model: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_hf_folder(model, tmp_path_factory.mktemp("jobs") / "llama")


@pytest.fixture(scope="module")
def gguf_file(model: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_gguf(model, tmp_path_factory.mktemp("jobs-gguf") / "l.gguf", embedding="F32")


@pytest.fixture(scope="module")
def imatrix(gguf_file: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from lowbit.checkpoints import open_checkpoint
    from lowbit.checkpoints.gguf.imatrix import write_imatrix

    rng = np.random.default_rng(1)
    sums, counts = {}, {}
    with open_checkpoint(gguf_file) as ckpt:
        for n in ckpt.names():
            shape = ckpt.info(n).shape
            if len(shape) == 2 and "token_embd" not in n:
                sums[n] = rng.uniform(0, 50, size=shape[-1]).astype(np.float32)
                counts[n] = np.array([17.0], np.float32)
    out = tmp_path_factory.mktemp("jobs-im") / "im.gguf"
    return write_imatrix(out, sums, counts, datasets=["t"], chunk_count=3, chunk_size=512) or out


def _files(path: Path) -> dict[str, bytes]:
    """Every tensor file's bytes (and a GGUF's own), without the manifest's timing."""
    if path.is_file():
        return {path.name: path.read_bytes()}
    return {f.name: f.read_bytes() for f in sorted(path.glob("*.safetensors"))}


def _cli(*argv: str) -> None:
    assert main(["quantize", *argv, "--no-progress"]) == 0


def test_rtn_same_bytes_as_the_cli(folder: Path, tmp_path: Path) -> None:
    """A scheme string to a lowbit checkpoint: the command's tensor bytes, a typed result."""
    _cli(str(folder), "--to", "int4:g32", "--out", str(tmp_path / "cli"))
    res = lowbit.quantize_model(folder, "int4:g32", tmp_path / "api", progress=False)
    assert _files(tmp_path / "cli") == _files(tmp_path / "api")
    assert isinstance(res, QuantizeResult)
    assert res.out == tmp_path / "api" and res.out_format == "lowbit"
    assert res.bytes == res["bytes"] > 0 and res.method is None and res["method"] is None
    assert res.seconds["total"] >= max(v for k, v in res.seconds.items() if k != "total")
    text = repr(res)
    assert text.startswith("QuantizeResult(") and len(text) < 200
    assert json.loads(res.to_json())["bytes"] == res.bytes
    assert "<table>" in res._repr_html_()


def test_hadamard_gptq_to_compressed_tensors_same_bytes(folder: Path, tmp_path: Path) -> None:
    """MR-GPTQ (hadamard+gptq) to compressed-tensors, a method the old API lacked: the same
    tensors and transform_config as the command."""
    opts = ["--calib-samples", "2", "--calib-len", "32"]
    _cli(str(folder), "--to", "nvfp4", "--method", "hadamard+gptq", "--out-format",
         "compressed-tensors", "--out", str(tmp_path / "cli"), *opts)  # fmt: skip
    res = lowbit.quantize_model(
        folder, "nvfp4", tmp_path / "api", method="hadamard+gptq",
        out_format="compressed-tensors", calibration=lowbit.Calibration(samples=2, length=32),
        progress=False,
    )  # fmt: skip
    assert _files(tmp_path / "cli") == _files(tmp_path / "api")
    cfg = [json.loads((tmp_path / d / "config.json").read_text()) for d in ("cli", "api")]
    assert cfg[0]["quantization_config"] == cfg[1]["quantization_config"]
    assert res.method is not None and res.method["rotation"]["tensors"]


@pytest.mark.parametrize("with_imatrix", [False, True])
def test_q4_k_m_same_bytes_as_the_cli(
    gguf_file: Path, imatrix: Path, tmp_path: Path, with_imatrix: bool
) -> None:
    """llama-quantize's Q4_K_M mix, with and without an importance matrix."""
    extra = ["--imatrix", str(imatrix)] if with_imatrix else []
    _cli(str(gguf_file), "--to", "q4_k_m", "--out-format", "gguf", "--out",
         str(tmp_path / "cli.gguf"), *extra)  # fmt: skip
    res = lowbit.quantize_model(
        gguf_file, "q4_k_m", tmp_path / "api.gguf", out_format="gguf",
        imatrix=imatrix if with_imatrix else None, progress=False,
    )  # fmt: skip
    assert (tmp_path / "cli.gguf").read_bytes() == (tmp_path / "api.gguf").read_bytes()
    assert isinstance(res, GGUFResult) and res.types["blk.0.ffn_down.weight"] in ("Q6_K", "Q4_K")
    assert (res.imatrix is not None) == with_imatrix
    assert "Q4_K" in repr(res) and len(repr(res)) < 300


def test_gguf_size_budget_same_bytes_as_the_cli(gguf_file: Path, tmp_path: Path) -> None:
    """A GGUF --size budget: the same trials, solution and bytes."""
    size = 900_000
    _cli(str(gguf_file), "--size", str(size), "--out-format", "gguf", "--out",
         str(tmp_path / "cli.gguf"), "--candidates", "Q3_K,Q6_K", "--calib-samples", "1",
         "--calib-len", "16")  # fmt: skip
    res = gguf_budget(
        gguf_file, tmp_path / "api.gguf", size=size, candidates=["Q3_K", "Q6_K"],
        scan_samples_count=1, scan_length=16, progress=False,
    )  # fmt: skip
    assert (tmp_path / "cli.gguf").read_bytes() == (tmp_path / "api.gguf").read_bytes()
    assert res.bytes == (tmp_path / "api.gguf").stat().st_size <= size
    assert res.plan is not None and set(res.types.values()) <= {"Q3_K", "Q6_K", "F32"}


def test_mlx_same_bytes_as_the_cli(folder: Path, tmp_path: Path) -> None:
    """out_format="mlx" (mlx_lm.convert's words: a mode or recipe, bits, group size) writes
    the command's folder."""
    _cli(str(folder), "--out-format", "mlx", "--q-bits", "3", "--q-group-size", "32", "--out",
         str(tmp_path / "cli"))  # fmt: skip
    res = lowbit.quantize_model(
        folder, None, tmp_path / "api", out_format="mlx", bits=3, group_size=32, progress=False
    )
    assert _files(tmp_path / "cli") == _files(tmp_path / "api")
    assert res.out_format == "mlx" and res.bytes > 0
    with pytest.raises(LowbitError, match="mixed recipes"):
        lowbit.quantize_model(folder, "int4:g32", tmp_path / "x", out_format="mlx")


def test_in_memory_transformers_model(model: Any, folder: Path, tmp_path: Path) -> None:
    """A transformers model held in memory is quantized as its saved folder is; the temporary
    copy is gone afterwards."""
    lowbit.quantize_model(folder, "int4:g32", tmp_path / "disk", progress=False)
    res = lowbit.quantize_model(model, "int4:g32", tmp_path / "mem", progress=False)
    a = lowbit.open_checkpoint(tmp_path / "disk")
    b = lowbit.open_checkpoint(tmp_path / "mem")
    linear = [n for n in a.names() if n.endswith("proj.weight")]
    assert linear
    for n in linear:
        np.testing.assert_array_equal(a.get(n), b.get(n))
    assert res.tensors > 0
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".lowbit-")]


def test_dry_run_writes_nothing(folder: Path, tmp_path: Path) -> None:
    res = lowbit.quantize_model(folder, "nvfp4", tmp_path / "x", dry_run=True)
    assert res.dry_run and res.out is None and not (tmp_path / "x").exists()
    assert res.bytes == res["totals"]["out_bytes"] > 0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"to": 3}, "give a scheme string"),
        ({"to": "q4_k_m"}, "writes GGUF"),  # a mix needs out_format="gguf"
        ({"to": "q4_k_m", "out_format": "gguf", "method": "awq"}, "rounded as llama.cpp"),
        ({"to": "int4", "out_format": "onnx"}, "out_format 'onnx'"),
        ({"to": "int4", "method": "gptqq"}, "unknown method 'gptqq'"),
        ({"to": None, "out_format": "gguf", "size": 10, "budget": 4.0}, "give size"),
        ({"to": "int4", "imatrix": "im.gguf"}, "go with a llama.cpp mix"),
    ],
)
def test_bad_arguments_are_one_line(
    folder: Path, tmp_path: Path, kwargs: dict, message: str
) -> None:
    with pytest.raises(LowbitError, match=message) as info:
        lowbit.quantize_model(folder, out=tmp_path / "o", progress=False, **kwargs)
    assert "\n" not in str(info.value)
    assert not (tmp_path / "o").exists()


def test_a_plain_module_is_refused(tmp_path: Path) -> None:
    import torch

    with pytest.raises(LowbitError, match="transformers models"):
        lowbit.quantize_model(torch.nn.Linear(4, 4), "int4", tmp_path / "o")
