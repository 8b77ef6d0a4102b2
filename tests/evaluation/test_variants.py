"""Measuring variants together: the same numbers as lowbit.evaluation.perplexity one model at a time, and
in-memory schemes equal to the same scheme written to disk and loaded back."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.torch

from lowbit.checkpoints.streaming import quantize_model  # noqa: E402
from lowbit.errors import LowbitError  # noqa: E402
from lowbit.evaluation import perplexity as evaluate  # noqa: E402
from lowbit.evaluation.variants import Variant, compare_causal, compare_encoder, evaluate_variants  # noqa: E402
from lowbit.plans.plan import PrecisionPlan  # noqa: E402
from tiny_models import (  # noqa: E402
    byte_fast_tokenizer,
    byte_tokenizer_json,
    perturbed,
    save_hf_folder,
    tiny_bert,
    tiny_llama,
)

WORDS = "river stone cloud garden lantern harbor meadow signal copper violet winter orchard"


def _text() -> str:
    """Distinct prose sentences (the encoder draws from them; the LM reads them)."""
    w = WORDS.split()
    return "\n\n".join(
        f"The {w[i % 12]} near the {w[(i * 5 + 1) % 12]} keeps {i} quiet {w[(i * 7 + 3) % 12]}s "
        f"until the {w[(i + 4) % 12]} returns."
        for i in range(80)
    )


@pytest.mark.parametrize("stride", [None, 24])
def test_compare_causal_equals_evaluate_perplexity(stride: int | None) -> None:
    """One pass over all variants gives exactly evaluate.perplexity's numbers per variant
    (perplexity, KL mean/max, top-1), with and without simulated int8 activations."""
    ref = tiny_llama()
    tok = byte_fast_tokenizer()
    a, b = perturbed(ref, 0.01, 1), perturbed(ref, 0.05, 2)
    variants = [
        Variant("original", "", ref),
        Variant("a", "", a),
        Variant("b", "", b),
        Variant("a+int8", "", a, activations="int8"),
    ]
    kw = {"window": 48, "stride": stride, "max_tokens": 300, "threads": 1, "progress": False}
    measured, rows = compare_causal(variants, ref, tok, _text(), label="t", **kw)
    assert measured["tokens"] == 300 and measured["windows"] > 4
    for v, row in zip(variants, rows, strict=True):
        if v.activations:
            from lowbit.models.activations import simulate_activations

            with simulate_activations(v.model, "int8"):
                want = evaluate.perplexity(v.model, tok, _text(), reference=ref, **kw)
        else:
            want = evaluate.perplexity(v.model, tok, _text(), reference=ref, **kw)
        for key in ("perplexity", "nll", "kl_mean", "kl_max", "top1_agreement"):
            assert row[key] == want[key], (v.name, key)
    assert rows[0]["kl_mean"] == 0 and rows[0]["top1_agreement"] == 1
    assert 0 < rows[1]["kl_mean"] < rows[2]["kl_mean"]
    assert rows[3]["perplexity"] != rows[1]["perplexity"]


def test_compare_encoder_equals_embedding_fidelity() -> None:
    """Embedding fidelity of each variant equals evaluate.embedding_fidelity's."""
    ref = tiny_bert()
    tok = byte_fast_tokenizer()
    other = perturbed(ref, 0.05, 3)
    sentences = evaluate.sentences_from_text(_text(), 24, seed=1)
    variants = [Variant("original", "", ref), Variant("x", "", other)]
    _, rows = compare_encoder(variants, ref, tok, sentences, threads=1, progress=False)
    want = evaluate.embedding_fidelity(other, ref, tok, sentences, threads=1, progress=False)
    for key in ("mean_cosine", "min_cosine", "nn_agreement"):
        assert rows[1][key] == want[key]
    assert rows[0]["mean_cosine"] == pytest.approx(1.0) and rows[0]["nn_agreement"] == 1.0
    assert rows[1]["mean_cosine"] < 1


def test_memory_variant_equals_disk_variant(tmp_path: Path) -> None:
    """A scheme quantized in memory measures exactly like the same scheme written by
    quantize_model and loaded back; sizes and bits per weight agree too."""
    src = save_hf_folder(tiny_llama(), tmp_path / "src")
    (tmp_path / "text.txt").write_text(_text())
    out = tmp_path / "int8"
    quantize_model(src, PrecisionPlan.uniform("int8:ch"), out, progress=False)
    res = evaluate_variants(
        src,
        [out],
        ["int8:ch", "int4:g32"],
        w8a8="int8",
        tokens=200,
        window=40,
        text=tmp_path / "text.txt",
        threads=1,
        progress=False,
    )
    assert res["kind"] == "causal-lm" and res["measured"]["tokens"] == 200
    rows = {r["name"]: r for r in res["rows"]}
    assert list(rows) == [
        "original", "int8", "int8:ch", "int4:g32",
        "original + int8 act", "int8 + int8 act", "int8:ch + int8 act", "int4:g32 + int8 act",
    ]  # fmt: skip
    disk, mem = rows["int8"], rows["int8:ch"]
    for key in ("perplexity", "kl_mean", "top1_agreement", "bits_per_weight", "bytes"):
        assert disk[key] == mem[key], key
    assert disk["size_source"] == "disk" and mem["size_source"] == "memory"
    assert rows["original"]["change"] == 0 and rows["original"]["bits_per_weight"] == 32
    # one fp32 scale per output row: 512 rows of 36,864 weights per layer
    assert mem["bits_per_weight"] == pytest.approx(8 + 32 * 512 / 36864)
    # measured (benchmarks/threshold_spread.py, threads {1,2} x numba {on,off} x AVX-512/
    # AVX2/SSE paths): KL int4:g32 0.019296, int8:ch 5.400e-5-5.402e-5, int8:ch + act
    # 1.0830e-4-1.0833e-4: each ordering holds by a factor of 2 or more; relative spreads < 4e-4
    assert rows["int4:g32"]["kl_mean"] > mem["kl_mean"] > 0
    assert rows["int8:ch + int8 act"]["kl_mean"] > mem["kl_mean"]


def test_encoder_variants(tmp_path: Path) -> None:
    """An encoder folder is measured by embedding fidelity."""
    folder = tmp_path / "bert"
    model = tiny_bert()
    model.save_pretrained(folder, safe_serialization=True)
    (folder / "tokenizer.json").write_text(byte_tokenizer_json())
    (folder / "tokenizer_config.json").write_text(
        '{"tokenizer_class": "PreTrainedTokenizerFast", "pad_token": "<pad>"}'
    )
    (tmp_path / "text.txt").write_text(_text())
    res = evaluate_variants(
        folder, schemes=["int8:ch", "int4:g32"], sentences=20, text=tmp_path / "text.txt",
        threads=1, progress=False,
    )  # fmt: skip
    assert res["kind"] == "encoder" and res["measured"]["sentences"] == 20
    cos = [r["mean_cosine"] for r in res["rows"]]
    # measured 1 - cos: int8:ch 6.5e-8-8.9e-8, int4:g32 1.655e-5-1.656e-5 (same sweep)
    assert cos[0] == pytest.approx(1.0) and 1 > cos[1] > cos[2] > 0.5
    assert np.isfinite([r["min_cosine"] for r in res["rows"]]).all()


def test_q4_0_scheme_equals_q4_0_gguf_file(tmp_path: Path) -> None:
    """eval --schemes q4_0 measures exactly what the Q4_0 GGUF written by quantize --to q4_0
    measures (one meaning per name: llama.cpp's rounding); lowbit's own int4:g32:fp16 differs."""
    from tiny_models import save_gguf

    src = save_gguf(tiny_llama(), tmp_path / "tiny.gguf")
    (tmp_path / "text.txt").write_text(_text())
    out = tmp_path / "tiny.Q4_0.gguf"
    quantize_model(src, PrecisionPlan.uniform("q4_0"), out, out_format="gguf", progress=False)
    res = evaluate_variants(
        src,
        [out],
        ["q4_0", "int4:g32:fp16"],
        tokens=200,
        window=40,
        text=tmp_path / "text.txt",
        threads=1,
        progress=False,
    )
    rows = {r["name"]: r for r in res["rows"]}
    disk, mem, own = rows["tiny.Q4_0.gguf"], rows["q4_0"], rows["int4:g32:fp16"]
    for key in ("perplexity", "kl_mean", "top1_agreement"):
        assert disk[key] == mem[key], key
    assert disk["kl_mean"] > 0
    assert own["kl_mean"] != mem["kl_mean"]


def test_one_variant_model_alive_at_a_time(tmp_path: Path, monkeypatch: Any) -> None:
    """evaluate_variants builds each variant's model when it measures it and frees it before
    building the next (W8A8 twins share it): the original and one variant are alive at most."""
    import weakref

    import lowbit.evaluation.variants as variants_module

    built: list[Any] = []
    alive: list[int] = []  # variant models still alive when the next model is built
    real = variants_module.build_model

    def spy(*args: Any, **kwargs: Any) -> Any:
        alive.append(sum(ref() is not None for ref in built[1:]))
        model = real(*args, **kwargs)
        built.append(weakref.ref(model))
        return model

    monkeypatch.setattr(variants_module, "build_model", spy)
    src = save_hf_folder(tiny_llama(), tmp_path / "src")
    (tmp_path / "text.txt").write_text(_text())
    kw = {"tokens": 120, "window": 40, "text": tmp_path / "text.txt", "threads": 1}
    res = evaluate_variants(src, [], ["int8:ch", "int4:g32", "nf4"], w8a8="int8", **kw)
    assert len(built) == 4 and alive == [0, 0, 0, 0]
    assert all(ref() is None for ref in built)  # the result holds no model
    assert [r["name"] for r in res["rows"]][4:] == [
        "original + int8 act", "int8:ch + int8 act", "int4:g32 + int8 act", "nf4 + int8 act",
    ]  # fmt: skip
    # the same numbers as the models measured side by side, all alive at once
    monkeypatch.setattr(variants_module, "build_model", real)
    ref_model = real(variants_module.open_model(src))
    models = [ref_model] + [
        variants_module._scheme_variant(variants_module.open_model(src), s, False).model
        for s in ("int8:ch", "int4:g32", "nf4")
    ]
    names = [r["name"] for r in res["rows"]]
    together = [Variant(n, "", m) for n, m in zip(names[:4], models, strict=True)]
    together += [
        Variant(n, "", m, activations="int8") for n, m in zip(names[4:], models, strict=True)
    ]
    tok = variants_module.build_tokenizer(variants_module.open_model(src))
    _, rows = compare_causal(
        together, ref_model, tok, _text(), max_tokens=120, window=40, threads=1, progress=False
    )
    for got, want in zip(res["rows"], rows, strict=True):
        for key in ("perplexity", "nll", "kl_mean", "kl_max", "top1_agreement"):
            assert got[key] == want[key], (got["name"], key)


def test_bad_quantized_path_fails_before_any_model_is_built(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """A QUANTIZED path that is missing, or a lowbit checkpoint of another model, is one
    LowbitError before the original is built or measured (variants are built later, when
    measured, so the paths are opened first)."""
    import lowbit.evaluation.variants as variants_module

    built: list[Any] = []
    real = variants_module.build_model
    monkeypatch.setattr(
        variants_module, "build_model", lambda *a, **k: built.append(1) or real(*a, **k)
    )
    measured: list[Any] = []  # the measuring loop, which would open the paths too late
    real_loop = variants_module._compare_causal_groups
    monkeypatch.setattr(
        variants_module,
        "_compare_causal_groups",
        lambda *a, **k: measured.append(1) or real_loop(*a, **k),
    )
    src = save_hf_folder(tiny_llama(), tmp_path / "src")
    (tmp_path / "text.txt").write_text(_text())
    kw = {"tokens": 120, "window": 40, "text": tmp_path / "text.txt", "threads": 1}
    with pytest.raises(LowbitError, match="no such file or folder"):
        evaluate_variants(src, [tmp_path / "missing"], None, **kw)
    assert built == [1] and not measured  # the original only; nothing measured
    other = save_hf_folder(tiny_llama(tie=True), tmp_path / "other")  # no lm_head.weight
    q = tmp_path / "other-int8"
    quantize_model(other, PrecisionPlan.uniform("int8:ch"), q, progress=False)
    built.clear()
    with pytest.raises(LowbitError, match="tensors differ"):
        evaluate_variants(src, [q], None, **kw)
    assert built == [1] and not measured
