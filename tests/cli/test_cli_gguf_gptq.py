"""`lowbit quantize MODEL.gguf --to q4_k_m --method gptq --out-format gguf`: GPTQ onto each
tensor's llama.cpp block type, in a GGUF the gguf package reads back."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")
pytestmark = pytest.mark.torch

from lowbit.checkpoints.gguf.imatrix import read_imatrix  # noqa: E402
from lowbit.checkpoints.gguf.mix import gguf_mix_types  # noqa: E402
from lowbit.checkpoints.opener import open_checkpoint  # noqa: E402
from lowbit.checkpoints.steps import raw_bytes  # noqa: E402
from lowbit.cli import main  # noqa: E402
from lowbit.ggml import blocks  # noqa: E402
from lowbit.methods._iq_gptq import IQ_TYPES  # noqa: E402
from tiny_models import save_gguf, tiny_llama  # noqa: E402

WORDS = "river stone cloud garden lantern harbor meadow signal copper violet winter orchard"


def _llama256() -> Any:
    """A random 2-layer llama whose rows are 256 and 512 values (K-quants fit, no fallback)."""
    return tiny_llama(hidden=256, inter=512, std=0.05)


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("ggufgptq")
    w = WORDS.split()
    text = d / "calib.txt"
    text.write_text(" ".join(f"The {w[i % 12]} keeps {w[i * 7 % 12]}." for i in range(80)))
    return save_gguf(_llama256(), d / "llama256.gguf", embedding="F32"), text


@pytest.mark.parametrize("mix", ["q4_k_m", "q3_k_s"])
def test_gptq_mix_reads_back(source: tuple[Path, Path], tmp_path: Path, mix: str, capsys) -> None:
    """Every tensor in the mix's type; GPTQ'd linear layers (different bytes from llama.cpp's
    rounding, lower layer error); gguf's decoding of every tensor equals lowbit's."""
    src, text = source
    out = tmp_path / f"m.{mix}.gguf"
    argv = ["quantize", str(src), "--to", mix, "--method", "gptq", "--out-format", "gguf",
            "--out", str(out), "--calib", str(text), "--calib-samples", "3", "--calib-len", "48",
            "--no-progress", "--json"]  # fmt: skip
    assert main(argv) == 0
    result = json.loads(capsys.readouterr().out)
    method = result["method"]
    assert method["gptq_tensors"] == 14 and method["importance"] == "diag(H)"
    assert method["mean_error"]["gptq"] < method["mean_error"]["rtn"]
    want = gguf_mix_types(open_checkpoint(src), mix)
    s = open_checkpoint(src)
    reader = gguf.GGUFReader(out)
    moved = 0
    for t in reader.tensors:
        qtype = t.tensor_type.name
        assert qtype == want[t.name], t.name
        if qtype not in blocks.TYPES:
            continue
        raw = np.asarray(t.data, np.uint8).reshape(-1, blocks.row_bytes(qtype, int(t.shape[0])))
        ours = blocks.dequantize(raw, qtype)
        theirs = gguf.quants.dequantize(raw, t.tensor_type).reshape(ours.shape)
        np.testing.assert_array_equal(
            ours.view(np.uint32), theirs.astype(np.float32).view(np.uint32)
        )
        rtn = blocks.quantize(np.asarray(s.get(t.name), np.float32), qtype)
        if t.name.startswith("blk."):
            moved += raw.tobytes() != rtn.tobytes()
        else:  # the embedding and the output: llama.cpp's rounding
            assert raw.tobytes() == rtn.tobytes(), t.name
    assert moved == 14
    assert (
        raw_bytes(open_checkpoint(out), "blk.0.attn_norm.weight").tobytes()
        == raw_bytes(s, "blk.0.attn_norm.weight").tobytes()
    )


@pytest.mark.parametrize(("mix", "own"), [("iq2_xxs", 12), ("iq1_s", 10), ("iq1_m", 10)])
def test_gptq_iquant_mix_reads_back(
    source: tuple[Path, Path], tmp_path: Path, mix: str, own: int, capsys
) -> None:
    """--to iq2_xxs|iq1_s|iq1_m --method gptq --imatrix: the tensors the mix puts in i-quants
    below 4 bits are GPTQ'd onto them (other bytes than llama.cpp's rounding, lower layer
    error) and gguf decodes every one as lowbit does."""
    src, text = source
    imat = tmp_path / "im.gguf"
    calib = ["--calib", str(text), "--calib-samples", "3", "--calib-len", "48", "--no-progress"]
    assert main(["imatrix", str(src), "--out", str(imat), *calib]) == 0
    capsys.readouterr()
    out = tmp_path / f"m.{mix}.gguf"
    base = ["quantize", str(src), "--method", "gptq", "--imatrix", str(imat), "--out-format",
            "gguf", *calib]  # fmt: skip
    assert main([*base, "--to", mix, "--out", str(out), "--json"]) == 0
    method = json.loads(capsys.readouterr().out)["method"]
    assert method["importance"] == "importance matrix"
    assert method["mean_error"]["gptq"] < method["mean_error"]["rtn"]
    want = gguf_mix_types(open_checkpoint(src), mix, has_imatrix=True)
    vectors = read_imatrix(imat)
    s = open_checkpoint(src)
    vector_coded = 0
    for t in gguf.GGUFReader(out).tensors:
        qtype = t.tensor_type.name
        assert qtype == want[t.name], t.name
        if qtype not in IQ_TYPES:
            continue
        vector_coded += 1
        raw = np.asarray(t.data, np.uint8).reshape(-1, blocks.row_bytes(qtype, int(t.shape[0])))
        ours = blocks.dequantize(raw, qtype)
        theirs = gguf.quants.dequantize(raw, t.tensor_type).reshape(ours.shape)
        assert ours.tobytes() == theirs.astype(np.float32).tobytes(), t.name
        x = np.asarray(s.get(t.name), np.float32)
        assert raw.tobytes() != blocks.quantize(x, qtype, imatrix=vectors[t.name]).tobytes()
    # 12 of the 14 linear layers: the mix's own type, and IQ2_XXS for attn_output in the IQ1
    # mixes; attn_v is Q2_K
    assert vector_coded == 12
    assert sum(t == mix.upper() for t in want.values()) == own


def test_gptq_mix_refusals(source: tuple[Path, Path], tmp_path: Path) -> None:
    """--method awq with a mix, an existing output: one line each, exit 2."""
    src = source[0]
    base = ["quantize", str(src), "--to", "q4_k_m", "--out-format", "gguf", "--no-progress"]
    assert main([*base, "--method", "awq", "--out", str(tmp_path / "a.gguf")]) == 2
    (tmp_path / "b.gguf").write_bytes(b"x")
    assert main([*base, "--method", "gptq", "--out", str(tmp_path / "b.gguf")]) == 2


def test_gptq_budget_writes_the_budget_types_gptqd(
    source: tuple[Path, Path], tmp_path: Path, capsys
) -> None:
    """--size with --method gptq: the same trials choose the same types and bytes as the
    rounded budget; GPTQ rounds every linear layer among them onto its chosen type (other
    bytes than llama.cpp's rounding, lower layer error), the others stay llama.cpp's."""
    src, text = source
    size = str(int(src.stat().st_size * 0.15))  # between all Q3_K and all Q6_K
    common = ["quantize", str(src), "--size", size, "--candidates", "Q3_K,Q4_K,Q6_K",
              "--out-format", "gguf", "--calib", str(text), "--calib-samples", "3",
              "--calib-len", "48", "--scan-samples", "2", "--scan-len", "32", "--no-progress",
              "--json"]  # fmt: skip
    rtn, gq = tmp_path / "rtn.gguf", tmp_path / "gptq.gguf"
    assert main([*common, "--out", str(rtn)]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert main([*common, "--method", "gptq", "--out", str(gq)]) == 0
    done = json.loads(capsys.readouterr().out)
    assert done["bytes"] == plain["bytes"] == gq.stat().st_size <= int(size)
    types = {r["tensor"]: r["type"] for r in plain["tensors"]}
    assert {r["tensor"]: r["type"] for r in done["tensors"]} == types
    assert len(set(types.values()) & {"Q3_K", "Q4_K", "Q6_K"}) >= 2  # a mix, not one type
    assert done["calibration"].startswith("2 x 32 tokens")  # the trials: --scan-*
    assert done["method"]["calibration"]["tokens"] == 3 * 48  # GPTQ: --calib-*
    method = done["method"]
    assert method["gptq_tensors"] == 14
    assert method["mean_error"]["gptq"] < method["mean_error"]["rtn"]
    a, b = gguf.GGUFReader(rtn), gguf.GGUFReader(gq)
    theirs = {t.name: t for t in b.tensors}
    moved = 0
    for t in a.tensors:
        u = theirs[t.name]
        assert u.tensor_type == t.tensor_type, t.name
        same = np.asarray(t.data).tobytes() == np.asarray(u.data).tobytes()
        if t.name.startswith("blk.") and t.name.endswith(".weight") and len(t.shape) == 2:
            moved += not same
        else:
            assert same, t.name
    assert moved == 14
