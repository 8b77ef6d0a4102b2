"""Block Hadamard rotations: orthogonal blocks that leave a linear layer's output unchanged, and
``lowbit eval --methods hadamard``'s rows."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from lowbit.errors import LowbitError
from lowbit.methods.hadamard import hadamard, rotate_rows, rotation_block
from lowbit.quant.scheme_text import parse_scheme

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytestmark = pytest.mark.torch
torch.set_num_threads(1)
sys.path[:0] = [str(Path(__file__).resolve().parents[1])]
from tiny_models import save_hf_folder, tiny_llama  # noqa: E402


@pytest.mark.parametrize("n", [1, 2, 16, 32, 128])
def test_hadamard_is_symmetric_orthogonal(n: int) -> None:
    """H = Hᵀ, H H = I, entries ±1/sqrt(n)."""
    h = hadamard(n)
    np.testing.assert_array_equal(h, h.T)
    np.testing.assert_allclose(h @ h, np.eye(n), atol=1e-12)
    assert set(np.unique(np.abs(h) * np.sqrt(n)).round(12)) == {1.0}


def test_rotation_keeps_the_layer_output() -> None:
    """(x R)(W R)ᵀ = x Wᵀ; numpy and torch rotate alike; rotating twice is the identity."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((24, 64)).astype(np.float32)
    x = rng.standard_normal((5, 64)).astype(np.float32)
    y = rotate_rows(x, 16) @ rotate_rows(w, 16).T
    np.testing.assert_allclose(y, x @ w.T, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(rotate_rows(torch.from_numpy(w), 16).numpy(), rotate_rows(w, 16),
                               rtol=1e-6, atol=1e-6)  # fmt: skip
    np.testing.assert_allclose(rotate_rows(rotate_rows(w, 32), 32), w, atol=1e-5)


def test_bad_input() -> None:
    """Blocks that are not powers of two, schemes without input-axis groups, widths a block
    does not divide: one LowbitError each."""
    with pytest.raises(LowbitError, match="power-of-two"):
        hadamard(12)
    with pytest.raises(LowbitError, match="has none"):
        rotation_block(parse_scheme("int4:ch"))
    with pytest.raises(LowbitError, match="power of two"):
        rotation_block(parse_scheme("int4:g48"))
    assert (
        rotation_block(parse_scheme("nvfp4")) == 16 and rotation_block(parse_scheme("mxfp4")) == 32
    )
    with pytest.raises(LowbitError, match="do not split"):
        rotate_rows(np.zeros((2, 40)), 16)


def test_eval_hadamard_rows(tmp_path: Path) -> None:
    """--methods rtn,hadamard: a rotated row per scheme beside round-to-nearest; with 8-bit
    groups the rotated model stays next to the original (the rotation itself is exact)."""
    from lowbit.evaluation.variants import evaluate_variants

    hf = save_hf_folder(tiny_llama(), tmp_path / "hf")
    text = tmp_path / "t.txt"
    text.write_text(" ".join(f"word{i % 17} and {i}" for i in range(800)))
    res = evaluate_variants(hf, [], ["int8:g16", "mxfp4"], methods=["rtn", "hadamard"],
                            tokens=120, window=40, text=text, threads=1, progress=False)  # fmt: skip
    rows = {r["name"]: r for r in res["rows"]}
    assert list(rows) == ["original", "int8:g16", "int8:g16 hadamard", "mxfp4", "mxfp4 hadamard"]
    assert rows["int8:g16 hadamard"]["kl_mean"] < 1e-3
    assert rows["mxfp4 hadamard"]["rotation_block"] == 32
    assert rows["mxfp4 hadamard"]["rotated_layers"] == 14


def test_rotated_unquantized_model_keeps_the_logits(tmp_path: Path) -> None:
    """Every linear weight rotated (unquantized) and its input rotated by rotate_inputs'
    hooks: the logits are the original's to 1e-5 (float32), a GGUF checkpoint's names too."""
    from lowbit.checkpoints import open_checkpoint
    from lowbit.evaluation.rotated import rotate_inputs
    from lowbit.models.build import build_model
    from tiny_models import save_gguf

    for path in (save_hf_folder(tiny_llama(), tmp_path / "hf"),
                 save_gguf(tiny_llama(), tmp_path / "m.gguf")):  # fmt: skip
        ckpt = open_checkpoint(path)
        names = [n for n in ckpt.names() if len(ckpt.shape(n)) == 2 and "emb" not in n
                 and "token" not in n and "output.weight" != n]  # fmt: skip
        blocks = {n: (16 if i % 2 else 32) for i, n in enumerate(names)}
        weights = {
            n: rotate_rows(np.asarray(ckpt.get(n), np.float32), b) for n, b in blocks.items()
        }
        ids = torch.randint(0, 200, (2, 24), generator=torch.Generator().manual_seed(0))
        with torch.inference_mode():
            ref = build_model(ckpt)(ids).logits
            model = build_model(ckpt, weights=weights)
            assert sorted(rotate_inputs(model, ckpt, blocks)) == sorted(names)
            got = model(ids).logits
        assert len(names) >= 14  # 7 per block, and an untied head
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
        with torch.inference_mode():  # without the hooks the rotated weights are wrong
            assert (build_model(ckpt, weights=weights)(ids).logits - ref).abs().max() > 1e-2


def test_eval_hadamard_fold_rows(tmp_path: Path) -> None:
    """--methods hadamard-fold,hadamard-fold+gptq: rows of the v -> o folded model, rounded and
    GPTQ'd; with 8-bit groups the folded row stays next to the original (the fold is exact);
    the record says the block and the pairs; a block straddling heads fails before any pass."""
    from lowbit.calibration.data import Calibration
    from lowbit.evaluation.variants import evaluate_variants

    hf = save_hf_folder(tiny_llama(), tmp_path / "hf")  # heads of 16 channels
    text = tmp_path / "t.txt"
    text.write_text(" ".join(f"word{i % 17} and {i}" for i in range(2000)))
    calib = Calibration(source=str(text), samples=4, length=40)
    kw = {"tokens": 120, "window": 40, "text": text, "threads": 1, "progress": False}
    res = evaluate_variants(hf, [], ["int8:g16", "nvfp4"],
                            methods=["rtn", "hadamard-fold", "hadamard-fold+gptq"],
                            calibration=calib, **kw)  # fmt: skip
    rows = {r["name"]: r for r in res["rows"]}
    assert list(rows) == ["original", "int8:g16", "int8:g16 hadamard-fold",
                          "int8:g16 hadamard-fold+gptq", "nvfp4", "nvfp4 hadamard-fold",
                          "nvfp4 hadamard-fold+gptq"]  # fmt: skip
    assert rows["int8:g16 hadamard-fold"]["kl_mean"] < 1e-3
    fold = {"kind": "block-hadamard", "where": "v_proj -> o_proj", "block": 16, "pairs": 2}
    assert rows["nvfp4 hadamard-fold"]["fold"] == fold
    assert rows["nvfp4 hadamard-fold+gptq"]["fold"] == fold
    g = rows["nvfp4 hadamard-fold+gptq"]
    assert g["layer_error_gptq"] < g["layer_error_rtn"]
    assert rows["nvfp4 hadamard-fold"]["bits_per_weight"] == rows["nvfp4"]["bits_per_weight"]
    assert rows["nvfp4 hadamard-fold"]["kl_mean"] != rows["nvfp4"]["kl_mean"]
    with pytest.raises(LowbitError, match="blocks of 32"):
        evaluate_variants(hf, [], ["mxfp4"], methods=["hadamard-fold"], **kw)


def test_eval_mr_gptq_rows(tmp_path: Path) -> None:
    """--methods rtn,hadamard+gptq with --act mxfp4: MR-GPTQ's row and its W4A4 twin, its
    weights in the rotated basis with every quantized layer's input rotated online."""
    from lowbit.calibration.data import Calibration
    from lowbit.evaluation.variants import evaluate_variants

    hf = save_hf_folder(tiny_llama(), tmp_path / "hf")
    text = tmp_path / "t.txt"
    text.write_text(" ".join(f"word{i % 17} and {i}" for i in range(2000)))
    calib = Calibration(source=str(text), samples=4, length=40)
    res = evaluate_variants(hf, [], ["mxfp4"], methods=["rtn", "hadamard+gptq"], act="mxfp4",
                            tokens=120, window=40, text=text, threads=1, progress=False,
                            calibration=calib)  # fmt: skip
    rows = {r["name"]: r for r in res["rows"]}
    assert list(rows) == ["original", "mxfp4", "mxfp4 hadamard+gptq", "original + mxfp4",
                          "mxfp4 + mxfp4", "mxfp4 hadamard+gptq + mxfp4"]  # fmt: skip
    mr = rows["mxfp4 hadamard+gptq"]
    assert mr["rotated_layers"] == 14 and mr["rotation_block"] == [32]
    assert mr["method"]["rotation"] == "block-hadamard"
    assert mr["bits_per_weight"] == rows["mxfp4"]["bits_per_weight"]
    assert mr["layer_error_gptq"] < mr["layer_error_rtn"]


def test_quantize_hadamard_writes_and_load_applies_the_rotation(tmp_path: Path) -> None:
    """lowbit quantize --method hadamard: the codes of W R in lowbit's format, the rotation
    recorded per tensor in the manifest; load_model rotates those layers' inputs, giving
    eval --methods hadamard's model (same logits); other formats and mixes are refused."""
    from lowbit.checkpoints import open_checkpoint
    from lowbit.checkpoints.lowbit_format.checkpoint import LowbitCheckpoint
    from lowbit.cli import main
    from lowbit.evaluation.calibrated_variants import variant_plan
    from lowbit.evaluation.rotated import rotated_variant
    from lowbit.models.build import load_model

    src = save_hf_folder(tiny_llama(), tmp_path / "hf")
    q = tmp_path / "q"
    assert main(["quantize", str(src), "--to", "mxfp4", "--method", "hadamard", "--out", str(q),
                 "--no-progress"]) == 0  # fmt: skip
    ckpt = LowbitCheckpoint(q)
    rot = ckpt.rotations()
    assert len(rot) == 14 and set(rot.values()) == {32}
    assert ckpt.manifest["method"]["rotation"]["kind"] == "block-hadamard"
    model = load_model(q)
    assert len(model.lowbit_rotations) == 14
    ref = rotated_variant(open_checkpoint(src), variant_plan("mxfp4"), "mxfp4", False).model
    ids = torch.randint(0, 200, (1, 20), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        torch.testing.assert_close(model(ids).logits, ref(ids).logits, rtol=1e-6, atol=1e-6)
    # compressed-tensors declares the rotation (transform_config): the same model; GGUF cannot
    assert main(["quantize", str(src), "--to", "mxfp4", "--method", "hadamard", "--out",
                 str(tmp_path / "ct"), "--out-format", "compressed-tensors"]) == 0  # fmt: skip
    with torch.inference_mode():
        ct = load_model(tmp_path / "ct")
        assert len(ct.lowbit_input_transforms) == 14
        torch.testing.assert_close(ct(ids).logits, ref(ids).logits, rtol=1e-6, atol=1e-6)
    assert main(["quantize", str(src), "--to", "mxfp4", "--method", "hadamard", "--out",
                 str(tmp_path / "g.gguf"), "--out-format", "gguf"]) == 2  # fmt: skip


def test_quantize_mr_gptq_records_the_rotation(tmp_path: Path) -> None:
    """lowbit quantize --method hadamard+gptq: MR-GPTQ's rotated codes written with their
    rotation; load_model's logits are those of the rotated codes with rotated inputs."""
    from lowbit.checkpoints.lowbit_format.checkpoint import LowbitCheckpoint
    from lowbit.cli import main
    from lowbit.models.build import build_model, load_model

    src = save_hf_folder(tiny_llama(), tmp_path / "hf")
    text = tmp_path / "t.txt"
    text.write_text(" ".join(f"word{i % 17} and {i}" for i in range(2000)))
    q = tmp_path / "q"
    assert main(["quantize", str(src), "--to", "nvfp4", "--method", "hadamard+gptq", "--calib",
                 str(text), "--calib-samples", "4", "--calib-len", "40", "--out", str(q),
                 "--no-progress", "--threads", "1"]) == 0  # fmt: skip
    ckpt = LowbitCheckpoint(q)
    assert set(ckpt.rotations().values()) == {16} and len(ckpt.rotations()) == 14
    assert ckpt.manifest["method"]["method"] == "gptq"
    model = load_model(q)
    plain = build_model(ckpt.as_source())  # the rotated codes, inputs not rotated: wrong
    # the same codes rotated back, Q(W R) Rᵀ, with plain inputs: the same layer outputs
    back = {n: rotate_rows(ckpt.get(n), b) for n, b in ckpt.rotations().items()}
    unrotated = build_model(ckpt.as_source(), weights=back)
    ids = torch.randint(0, 200, (1, 20), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        a, b, c = model(ids).logits, plain(ids).logits, unrotated(ids).logits
    assert (a - b).abs().max() > 1e-2
    torch.testing.assert_close(a, c, rtol=1e-5, atol=1e-5)


def test_quantize_hadamard_fold_any_format(tmp_path: Path, capsys: Any) -> None:
    """lowbit quantize --method hadamard-fold: compressed-tensors and GGUF written from the
    v -> o folded weights (load_model gives eval's hadamard-fold model), the fold in --json and
    the lowbit manifest, no online rotation recorded; hadamard-fold+gptq records GPTQ and the
    fold; a block straddling heads is refused in one line."""
    import json

    from lowbit.checkpoints import open_checkpoint
    from lowbit.checkpoints.lowbit_format.checkpoint import LowbitCheckpoint
    from lowbit.cli import main
    from lowbit.evaluation.calibrated_variants import variant_plan
    from lowbit.evaluation.rotated import fold_checkpoint, folded_variant
    from lowbit.evaluation.variants import _scheme_variant
    from lowbit.models.build import load_model
    from tiny_models import save_gguf

    src = save_hf_folder(tiny_llama(), tmp_path / "hf")  # heads of 16 channels
    fold = {"kind": "block-hadamard", "where": "v_proj -> o_proj", "block": 16, "pairs": 2}
    ct = tmp_path / "ct"
    capsys.readouterr()
    assert main(["quantize", str(src), "--to", "nvfp4", "--method", "hadamard-fold", "--out",
                 str(ct), "--out-format", "compressed-tensors", "--json"]) == 0  # fmt: skip
    assert json.loads(capsys.readouterr().out)["method"] == {"method": "rtn", "fold": fold}
    folded, _ = fold_checkpoint(open_checkpoint(src), 16)
    for n in ("model.layers.1.self_attn.v_proj.weight", "model.layers.1.self_attn.o_proj.weight"):
        got = np.asarray(open_checkpoint(ct).get(n), np.float32)  # NVFP4 of the folded weight
        near, far = np.abs(got - folded.get(n)).max(), np.abs(got - folded.base.get(n)).max()
        assert near < 0.05 < far
    q = tmp_path / "q"
    assert main(["quantize", str(src), "--to", "nvfp4", "--method", "hadamard-fold", "--out",
                 str(q), "--no-progress"]) == 0  # fmt: skip
    ckpt = LowbitCheckpoint(q)
    assert ckpt.manifest["method"]["fold"] == fold and ckpt.rotations() == {}
    ref = folded_variant(open_checkpoint(src), variant_plan("nvfp4"), "nvfp4", "hadamard-fold",
                         lambda c: _scheme_variant(c, "nvfp4", False)).model  # fmt: skip
    ids = torch.randint(0, 200, (1, 20), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        torch.testing.assert_close(load_model(q)(ids).logits, ref(ids).logits, rtol=1e-5,
                                   atol=1e-5)  # fmt: skip
    # lowbit report measures v/o against the folded source (the same model), not the unfolded
    from lowbit.view.report import build_report

    rows = {r.name: r for r in build_report(q).rows}
    for n in ("model.layers.1.self_attn.v_proj.weight", "model.layers.1.self_attn.o_proj.weight"):
        x = folded.get(n).astype(np.float64)
        back = np.asarray(ckpt.get(n), np.float64)
        want = np.linalg.norm(x - back) / np.linalg.norm(x)
        assert rows[n].rel_fro == pytest.approx(want, rel=1e-5) and want < 0.3
    # GGUF to GGUF (q8_0, groups of 32; a llama with heads of 32): the folded rows are stored
    big = save_gguf(tiny_llama(hidden=128), tmp_path / "big.gguf")
    gg = tmp_path / "m.gguf"
    assert main(["quantize", str(big), "--to", "q8_0", "--method", "hadamard-fold", "--out",
                 str(gg), "--out-format", "gguf", "--no-progress"]) == 0  # fmt: skip
    folded, _ = fold_checkpoint(open_checkpoint(big), 32)
    for n in ("blk.0.attn_v.weight", "blk.1.attn_output.weight"):
        got = np.asarray(open_checkpoint(gg).get(n), np.float32)
        near, far = np.abs(got - folded.get(n)).max(), np.abs(got - folded.base.get(n)).max()
        assert near < 2e-3 < 1e-2 < far
    text = tmp_path / "t.txt"
    text.write_text(" ".join(f"word{i % 17} and {i}" for i in range(2000)))
    assert main(["quantize", str(src), "--to", "nvfp4", "--method", "hadamard-fold+gptq",
                 "--calib", str(text), "--calib-samples", "4", "--calib-len", "40", "--out",
                 str(tmp_path / "g"), "--no-progress", "--threads", "1"]) == 0  # fmt: skip
    m = LowbitCheckpoint(tmp_path / "g").manifest["method"]
    assert m["method"] == "gptq" and m["fold"] == fold
    capsys.readouterr()
    assert main(["quantize", str(src), "--to", "mxfp4", "--method", "hadamard-fold", "--out",
                 str(tmp_path / "x")]) == 2  # fmt: skip
    err = capsys.readouterr().err.strip()
    assert "blocks of 32" in err and len(err.splitlines()) == 1
