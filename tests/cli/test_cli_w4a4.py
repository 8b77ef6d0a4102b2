"""lowbit quantize --activations nvfp4 (NVFP4 W4A4 compressed-tensors) and lowbit eval of the
folder it writes, in-process on a tiny Llama."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("compressed_tensors")
pytestmark = pytest.mark.torch

from lowbit.calibration.data import Calibration, decoder_windows  # noqa: E402
from lowbit.checkpoints import open_checkpoint  # noqa: E402
from lowbit.checkpoints.tokenizer import build_tokenizer  # noqa: E402
from lowbit.cli import main  # noqa: E402
from lowbit.evaluation.act_modes import simulate_act_mode  # noqa: E402
from lowbit.evaluation.perplexity import perplexity  # noqa: E402
from lowbit.evaluation.variants import evaluate_variants  # noqa: E402
from lowbit.models.act_quant import input_global_scale  # noqa: E402
from lowbit.models.build import build_model  # noqa: E402
from tiny_models import save_hf_folder, tiny_llama  # noqa: E402

torch.set_num_threads(1)
CAL = ["--calib-samples", "3", "--calib-len", "48", "--threads", "1", "--no-progress"]
FUSED = (("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
         ("mlp.gate_proj", "mlp.up_proj"))  # fmt: skip


def _raw(folder: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The source, its W4A4 folder (with the --json summary) and its W4A16 folder."""
    d = tmp_path_factory.mktemp("w4a4")
    hf = save_hf_folder(tiny_llama(seed=3), d / "hf")
    w4a4, w4a16 = d / "w4a4", d / "w4a16"
    base = ["quantize", str(hf), "--to", "nvfp4", "--out-format", "compressed-tensors", *CAL]
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main([*base, "--activations", "nvfp4", "--out", str(w4a4), "--json"]) == 0
    summary = json.loads(buf.getvalue())
    assert main([*base, "--out", str(w4a16)]) == 0
    return {"hf": hf, "w4a4": w4a4, "w4a16": w4a16, "summary": summary}


def test_input_global_scale_is_the_calibrated_amax(folders: dict[str, Any]) -> None:
    """Each layer's input_global_scale is input_global_scale(amax) of its input over the same
    calibration windows, run on the written weights (observed here with hooks of this test's
    own), bit for bit; q/k/v and gate/up hold one value; --json records the count and slice."""
    out = folders["w4a4"]
    raw = _raw(out)
    windows = decoder_windows(
        build_tokenizer(open_checkpoint(folders["hf"])), Calibration(samples=3, length=48)
    )
    model = build_model(open_checkpoint(out), progress=False)
    amax: dict[str, float] = {}
    hooks = []
    for name, m in model.named_modules():
        if isinstance(m, torch.nn.Linear) and name != "lm_head":

            def hook(_m: Any, args: tuple[Any, ...], name: str = name) -> None:
                a = float(args[0].abs().max())
                amax[name] = max(a, amax.get(name, 0.0))

            hooks.append(m.register_forward_pre_hook(hook))
    with torch.no_grad():
        for ids in windows:
            model(input_ids=torch.tensor([ids]))
    for h in hooks:
        h.remove()
    assert len(amax) == 14
    for layer in (0, 1):
        p = f"model.layers.{layer}"
        for group in (*FUSED, ("self_attn.o_proj",), ("mlp.down_proj",)):
            names = [f"{p}.{m}" for m in group]
            want = input_global_scale(np.float32(max(amax[n] for n in names))).numpy()
            for n in names:
                got = raw[f"{n}.input_global_scale"].numpy()
                assert got.shape == (1,) and got.dtype == np.float32
                assert got.view(np.uint32)[0] == want.view(np.uint32), n
    rec = folders["summary"]["input_scales"]
    assert (rec["layers"], rec["fused_groups"], rec["windows"], rec["tokens"]) == (14, 4, 3, 144)
    assert rec["calibration"]["samples"] == 3 and rec["calibration"]["length"] == 48


def test_config_is_the_nvfp4_preset_and_weights_decompress_alike(folders: dict[str, Any]) -> None:
    """The config validates as compressed-tensors' QuantizationConfig, its group is the
    NVFP4 preset's (weights and input_activations), its format nvfp4-pack-quantized; its
    weights are the W4A16 folder's, and compressed-tensors' own dequantizer gives lowbit's
    (rounded to bfloat16, the dequantizer's dtype)."""
    from compressed_tensors.compressors.format import infer_module_format
    from compressed_tensors.entrypoints.convert.converters.ct_dequantizer import (
        CompressedTensorsDequantizer,
    )
    from compressed_tensors.quantization import QuantizationConfig, preset_name_to_scheme

    out = folders["w4a4"]
    qc = json.loads((out / "config.json").read_text())["quantization_config"]
    groups = QuantizationConfig.model_validate(qc).config_groups
    assert len(groups) == 1
    group = next(iter(groups.values()))
    preset = preset_name_to_scheme("NVFP4", ["Linear"])
    assert group.input_activations == preset.input_activations
    assert group.weights == preset.weights
    assert infer_module_format(torch.nn.Linear, group).value == "nvfp4-pack-quantized"
    raw, plain = _raw(out), _raw(folders["w4a16"])
    assert set(raw) - set(plain) == {n for n in raw if n.endswith(".input_global_scale")}
    for n in plain:
        assert torch.equal(raw[n], plain[n]), n
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = CompressedTensorsDequantizer(out, dtype=torch.float32).process(dict(raw))
    mine = open_checkpoint(out)
    n = 0
    for name in mine.names():
        if name.endswith("proj.weight"):
            want = torch.from_numpy(np.array(mine.get(name))).bfloat16().float()
            assert torch.equal(theirs[name].float(), want), name
            n += 1
    assert n == 14


def test_eval_applies_the_stored_activations(folders: dict[str, Any]) -> None:
    """lowbit eval of the W4A4 folder runs its inputs as NVFP4 under the stored scales: its
    perplexity is the W4A16 folder's model under --act nvfp4 emulation with those scales
    (computed here by lowbit.evaluation.perplexity, one model at a time), and differs from the
    W4A16 row."""
    hf, w4a4, w4a16 = folders["hf"], folders["w4a4"], folders["w4a16"]
    res = evaluate_variants(hf, [w4a4, w4a16], schemes=[], tokens=600, window=200, threads=1,
                            progress=False)  # fmt: skip
    rows = {r["name"]: r for r in res["rows"]}
    a4, a16 = rows["w4a4"], rows["w4a16"]
    assert a4["activations"] == "nvfp4 (stored)" and a16["activations"] is None
    assert "input_global_scale" in a4["format"] and a4["activations_applied"].endswith("14 layers")
    assert a4["perplexity"] != a16["perplexity"]
    raw = _raw(w4a4)
    scales = {
        n[: -len(".input_global_scale")]: raw[n] for n in raw if n.endswith("input_global_scale")
    }
    ckpt = open_checkpoint(hf)
    tok = build_tokenizer(ckpt)
    model = build_model(open_checkpoint(w4a16), progress=False)
    with simulate_act_mode(model, "nvfp4", global_scales=scales) as hooked:
        assert sorted(hooked) == sorted(scales)
        want = perplexity(model, tok, max_tokens=600, window=200, threads=1, progress=False)
    assert a4["perplexity"] == want["perplexity"]
    plain = perplexity(model, tok, max_tokens=600, window=200, threads=1, progress=False)
    assert a16["perplexity"] == plain["perplexity"]


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--to", "nvfp4", "--out-format", "lowbit"], "add --out-format compressed-tensors"),
        (["--to", "nvfp4", "--out-format", "gguf"], "llama.cpp"),
        (["--to", "int4:g16", "--out-format", "compressed-tensors"], "give --to nvfp4"),
        (["--to", "mxfp4:ct", "--out-format", "compressed-tensors"], "give --to nvfp4"),
    ],
)
def test_bad_combinations_are_one_line(
    folders: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str],
    extra: list[str], needle: str,
) -> None:  # fmt: skip
    """--activations nvfp4 without NVFP4 weights or compressed-tensors output: one line."""
    argv = ["quantize", str(folders["hf"]), "--activations", "nvfp4", *extra,
            "--out", str(tmp_path / "x"), "--no-progress"]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and needle in err, err
    assert not (tmp_path / "x").exists()


def test_library_refuses_w4a4_without_scales(folders: dict[str, Any], tmp_path: Path) -> None:
    """quantize_model of a plan with NVFP4 activations: compressed-tensors needs the
    calibrated input scales, other formats cannot hold them."""
    from lowbit.checkpoints.streaming import quantize_model
    from lowbit.errors import LowbitError
    from lowbit.plans.plan import PrecisionPlan

    plan = PrecisionPlan.uniform("nvfp4", activations="nvfp4")
    with pytest.raises(LowbitError, match="run lowbit quantize --activations nvfp4"):
        quantize_model(folders["hf"], plan, tmp_path / "a", out_format="compressed-tensors",
                       progress=False)  # fmt: skip
    with pytest.raises(LowbitError, match="compressed-tensors only"):
        quantize_model(folders["hf"], plan, tmp_path / "b", progress=False)


def test_gguf_source(tmp_path: Path) -> None:
    """A GGUF source's W4A4 folder holds the W4A16 folder's tensors (q/k rows put back in the
    transformers order with their NVFP4 group scales) plus one input_global_scale per layer."""
    from tiny_models import save_gguf

    gguf = save_gguf(tiny_llama(seed=3), tmp_path / "t.gguf", embedding="F32")
    base = ["quantize", str(gguf), "--to", "nvfp4", "--out-format", "compressed-tensors", *CAL]
    assert main([*base, "--activations", "nvfp4", "--out", str(tmp_path / "a4")]) == 0
    assert main([*base, "--out", str(tmp_path / "a16")]) == 0
    a4, a16 = _raw(tmp_path / "a4"), _raw(tmp_path / "a16")
    assert sorted(set(a4) - set(a16)) == sorted(
        f"model.layers.{i}.{m}.input_global_scale" for i in (0, 1)
        for m in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                  "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
    )  # fmt: skip
    for n in a16:
        assert torch.equal(a4[n], a16[n]), n


@pytest.mark.parametrize(("w8a8", "mode"), [("int8", "int8"), ("fp8", "fp8_token")])
def test_eval_applies_stored_per_token_activations(
    folders: dict[str, Any], tmp_path: Path, w8a8: str, mode: str
) -> None:
    """A W8A8 folder (int8 or fp8 weights per channel, dynamic per-token inputs) is measured
    with its inputs quantized per token as declared: the perplexity of its weight-only twin
    under the same per-token emulation, not the weight-only one."""
    hf = folders["hf"]
    a8, w8 = tmp_path / "a8", tmp_path / "w8"
    base = ["quantize", str(hf), "--out-format", "compressed-tensors", "--no-progress"]
    assert main([*base, "--w8a8", w8a8, "--out", str(a8)]) == 0
    to = {"int8": "int8:ch", "fp8": "fp8_e4m3:ch"}[w8a8]
    assert main([*base, "--to", to, "--out", str(w8)]) == 0
    res = evaluate_variants(hf, [a8, w8], schemes=[], tokens=600, window=200, threads=1,
                            progress=False)  # fmt: skip
    rows = {r["name"]: r for r in res["rows"]}
    assert rows["a8"]["activations"] == f"{mode} (stored)"
    applied = rows["a8"]["activations_applied"]
    assert applied == f"{mode} activations as stored (dynamic) on 14 layers"
    tok = build_tokenizer(open_checkpoint(hf))
    model = build_model(open_checkpoint(w8), progress=False)
    with simulate_act_mode(model, mode):
        want = perplexity(model, tok, max_tokens=600, window=200, threads=1, progress=False)
    assert rows["a8"]["perplexity"] == want["perplexity"]
    assert rows["a8"]["perplexity"] != rows["w8"]["perplexity"]
