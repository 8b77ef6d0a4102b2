"""lowbit.calibration.imatrix and `lowbit imatrix`: llama.cpp's importance matrix of a GGUF model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("gguf")

from lowbit.calibration.data import Calibration, decoder_windows
from lowbit.calibration.imatrix import compute_imatrix
from lowbit.checkpoints.gguf.imatrix import read_imatrix
from lowbit.cli import main
from lowbit.errors import LowbitError
from tiny_models import save_gguf, tiny_llama


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, object]:
    model = tiny_llama()
    path = save_gguf(model, tmp_path_factory.mktemp("im") / "tiny.gguf", embedding="F32")
    return path, model


def test_sums_are_squared_inputs_per_column(tiny: tuple[Path, object]) -> None:
    """blk.0's q/k/v get sum over tokens of (input_layernorm(embedding))**2, counts = tokens;
    the LM head is left out (llama-imatrix's default)."""
    import torch

    from lowbit.checkpoints.opener import open_checkpoint
    from lowbit.checkpoints.tokenizer import build_tokenizer

    path, model = tiny
    calib = Calibration(samples=3, length=32)
    im = compute_imatrix(path, calib, threads=1, progress=False)
    assert "output.weight" not in im.sums and "blk.1.ffn_down.weight" in im.sums
    assert im.chunks == 3 and im.chunk_size == 32
    ids = decoder_windows(build_tokenizer(open_checkpoint(path)), calib)
    with torch.no_grad():
        x = model.model.layers[0].input_layernorm(model.model.embed_tokens(torch.tensor(ids)))
    want = (x.double() ** 2).reshape(-1, x.shape[-1]).sum(0).numpy()
    for name in ("blk.0.attn_q.weight", "blk.0.attn_k.weight", "blk.0.attn_v.weight"):
        np.testing.assert_allclose(im.sums[name], want, rtol=1e-5)
        assert im.counts[name].tolist() == [96.0]


def test_cli_imatrix_then_quantize(tiny: tuple[Path, object], tmp_path: Path) -> None:
    """`lowbit imatrix` writes a file `lowbit quantize --imatrix` (and llama-quantize) reads."""
    path, _ = tiny
    out = tmp_path / "im.gguf"
    argv = ["imatrix", str(path), "--out", str(out), "--calib-samples", "2", "--calib-len", "16",
            "--threads", "1", "--no-progress", "--process-output"]  # fmt: skip
    assert main(argv) == 0
    vecs = read_imatrix(out)
    assert "output.weight" in vecs and all(v.shape == (v.size,) for v in vecs.values())
    q = tmp_path / "q.gguf"
    rc = main(["quantize", str(path), "--to", "q4_k_m", "--out-format", "gguf", "--imatrix",
               str(out), "--out", str(q), "--no-progress"])  # fmt: skip
    assert rc == 0 and q.is_file()
    assert main(argv) == 2  # exists: --overwrite needed


def test_non_gguf_model_is_refused(tmp_path: Path) -> None:
    """Importance matrices are keyed by GGUF names: other sources are one LowbitError."""
    from tiny_models import save_hf_folder

    folder = save_hf_folder(tiny_llama(), tmp_path / "hf")
    with pytest.raises(LowbitError, match="give a GGUF model"):
        compute_imatrix(folder, Calibration(samples=1, length=8))
