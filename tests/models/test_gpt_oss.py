"""gpt-oss (lowbit.checkpoints.experts_view, lowbit.models.moe): the bf16 folder transformers
writes (fused, transposed, gate/up interleaved experts with biases) and the MXFP4 experts of
OpenAI's release, read per expert; transformers' logits and its own MXFP4 dequantization as the
oracles; sinks, the sliding window on every other layer and the router (kept) handled."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.torch

import lowbit  # noqa: E402
from lowbit.calibration.data import Calibration  # noqa: E402
from lowbit.calibration.gptq import gptq_weights  # noqa: E402
from lowbit.checkpoints import open_checkpoint  # noqa: E402
from lowbit.checkpoints.experts_view import ExpertsView, decode_mxfp4  # noqa: E402
from lowbit.checkpoints.lowbit_format.checkpoint import LowbitCheckpoint  # noqa: E402
from lowbit.checkpoints.streaming import plan_model  # noqa: E402
from lowbit.cli import main  # noqa: E402
from lowbit.errors import LowbitError  # noqa: E402
from lowbit.models.build import build_model, load_model  # noqa: E402
from lowbit.models.moe import expert_of  # noqa: E402
from lowbit.plans.plan import PrecisionPlan  # noqa: E402
from lowbit.quant.scheme_text import parse_scheme  # noqa: E402
from tiny_models import save_mxfp4_folder, tiny_gpt_oss, write_byte_tokenizer  # noqa: E402

WORDS = "river stone cloud garden lantern harbor meadow signal copper violet winter orchard"
EXPERT = "model.layers.{l}.mlp.experts.{e}.{p}.weight"


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """The transformers model, its bf16 folder (``save_pretrained``), an MXFP4 folder and
    transformers' own float32 model loaded from that MXFP4 folder."""
    root = tmp_path_factory.mktemp("gptoss")
    model = tiny_gpt_oss()
    bf16 = root / "bf16"
    copy.deepcopy(model).to(torch.bfloat16).save_pretrained(str(bf16))
    write_byte_tokenizer(bf16)
    mx = save_mxfp4_folder(model, root / "mxfp4")
    ref = transformers.GptOssForCausalLM.from_pretrained(str(mx), dtype=torch.float32).eval()
    return {"model": model, "bf16": bf16, "mxfp4": mx, "mx_ref": ref}


@pytest.fixture(scope="module")
def calib(tmp_path_factory: pytest.TempPathFactory) -> Calibration:
    w = WORDS.split()
    f = tmp_path_factory.mktemp("calib") / "calib.txt"
    f.write_text(" ".join(f"The {w[i % 12]} keeps {w[i * 7 % 12]}." for i in range(60)))
    return Calibration(source=str(f), samples=4, length=48)


def _ids() -> object:
    return torch.randint(0, 261, (2, 17), generator=torch.Generator().manual_seed(3))


def test_decode_mxfp4_golden() -> None:
    """Byte 0x21 holds codes 1 (low nibble, first) and 2: 0.5 and 1.0 times 2**(scale-127);
    0xF9 holds -0.5 (code 9) then -6 (code 15); scale byte 255 is NaN."""
    blocks = np.zeros((3, 1, 16), np.uint8)
    blocks[:, 0, 0], blocks[:, 0, 15] = 0x21, 0xF9
    got = decode_mxfp4(blocks, np.array([[127], [130], [255]], np.uint8))
    want = np.zeros(32, np.float32)
    want[[0, 1, 30, 31]] = [0.5, 1.0, -0.5, -6.0]
    np.testing.assert_array_equal(got[0], want)
    np.testing.assert_array_equal(got[1], want * 8)
    assert np.isnan(got[2]).all()
    with pytest.raises(LowbitError, match="do not pair"):
        decode_mxfp4(blocks, np.zeros((3, 2), np.uint8))


def test_mxfp4_experts_equal_transformers_dequantization(made: dict) -> None:
    """Every expert's gate, up and down weight read from the MXFP4 folder is, bit for bit,
    the slice of transformers' ``convert_moe_packed_tensors`` (gate the even, up the odd
    columns of its [E, H, 2I], each turned round into nn.Linear's [out, in])."""
    from safetensors.torch import load_file
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    ckpt = open_checkpoint(made["mxfp4"])
    assert isinstance(ckpt, ExpertsView) and "quantization_config" not in ckpt.config
    assert not any(n.endswith(("_blocks", "_scales")) for n in ckpt.names())
    disk = load_file(str(made["mxfp4"] / "model.safetensors"))
    for layer in range(2):
        base = f"model.layers.{layer}.mlp.experts."
        gu = convert_moe_packed_tensors(
            disk[base + "gate_up_proj_blocks"], disk[base + "gate_up_proj_scales"],
            dtype=torch.float32,
        ).numpy()  # fmt: skip
        down = convert_moe_packed_tensors(
            disk[base + "down_proj_blocks"], disk[base + "down_proj_scales"], dtype=torch.float32
        ).numpy()
        for e in range(4):
            for proj, want in (("gate_proj", gu[e][:, 0::2].T), ("up_proj", gu[e][:, 1::2].T),
                               ("down_proj", down[e].T)):  # fmt: skip
                got = ckpt.get(EXPERT.format(l=layer, e=e, p=proj), np.float32)
                assert got.shape == want.shape == ckpt.shape(EXPERT.format(l=layer, e=e, p=proj))
                np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
            bias = disk[base + "gate_up_proj_bias"][e].float().numpy()
            got = ckpt.get(f"{base}{e}.up_proj.bias", np.float32)
            np.testing.assert_array_equal(got, bias[1::2])


@pytest.mark.parametrize("kind", ["bf16", "mxfp4"])
def test_logits_equal_transformers(made: dict, kind: str) -> None:
    """Built per expert from the bf16 folder (fused [E, H, 2I], interleaved) or the MXFP4 one,
    the model gives transformers' logits on the same weights (float32, within 1e-4)."""
    ref = made["model"] if kind == "bf16" else made["mx_ref"]
    net = build_model(open_checkpoint(made[kind]))
    experts = [m for m in net.modules() if hasattr(m, "route_all")]
    assert len(experts) == 2 and all(len(m) == 4 and not m.is_concatenated for m in experts)
    assert net.config.layer_types == ["sliding_attention", "full_attention"]
    with torch.no_grad():
        want = ref(_ids()).logits
        got = net(_ids()).logits
    torch.testing.assert_close(got, want, rtol=0, atol=1e-4)


def test_sinks_and_window_matter(made: dict) -> None:
    """The logits test can fail on sinks and on the sliding window: without the sinks, or
    with every layer attending fully, the logits move by far more than its tolerance."""
    net = build_model(open_checkpoint(made["bf16"]))
    with torch.no_grad():
        base = net(_ids()).logits
        for layer in net.model.layers:
            layer.self_attn.sinks.zero_()
        no_sinks = net(_ids()).logits
    wide = transformers.GptOssForCausalLM.from_pretrained(
        str(made["bf16"]), dtype=torch.float32, sliding_window=64
    ).eval()
    with torch.no_grad():
        full = wide(_ids()).logits
    assert (no_sinks - base).abs().max() > 1e-2
    assert (full - base).abs().max() > 1e-2


def test_router_kept_experts_quantized(made: dict) -> None:
    """The default plan keeps the router (weight and bias) and quantizes each expert's three
    weights; the experts' biases stay."""
    applied = plan_model(open_checkpoint(made["mxfp4"]), PrecisionPlan.uniform("int4:g32"))
    by_name = {t.name: t for t in applied.tensors}
    routers = [n for n in by_name if ".mlp.router." in n]
    assert len(routers) == 4 and all(by_name[n].action == "keep" for n in routers)
    assert all("MoE router" in by_name[n].reason for n in routers)
    experts = [n for n in by_name if expert_of(n)]
    assert len(experts) == 2 * 4 * 3 and all(by_name[n].action == "quantize" for n in experts)
    assert all(by_name[n].action == "keep" for n in by_name if ".experts." in n and "bias" in n)


@pytest.mark.parametrize("kind", ["bf16", "mxfp4"])
def test_rtn_codes_per_expert(
    made: dict, kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``lowbit quantize --method rtn`` stores each expert under its own name with the codes
    and scales of quantizing that expert's 2-D slice alone (the slice taken from the
    transformers model's own weights), and the output loads back to the logits of the
    model built with those dequantized weights."""
    out = tmp_path / "q"
    argv = ["quantize", str(made[kind]), "--to", "int4:g32", "--out", str(out), "--no-progress"]
    assert main(argv) == 0
    capsys.readouterr()
    ckpt = LowbitCheckpoint(out)
    ref = made["model"] if kind == "bf16" else made["mx_ref"]
    for layer in range(2):
        mod = ref.model.layers[layer].mlp.experts
        gu, down = mod.gate_up_proj.detach().numpy(), mod.down_proj.detach().numpy()
        for e in range(4):
            for proj, w in (("gate_proj", gu[e][:, 0::2].T), ("up_proj", gu[e][:, 1::2].T),
                            ("down_proj", down[e].T)):  # fmt: skip
                got = ckpt.quantized(EXPERT.format(l=layer, e=e, p=proj))
                want = lowbit.quantize(np.ascontiguousarray(w), parse_scheme("int4:g32"))
                np.testing.assert_array_equal(got.unpack(), want.unpack())
                np.testing.assert_array_equal(got.scale, want.scale)
    deq = {n: ckpt.get(n) for n in ckpt.names()}  # every tensor as stored (most quantized)
    with torch.no_grad():
        back = load_model(out)(_ids()).logits
        want = build_model(open_checkpoint(made[kind]), weights=deq)(_ids()).logits
    torch.testing.assert_close(back, want, rtol=0, atol=1e-5)


def test_gptq_every_expert_gets_a_hessian(made: dict, calib: Calibration) -> None:
    """GPTQ of the MXFP4 model reaches every expert layer with all calibration tokens and a
    Hessian of nonzero rank, and beats round-to-nearest on each."""
    run = gptq_weights(made["mxfp4"], "int4:g32", calib, progress=False)
    experts = {n: e for n, e in run.layers.items() if expert_of(n)}
    assert len(experts) == 2 * 4 * 3
    total = run.calibration["tokens"]
    for n, e in experts.items():
        assert e["tokens"] == total and e["rank"] > 0 and "fallback" not in e, n
        assert run.methods[n] == "gptq" and e["gptq"] < e["rtn"], n


def test_gptq_compressed_tensors_and_eval(
    made: dict, calib: Calibration, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``lowbit quantize --method gptq --out-format compressed-tensors`` of the MXFP4 model
    writes per-expert names (``mlp.experts.N.gate_proj.weight_packed``), the router as it was;
    the folder reads back to a model with the logits of the lowbit-format output of the same
    run; and ``lowbit eval`` measures the MXFP4 model."""
    common = ["--to", "int4:g32", "--method", "gptq", "--calib", calib.source,
              "--calib-samples", "4", "--calib-len", "48", "--no-progress"]  # fmt: skip
    ct, lb = tmp_path / "ct", tmp_path / "lb"
    src = str(made["mxfp4"])
    assert (
        main(["quantize", src, *common, "--out", str(ct), "--out-format", "compressed-tensors"])
        == 0
    )
    assert main(["quantize", src, *common, "--out", str(lb)]) == 0
    from safetensors import safe_open

    with safe_open(str(ct / "model.safetensors"), "np") as f:
        keys = set(f.keys())
    for e in range(4):
        for p in ("gate_proj", "up_proj", "down_proj"):
            assert f"model.layers.1.mlp.experts.{e}.{p}.weight_packed" in keys
    assert "model.layers.0.mlp.router.weight" in keys
    assert not any(k.endswith(("_blocks", "_scales")) for k in keys)
    cfg = json.loads((ct / "config.json").read_text())["quantization_config"]
    assert cfg["quant_method"] == "compressed-tensors"
    with torch.no_grad():
        a = build_model(open_checkpoint(ct))(_ids()).logits
        b = load_model(lb)(_ids()).logits
    torch.testing.assert_close(a, b, rtol=0, atol=1e-4)
    capsys.readouterr()
    argv = ["eval", src, "--schemes", "int4:g32", "--tokens", "96", "--window", "32",
            "--threads", "1", "--json", "--no-progress"]  # fmt: skip
    assert main(argv) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)["rows"]}
    assert set(rows) == {"original", "int4:g32"} and rows["int4:g32"]["kl_mean"] > 0


def test_mxfp4_without_scales_is_one_error(made: dict, tmp_path: Path) -> None:
    """An MXFP4 experts tensor whose scales are missing, or an MXFP4 tensor outside the
    experts, is one LowbitError naming it."""
    from safetensors.torch import load_file, save_file

    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text((made["mxfp4"] / "config.json").read_text())
    tensors = load_file(str(made["mxfp4"] / "model.safetensors"))
    del tensors["model.layers.1.mlp.experts.down_proj_scales"]
    save_file(tensors, str(bad / "model.safetensors"))
    with pytest.raises(LowbitError, match=r"layers\.1\.mlp\.experts\.down_proj_blocks.*no _scales"):
        open_checkpoint(bad)
    tensors = load_file(str(made["mxfp4"] / "model.safetensors"))
    tensors["model.layers.0.self_attn.o_proj.weight_blocks"] = torch.zeros(
        64, 2, 16, dtype=torch.uint8
    )
    save_file(tensors, str(bad / "model.safetensors"))
    with pytest.raises(
        LowbitError, match=r"'model\.layers\.0\.self_attn\.o_proj\.weight_blocks' is not"
    ):
        open_checkpoint(bad)


def test_plan_counts_mxfp4_as_weights(made: dict) -> None:
    """The planner counts an MXFP4 experts tensor as the weights it holds (32 a block, its
    scales' bytes with it), so both folders have the same parameters per tensor."""
    import warnings

    from lowbit.planning.archs import load_spec

    with warnings.catch_warnings():  # gpt_oss is counted as a llama-style decoder, and says so
        warnings.simplefilter("ignore", UserWarning)
        mx, bf = load_spec(str(made["mxfp4"])), load_spec(str(made["bf16"]))
    assert sum(t.numel for t in mx.tensors) == sum(t.numel for t in bf.tensors)
    t = next(t for t in mx.tensors if t.name == "model.layers.0.mlp.experts.gate_up_proj")
    assert t.dtype == "MXFP4" and t.shape == (4, 64, 64) and t.nbytes == 4 * 64 * 2 * 17
    assert not any(t.name.endswith(("_blocks", "_scales")) for t in mx.tensors)


def test_gate_up_order_is_checked(made: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    """Were the reader's gate/up order (from the family) not the model's, building refuses
    with one LowbitError instead of a model with gate and up swapped."""
    import lowbit.checkpoints.experts_view as ev

    monkeypatch.setattr(ev, "INTERLEAVED_FAMILIES", frozenset())
    ckpt = open_checkpoint(made["bf16"])
    assert not any(lay["interleaved"] for lay in ckpt.layouts.values())
    with pytest.raises(LowbitError, match=r"read as concatenated.*want them interleaved"):
        build_model(ckpt)
