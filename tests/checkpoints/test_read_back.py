"""Every output lowbit writes opens again: compressed-tensors folders read back (dequantized by
lowbit, cross-checked against compressed-tensors' own decompressor), kept tensors keep their
source precision, and the writers' progress bars stay off when output is not a terminal."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("compressed_tensors")
pytestmark = pytest.mark.torch

import lowbit  # noqa: E402
from lowbit.checkpoints import open_checkpoint  # noqa: E402
from lowbit.checkpoints.streaming import plan_model, quantize_model  # noqa: E402
from lowbit.plans.plan import PrecisionPlan  # noqa: E402
from tiny_models import save_gguf, save_hf_folder, tiny_llama  # noqa: E402

# one rule per storage format lowbit writes: pack-quantized (symmetric, asymmetric groups with
# zero points packed down the rows, asymmetric channels), int-quantized (W8A8), naive fp8
RULES = [
    {"match": "*.q_proj.weight", "format": "int2:g16"},
    {"match": "*.k_proj.weight", "format": "fp8_e4m3:ch"},
    {"match": "*.v_proj.weight", "format": "int8:ch", "activations": "int8"},
    {"match": "*.o_proj.weight", "format": "int4:g32:asym"},
    {"match": "*.up_proj.weight", "format": "int3:ch:asym"},
]


def _bits(a: Any) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


@pytest.fixture(scope="module")
def hf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_hf_folder(tiny_llama(), tmp_path_factory.mktemp("hf") / "hf")


@pytest.fixture(scope="module")
def ct(hf: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("ct") / "ct"
    plan = PrecisionPlan.uniform("int4", group_size=32, rules=RULES)
    quantize_model(hf, plan, out, out_format="compressed-tensors", progress=False)
    return out


def test_compressed_tensors_folder_reads_back(hf: Path, ct: Path) -> None:
    """open_checkpoint on a compressed-tensors folder gives the source's tensor names, each
    weight dequantized by lowbit bit for bit as compressed-tensors' own decompressor does and
    as lowbit.quantize(...).dequantize() gives."""
    from compressed_tensors.entrypoints.convert.converters.ct_dequantizer import (
        CompressedTensorsDequantizer,
    )
    from safetensors import safe_open

    src, back = open_checkpoint(hf), open_checkpoint(ct)
    assert back.format == "compressed-tensors"
    assert set(back.names()) == set(src.names())
    assert "quantization_config" not in back.config
    raw: dict[str, Any] = {}
    for f in ct.glob("*.safetensors"):
        with safe_open(f, framework="pt") as sf:
            raw.update({k: sf.get_tensor(k) for k in sf.keys()})
    theirs = CompressedTensorsDequantizer(ct, dtype=torch.float32).process(raw)
    applied = plan_model(src, PrecisionPlan.uniform("int4", group_size=32, rules=RULES),
                         out_format="compressed-tensors")  # fmt: skip
    labels = set()
    for t in applied.tensors:
        got = back.get(t.name)
        np.testing.assert_array_equal(_bits(got), _bits(theirs[t.name].float().numpy()), t.name)
        if t.action == "quantize":
            labels.add(t.label)
            want = lowbit.quantize(src.get(t.name), t.scheme).dequantize()
            np.testing.assert_array_equal(_bits(got), _bits(want), err_msg=t.name)
            assert back.dtype(t.name).startswith("CT_")
    assert labels == {"int2:g16:fp32", "fp8_e4m3:ch:fp32", "int8:ch:fp32", "int4:g32:fp32:asym",
                      "int3:ch:fp32:asym", "int4:g32:fp32"}  # fmt: skip


def test_eval_load_and_verify_open_it(hf: Path, ct: Path, tmp_path: Path) -> None:
    """lowbit eval measures the folder exactly as the same plan quantized in memory; load_model
    builds it; lowbit verify checks it."""
    from lowbit.checkpoints.verify import verify_checkpoint
    from lowbit.evaluation.variants import evaluate_variants

    text = tmp_path / "t.txt"
    text.write_text(" ".join(f"word{i % 17} and {i}" for i in range(400)))
    plain = tmp_path / "uniform"
    quantize_model(hf, PrecisionPlan.uniform("int4:g32"), plain, out_format="compressed-tensors",
                   progress=False)  # fmt: skip
    res = evaluate_variants(hf, [plain], ["int4:g32"], tokens=160, window=40, text=text,
                            threads=1, progress=False)  # fmt: skip
    rows = {r["name"]: r for r in res["rows"]}
    for key in ("perplexity", "kl_mean", "top1_agreement"):
        assert rows["uniform"][key] == rows["int4:g32"][key], key
    assert rows["uniform"]["kl_mean"] > 0
    model = lowbit.load_model(ct, progress=False)
    assert type(model).__name__ == "LlamaForCausalLM"
    assert verify_checkpoint(ct)["kind"] == "compressed-tensors"


def test_kept_block_type_stays_16_bit(tmp_path: Path) -> None:
    """A GGUF source's Q8_0 embedding, kept, is float16 in a compressed-tensors folder (values:
    the Q8_0 values rounded to float16), and the summary reports the kept size."""

    src = save_gguf(tiny_llama(), tmp_path / "t.gguf")
    out = tmp_path / "ct"
    quantize_model(src, PrecisionPlan.uniform("int4:g32"), out, out_format="compressed-tensors",
                   progress=False)  # fmt: skip
    header = _header(out / "model.safetensors")
    emb = header["model.embed_tokens.weight"]
    assert emb["dtype"] == "F16"
    n = int(np.prod(emb["shape"]))
    assert emb["data_offsets"][1] - emb["data_offsets"][0] == 2 * n
    want = open_checkpoint(src).get("token_embd.weight").astype(np.float16)
    got = open_checkpoint(out).get("model.embed_tokens.weight")
    assert got.dtype == np.float16
    np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))


def test_summary_says_what_happened(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--to fp32 says what was cast (not '0 ... quantized to -'); kept tensors get a size."""
    from lowbit.cli import main

    src = save_gguf(tiny_llama(), tmp_path / "t.gguf")
    assert main(["quantize", str(src), "--to", "fp32", "--out", str(tmp_path / "o")]) == 0
    line = capsys.readouterr().out.splitlines()[1]
    assert "quantized to -" not in line
    assert "14 cast to fp32 (" in line and "7 kept at source precision (" in line


def test_gguf_writer_is_quiet_off_a_terminal(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """write_gguf and the compressed-tensors writer show no bar unless asked (stderr is not a
    terminal here); progress=True still shows one."""
    src = save_gguf(tiny_llama(), tmp_path / "t.gguf")
    capfd.readouterr()
    quantize_model(src, PrecisionPlan.uniform("q8_0"), tmp_path / "o.gguf", out_format="gguf")
    quantize_model(
        src, PrecisionPlan.uniform("int8"), tmp_path / "ct", out_format="compressed-tensors"
    )
    assert capfd.readouterr().err == ""
    quantize_model(src, PrecisionPlan.uniform("q8_0"), tmp_path / "p.gguf", out_format="gguf",
                   progress=True)  # fmt: skip
    assert "writing p.gguf" in capfd.readouterr().err


def _header(path: Path) -> dict[str, Any]:
    with open(path, "rb") as fh:
        n = int.from_bytes(fh.read(8), "little")
        return json.loads(fh.read(n))
