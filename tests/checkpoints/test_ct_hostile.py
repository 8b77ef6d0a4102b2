"""A downloaded compressed-tensors folder cannot hang lowbit or pass for something it is not:
``re:`` targets are matched in linear time, and a malformed or foreign ``quantization_config``
is one LowbitError instead of a plain model read from packed codes."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytestmark = pytest.mark.torch

from lowbit.checkpoints import open_checkpoint  # noqa: E402
from lowbit.checkpoints.streaming import quantize_model  # noqa: E402
from lowbit.checkpoints.verify import verify_checkpoint  # noqa: E402
from lowbit.errors import LowbitError  # noqa: E402
from lowbit.plans.plan import PrecisionPlan  # noqa: E402
from tiny_models import save_hf_folder, tiny_bert  # noqa: E402


@pytest.fixture(scope="module")
def ct(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("ct")
    src = save_hf_folder(tiny_bert(bias_std=0.05), tmp / "bert")
    out = tmp / "ct"
    quantize_model(src, PrecisionPlan.uniform("int8:ch"), out, out_format="compressed-tensors",
                   progress=False)  # fmt: skip
    return out


def _with_config(ct: Path, tmp: Path, edit) -> Path:
    import shutil

    folder = tmp / "edited"
    shutil.copytree(ct, folder)
    cfg = json.loads((folder / "config.json").read_text())
    edit(cfg)
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


@pytest.mark.parametrize("pattern", ["re:(.*.*)*z", "re:(a|a)*$", "re:(\\w+\\s?)*$"])
def test_catastrophic_targets_are_linear(ct: Path, tmp_path: Path, pattern: str) -> None:
    """A target that makes re backtrack for hours: verify and open_checkpoint finish fast."""

    def edit(cfg: dict) -> None:
        for g in cfg["quantization_config"]["config_groups"].values():
            g["targets"] = [pattern, *g["targets"]]

    folder = _with_config(ct, tmp_path, edit)
    t0 = time.perf_counter()
    verify_checkpoint(folder)
    names = open_checkpoint(folder).names()
    assert time.perf_counter() - t0 < 5.0
    assert sum(n.endswith("bias") for n in names) > 0


def test_unsupported_target_is_one_error(ct: Path, tmp_path: Path) -> None:
    """A look-around target (no linear-time engine has one) is refused, naming the field."""

    def edit(cfg: dict) -> None:
        g = next(iter(cfg["quantization_config"]["config_groups"].values()))
        g["targets"] = ["re:(?=.*)dense"]

    folder = _with_config(ct, tmp_path, edit)
    with pytest.raises(LowbitError, match="targets regex"):
        open_checkpoint(folder)


@pytest.mark.parametrize(
    ("qc", "match"),
    [
        ([1, 2], "not an object"),
        ("compressed-tensors", "not an object"),
        (None, "not an object"),
        ({"quant_method": "gptq", "bits": 4}, "'gptq'"),
        ({}, "quant_method"),
        ({"quant_method": "compressed-tensors", "config_groups": []}, "config_groups"),
        ({"quant_method": "compressed-tensors", "config_groups": {"g": 5}}, "not an object"),
    ],
)
def test_malformed_quantization_config(ct: Path, tmp_path: Path, qc, match: str) -> None:
    """Not read as a plain model (its weight_packed/weight_scale would pass for tensors)."""

    def edit(cfg: dict) -> None:
        cfg["quantization_config"] = qc

    folder = _with_config(ct, tmp_path, edit)
    with pytest.raises(LowbitError, match=match):
        open_checkpoint(folder)


def test_many_targets_over_many_modules() -> None:
    """50,000 exact targets over 10,000 modules: a set look-up per module (a scan of every
    target per module before: 5 x 10^8 comparisons)."""
    from lowbit.checkpoints.compressed_tensors.layout import ct_candidates, ct_groups

    targets = [f"model.layers.{i}.mlp.up_proj" for i in range(50_000)]
    qc = {"format": "pack-quantized", "config_groups": {"g": {
        "targets": targets, "weights": {"num_bits": 4, "type": "int", "strategy": "channel"}}}}  # fmt: skip
    groups = ct_groups(qc, "config.json")
    modules = {f"m.{i}" for i in range(10_000)}
    t0 = time.perf_counter()
    hits = sum(bool(ct_candidates(m, groups, modules)) for m in modules)
    assert time.perf_counter() - t0 < 2.0
    assert hits == 10_000  # no module is named, and its targets name no module: class-like
    assert ct_candidates("model.layers.7.mlp.up_proj", groups, modules)[0][0] == "g"
