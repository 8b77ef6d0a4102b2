"""compressed-tensors output in NVFP4, MXFP4 and FP8 blocks: the bytes compressed-tensors' own
compressors write, its config schema, its and transformers' loaders, and shared global scales."""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import lowbit
from lowbit.errors import LowbitError
from lowbit.quant.scheme_text import parse_scheme

torch = pytest.importorskip("torch")
pytest.importorskip("compressed_tensors")
pytest.importorskip("safetensors")
from compressed_tensors.compressors.format import infer_module_format  # noqa: E402
from compressed_tensors.compressors.naive_quantized.base import (  # noqa: E402
    NaiveQuantizationCompressor,
)
from compressed_tensors.quantization import QuantizationConfig, QuantizationScheme  # noqa: E402
from compressed_tensors.quantization.quant_scheme import FP8_BLOCK  # noqa: E402
from compressed_tensors.quantization.utils.helpers import calculate_qparams  # noqa: E402
from safetensors import safe_open  # noqa: E402

sys.path[:0] = [str(Path(__file__).resolve().parents[i] / d) for i, d in ((1, "quant"), (1, ""))]
from test_fp4_ct_oracle import ct_mx, ct_nvfp4  # noqa: E402
from test_fp4_served import _cases  # noqa: E402

from lowbit.checkpoints.compressed_tensors.writer import (  # noqa: E402
    from_quantized,
    write_compressed_tensors,
)
from tiny_models import save_hf_folder, tiny_llama  # noqa: E402

pytestmark = pytest.mark.torch
torch.set_num_threads(1)


def _read(folder: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in sorted(folder.glob("*.safetensors")):
        with safe_open(f, framework="pt") as sf:
            out.update({k: sf.get_tensor(k) for k in sf.keys()})
    return out


def _u8(t: Any) -> np.ndarray:
    return t.contiguous().view(torch.uint8).numpy()


def ct_fp8_block(
    x: np.ndarray, block: tuple[int, int] = (128, 128)
) -> tuple[np.ndarray, np.ndarray]:
    """compressed-tensors' FP8_BLOCK: per-block amax (zero-padded), ``calculate_qparams``,
    and the float-quantized compressor; (fp8 bytes, float32 scales)."""
    w = torch.from_numpy(x)
    scheme = QuantizationScheme(targets=["Linear"], **FP8_BLOCK)
    bh, bw = block
    r, c = x.shape
    nr, nc = -(-r // bh), -(-c // bw)
    padded = torch.zeros(nr * bh, nc * bw)
    padded[:r, :c] = w
    tiles = padded.reshape(nr, bh, nc, bw)
    scale, zp = calculate_qparams(tiles.amin((1, 3)), tiles.amax((1, 3)), scheme.weights)
    sd = NaiveQuantizationCompressor.compress(
        {"weight": w, "weight_scale": scale, "weight_zero_point": zp}, scheme
    )
    return _u8(sd["weight"]), scale.numpy()


def _write(tmp: Path, name: str, x: np.ndarray, spec: str, **kw: Any) -> dict[str, Any]:
    qt = lowbit.quantize(x, parse_scheme(spec), underflow="ignore")
    out = write_compressed_tensors(
        tmp / name.replace(":", "_"), {"m.weight": from_quantized(qt, **kw)}, {}, progress=False
    )
    return _read(out)


@pytest.mark.parametrize("case", list(_cases()))
def test_nvfp4_files_equal_the_compressor(tmp_path: Path, case: str) -> None:
    """weight_packed, weight_scale (F8_E4M3) and weight_global_scale are the NVFP4 compressor's."""
    x = _cases()[case]
    got = _write(tmp_path, case, x, "nvfp4")
    want = ct_nvfp4(x)
    assert np.array_equal(got["m.weight_packed"].numpy(), want["packed"])
    assert got["m.weight_scale"].dtype == torch.float8_e4m3fn
    assert np.array_equal(_u8(got["m.weight_scale"]), want["scale"])
    assert np.array_equal(got["m.weight_global_scale"].numpy(), want["global"])
    assert set(got) == {"m.weight_packed", "m.weight_scale", "m.weight_global_scale"}


@pytest.mark.parametrize("case", list(_cases()))
def test_mxfp4_files_equal_the_compressor(tmp_path: Path, case: str) -> None:
    """mxfp4:ct: weight_packed and the uint8 E8M0 weight_scale are the MXFP4 compressor's."""
    from compressed_tensors.quantization.quant_scheme import MXFP4A16

    x = _cases()[case]
    got = _write(tmp_path, case, x, "mxfp4:ct")
    packed, scale = ct_mx(x, MXFP4A16)
    assert np.array_equal(got["m.weight_packed"].numpy(), packed)
    assert got["m.weight_scale"].dtype == torch.uint8
    assert np.array_equal(got["m.weight_scale"].numpy(), scale)


@pytest.mark.parametrize("shape", [(256, 384), (200, 300), (130, 64), (1, 129)])
def test_fp8_block_files_equal_the_compressor(tmp_path: Path, shape: tuple[int, int]) -> None:
    """fp8_block: F8_E4M3 weights and float32 [ceil(out/128), ceil(in/128)] scales are the
    float-quantized compressor's, partial tiles (zero-padded) included."""
    rng = np.random.default_rng(shape[0])
    x = (rng.standard_normal(shape) * rng.choice([1e-3, 1.0, 50.0], size=shape)).astype(np.float32)
    x[0, : min(8, shape[1])] = 0.0
    got = _write(tmp_path, "b", x, "fp8_block", activations="fp8")
    w, s = ct_fp8_block(x)
    assert np.array_equal(_u8(got["m.weight"]), w)
    assert np.array_equal(got["m.weight_scale"].numpy(), s)


def test_configs_validate_and_infer_their_format(tmp_path: Path) -> None:
    """compressed-tensors parses each config group and infers the format lowbit wrote."""
    x = np.random.default_rng(1).standard_normal((32, 256)).astype(np.float32)
    for spec, kw, fmt in [("nvfp4", {}, "nvfp4-pack-quantized"),
                          ("mxfp4:ct", {}, "mxfp4-pack-quantized"),
                          ("fp8_block", {"activations": "fp8"}, "float-quantized"),
                          ("fp8_block", {}, "naive-quantized")]:  # fmt: skip
        qt = lowbit.quantize(x, parse_scheme(spec))
        out = write_compressed_tensors(
            tmp_path / f"{spec}{len(kw)}".replace(":", "_"),
            {"m.weight": from_quantized(qt, **kw)},
            {},
            progress=False,
        )
        qc = json.loads((out / "config.json").read_text())["quantization_config"]
        cfg = QuantizationConfig.model_validate(qc)
        assert qc["format"] == fmt
        for g in cfg.config_groups.values():
            assert infer_module_format(torch.nn.Linear, g).value == fmt


def test_bad_input_is_one_line(tmp_path: Path) -> None:
    """Widths a block cannot hold and broken NVFP4 parts: one LowbitError each."""
    from lowbit.checkpoints.compressed_tensors.writer import CTTensor

    x = np.random.default_rng(2).standard_normal((8, 40)).astype(np.float32)
    for spec, what in [("nvfp4", "multiple of 16"), ("mxfp4", "multiple of 32")]:
        qt = lowbit.quantize(x, parse_scheme(spec))
        with pytest.raises(LowbitError, match=what) as info:
            from_quantized(qt)
        assert "\n" not in str(info.value)
    codes = np.zeros((4, 32), np.uint8)
    cases = [
        (dict(scale=np.ones((4, 2), np.float32), global_scale=np.array([0.0])), "global scale"),
        (dict(scale=np.full((4, 2), 0.3, np.float32), global_scale=[1.0]), "float8_e4m3fn"),
        (dict(scale=np.full((4, 1), 0.3, np.float32)), "powers of two"),
    ]
    for kw, what in cases:
        gs = 16 if "global_scale" in kw else 32
        t = CTTensor(codes=codes, kind="fp4", num_bits=4, group_size=gs, **kw)
        with pytest.raises(LowbitError, match=what):
            write_compressed_tensors(tmp_path / what.replace(" ", "_"), {"m.weight": t}, {})


@pytest.fixture(scope="module")
def hf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_hf_folder(tiny_llama(), tmp_path_factory.mktemp("hf") / "hf")


@pytest.mark.parametrize("spec", ["nvfp4", "mxfp4:ct", "fp8_block"])
def test_model_folder_loads_in_compressed_tensors_and_transformers(
    hf: Path, tmp_path: Path, spec: str
) -> None:
    """lowbit quantize --out-format compressed-tensors on a tiny Llama: compressed-tensors'
    decompressor and transformers give lowbit.load's weights (max abs difference 0; for NVFP4,
    whose decompressor unpacks to bfloat16, lowbit's float32 weights rounded to bfloat16), and
    q/k/v and gate/up share one NVFP4 global scale."""
    import transformers
    from compressed_tensors.entrypoints.convert.converters.ct_dequantizer import (
        CompressedTensorsDequantizer,
    )
    from transformers.utils.quantization_config import CompressedTensorsConfig

    from lowbit.checkpoints import open_checkpoint
    from lowbit.checkpoints.streaming import quantize_model
    from lowbit.plans.plan import PrecisionPlan

    out = tmp_path / "ct"
    quantize_model(hf, PrecisionPlan.uniform(spec), out, out_format="compressed-tensors",
                   progress=False)  # fmt: skip
    back = open_checkpoint(out)
    raw = _read(out)
    theirs = CompressedTensorsDequantizer(out, dtype=torch.float32).process(dict(raw))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = transformers.AutoModelForCausalLM.from_pretrained(
            out, dtype=torch.float32, quantization_config=CompressedTensorsConfig(dequantize=True)
        )
    sd = model.state_dict()
    mine = lowbit.load(out)
    n = 0
    for name in back.names():
        if not name.endswith("proj.weight"):
            continue
        got = np.array(mine[name])
        assert np.array_equal(got, back.get(name)), name
        want = got if spec != "nvfp4" else torch.from_numpy(got).bfloat16().float().numpy()
        assert np.array_equal(theirs[name].float().numpy(), want), name
        assert np.array_equal(sd[name].numpy(), want), name
        n += 1
    assert n == 14
    if spec == "nvfp4":
        for layer in (0, 1):
            p = f"model.layers.{layer}"
            for group in (("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
                          ("mlp.gate_proj", "mlp.up_proj")):  # fmt: skip
                gs = {float(raw[f"{p}.{m}.weight_global_scale"]) for m in group}
                assert len(gs) == 1, (p, group, gs)


def test_w4a4_config_and_input_global_scale(tmp_path: Path) -> None:
    """NVFP4 W4A4: input_global_scale is written beside the weight's parts and the config
    group's input_activations are compressed-tensors' NVFP4 preset's."""
    from compressed_tensors.quantization.quant_scheme import NVFP4

    x = np.random.default_rng(4).standard_normal((16, 64)).astype(np.float32)
    qt = lowbit.quantize(x, parse_scheme("nvfp4"))
    t = from_quantized(qt, activations="nvfp4", input_global_scale=np.float32(123.5))
    out = write_compressed_tensors(tmp_path / "w4a4", {"m.weight": t}, {}, progress=False)
    raw = _read(out)
    assert raw["m.input_global_scale"].tolist() == [123.5]
    qc = json.loads((out / "config.json").read_text())["quantization_config"]
    group = QuantizationConfig.model_validate(qc).config_groups["group_0"]
    assert group.input_activations == NVFP4["input_activations"]
    assert group.weights == NVFP4["weights"]
    assert infer_module_format(torch.nn.Linear, group).value == "nvfp4-pack-quantized"
    with pytest.raises(LowbitError, match="input_global_scale"):
        from_quantized(qt, activations="nvfp4")


def test_verify_refuses_unshared_fused_scales(hf: Path, tmp_path: Path) -> None:
    """lowbit verify: q/k/v with different NVFP4 global scales is one LowbitError saying
    what vLLM needs; lowbit's own output passes."""
    from safetensors.torch import save_file

    from lowbit.checkpoints.streaming import quantize_model
    from lowbit.checkpoints.verify import verify_checkpoint
    from lowbit.plans.plan import PrecisionPlan

    out = tmp_path / "ct"
    quantize_model(hf, PrecisionPlan.uniform("nvfp4"), out, out_format="compressed-tensors",
                   progress=False)  # fmt: skip
    assert verify_checkpoint(out)["kind"] == "compressed-tensors"
    raw = _read(out)
    raw["model.layers.0.self_attn.k_proj.weight_global_scale"] *= 2
    save_file(raw, str(out / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(LowbitError, match="different NVFP4 global scales") as info:
        verify_checkpoint(out)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(("spec", "out_format"), [("nvfp4", "compressed-tensors"),
                                                  ("mxfp4:ct", "compressed-tensors"),
                                                  ("fp8_block", "compressed-tensors"),
                                                  ("nvfp4", "lowbit"), ("fp8_block", "lowbit")])  # fmt: skip
def test_report_and_verify_read_them(hf: Path, tmp_path: Path, spec: str, out_format: str) -> None:
    """lowbit report writes its page and lowbit verify passes for every new layout."""
    from lowbit.checkpoints.streaming import quantize_model
    from lowbit.cli import main
    from lowbit.plans.plan import PrecisionPlan

    out = tmp_path / "q"
    quantize_model(hf, PrecisionPlan.uniform(spec), out, out_format=out_format, progress=False)
    page = tmp_path / "r.html"
    argv = ["report", str(out), "--out", str(page), "--against", str(hf), "--json"]
    assert main(argv) == 0 and page.stat().st_size > 0
    assert main(["verify", str(out), "--json"]) == 0
