"""lowbit.calibration.awq: AWQ and SmoothQuant on a tiny llama (folder and GGUF) and a tiny
BERT; the folds of lowbit.methods.folds leave the full-precision models' outputs unchanged."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.torch

import lowbit  # noqa: E402
from lowbit.calibration.awq import awq_weights  # noqa: E402
from lowbit.calibration.data import Calibration  # noqa: E402
from lowbit.checkpoints import open_checkpoint  # noqa: E402
from lowbit.evaluation.variants import evaluate_variants  # noqa: E402
from lowbit.methods.awq import AWQ  # noqa: E402
from lowbit.methods.folds import FOLDS, FoldKind, fold_scales, head_repeat  # noqa: E402
from lowbit.methods.smoothquant import SmoothQuant  # noqa: E402
from lowbit.models.build import build_model  # noqa: E402
from lowbit.quant.scheme_text import parse_scheme  # noqa: E402
from tiny_models import llamacpp_permute, save_gguf, save_hf_folder, tiny_bert, tiny_llama  # noqa: E402

WORDS = "river stone cloud garden lantern harbor meadow signal copper violet winter orchard"


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_hf_folder(tiny_llama(), tmp_path_factory.mktemp("awq") / "llama")


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny BERT with nonzero biases (BERT's init zeroes them; a fold divides them)."""
    return save_hf_folder(tiny_bert(bias_std=0.05), tmp_path_factory.mktemp("awq") / "bert")


@pytest.fixture(scope="module")
def calib(tmp_path_factory: pytest.TempPathFactory) -> Calibration:
    w = WORDS.split()
    f = tmp_path_factory.mktemp("calib") / "calib.txt"
    f.write_text(" ".join(f"The {w[i % 12]} keeps {w[i * 7 % 12]}." for i in range(60)))
    return Calibration(source=str(f), samples=4, length=64)


@pytest.fixture(scope="module")
def bert_calib(tmp_path_factory: pytest.TempPathFactory) -> Calibration:
    f = tmp_path_factory.mktemp("calib") / "sentences.txt"
    words = WORDS.split() * 6
    f.write_text(" ".join(f"The {w} stays near sentence number {i}." for i, w in enumerate(words)))
    return Calibration(source=str(f), samples=40, length=64)


def _outputs(model: Any, bert: bool) -> np.ndarray:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 250, (2, 20), generator=g)
    with torch.inference_mode():
        if bert:
            return model(input_ids=ids).last_hidden_state.numpy().astype(np.float64)
        return model(input_ids=ids).logits.numpy().astype(np.float64)


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


@pytest.mark.parametrize("kind", ["llama", "bert"])
def test_every_fold_of_the_table_is_exact(kind: str, llama_dir: Path, bert_dir: Path) -> None:
    """Random scales from 0.2 to 5 folded at every place the table names leave the
    full-precision model's outputs unchanged (relative error < 1e-5), grouped-query heads
    included (the tiny llama has 4 query heads on 2 value heads)."""
    folder = llama_dir if kind == "llama" else bert_dir
    ckpt = open_checkpoint(folder)
    cfg = ckpt.config
    prefix = "model.layers" if kind == "llama" else "encoder.layer"
    head_dim = cfg["hidden_size"] // cfg["num_attention_heads"]
    rng = np.random.default_rng(0)
    now: dict[str, np.ndarray] = {}

    def get(name: str) -> np.ndarray:
        return now.get(name, np.asarray(ckpt.get(name), dtype=np.float64))

    names = set(ckpt.names())
    for i in range(cfg["num_hidden_layers"]):
        for f in FOLDS[kind]:
            p = f"{prefix}.{i}.{f.prev}"
            prev = {k: get(f"{p}.{k}") for k in ("weight", "bias") if f"{p}.{k}" in names}
            lins = {n: get(f"{prefix}.{i}.{n}.weight") for n in f.linears}
            width = next(iter(lins.values())).shape[1]
            s = np.exp(rng.uniform(np.log(0.2), np.log(5.0), prev["weight"].shape[0]))
            s_in = head_repeat(s, width, head_dim) if f.kind is FoldKind.HEADS else s
            new_prev, new_lin = fold_scales(prev, lins, s, s_in)
            now.update({f"{p}.{k}": v for k, v in new_prev.items()})
            now.update({f"{prefix}.{i}.{n}.weight": v for n, v in new_lin.items()})
    assert len(now) == (6 if kind == "bert" else 18)
    base = _outputs(build_model(ckpt), kind == "bert")
    folded = build_model(ckpt, weights={n: a.astype(np.float32) for n, a in now.items()})
    assert _rel(_outputs(folded, kind == "bert"), base) < 1e-5


@pytest.mark.parametrize("method", [AWQ(), SmoothQuant(activations="int8")])
def test_the_folded_model_is_the_quantized_one(
    method: Any, llama_dir: Path, calib: Calibration
) -> None:
    """The driver's bookkeeping is exact: the model built from the run (folded norms, quantized
    folded weights) computes what the original model computes with each linear's quantized
    weight unfolded (``rows * Ŵ / cols``)."""
    spec = "int4:g32" if isinstance(method, AWQ) else "int8:ch"
    run = awq_weights(llama_dir, spec, calib, method, progress=False)
    ckpt = open_checkpoint(llama_dir)
    assert set(run.replaced) == {
        f"model.layers.{i}.{n}.weight" for i in range(2)
        for n in ("input_layernorm", "post_attention_layernorm")
    }  # fmt: skip
    assert len(run.scales) == 14 and set(run.methods.values()) == {method.name}
    unfolded = {}
    for name, qt in run.weights.items():
        r, c = run.scales[name]
        unfolded[name] = (r[:, None] * qt.dequantize(np.float64) / c[None, :]).astype(np.float32)
    a = _outputs(build_model(ckpt, weights=run.model_weights()), False)
    b = _outputs(build_model(ckpt, weights=unfolded), False)
    assert _rel(a, b) < 1e-5
    assert len([f for f in run.folds if "skipped" not in f]) == 8


def test_alpha_zero_without_clipping_is_round_to_nearest(
    llama_dir: Path, calib: Calibration
) -> None:
    """AWQ(alpha=0, clip=False) writes round to nearest's codes and changes no other tensor."""
    run = awq_weights(llama_dir, "int4:g32:asym", calib, AWQ(alpha=0.0, clip=False), progress=False)
    ckpt = open_checkpoint(llama_dir)
    scheme = parse_scheme("int4:g32:asym")
    assert run.replaced == {} and len(run.weights) == 14
    for name, qt in run.weights.items():
        ref = lowbit.quantize(ckpt.get(name), scheme)
        assert np.array_equal(qt.codes, ref.codes) and np.array_equal(qt.scale, ref.scale)
        assert np.array_equal(qt.zero_point, ref.zero_point)
    assert all(e["awq"] == pytest.approx(e["rtn"], rel=1e-9) for e in run.layers.values())


@pytest.mark.parametrize("spec", ["int4:g32", "nf4", "mxfp4"])
def test_awq_on_a_tiny_llama(spec: str, llama_dir: Path, calib: Calibration) -> None:
    """Every planned tensor is AWQ's, in round to nearest's layout; its four folds per block are
    applied; the layer-output error on the calibration data falls on average."""
    run = awq_weights(llama_dir, spec, calib, progress=False)
    ckpt = open_checkpoint(llama_dir)
    for name, qt in run.weights.items():
        ref = lowbit.quantize(ckpt.get(name), qt.scheme)
        assert qt.scale.shape == ref.scale.shape and qt.nbytes == ref.nbytes
    errs = list(run.layers.values())
    assert all(e["tokens"] == 256 for e in errs)
    gain = 0.95 if spec == "mxfp4" else 0.8  # power-of-two block scales absorb less
    assert np.mean([e["awq"] for e in errs]) < gain * np.mean([e["rtn"] for e in errs])
    for f in run.folds:
        assert f["after"] <= f["before"]
    assert {"collect", "search", "quantize", "propagate", "total"} <= set(run.seconds)


def test_gguf_equals_folder_up_to_the_row_permutation(tmp_path: Path, calib: Calibration) -> None:
    """Folding in a GGUF file's layout (llama.cpp names, permuted q/k rows) gives the folder's
    codes with the q/k rows permuted, and the same folded norms."""
    model = tiny_llama()
    folder = save_hf_folder(model, tmp_path / "llama")
    gguf = save_gguf(model, tmp_path / "llama.gguf", embedding="F32")
    a = awq_weights(folder, "int4:g32", calib, progress=False)
    b = awq_weights(gguf, "int4:g32", calib, progress=False)
    heads = {"attn_q": 4, "attn_k": 2}
    for i in range(2):
        for hf, gg in [("self_attn.q_proj", "attn_q"), ("self_attn.k_proj", "attn_k"),
                       ("self_attn.o_proj", "attn_output"), ("mlp.down_proj", "ffn_down")]:  # fmt: skip
            x = a.weights[f"model.layers.{i}.{hf}.weight"]
            y = b.weights[f"blk.{i}.{gg}.weight"]
            cx = x.unpack()
            if gg in heads:
                cx = llamacpp_permute(cx, heads[gg])
            np.testing.assert_array_equal(y.unpack(), cx)
        np.testing.assert_allclose(
            b.replaced[f"blk.{i}.attn_norm.weight"],
            a.replaced[f"model.layers.{i}.input_layernorm.weight"], rtol=1e-6,
        )  # fmt: skip


@pytest.mark.parametrize("method", [AWQ(), SmoothQuant()])
def test_tiny_bert(method: Any, bert_dir: Path, bert_calib: Calibration) -> None:
    """A BERT encoder: value -> attention output folded in each block (the post-norm
    LayerNorms are not exact folds), the pooler rounded to nearest, padding masked out."""
    spec = "int4:g32" if isinstance(method, AWQ) else "int8:ch"
    run = awq_weights(bert_dir, spec, bert_calib, method, progress=False)
    assert run.methods.pop("pooler.dense.weight") == "rtn"
    assert len(run.methods) == 12 and set(run.methods.values()) == {method.name}
    done = [f for f in run.folds if "skipped" not in f]
    assert [f["prev"] for f in done] == [
        f"encoder.layer.{i}.attention.self.value" for i in range(2)
    ]
    assert set(run.replaced) == {f"encoder.layer.{i}.attention.self.value.bias" for i in range(2)}
    errs = list(run.layers.values())
    assert np.mean([e[method.name] for e in errs]) < np.mean([e["rtn"] for e in errs])
    assert 40 * 10 < run.calibration["tokens"] < 40 * 64


def test_eval_rows_side_by_side(llama_dir: Path) -> None:
    """lowbit eval's rows: AWQ closer to the original than round to nearest at 4 bits, and a
    SmoothQuant row per scheme with W8A8."""
    cal = Calibration(samples=4, length=64)
    res = evaluate_variants(
        llama_dir, schemes=["int4:g32"], methods=["rtn", "awq"], calibration=cal, tokens=512,
        window=128, threads=1, progress=False,
    )  # fmt: skip
    rows = {r["name"]: r for r in res["rows"]}
    assert list(rows) == ["original", "int4:g32", "int4:g32 awq"]
    assert rows["int4:g32 awq"]["kl_mean"] < rows["int4:g32"]["kl_mean"]
    assert rows["int4:g32 awq"]["calibration"]["described"].endswith("from token 32,768")
    res = evaluate_variants(
        llama_dir, schemes=["int8:ch"], w8a8="int8", smooth=True, calibration=cal, tokens=512,
        window=128, threads=1, progress=False,
    )  # fmt: skip
    names = [r["name"] for r in res["rows"]]
    assert "int8:ch smoothquant + int8 act" in names
    sq = next(r for r in res["rows"] if r["name"] == "int8:ch smoothquant")
    assert sq["method"]["activations"] == "int8" and sq["folds"] == 8
    with pytest.raises(lowbit.LowbitError, match="w8a8"):
        evaluate_variants(llama_dir, schemes=["int8:ch"], smooth=True, progress=False)
    with pytest.raises(lowbit.LowbitError, match="AWQ or SmoothQuant"):
        awq_weights(llama_dir, "int4", cal, method="awq", progress=False)


@pytest.mark.parametrize("source", ["folder", "gguf"])
def test_folded_checkpoint_computes_the_original(
    source: str, llama_dir: Path, calib: Calibration, tmp_path: Path
) -> None:
    """SmoothQuant then GPTQ starts from AWQRun.folded_checkpoint: every folded linear's
    float weight rebuilt from its scales, and the folded norms; unquantized, it computes what
    the source computes (relative error < 1e-5), though its 14 weights and 4 norms were
    refolded."""
    path = llama_dir if source == "folder" else save_gguf(tiny_llama(), tmp_path / "t.gguf")
    run = awq_weights(path, "int8:ch", calib, SmoothQuant(activations="int8"), progress=False)
    folded = run.folded_checkpoint(path)
    ckpt = open_checkpoint(path)
    assert len(folded.replaced) == 18
    moved = [n for n in folded.replaced if not np.allclose(folded.get(n), ckpt.get(n))]
    assert len(moved) >= 14  # a fold whose searched scales are all near 1 may move little
    assert _rel(_outputs(build_model(folded), False), _outputs(build_model(ckpt), False)) < 1e-5


def test_eval_smoothquant_then_gptq_row(llama_dir: Path) -> None:
    """--smooth with gptq in --methods: a 'smoothquant+gptq' row (the folds made, GPTQ's
    tensors), beside the gptq and smoothquant rows."""
    cal = Calibration(samples=4, length=64)
    res = evaluate_variants(
        llama_dir, schemes=["int4:g32"], methods=["gptq"], w8a8="int8", smooth=True,
        calibration=cal, tokens=256, window=128, threads=1, progress=False,
    )  # fmt: skip
    names = [r["name"] for r in res["rows"]]
    assert names[:4] == ["original", "int4:g32 gptq", "int4:g32 smoothquant",
                         "int4:g32 smoothquant+gptq"]  # fmt: skip
    row = res["rows"][3]
    assert row["folds"] == 8 and row["gptq_tensors"] == 14
    assert row["smoothquant"]["activations"] == "int8" and row["kl_mean"] > 0
