"""MLX folders of mixtures of experts: experts stacked as mlx-lm's switch_mlp by the writer
(the same tensors and config.json as mlx_lm.convert), un-stacked by the reader, loaded by
mlx_lm.load with lowbit's logits, and bad stacks refused in one line."""

from __future__ import annotations

import contextlib
import io
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from lowbit.checkpoints import open_checkpoint
from lowbit.checkpoints.mlx.convert import quantize_mlx
from lowbit.checkpoints.mlx.params import MLXParams
from lowbit.checkpoints.verify import verify_checkpoint
from lowbit.errors import LowbitError
from lowbit.quant import mlx as Q

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("safetensors")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tiny_models import save_moe_folder, tiny_moe  # noqa: E402

pytestmark = pytest.mark.torch

FAMILIES = ["mixtral", "qwen2_moe", "qwen3_moe"]
#: the stacked gate projection of layer 0 and the per-expert name of expert e
GATE = {
    "mixtral": ("model.layers.0.block_sparse_moe.switch_mlp.gate_proj",
                "model.layers.0.block_sparse_moe.experts.{}.w1.weight"),
    "qwen2_moe": ("model.layers.0.mlp.switch_mlp.gate_proj",
                  "model.layers.0.mlp.experts.{}.gate_proj.weight"),
    "qwen3_moe": ("model.layers.0.mlp.switch_mlp.gate_proj",
                  "model.layers.0.mlp.experts.{}.gate_proj.weight"),
}  # fmt: skip


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """family -> a per-expert folder; family-fused -> transformers 5's fused state dict. The
    configs gain ``rope_theta`` and ``num_experts`` as published Qwen/Mixtral configs have them
    (transformers 5 writes ``rope_parameters`` and ``num_local_experts``, which mlx-lm 0.32's
    model arguments do not read)."""
    d = tmp_path_factory.mktemp("moe-src")
    out = {}
    for kind in FAMILIES:
        model = tiny_moe(kind)
        for fused in (False, True):
            key = f"{kind}-fused" if fused else kind
            folder = save_moe_folder(model, d / key, fused=fused)
            cfg = json.loads((folder / "config.json").read_text())
            cfg["rope_theta"] = cfg["rope_parameters"]["rope_theta"]
            if kind != "mixtral":
                cfg["num_experts"] = 4
            (folder / "config.json").write_text(json.dumps(cfg))
            out[key] = folder
    return out


def _read(folder: Path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    out: dict[str, np.ndarray] = {}
    for f in sorted(folder.glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


# --- the writer and the reader, without mlx -------------------------------------------------


@pytest.mark.parametrize("kind", FAMILIES)
def test_experts_stacked_and_read_back(sources: dict[str, Path], tmp_path: Path, kind: str) -> None:
    """Each layer's experts become one [experts, out, in/words] stack whose slices are each
    expert's own quantization; the reader gives the per-expert names and weights back."""
    out = tmp_path / kind
    quantize_mlx(sources[kind], out, MLXParams(bits=3, group_size=32), progress=False)
    t = _read(out)
    assert not any(".experts." in k for k in t)
    stack, per_expert = GATE[kind]
    src = open_checkpoint(sources[kind])
    for e in range(4):
        w = np.asarray(src.get(per_expert.format(e)))
        words, scales, biases = Q.quantize(w, group_size=32, bits=3)
        assert t[f"{stack}.weight"][e].tobytes() == words.tobytes()
        assert t[f"{stack}.scales"][e].tobytes() == scales.tobytes()
        assert t[f"{stack}.biases"][e].tobytes() == biases.tobytes()
    assert t[f"{stack}.weight"].shape == (4, 32 if kind != "mixtral" else 128, 6)
    back = open_checkpoint(out)
    assert set(back.names()) == set(src.names())
    got = back.get(per_expert.format(2))
    w = np.asarray(src.get(per_expert.format(2)))
    want = Q.dequantize(*Q.quantize(w, group_size=32, bits=3), group_size=32, bits=3)
    assert got.shape == w.shape and got.tobytes() == want.astype(np.float32).tobytes()
    assert back.info(per_expert.format(2)).dtype == "MLX_AFFINE3"
    assert verify_checkpoint(out)["kind"] == "mlx"


def test_unquantizable_stack_stays_float(sources: dict[str, Path], tmp_path: Path) -> None:
    """Qwen2-MoE's expert down_proj rows of 32 are not whole groups of 64: stacked as floats
    (as mlx-lm leaves them), read back per expert exactly."""
    out = tmp_path / "q2"
    quantize_mlx(sources["qwen2_moe"], out, progress=False)
    t = _read(out)
    down = t["model.layers.1.mlp.switch_mlp.down_proj.weight"]
    assert down.dtype == np.float32 and down.shape == (4, 64, 32)
    assert "model.layers.1.mlp.switch_mlp.down_proj.scales" not in t
    src = open_checkpoint(sources["qwen2_moe"])
    name = "model.layers.1.mlp.experts.3.down_proj.weight"
    assert open_checkpoint(out).get(name).tobytes() == np.asarray(src.get(name)).tobytes()


def test_qwen3_moe_router_at_8_bits(sources: dict[str, Path], tmp_path: Path) -> None:
    """Qwen3-MoE's router is 8-bit g64 by mlx-lm's model predicate, written as mlx-lm writes
    the entry (no mode); a mixed recipe replaces the predicate, as in mlx-lm."""
    out = tmp_path / "q3"
    quantize_mlx(sources["qwen3_moe"], out, progress=False)
    q = json.loads((out / "config.json").read_text())["quantization"]
    assert q["model.layers.0.mlp.gate"] == {"group_size": 64, "bits": 8}
    assert _read(out)["model.layers.0.mlp.gate.weight"].shape == (4, 16)
    quantize_mlx(sources["qwen3_moe"], tmp_path / "mixed", recipe="mixed_3_6", progress=False)
    q = json.loads((tmp_path / "mixed" / "config.json").read_text())["quantization"]
    assert q["model.layers.0.mlp.gate"]["bits"] == 3
    assert q["model.layers.0.mlp.switch_mlp.up_proj"]["bits"] == 3
    assert q["model.layers.1.self_attn.v_proj"]["bits"] == 6  # the last eighth of the layers


def _stored(folder: Path, edit: Any) -> None:
    """Rewrite an MLX folder's single safetensors file through ``edit(tensors)``."""
    from safetensors.numpy import save_file

    t = _read(folder)
    edit(t)
    save_file(t, str(folder / "model.safetensors"), metadata={"format": "mlx"})


def test_bad_stacks_are_one_line(sources: dict[str, Path], tmp_path: Path) -> None:
    """A switch_mlp in a family lowbit does not un-stack, a stack that is not 3-D, a source
    with an expert missing, or with expert biases: one LowbitError each."""
    out = tmp_path / "m"
    quantize_mlx(sources["mixtral"], out, progress=False)
    cfg = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**cfg, "model_type": "llama"}))
    with pytest.raises(LowbitError, match="stacked experts of model_type 'llama'"):
        open_checkpoint(out)
    (out / "config.json").write_text(json.dumps(cfg))
    name = "model.layers.0.block_sparse_moe.switch_mlp.down_proj"

    def flatten(t: dict[str, np.ndarray]) -> None:
        for part in ("weight", "scales", "biases"):
            t[f"{name}.{part}"] = t[f"{name}.{part}"].reshape(-1, t[f"{name}.{part}"].shape[-1])

    _stored(out, flatten)
    with pytest.raises(LowbitError, match=r"stacked experts are \[experts, out, in\]"):
        open_checkpoint(out)

    from safetensors.numpy import save_file

    src = tmp_path / "holes"
    src.mkdir()
    for f in sources["mixtral"].iterdir():
        if f.suffix != ".safetensors":
            (src / f.name).write_bytes(f.read_bytes())
    t = _read(sources["mixtral"])
    gone = t.pop("model.layers.1.block_sparse_moe.experts.2.w2.weight")
    save_file(t, str(src / "model.safetensors"))
    # the shape checks against config.json see the hole before the stacking does
    with pytest.raises(
        LowbitError, match=r"layer 1 lacks expert 2's w2 .*config.json has 4 experts"
    ):
        quantize_mlx(src, tmp_path / "x", progress=False)
    t["model.layers.1.block_sparse_moe.experts.2.w2.weight"] = gone
    t["model.layers.1.block_sparse_moe.experts.2.w2.bias"] = np.zeros(64, np.float32)
    save_file(t, str(src / "model.safetensors"))
    with pytest.raises(LowbitError, match="no expert biases"):
        quantize_mlx(src, tmp_path / "x", progress=False)
    assert not (tmp_path / "x").exists()


# --- checked by mlx-lm ----------------------------------------------------------------------


def _mlx_lm() -> Any:
    pytest.importorskip("mlx.core", reason="mlx[cpu] is not installed (pip install 'mlx[cpu]')")
    return pytest.importorskip("mlx_lm", reason="mlx-lm is not installed (pip install mlx-lm)")


@pytest.mark.parametrize("kind", FAMILIES)
@pytest.mark.parametrize("recipe", [None, "mixed_3_6"])
def test_identical_to_mlx_lm_convert(
    sources: dict[str, Path], tmp_path: Path, kind: str, recipe: str | None
) -> None:
    """mlx_lm.convert -q of a per-expert folder and lowbit's folders from it and from the fused
    layout: the same tensors (names, dtypes, shapes, bytes) and the same config.json."""
    _mlx_lm()
    from mlx_lm.convert import convert

    theirs = tmp_path / "theirs"
    kw = {"quant_predicate": recipe, "q_group_size": 64} if recipe else {}
    with contextlib.redirect_stdout(io.StringIO()):
        convert(str(sources[kind]), str(theirs), quantize=True, **kw)
    b = _read(theirs)
    cb = json.loads((theirs / "config.json").read_text())
    for src in (kind, f"{kind}-fused"):
        ours = tmp_path / src
        quantize_mlx(sources[src], ours, recipe=recipe, progress=False)
        a = _read(ours)
        assert sorted(a) == sorted(b)
        for k in b:
            assert (a[k].dtype, a[k].shape, a[k].tobytes()) == (b[k].dtype, b[k].shape,
                                                               b[k].tobytes()), k  # fmt: skip
        assert json.loads((ours / "config.json").read_text()) == cb


@pytest.mark.parametrize("kind", FAMILIES)
def test_mlx_lm_load_logits_match_lowbit(
    sources: dict[str, Path], tmp_path: Path, kind: str
) -> None:
    """mlx_lm.load reads lowbit's MoE folder; its logits equal lowbit's own evaluation of the
    folder (un-stacked experts in torch, float32) within 2e-4 of the logits' range."""
    _mlx_lm()
    import mlx.core as mx
    from mlx_lm import load

    from lowbit.models.build import load_model

    out = tmp_path / kind
    quantize_mlx(sources[kind], out, MLXParams(bits=3, group_size=32), progress=False)
    ids = [[257, 72, 101, 108, 108, 111, 32, 116, 104, 101, 114, 101]]
    model, _ = load(str(out))
    theirs = np.array(model(mx.array(ids)).astype(mx.float32))
    with torch.no_grad():
        ours = load_model(out)(torch.tensor(ids)).logits.float().numpy()
    span = float(theirs.max() - theirs.min())
    assert theirs.shape == ours.shape
    assert np.max(np.abs(theirs - ours)) <= 2e-4 * span


def test_gptq_reaches_every_expert(sources: dict[str, Path], tmp_path: Path, capsys) -> None:
    """--method gptq --out-format mlx on a mixture: every expert of every layer is GPTQ'd onto
    its MLX grid (less layer error than round to nearest) before the stack is written."""
    from lowbit.cli import main

    calib = tmp_path / "calib.txt"
    calib.write_text(" ".join(f"The river {i} keeps the stone {i * 7 % 13}." for i in range(80)))
    out = tmp_path / "gptq"
    argv = ["quantize", str(sources["mixtral-fused"]), "--out-format", "mlx", "--method", "gptq",
            "--calib", str(calib), "--calib-samples", "4", "--calib-len", "48", "--out", str(out),
            "--threads", "2", "--json"]  # fmt: skip
    assert main(argv) == 0
    rec = json.loads(capsys.readouterr().out)["method"]
    assert rec["gptq_tensors"] == 2 * (4 + 4 * 3)  # attention + 3 projections x 4 experts
    assert rec["mean_error"]["gptq"] < 0.5 * rec["mean_error"]["rtn"]
    assert "model.layers.1.block_sparse_moe.switch_mlp.down_proj.weight" in _read(out)
    assert verify_checkpoint(out)["kind"] == "mlx"


def test_budget_refuses_stacks(sources: dict[str, Path], tmp_path: Path) -> None:
    """A budget over a mixture of experts (stacks not priced yet): one line, no folder."""
    from lowbit.jobs.mlx_budget import mlx_budget

    with pytest.raises(LowbitError, match=r"stacked experts \(switch_mlp\) are not priced yet"):
        mlx_budget(sources["mixtral"], tmp_path / "b", bits_per_weight=4.0, progress=False)
    assert not (tmp_path / "b").exists()
