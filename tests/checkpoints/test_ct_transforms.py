"""compressed-tensors' transform_config (online block-Hadamard input rotations): lowbit writes
llm-compressor's QuIP "v" folders byte for byte, reads them with the rotation applied as
compressed-tensors' own transform modules apply it, and refuses what it cannot apply."""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("compressed_tensors")
pytest.importorskip("safetensors")
pytestmark = pytest.mark.torch

from compressed_tensors.transform import TransformConfig, apply_transform_config  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

from lowbit.calibration.data import Calibration, decoder_windows  # noqa: E402
from lowbit.checkpoints import open_checkpoint  # noqa: E402
from lowbit.checkpoints.streaming import quantize_model  # noqa: E402
from lowbit.checkpoints.tokenizer import build_tokenizer  # noqa: E402
from lowbit.cli import main  # noqa: E402
from lowbit.errors import LowbitError  # noqa: E402
from lowbit.evaluation.act_modes import simulate_stored_activations  # noqa: E402
from lowbit.methods.hadamard import rotate_rows  # noqa: E402
from lowbit.models.act_quant import fake_quantize_activation, input_global_scale  # noqa: E402
from lowbit.models.build import build_model, load_model  # noqa: E402
from lowbit.plans.plan import PrecisionPlan  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tiny_models import save_hf_folder, tiny_llama  # noqa: E402

torch.set_num_threads(1)
REF = Path(__file__).resolve().parents[1] / "fixtures" / "llmcompressor_quip"
IDS = torch.randint(0, 256, (1, 24), generator=torch.Generator().manual_seed(1))
CAL = ["--calib-samples", "3", "--calib-len", "48", "--threads", "1", "--no-progress"]


def _bytes(t: Any) -> bytes:
    return t.contiguous().view(-1).view(torch.uint8).numpy().tobytes()


def _unhooked(folder: Path) -> Any:
    """The folder's model with its dequantized weights and no lowbit hooks."""
    model = build_model(open_checkpoint(folder), progress=False)
    for m in model.modules():
        m._forward_pre_hooks.clear()
    return model


def _ct_online(folder: Path) -> Any:
    """The oracle: compressed-tensors' own transform modules for the folder's online entries
    (its weight_input entries are already in the stored weights), on the unhooked model."""
    model = _unhooked(folder)
    tc = json.loads((folder / "config.json").read_text())["quantization_config"]
    tc = tc["transform_config"]
    for g in tc["config_groups"].values():
        g["apply"] = [a for a in g["apply"] if a["location"] == "input"]
    apply_transform_config(model, TransformConfig.model_validate(tc))
    return model


@pytest.mark.parametrize("folder", ["nvfp4-b16", "mxfp4-b32"])
def test_reads_llmcompressor_quip_as_compressed_tensors_applies_it(folder: str) -> None:
    """llm-compressor's folder builds with every linear's input rotated: logits equal those of
    compressed-tensors' own transform modules (float64 there) within 1e-5; without the
    rotation they are far off; the stored matrix is not a model tensor."""
    path = REF / folder
    model = load_model(path, progress=False)
    assert len(model.lowbit_input_transforms) == 14
    assert set(model.lowbit_input_transforms.values()) == {16 if "16" in folder else 32}
    assert not any("v_input" in n for n in open_checkpoint(path).names())
    with torch.no_grad():
        got = model(IDS).logits
        want = _ct_online(path)(IDS).logits
        plain = _unhooked(path)(IDS).logits
    assert torch.allclose(got, want, atol=1e-5, rtol=0)
    assert (got - plain).abs().max() > 0.1


def test_stored_input_quantization_sees_the_rotated_input() -> None:
    """In llm-compressor's W4A4 folder the rotation runs before NVFP4 input quantization (its
    input_global_scale was observed on rotated inputs): eval's emulation equals a single hook
    that rotates, then fake-quantizes with the stored scale."""
    path = REF / "nvfp4a4-b16"
    ckpt = open_checkpoint(path)
    stored = ckpt.input_activations()
    assert len(stored) == 14 and {m for m, _ in stored.values()} == {"nvfp4"}
    model = load_model(path, progress=False)
    with torch.no_grad(), simulate_stored_activations(model, stored):
        got = model(IDS).logits
    oracle = _unhooked(path)
    for name, (mode, g) in stored.items():

        def hook(_m: Any, a: tuple[Any, ...], g: Any = g, mode: str = mode) -> tuple[Any, ...]:
            return (fake_quantize_activation(rotate_rows(a[0], 16), mode, g), *a[1:])

        dict(oracle.named_modules())[name].register_forward_pre_hook(hook)
    with torch.no_grad():
        want = oracle(IDS).logits
    assert torch.equal(got, want)


@pytest.mark.parametrize(("to", "folder"), [("nvfp4", "nvfp4-b16"), ("mxfp4:ct", "mxfp4-b32")])
def test_writes_llmcompressor_quip_byte_for_byte(to: str, folder: str, tmp_path: Path) -> None:
    """lowbit quantize --method hadamard --out-format compressed-tensors of llm-compressor's
    source holds the same tensors, byte for byte (rotated packed codes, scales, shared NVFP4
    global scales, the one float64 ±1 matrix), and a transform_config compressed-tensors
    validates whose targets resolve to the same layers."""
    out = tmp_path / "out"
    args = ["quantize", str(REF / "src"), "--to", to, "--method", "hadamard"]
    assert main([*args, "--out-format", "compressed-tensors", "--out", str(out), *CAL]) == 0
    mine, ref = (
        load_file(str(out / "model.safetensors")),
        load_file(str(REF / folder / "model.safetensors")),
    )
    assert sorted(mine) == sorted(ref)
    for name in ref:
        assert mine[name].dtype == ref[name].dtype and mine[name].shape == ref[name].shape, name
        assert _bytes(mine[name]) == _bytes(ref[name]), name
    tc = json.loads((out / "config.json").read_text())["quantization_config"]["transform_config"]
    TransformConfig.model_validate(tc)
    want = json.loads((REF / folder / "config.json").read_text())["quantization_config"]
    want = want["transform_config"]["config_groups"]["v"]
    got = tc["config_groups"]["v"]
    for key in ("type", "head_dim", "randomize", "requires_grad", "precision"):
        assert got[key] == want[key], key
    assert [(a["location"], a["inverse"]) for a in got["apply"]] == [
        (a["location"], a["inverse"]) for a in want["apply"]
    ]
    layers = load_model(out, progress=False).lowbit_input_transforms
    assert layers == load_model(REF / folder, progress=False).lowbit_input_transforms


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_hf_folder(tiny_llama(seed=3), tmp_path_factory.mktemp("rot") / "hf")


def _quantize(hf: Path, out: Path, *extra: str) -> dict[str, Any]:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(["quantize", str(hf), "--to", "nvfp4", "--out", str(out), *extra, *CAL,
                     "--json"]) == 0  # fmt: skip
    return json.loads(buf.getvalue())


def test_mr_gptq_folder_computes_the_lowbit_checkpoint(tiny: Path, tmp_path: Path) -> None:
    """MR-GPTQ written as compressed-tensors (transform_config) and as lowbit's format (the
    manifest's rotation) give the same logits exactly; compressed-tensors' own transform
    modules agree within 1e-5; lowbit verify accepts the folder."""
    ct, lb = tmp_path / "ct", tmp_path / "lb"
    _quantize(tiny, ct, "--method", "hadamard+gptq", "--out-format", "compressed-tensors")
    _quantize(tiny, lb, "--method", "hadamard+gptq")
    ids = IDS % 200
    with torch.no_grad():
        a = load_model(ct, progress=False)(ids).logits
        b = load_model(lb, progress=False)(ids).logits
        c = _ct_online(ct)(ids).logits
    assert torch.equal(a, b)
    assert torch.allclose(a, c, atol=1e-5, rtol=0)
    assert main(["verify", str(ct)]) == 0


def test_w4a4_scales_are_the_rotated_inputs(tiny: Path, tmp_path: Path) -> None:
    """With --activations nvfp4 each input_global_scale is observed on the rotated input (what
    the served layer quantizes): bit for bit input_global_scale of the largest |x R| over the
    calibration windows, per fused group."""
    out = tmp_path / "a4"
    _quantize(tiny, out, "--method", "hadamard", "--activations", "nvfp4",
              "--out-format", "compressed-tensors")  # fmt: skip
    windows = decoder_windows(
        build_tokenizer(open_checkpoint(tiny)), Calibration(samples=3, length=48)
    )
    model = load_model(out, progress=False)  # rotation hooks first, then ours see x R
    amax: dict[str, float] = {}
    for name in model.lowbit_input_transforms:

        def hook(_m: Any, args: tuple[Any, ...], name: str = name) -> None:
            amax[name] = max(float(args[0].abs().max()), amax.get(name, 0.0))

        dict(model.named_modules())[name].register_forward_pre_hook(hook)
    with torch.no_grad():
        for ids in windows:
            model(input_ids=torch.tensor([ids]))
    raw = load_file(str(out / "model.safetensors"))
    p = "model.layers.0"
    group = [f"{p}.self_attn.{m}_proj" for m in "qkv"]
    want = input_global_scale(np.float32(max(amax[n] for n in group))).numpy()
    for n in group:
        assert raw[f"{n}.input_global_scale"].numpy().view(np.uint32)[0] == want.view(np.uint32)
    plain = tmp_path / "a4-plain"
    _quantize(tiny, plain, "--activations", "nvfp4", "--out-format", "compressed-tensors")
    other = load_file(str(plain / "model.safetensors"))[f"{group[0]}.input_global_scale"]
    assert _bytes(other) != _bytes(raw[f"{group[0]}.input_global_scale"])


def _crafted(tmp_path: Path, edit: Any, tensors: Any = None) -> Path:
    """A copy of llm-compressor's nvfp4-b16 folder with its transform_config (or tensors)
    edited."""
    out = tmp_path / "crafted"
    shutil.copytree(REF / "nvfp4-b16", out)
    cfg = json.loads((out / "config.json").read_text())
    edit(cfg["quantization_config"]["transform_config"])
    (out / "config.json").write_text(json.dumps(cfg))
    if tensors is not None:
        from safetensors.torch import save_file

        raw = load_file(str(out / "model.safetensors"))
        tensors(raw)
        save_file(raw, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def _v(tc: dict[str, Any]) -> dict[str, Any]:
    return tc["config_groups"]["v"]


def _set_online(key: str, value: Any) -> Any:
    def edit(tc: dict[str, Any]) -> None:
        _v(tc)["apply"][0][key] = value

    return edit


def _not_sylvester(raw: dict[str, Any]) -> None:
    raw["model.layers.0.self_attn.q_proj.v_input.weight"][0, 1] *= -1


@pytest.mark.parametrize(
    ("edit", "tensors", "says"),
    [
        (_set_online("location", "output"), None, "applies online transforms to layer inputs"),
        (_set_online("location", "k_cache"), None, "applies online transforms to layer inputs"),
        (lambda tc: _v(tc).update(randomize=True), None, "randomized"),
        (lambda tc: _v(tc).update(type="random-matrix"), None, "not applied by lowbit"),
        (lambda tc: _v(tc).update(head_dim=0), None, "not a positive integer"),
        (lambda tc: _v(tc).update(head_dim=48), None, "do not divide"),
        (lambda tc: tc.update(config_groups=[]), None, "no config_groups"),
        (_set_online("targets", ["re:model\\.norm$"]), None, "linear layers"),
        (_set_online("targets", ["nothing.here"]), None, "matches no layer"),
        (_set_online("targets", 5), None, "strings or lists"),
        (lambda tc: _v(tc).update(type="random-hadamard"), lambda raw: raw.pop(
            "model.layers.0.self_attn.q_proj.v_input.weight"), "needs its stored matrix"),
        (lambda tc: None, _not_sylvester, "not the ±1 Sylvester"),
    ],
)  # fmt: skip
def test_crafted_transform_configs_are_one_line(
    edit: Any, tensors: Any, says: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A transform lowbit cannot apply (or a folder that lies about one) is one LowbitError
    line from lowbit eval, never a model measured without its rotation."""
    path = _crafted(tmp_path, edit, tensors)
    with pytest.raises(LowbitError, match=says):
        load_model(path, progress=False)
    code = main(["eval", "minilm", str(path), "--schemes", "none", "--no-progress"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1


def test_rotated_outputs_and_sources_refused(tiny: Path, tmp_path: Path) -> None:
    """A GGUF cannot declare the rotation (refused before any work); a folder stored rotated
    is not a source for a new output, which would drop its rotation."""
    with pytest.raises(LowbitError, match="GGUF cannot declare"):
        quantize_model(
            tiny, PrecisionPlan.uniform("q4_0"), tmp_path / "x.gguf", out_format="gguf",
            weights={}, method={"rotation": {"tensors": {"a.weight": 32}}},
        )  # fmt: skip
    code = main(["quantize", str(tiny), "--to", "int4:g32", "--method", "hadamard",
                 "--out-format", "gguf", "--out", str(tmp_path / "y.gguf")])  # fmt: skip
    assert code == 2 and not (tmp_path / "y.gguf").exists()
    for fmt in ("lowbit", "compressed-tensors", "gguf"):
        out = tmp_path / f"again-{fmt}"
        code = main(["quantize", str(REF / "nvfp4-b16"), "--to", "int8", "--out-format", fmt,
                     "--out", str(out)])  # fmt: skip
        assert code == 2 and not out.exists()
    with pytest.raises(LowbitError, match="stored rotated"):
        quantize_model(REF / "nvfp4-b16", PrecisionPlan.uniform("int8"), tmp_path / "z")


def test_verify_checks_the_transforms(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """lowbit verify accepts llm-compressor's rotated folders, saying it checked the transforms,
    and refuses one whose stored Hadamard matrix is not Sylvester's or whose transform lowbit
    cannot apply, in one line."""
    for folder in ("nvfp4-b16", "mxfp4-b32", "nvfp4a4-b16"):
        assert main(["verify", str(REF / folder), "--json"]) == 0
        got = json.loads(capsys.readouterr().out)
        assert any("transform_config" in c for c in got["checks"])
        assert got["summary"]["online input transforms"] == 1
    bad = _crafted(tmp_path, lambda tc: None, _not_sylvester)
    assert main(["verify", str(bad)]) == 2
    assert "Sylvester" in capsys.readouterr().err
    shutil.rmtree(bad)
    bad = _crafted(tmp_path, _set_online("location", "output"))
    assert main(["verify", str(bad)]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_report_measures_rotated_weights_in_their_basis(tiny: Path, tmp_path: Path) -> None:
    """lowbit report compares a weight stored rotated (W R) with the rotated source, the same
    error as the weight the layer computes with: MR-GPTQ's errors are equal in lowbit's format
    and in compressed-tensors, each close to the dequantized weight's own error (``W`` against
    ``Q Rᵀ``), and llm-compressor's folder shows no transform matrix as a tensor."""
    from lowbit.view.report import build_report

    ct, lb = tmp_path / "ct", tmp_path / "lb"
    _quantize(tiny, ct, "--method", "hadamard+gptq", "--out-format", "compressed-tensors")
    _quantize(tiny, lb, "--method", "hadamard+gptq")
    a = {r.name: r.rel_fro for r in build_report(ct, against=tiny).rows if r.stored != "kept"}
    b = {r.name: r.rel_fro for r in build_report(lb, against=tiny).rows if r.stored != "kept"}
    assert len(a) == 14 and a.keys() == b.keys()
    src, folder = open_checkpoint(tiny), open_checkpoint(ct)
    for name in a:
        assert a[name] == pytest.approx(b[name], rel=1e-6)
        x = np.asarray(src.get(name), np.float64)
        back = rotate_rows(np.asarray(folder.get(name), np.float64), 16)  # Q R R = Q Rᵀ
        assert a[name] == pytest.approx(np.linalg.norm(x - back) / np.linalg.norm(x), rel=1e-4)
        assert a[name] < 0.3
    rows = build_report(REF / "nvfp4-b16", against=REF / "src").rows
    assert not any("v_input" in r.name for r in rows)
    assert max(r.rel_fro for r in rows if r.stored != "kept") < 0.3


def test_rotated_experts_refused_for_compressed_tensors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """vLLM applies transform_config to linear layers, not to fused experts: a mixture's
    rotated experts are refused for compressed-tensors before any work (CLI) and by the
    library, in one line; lowbit's own format takes them."""
    from tiny_models import save_moe_folder, tiny_moe

    src = save_moe_folder(tiny_moe("mixtral"), tmp_path / "moe")
    out = tmp_path / "ct"
    capsys.readouterr()
    code = main(["quantize", str(src), "--to", "nvfp4", "--method", "hadamard",
                 "--out-format", "compressed-tensors", "--out", str(out)])  # fmt: skip
    err = capsys.readouterr().err.strip()
    assert code == 2 and "fused experts" in err and len(err.splitlines()) == 1
    assert not out.exists()
    name = "model.layers.0.mlp.experts.0.w1.weight"
    with pytest.raises(LowbitError, match="fused experts"):
        quantize_model(src, PrecisionPlan.uniform("nvfp4"), out, out_format="compressed-tensors",
                       weights={}, method={"rotation": {"tensors": {name: 16}}})  # fmt: skip
    assert main(["quantize", str(src), "--to", "nvfp4", "--method", "hadamard",
                 "--out", str(tmp_path / "lb"), "--no-progress"]) == 0  # fmt: skip
