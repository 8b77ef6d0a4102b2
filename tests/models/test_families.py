"""The dense families people run, from Hugging Face folders (qwen2, qwen3, mistral, gemma2,
gemma3, phi3): lowbit builds transformers' logits, GPTQ's layer walk finds each family's block
structure (and gives the generic walk's codes), and quantize writes lowbit and
compressed-tensors checkpoints with every method."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.torch

import lowbit.calibration.gptq as gptq_model  # noqa: E402
from lowbit.calibration.data import Calibration  # noqa: E402
from lowbit.calibration.gptq import gptq_weights  # noqa: E402
from lowbit.checkpoints import open_checkpoint  # noqa: E402
from lowbit.cli import main  # noqa: E402
from lowbit.methods.gptq import GPTQ  # noqa: E402
from lowbit.models.build import build_model  # noqa: E402
from tiny_models import DENSE_FAMILIES, save_hf_folder, tiny_family  # noqa: E402

WORDS = "river stone cloud garden lantern harbor meadow signal copper violet winter orchard"
FAMILIES = list(DENSE_FAMILIES)


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Any, Path]]:
    root = tmp_path_factory.mktemp("families")
    out = {}
    for kind in FAMILIES:
        model = tiny_family(kind)
        out[kind] = (model, save_hf_folder(model, root / kind))
    return out


@pytest.fixture(scope="module")
def calib(tmp_path_factory: pytest.TempPathFactory) -> Calibration:
    w = WORDS.split()
    f = tmp_path_factory.mktemp("calib") / "calib.txt"
    f.write_text(" ".join(f"The {w[i % 12]} keeps {w[i * 7 % 12]}." for i in range(60)))
    return Calibration(source=str(f), samples=2, length=32)


@pytest.mark.parametrize("kind", FAMILIES)
def test_logits_equal_transformers(folders: dict, kind: str) -> None:
    """lowbit's model from the folder gives transformers' logits (float32, within 1e-4)."""
    model, folder = folders[kind]
    ids = torch.randint(0, 261, (2, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(
            build_model(open_checkpoint(folder))(ids).logits, model(ids).logits,
            rtol=0, atol=1e-4,
        )  # fmt: skip


@pytest.mark.parametrize("kind", FAMILIES)
def test_layer_walk_finds_the_structure(
    folders: dict, calib: Calibration, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The layers order walks every family's blocks sublayer by sublayer (Gemma's post-norms,
    Phi-3's fused qkv and gate_up), and its codes are the generic group walk's, bit for bit."""
    _, folder = folders[kind]
    found: list[Any] = []
    of = gptq_model._LayerWalk.of.__func__

    def spy(cls: Any, *a: Any) -> Any:
        found.append(of(cls, *a))
        return found[-1]

    monkeypatch.setattr(gptq_model._LayerWalk, "of", classmethod(spy))
    walked = gptq_weights(folder, "int4:g32", calib, progress=False)
    assert found and all(w is not None for w in found), kind
    post = {p.post for p in found[0].parts}
    assert (post != {""}) == kind.startswith("gemma")
    assert all(found[0].lasts)
    monkeypatch.setattr(gptq_model._LayerWalk, "of", classmethod(lambda cls, *a: None))
    generic = gptq_weights(folder, "int4:g32", calib, progress=False)
    assert set(walked.weights) == set(generic.weights) and len(walked.weights) >= 8
    for name, qt in walked.weights.items():
        np.testing.assert_array_equal(qt.codes, generic.weights[name].codes, err_msg=name)
        np.testing.assert_array_equal(qt.scale, generic.weights[name].scale, err_msg=name)


def test_each_block_gets_its_own_rotary_tables(folders: dict, calib: Calibration) -> None:
    """Gemma 3's global layer rotates with another base than its local one: calibration runs
    each block with its own arguments, so its quantized model's outputs on the calibration
    text are those the block-by-block forward gives with the layer types respected."""
    from lowbit.calibration._block_args import block_args

    model, _ = folders["gemma3_text"]
    ids = torch.randint(0, 261, (1, 24), generator=torch.Generator().manual_seed(2))
    _, blocks = gptq_model._find_blocks(model)
    samples = [({"input_ids": ids}, None)]
    with torch.inference_mode():
        states = gptq_model._capture(model, blocks[0], samples, True)
        per = block_args(model, blocks, samples, True)
        assert per is not None
        h = states[0][0]
        for i, block in enumerate(blocks):
            a, k = per[i][0]
            h = gptq_model._out(block(h, *a, **k))
        want = model.model(ids).last_hidden_state
        torch.testing.assert_close(model.model.norm(h), want, rtol=1e-5, atol=1e-5)
        k0, k1 = per[0][0][1], per[1][0][1]
        assert not torch.equal(k0["position_embeddings"][0], k1["position_embeddings"][0])


@pytest.mark.slow  # 7-13 s per family on 2 cores
@pytest.mark.parametrize("kind", FAMILIES)
def test_quantize_every_method_and_format(
    folders: dict, calib: Calibration, kind: str, tmp_path: Path
) -> None:
    """``lowbit quantize --method rtn|gptq|awq --out-format lowbit|compressed-tensors``."""
    _, folder = folders[kind]
    for method, fmt in (("rtn", "compressed-tensors"), ("gptq", "compressed-tensors"),
                        ("awq", "lowbit"), ("gptq", "lowbit")):  # fmt: skip
        out = tmp_path / f"{method}-{fmt}"
        rc = main([
            "quantize", str(folder), "--to", "int4:g32", "--method", method, "--out", str(out),
            "--out-format", fmt, "--no-progress", "--json",
            *([] if method == "rtn" else ["--calib", calib.source, "--calib-samples", "2",
                                          "--calib-len", "32"]),
        ])  # fmt: skip
        assert rc == 0, (kind, method, fmt)
        assert (out / "model.safetensors").is_file()
    with torch.no_grad():  # the lowbit checkpoint builds and runs
        net = __import__("lowbit").load_model(tmp_path / "gptq-lowbit")
        assert torch.isfinite(net(torch.tensor([[1, 2, 3]])).logits).all()
    assert GPTQ().sequential.value == "layers"
