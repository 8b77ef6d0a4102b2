"""One scheme string means one scheme in every command: the same label and bits per value
from ``quantize-tensor``, ``compare``, ``quantize --dry-run``, ``eval --schemes`` and ``plan``."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from lowbit.cli import main
from lowbit.evaluation.variants import variant_plan
from lowbit.quant.scheme_text import PRESETS

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
st_np = pytest.importorskip("safetensors.numpy")

from tiny_models import save_hf_folder, tiny_llama  # noqa: E402

NAME = "model.layers.0.mlp.down_proj.weight"  # (64, 128) in the tiny llama
SPECS = [*PRESETS, "int8", "int4", "int4:g128", "int4:g128:fp16:asym", "nf4", "nf4:g64:dq",
         "fp8_e4m3:ch", "mxfp4", "int8:t", "fp4:g16:bf16", "mxint8", "int3:g32:bf16:asym:mse",
         "nvfp4", "mxfp4:ct", "mxfp8_e4m3:carry", "fp8_block", "fp8_e4m3:b1x32:e8m0"]  # fmt: skip


def _cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(list(argv))
    return rc, out.getvalue(), err.getvalue()


def _json(*argv: str) -> Any:
    rc, out, err = _cli(*argv, "--json")
    assert rc == 0, err
    return json.loads(out)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The tiny llama as a Hugging Face folder, and one of its weights as .npy and as a
    one-tensor .safetensors file."""
    root = tmp_path_factory.mktemp("consistency")
    folder = save_hf_folder(tiny_llama(), root / "tiny")
    from safetensors import safe_open

    with safe_open(str(folder / "model.safetensors"), framework="numpy") as f:
        w = f.get_tensor(NAME).astype(np.float32)
    np.save(root / "w.npy", w)
    st_np.save_file({NAME: w}, root / "w.safetensors")
    return {"model": folder, "npy": root / "w.npy", "st": root / "w.safetensors"}


@pytest.mark.parametrize("spec", SPECS)
def test_every_command_reports_the_same_label_and_bits(files: dict[str, Path], spec: str) -> None:
    """The same string gives the same label and the same stored bits per value everywhere."""
    seen: dict[str, tuple[str, float]] = {}
    t = _json("quantize-tensor", str(files["npy"]), "--to", spec)
    seen["quantize-tensor"] = (t["label"], t["bits_per_value"])
    c = _json("compare", "--data", str(files["npy"]), "--formats", spec)["results"][0]
    seen["compare"] = (c["scheme"], c["bits_per_value"])
    doc = _json("quantize", str(files["model"]), "--to", spec, "--dry-run")
    row = next(r for r in doc["tensors"] if r["name"] == NAME)
    assert row["action"] == "quantize"
    seen["quantize --dry-run"] = (row["format"], row["bits"])
    scheme = variant_plan(spec).default
    shape = tuple(t["shape"])
    seen["eval --schemes"] = (scheme.label, scheme.tensor_bytes(shape) * 8 / np.prod(shape))
    p = _json("plan", str(files["st"]), "--precisions", spec)["rows"]
    assert len(p) == 1
    seen["plan"] = (p[0]["format"], p[0]["bits_per_weight"])
    assert len(set(seen.values())) == 1, seen
    assert t["scheme"] == p[0]["scheme"] == row["scheme"]


@pytest.mark.parametrize(
    "argv",
    [
        ["quantize-tensor", "{npy}", "--to", "fp8_e4m3", "--asym"],
        ["quantize-tensor", "{npy}", "--to", "fp8_e4m3:asym"],
        ["compare", "--data", "{npy}", "--formats", "int8,fp8_e4m3", "--asym"],
        ["quantize", "{model}", "--to", "nf4", "--asym", "--dry-run"],
        ["plan", "{st}", "--precisions", "fp4:asym"],
        ["eval", "--schemes", "fp8_e4m3:asym"],
    ],
)
def test_asym_with_a_float_format_is_an_error(files: dict[str, Path], argv: list[str]) -> None:
    """--asym (or :asym) with a float format exits 2 naming the need for an integer format."""
    args = [a.format(npy=files["npy"], model=files["model"], st=files["st"]) for a in argv]
    rc, _, err = _cli(*args)
    assert rc == 2 and "integer format" in err


@pytest.mark.parametrize("spec", ["q4_1", "int4:g16:e4m3"])
def test_what_the_quantizer_cannot_make_is_refused_everywhere(
    files: dict[str, Path], spec: str
) -> None:
    """q4_1 and bare E4M3 scales: the planner refuses them as the quantizer does."""
    for argv in (
        ["quantize-tensor", str(files["npy"]), "--to", spec],
        ["compare", "--data", str(files["npy"]), "--formats", spec],
        ["quantize", str(files["model"]), "--to", spec, "--dry-run"],
        ["plan", str(files["st"]), "--precisions", spec],
        ["eval", "--schemes", spec],
    ):
        rc, _, err = _cli(*argv)
        assert rc == 2 and (spec.split(":")[0] in err or "e4m3" in err), (argv, err)


def test_per_channel_on_1d_data_names_the_fix(files: dict[str, Path], tmp_path: Path) -> None:
    """A bare format on a 1-D tensor (per channel: no rows) is refused with the :t spelling."""
    np.save(tmp_path / "v.npy", np.linspace(-1, 1, 300, dtype=np.float32))
    rc, _, err = _cli("quantize-tensor", str(tmp_path / "v.npy"), "--to", "int4")
    assert rc == 2 and "int4:t:fp32" in err
    rc, _, err = _cli("compare", "--formats", "int8", "--size", "64")
    assert rc == 2 and "int8:t:fp32" in err
    assert _cli("compare", "--formats", "int8:t", "--size", "64")[0] == 0
