"""lowbit.calibration.gptq: GPTQ on a tiny llama (folder and GGUF) and a tiny BERT, block
by block, in lowbit's ordinary layouts, with lower layer-output error than round-to-nearest."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.torch

import lowbit  # noqa: E402
from layer_inputs import assert_groups_match_alone  # noqa: E402
from lowbit.calibration.data import Calibration  # noqa: E402
from lowbit.calibration.gptq import gptq_weights  # noqa: E402
from lowbit.checkpoints import open_checkpoint  # noqa: E402
from lowbit.evaluation.variants import evaluate_variants  # noqa: E402
from lowbit.methods.gptq import GPTQ  # noqa: E402
from lowbit.models.build import build_model  # noqa: E402
from lowbit.plans.plan import PrecisionPlan  # noqa: E402
from tiny_models import (  # noqa: E402
    llamacpp_permute,
    save_gguf,
    save_hf_folder,
    tiny_bert,
    tiny_llama,
)

WORDS = "river stone cloud garden lantern harbor meadow signal copper violet winter orchard"


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_hf_folder(tiny_llama(), tmp_path_factory.mktemp("gptq") / "llama")


@pytest.fixture(scope="module")
def calib(tmp_path_factory: pytest.TempPathFactory) -> Calibration:
    """4 x 64 tokens of a small text file (the default text takes seconds to tokenize)."""
    w = WORDS.split()
    f = tmp_path_factory.mktemp("calib") / "calib.txt"
    f.write_text(" ".join(f"The {w[i % 12]} keeps {w[i * 7 % 12]}." for i in range(60)))
    return Calibration(source=str(f), samples=4, length=64)


def _same_layout(qt: Any, rtn: Any) -> None:
    assert qt.scheme == rtn.scheme and qt.shape == rtn.shape
    assert qt.scale.shape == rtn.scale.shape and qt.codes.shape == rtn.codes.shape
    assert (qt.zero_point is None) == (rtn.zero_point is None)
    assert qt.nbytes == rtn.nbytes


@pytest.mark.parametrize("spec", ["int4:g32", "int4:g32:asym", "nf4", "int4:g32:asym:mse"])
def test_tiny_llama(llama_dir: Path, spec: str, calib: Calibration) -> None:
    """Every planned tensor of a tiny llama is GPTQ'd, in the layout round-to-nearest gives,
    and every layer's output error on the calibration data is below round-to-nearest's."""
    run = gptq_weights(llama_dir, spec, calib, progress=False)
    ckpt = open_checkpoint(llama_dir)
    assert len(run.weights) == 14 and set(run.methods.values()) == {"gptq"}
    for name, qt in run.weights.items():
        _same_layout(qt, lowbit.quantize(ckpt.get(name), qt.scheme))
        assert qt.dequantize().shape == ckpt.shape(name)
        assert (qt.scheme.scale_method.value == "mse") == spec.endswith(":mse")
    assert set(run.layers) == set(run.weights)
    for name, e in run.layers.items():
        assert e["tokens"] == 4 * 64
        assert e["gptq"] < 0.5 * e["rtn"], name
    assert run.calibration["tokens"] == 256 and run.calibration["samples_used"] == 4
    assert {"collect", "solve", "propagate", "total"} <= set(run.seconds)


def test_sequential_inputs_come_from_quantized_blocks(
    llama_dir: Path, tmp_path: Path, calib: Calibration
) -> None:
    """Block 1 is calibrated on the outputs of the already quantized block 0: GPTQ of block 1
    alone, on a copy of the model whose block 0 holds the run's weights, gives the run's codes;
    on the original model it does not."""
    run = gptq_weights(llama_dir, "int4:g32", calib, progress=False)
    ckpt = open_checkpoint(llama_dir)
    block0 = {n: qt.dequantize() for n, qt in run.weights.items() if ".layers.0." in n}
    q0 = save_hf_folder(build_model(ckpt, weights=block0), tmp_path / "q0")
    only1 = PrecisionPlan.uniform(
        "int4:g32", rules=[{"match": "model.layers.0.*", "format": "keep"}]
    )
    on_q0 = gptq_weights(q0, only1, calib, progress=False)
    on_orig = gptq_weights(llama_dir, only1, calib, progress=False)
    assert set(on_q0.weights) == {n for n in run.weights if ".layers.1." in n}
    for name, qt in on_q0.weights.items():
        np.testing.assert_array_equal(qt.codes, run.weights[name].codes)
    assert any(
        not np.array_equal(qt.codes, run.weights[n].codes) for n, qt in on_orig.weights.items()
    )


def test_gguf_equals_folder_up_to_the_row_permutation(tmp_path: Path, calib: Calibration) -> None:
    """A GGUF file (llama.cpp names, permuted q/k rows) gives the folder's codes with the
    q/k rows permuted: GPTQ treats rows independently, so nothing else changes."""
    model = tiny_llama()
    folder = save_hf_folder(model, tmp_path / "llama")
    gguf = save_gguf(model, tmp_path / "llama.gguf", embedding="F32")
    a = gptq_weights(folder, "int4:g32", calib, progress=False)
    b = gptq_weights(gguf, "int4:g32", calib, progress=False)
    heads = {"attn_q": 4, "attn_k": 2}
    for i in range(2):
        for hf, gg in [
            ("self_attn.q_proj", "attn_q"), ("self_attn.k_proj", "attn_k"),
            ("self_attn.v_proj", "attn_v"), ("mlp.down_proj", "ffn_down"),
        ]:  # fmt: skip
            x = a.weights[f"model.layers.{i}.{hf}.weight"]
            y = b.weights[f"blk.{i}.{gg}.weight"]
            cx, sx = x.unpack(), x.scale
            if gg in heads:
                cx, sx = llamacpp_permute(cx, heads[gg]), llamacpp_permute(sx, heads[gg])
            np.testing.assert_array_equal(y.unpack(), cx)
            np.testing.assert_array_equal(y.scale, sx)


def test_tiny_bert(tmp_path: Path) -> None:
    """A BERT encoder: its 12 block linears by GPTQ with padding masked out, the pooler (outside
    the blocks) rounded to nearest; every layer's output error below round-to-nearest's."""
    folder = save_hf_folder(tiny_bert(), tmp_path / "bert")
    text = tmp_path / "sentences.txt"
    words = WORDS.split() * 6
    text.write_text(
        " ".join(f"The {w} stays near sentence number {i}." for i, w in enumerate(words))
    )
    calib = Calibration(source=str(text), samples=40, length=64)
    run = gptq_weights(folder, "int4:g32", calib, progress=False)
    assert run.methods.pop("pooler.dense.weight") == "rtn"
    assert len(run.methods) == 12 and set(run.methods.values()) == {"gptq"}
    ckpt = open_checkpoint(folder)
    for name, qt in run.weights.items():
        _same_layout(qt, lowbit.quantize(ckpt.get(name), qt.scheme))
    for name, e in run.layers.items():
        assert e["gptq"] < 0.7 * e["rtn"], name
    # tokens counted are the real ones: fewer than 40 texts x the longest
    assert 40 * 10 < run.calibration["tokens"] < 40 * 64
    assert all(e["tokens"] == run.calibration["tokens"] for e in run.layers.values())


def test_model_outputs_closer_than_rtn(llama_dir: Path) -> None:
    """End to end, on tokens the calibration never saw: the GPTQ model's logits are closer to
    the original's than round-to-nearest's (measured: about 4x less KL)."""
    res = evaluate_variants(
        llama_dir, schemes=["int4:g32"], methods=["rtn", "gptq"], calibration=Calibration(samples=4, length=64),
        gptq=GPTQ(act_order="static"), tokens=512, window=128, threads=1, progress=False,
    )  # fmt: skip
    rows = {r["name"]: r for r in res["rows"]}
    assert list(rows) == ["original", "int4:g32", "int4:g32 gptq"]
    rtn, gptq = rows["int4:g32"], rows["int4:g32 gptq"]
    assert gptq["kl_mean"] < 0.5 * rtn["kl_mean"]
    assert gptq["bits_per_weight"] == rtn["bits_per_weight"] and gptq["bytes"] == rtn["bytes"]
    assert gptq["calibration"]["described"].endswith("from token 32,768")
    assert gptq["layer_error_gptq"] < gptq["layer_error_rtn"]


def test_bad_method(llama_dir: Path, calib: Calibration) -> None:
    """Unknown methods are LowbitErrors."""
    with pytest.raises(lowbit.LowbitError, match="unknown method"):
        evaluate_variants(llama_dir, schemes=["int4"], methods=["hqq"], progress=False)
    with pytest.raises(lowbit.LowbitError, match="GPTQ"):
        gptq_weights(llama_dir, "int4", calib, method="gptq", progress=False)


def test_build_model_accepts_the_weights(llama_dir: Path, calib: Calibration) -> None:
    """The run's QuantizedTensors dequantize into a model lowbit builds (what eval does)."""
    run = gptq_weights(llama_dir, "mxfp4", calib, progress=False)
    ckpt = open_checkpoint(llama_dir)
    model = build_model(ckpt, weights={n: q.dequantize() for n, q in run.weights.items()})
    w = model.model.layers[1].mlp.down_proj.weight.detach().numpy()
    np.testing.assert_array_equal(
        w, run.weights["model.layers.1.mlp.down_proj.weight"].dequantize()
    )


@pytest.mark.parametrize("kind", ["llama", "bert"])
def test_block_by_block_forward_equals_the_model(kind: str) -> None:
    """Running the captured first-block inputs through the blocks one at a time (as the
    calibration does) gives the model's own hidden states: the causal mask, rotary positions
    and padding mask travel with them."""
    from lowbit.calibration.blocks import _capture, _find_blocks, _out

    model = tiny_llama() if kind == "llama" else tiny_bert()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 250, (2, 24), generator=g)
    if kind == "llama":
        inputs, mask = {"input_ids": ids[:1]}, None
    else:
        am = torch.ones(2, 24, dtype=torch.long)
        am[1, 15:] = 0  # the second text is shorter: padding
        inputs, mask = {"input_ids": ids, "attention_mask": am}, am.bool()
    prefix, blocks = _find_blocks(model)
    assert prefix == ("model.layers" if kind == "llama" else "encoder.layer")
    with torch.inference_mode():
        want = model(**inputs, output_hidden_states=True).hidden_states
        ((h, a, k),) = _capture(model, blocks[0], [(inputs, mask)], kind == "llama")
        for i, block in enumerate(blocks):
            got, ref = (h, want[i]) if mask is None else (h[mask], want[i][mask])
            torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
            h = _out(block(h, *a, **k))


def test_plan_rules_name_the_method(llama_dir: Path, calib: Calibration) -> None:
    """A rule's method wins: `rtn` tensors get round-to-nearest's exact codes inside a GPTQ
    run, and with default_method="rtn" only the rules saying `gptq` use GPTQ (the later blocks
    are then not run at all)."""
    from lowbit.checkpoints import open_checkpoint as open_ckpt

    rules = [{"match": "*mlp*", "format": "int4:g32", "method": "rtn"}]
    plan = PrecisionPlan.from_dict({"default": "int4:g32", "rules": rules})
    run = gptq_weights(llama_dir, plan, calib, progress=False)
    src = open_ckpt(str(llama_dir))
    for name, qt in run.weights.items():
        want = "rtn" if ".mlp." in name else "gptq"
        assert run.methods[name] == want, name
        rtn = lowbit.quantize(np.asarray(src.get(name), np.float32), qt.scheme)
        assert np.array_equal(qt.unpack(), rtn.unpack()) == (want == "rtn"), name
    assert set(run.layers) == {n for n, m in run.methods.items() if m == "gptq"}

    only = [{"regex": r"model\.layers\.0\.self_attn\..*", "format": "int4:g32", "method": "gptq"}]
    plan = PrecisionPlan.from_dict({"default": "int4:g32", "rules": only})
    run = gptq_weights(llama_dir, plan, calib, progress=False, default_method="rtn")
    gptq = sorted(n for n, m in run.methods.items() if m == "gptq")
    assert gptq == sorted(f"model.layers.0.self_attn.{p}_proj.weight" for p in "qkvo")
    assert len(run.methods) == 14


def test_heap_released_before_every_block(
    llama_dir: Path, calib: Calibration, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The C heap's free pages are handed back before each block (the 220 MB that the
    allocator kept over SmolLM2's 30 blocks), and doing so leaves the codes unchanged."""
    import lowbit.calibration.gptq as gptq_model

    real = gptq_model._release_heap
    monkeypatch.setattr(gptq_model, "_release_heap", lambda: False)
    plain = gptq_weights(llama_dir, "int4:g32", calib, progress=False)  # never released
    calls: list[bool] = []
    monkeypatch.setattr(gptq_model, "_release_heap", lambda: calls.append(real()) or True)
    run = gptq_weights(llama_dir, "int4:g32", calib, progress=False)
    blocks = len(build_model(open_checkpoint(llama_dir)).model.layers)
    assert len(calls) == blocks and all(calls)  # glibc here: malloc_trim was found
    for name, qt in plain.weights.items():
        assert np.array_equal(qt.codes, run.weights[name].codes), name
        assert np.array_equal(qt.scale, run.weights[name].scale), name


@pytest.mark.parametrize("block", [0, 1])
def test_layers_order_sees_earlier_groups_quantized(
    llama_dir: Path, tmp_path: Path, calib: Calibration, block: int
) -> None:
    """sequential="layers" (the default): inside a block, o_proj is calibrated on the already
    quantized q/k/v, gate/up on the quantized attention, down_proj on the quantized gate/up.
    Reference: ``blocks`` GPTQ of one group alone, on a copy of the model holding the run's
    weights for every group before it (and every earlier block), gives the run's codes."""
    run = gptq_weights(llama_dir, "int4:g32", calib, progress=False)
    assert run.sequential == "layers"
    pre = f"model.layers.{block}."
    order = [
        ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
        ("self_attn.o_proj",),
        ("mlp.gate_proj", "mlp.up_proj"),
        ("mlp.down_proj",),
    ]
    assert_groups_match_alone(run, llama_dir, calib, "model.layers.", block, order, tmp_path)
    # and the order matters: the blocks order gives other codes for a later group
    other = gptq_weights(llama_dir, "int4:g32", calib, GPTQ(sequential="blocks"), progress=False)
    assert other.sequential == "blocks"
    assert not np.array_equal(
        other.weights[pre + "mlp.down_proj.weight"].codes,
        run.weights[pre + "mlp.down_proj.weight"].codes,
    )


def test_layer_walk_only_where_the_block_decomposes() -> None:
    """The llama block decomposes into norm + sublayer residual steps (the walk is used); a
    BERT layer (post-norm) does not: the generic group walk runs there (test_group_walk.py)."""
    from lowbit.calibration.blocks import _capture, _find_blocks
    from lowbit.calibration.gptq import _LayerWalk

    for model, want in ((tiny_llama(), ("self_attn.o_proj", "mlp.down_proj")), (tiny_bert(), None)):
        ids = torch.randint(0, 250, (1, 16), generator=torch.Generator().manual_seed(0))
        with torch.inference_mode():
            _, blocks = _find_blocks(model)
            states = _capture(model, blocks[0], [({"input_ids": ids}, None)], want is not None)
            walk = _LayerWalk.of(blocks[0], states, GPTQ())
            assert (walk.lasts if walk else None) == want
            assert _LayerWalk.of(blocks[0], states, GPTQ(sequential="blocks")) is None


def test_sequential_setting() -> None:
    assert GPTQ().to_dict()["sequential"] == "layers"
    assert GPTQ(sequential="BLOCKS").sequential.value == "blocks"
    with pytest.raises(lowbit.LowbitError, match="sequential"):
        GPTQ(sequential="rows")


def test_later_blocks_are_read_at_their_turn(llama_dir: Path) -> None:
    """Built for GPTQ, the blocks after the first hold no weights until their turn, then
    exactly the checkpoint's, and the LM head none at all; a parameter two blocks share is
    never freed."""
    from lowbit.calibration.gptq import _Deferred, _find_blocks, _later_block, _own

    ckpt = open_checkpoint(llama_dir)
    want = build_model(ckpt).state_dict()
    model = build_model(ckpt, defer=_later_block)
    prefix, blocks = _find_blocks(model)
    assert model.lowbit_deferred and all(
        ".layers.1." in k or k == "lm_head.weight" for k in model.lowbit_deferred
    )
    deferred = _Deferred(model, ckpt, prefix)
    with torch.inference_mode():
        assert all(p.numel() == 0 for p in blocks[1].parameters())
        assert all(p.numel() > 0 for p in blocks[0].parameters())
        deferred.restore(1)
    for k, v in model.state_dict().items():
        if k == "lm_head.weight":  # never needed: GPTQ's capture stops at the first block
            assert v.numel() == 0
            continue
        assert torch.equal(v, want[k]), k
    shared = blocks[0].mlp.down_proj.weight
    blocks[1].mlp.down_proj.weight = shared  # a tied parameter (as ALBERT ties whole layers)
    assert all(p is not shared for b in blocks for p in _own(blocks, b))
