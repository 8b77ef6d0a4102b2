"""The data of ``lowbit report`` equals lowbit's own metrics, tensor by tensor."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("transformers")
import lowbit
from lowbit.checkpoints import open_checkpoint
from lowbit.cli import main
from lowbit.errors import LowbitError
from lowbit.view.report import build_report, group_levels, layer_and_kind
from tiny_models import save_hf_folder, tiny_llama


@pytest.fixture(scope="module")
def quantized(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("reportdata")
    src = save_hf_folder(tiny_llama(seed=2), root / "src")
    q = root / "q"
    argv = ["quantize", str(src), "--to", "int4", "--group", "32", "--out", str(q)]
    assert main(argv) == 0
    return src, q


def test_bits_and_errors_equal_lowbits_metrics(quantized: tuple[Path, Path]) -> None:
    """Every quantized tensor's bits are QuantizedTensor.bits_per_value, its errors are
    lowbit.error against the source; kept tensors cost the source's bits with no error."""
    src, q = quantized
    report = build_report(q, worst=0)
    ck, sc = open_checkpoint(q), open_checkpoint(src)
    assert [r.name for r in report.rows] == ck.names()
    assert len(report.quantized) == 14
    for r in report.rows:
        x = sc.get(r.name)
        if r.stored == "quantized":
            qt = ck.quantized(r.name)
            e = lowbit.error(x, qt)
            assert r.bits == qt.bits_per_value == 5.0
            assert r.rel_fro == e["rel_fro"] and r.sqnr_db == e["sqnr_db"]
            assert 0 < r.rel_fro < 0.2
            assert r.scheme == "int4:g32:fp32"
        else:
            assert r.stored == "kept" and r.bits == 32.0 and r.rel_fro == 0.0
            assert r.sqnr_db == math.inf
        assert r.source_bits == 32.0
    doc = json.loads((q / "lowbit.json").read_text())
    assert report.size_bytes == sum(ck.info(n).nbytes for n in ck.names())
    assert report.source_bytes == doc["totals"]["source_bytes"]
    assert report.quantized_bits_per_weight == pytest.approx(doc["totals"]["bits_per_weight"])
    assert report.formats()[0] == ("int4:g32:fp32", 14, doc["totals"]["quantized_params"])
    layers, kinds = report.grid()
    assert layers == [0, 1] and "self_attn.q_proj" in kinds and "mlp.down_proj" in kinds


def test_worst_tensors_have_levels_and_candidates(quantized: tuple[Path, Path]) -> None:
    """The details are the tensors of largest relative error, in falling order; the levels are
    the group's 16 scaled int4 values; the checkpoint's own scheme is the chosen candidate."""
    src, q = quantized
    report = build_report(q, worst=2, candidates=("int8:ch", "nf4"))
    errs = sorted((r.rel_fro for r in report.quantized), reverse=True)
    assert [d.name for d in report.details] == [
        next(r.name for r in report.quantized if r.rel_fro == e) for e in errs[:2]
    ]
    ck, sc = open_checkpoint(q), open_checkpoint(src)
    d = report.details[0]
    qt = ck.quantized(d.name)
    s = float(np.asarray(qt.scale).reshape(-1)[0])
    assert d.levels == tuple(float(v) * s for v in range(-8, 8))
    assert sum(d.counts) == 32  # one group of 32 values
    assert [c.scheme for c in d.candidates] == ["int4:g32:fp32", "int8:ch:fp32", "nf4:g64:fp32"]
    assert [c.chosen for c in d.candidates] == [True, False, False]
    x = sc.get(d.name)
    e = lowbit.error(x, lowbit.quantize(x, "int8", axis=0))
    assert d.candidates[1].sqnr_db == pytest.approx(e["sqnr_db"])


def test_group_levels_first_group_members() -> None:
    """The first group of g4 along the last axis is row 0's first four values; per channel,
    channel 0 is row 0 (weight layout)."""
    x = np.arange(1, 33, dtype=np.float32).reshape(4, 8)
    levels, members, _ = group_levels(lowbit.quantize(x, "int8", group_size=4))
    assert list(members) == [0, 1, 2, 3]
    assert levels.max() == pytest.approx(4.0, rel=0.01)  # scale 4/127, top level 127·s
    _, members, _ = group_levels(lowbit.quantize(x, "int8", axis=0))
    assert list(members) == list(range(8))


def test_layer_and_kind() -> None:
    """Hugging Face and GGUF names give the layer and kind; others are their own kind."""
    assert layer_and_kind("model.layers.12.mlp.up_proj.weight") == (12, "mlp.up_proj")
    assert layer_and_kind("blk.3.ffn_up.weight") == (3, "ffn_up")
    assert layer_and_kind("token_embd.weight") == (None, "token_embd")


def test_without_source_no_errors(quantized: tuple[Path, Path], tmp_path: Path) -> None:
    """A GGUF-like case: no source found means bits only; a wrong --against is refused."""
    src, q = quantized
    other = save_hf_folder(tiny_llama(seed=2, tie=True), tmp_path / "other")
    report = build_report(q, against=src, worst=0)
    assert all(r.rel_fro is not None for r in report.rows)
    bad = tmp_path / "bad"
    save_hf_folder(_wider(), bad)
    with pytest.raises(LowbitError, match="shape"):
        build_report(q, against=bad, worst=0)
    assert other.exists()


def _wider():
    import torch
    import transformers

    cfg = tiny_llama().config
    cfg.intermediate_size = 96
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(cfg).eval()


def test_cli_report_outputs(quantized: tuple[Path, Path], tmp_path: Path, capsys) -> None:
    """The page is one file with no external resource, marked so --overwrite may replace it;
    a file lowbit did not write is refused; --png writes titled PNGs."""
    pytest.importorskip("matplotlib")
    _, q = quantized
    out = tmp_path / "r.html"
    figs = tmp_path / "figs"
    figs.mkdir()
    assert main(["report", str(q), "--out", str(out), "--png", str(figs), "--worst", "1"]) == 0
    page = out.read_text()
    assert page.startswith("<!DOCTYPE html>") and '<meta name="generator" content="lowbit ' in page
    for bad in ("http://", "https://", "<link", "src="):
        assert bad not in page
    names = sorted(p.name for p in figs.iterdir())
    assert names[:3] == ["bits.png", "error.png", "formats.png"] and len(names) == 5
    assert main(["report", str(q), "--out", str(out), "--worst", "0"]) == 2
    assert "already exists" in capsys.readouterr().err
    assert main(["report", str(q), "--out", str(out), "--worst", "0", "--overwrite"]) == 0
    said = capsys.readouterr().out
    assert re.match(r"wrote .* \(21 tensors\) in [\d.]+ s", said), said
    assert main(["report", str(q), "--out", str(out), "--overwrite", "--json"]) == 0
    sec = json.loads(capsys.readouterr().out)["seconds"]  # the whole command, by part
    assert {"total", "tensors", "candidates", "page", "other"} == set(sec)
    assert sum(v for k, v in sec.items() if k != "total") == pytest.approx(sec["total"])
    foreign = tmp_path / "mine.html"
    foreign.write_text("<html>my notes</html>")
    assert main(["report", str(q), "--out", str(foreign), "--overwrite"]) == 2
    assert foreign.read_text() == "<html>my notes</html>"
    assert main(["report", str(q), "--out", str(q / "x.html")]) == 2  # inside the input


def test_sensitivity_section(quantized: tuple[Path, Path], tmp_path: Path) -> None:
    """A sensitivity document is read back through SensitivityResult and drawn as a heatmap
    with one cell per (tensor, scheme); a document that is not one is refused."""
    from lowbit.view.html import render

    _, q = quantized
    names = [r.name for r in build_report(q, worst=0).quantized][:3]
    doc = {
        "version": 1, "model": "tiny", "kind": "causal", "measure": "proxy", "metric": "kl",
        "calibration": "x", "schemes": ["int8:ch", "int4:g32"], "rank_correlation": None,
        "seconds": {},
        "entries": [
            {"tensor": n, "scheme": s, "numel": 8192, "bits": 8192 * b, "bits_per_weight": b,
             "proxy": p, "damage": None}
            for n in names for s, b, p in (("int8:ch", 8.5, 1e-4), ("int4:g32", 5.0, 1e-2))
        ],
    }  # fmt: skip
    report = build_report(q, worst=0, sensitivity=doc)
    page = render(report)
    section = page[page.index('id="sensitivity"') :]
    assert section.count('class="cell"') == 6
    with pytest.raises(LowbitError, match="sensitivity"):
        build_report(q, worst=0, sensitivity={"entries": [{}]})


def test_compressed_tensors_errors_match_the_lowbit_checkpoint(
    quantized: tuple[Path, Path], tmp_path: Path
) -> None:
    """The same int4 g32 quantization written as compressed-tensors reads back (packed int32
    words, group scales) to the lowbit checkpoint's errors; bits count every stored part."""
    src, q = quantized
    ct = tmp_path / "ct"
    argv = ["quantize", str(src), "--to", "int4", "--group", "32", "--out-format",
            "compressed-tensors", "--out", str(ct), "--no-progress"]  # fmt: skip
    assert main(argv) == 0
    ours = {r.name: r for r in build_report(q, worst=0).rows}
    theirs = build_report(ct, against=src, worst=0)
    assert theirs.format == "compressed-tensors"
    assert [r.name for r in theirs.rows] == list(ours)
    for r in theirs.quantized:
        assert r.scheme == "int4:g32 (pack-quantized)"
        assert r.rel_fro == pytest.approx(ours[r.name].rel_fro, rel=1e-6)
        assert 5.0 < r.bits < 5.1  # codes, fp32 group scales and the I64 weight_shape


def test_gguf_against_its_source(tmp_path: Path) -> None:
    """A GGUF file quantized to Q4_0 reports its storage bits (4.5) and its error against
    the source GGUF, tensor names as GGUF spells them."""
    from tiny_models import save_gguf

    src = save_gguf(tiny_llama(seed=4), tmp_path / "src.gguf", embedding="F32")
    out = tmp_path / "q.gguf"
    argv = ["quantize", str(src), "--to", "q4_0", "--out-format", "gguf", "--out", str(out),
            "--no-progress"]  # fmt: skip
    assert main(argv) == 0
    report = build_report(out, against=src, worst=0)
    q4 = [r for r in report.rows if r.scheme == "Q4_0"]
    assert q4 and all(r.bits == 4.5 and r.layer is not None for r in q4)
    sc, qc = open_checkpoint(src), open_checkpoint(out)
    r = q4[0]
    assert r.rel_fro == pytest.approx(
        lowbit.error(sc.get(r.name), qc.get(r.name, np.float32))["rel_fro"], rel=1e-12
    )


def test_rules_that_fired(quantized: tuple[Path, Path], tmp_path: Path) -> None:
    """A plan rule that picked int8 for the MLP weights is listed with its tensor count, and
    each of those tensors names it; the summary shows the rule itself."""
    from lowbit.view.html import render

    src, _ = quantized
    plan = tmp_path / "plan.yaml"
    plan.write_text('default: int4:g32\nrules:\n  - match: "*mlp*"\n    scheme: int8\n')
    out = tmp_path / "qp"
    argv = ["quantize", str(src), "--plan", str(plan), "--out", str(out), "--no-progress"]
    assert main(argv) == 0
    report = build_report(out, worst=0)
    assert report.rules_fired() == [("rule 0", 6)]
    mlp = [r for r in report.rows if ".mlp." in r.name]
    assert {(r.rule, r.scheme) for r in mlp} == {("rule 0", "int8:ch:fp32")}
    assert all(r.rule is None for r in report.rows if ".mlp." not in r.name)
    assert "rule 0 <code>{&quot;format&quot;: &quot;int8:ch:fp32&quot;" in render(report)


def test_evaluation_results_are_shown(quantized: tuple[Path, Path], tmp_path: Path) -> None:
    """--eval results with rows become a table of their scalar fields."""
    _, q = quantized
    ev = {"kind": "causal-lm", "rows": [{"variant": "int4 g32", "ppl": 12.345678, "kl": None}]}
    path = tmp_path / "eval.json"
    path.write_text(json.dumps(ev))
    out = tmp_path / "r.html"
    assert main(["report", str(q), "--out", str(out), "--worst", "0", "--eval", str(path)]) == 0
    page = out.read_text()
    section = page[page.index('id="evaluation"') :]
    assert "<th>variant</th><th>ppl</th><th>kl</th>" in section
    assert "<td>int4 g32</td><td>12.346</td><td>-</td>" in section
    path.write_text("{not json")
    assert main(["report", str(q), "--out", str(out), "--overwrite", "--eval", str(path)]) == 2


def test_mixed_plan_colours_and_order(tmp_path: Path) -> None:
    """A mixed plan's grid: columns in the block's order, one colour per scheme (no two
    schemes share one, every tensor of a scheme has its colour), kept tensors in kept's grey,
    and the legend names every scheme shown, cheapest first."""
    from report_models import LLAMA_ORDER, MIXED_SCHEMES, mixed_llama

    from lowbit.view.palette import KEPT, KEPT_COLOUR

    report = build_report(mixed_llama(tmp_path), worst=0)
    layers, kinds = report.grid()
    assert layers == [0, 1] and kinds == LLAMA_ORDER
    pal = report.palette()
    for r in report.rows:
        if r.kind in MIXED_SCHEMES:
            assert r.scheme == MIXED_SCHEMES[r.kind] and r.colour_key == r.scheme
        elif r.layer is not None:
            assert r.colour_key == KEPT
    keys = {r.colour_key for r in report.rows}
    assert keys == set(MIXED_SCHEMES.values()) | {KEPT}
    colours = {k: pal[k] for k in keys}
    assert len(set(colours.values())) == len(keys)  # different schemes, different colours
    assert colours[KEPT] == KEPT_COLOUR
    legend = [k for k, _, _ in pal.entries]
    bits = [b for _, _, b in pal.entries]
    assert legend[-1] == KEPT and bits[:-1] == sorted(bits[:-1])
    assert legend[:2] == ["int4:g64:fp32", "int4:g32:fp32"]  # 4.5 then 5.0 bits/weight


def test_moe_expert_grids(tmp_path: Path) -> None:
    """A Mixtral-named checkpoint: the main grid has attention, router and norms in block
    order; the experts form one grid per expert kind (w1, w3, w2: gate, up, down)."""
    from report_models import MOE_EXPERTS, moe_checkpoint

    report = build_report(moe_checkpoint(tmp_path), worst=0)
    _, kinds = report.grid()
    assert kinds == ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                     "self_attn.o_proj", "block_sparse_moe.gate", "input_layernorm",
                     "post_attention_layernorm"]  # fmt: skip
    experts = list(range(MOE_EXPERTS))
    assert report.experts() == [(f"block_sparse_moe.experts.*.{w}", experts)
                                for w in ("w1", "w3", "w2")]  # fmt: skip
    schemes = {r.kind: r.scheme for r in report.rows if r.layer == 0}
    assert schemes["block_sparse_moe.experts.3.w2"] == "int8:ch:fp32"
    assert schemes["block_sparse_moe.experts.0.w1"] == "int4:g32:fp32"


def test_png_grids_use_the_pages_colours(tmp_path: Path) -> None:
    """--png on the MoE checkpoint: a bits grid per expert kind besides the main one, and
    every scheme's cells painted in exactly the page's colour for it (pixels of bits.png)."""
    pytest.importorskip("matplotlib")
    from report_models import moe_checkpoint

    from lowbit.view.png import write_pngs

    report = build_report(moe_checkpoint(tmp_path / "m"), worst=0)
    figs = tmp_path / "figs"
    names = sorted(p.name for p in write_pngs(report, figs))
    groups = [f"block_sparse_moe.experts.{w}" for w in ("w1", "w2", "w3")]
    assert names == sorted(["bits.png", "error.png", "formats.png"]
                           + [f"{k}-{g}.png" for k in ("bits", "error") for g in groups])  # fmt: skip
    import matplotlib.image

    pal = report.palette()

    def colours(name: str) -> set[tuple[int, int, int]]:
        img = (matplotlib.image.imread(figs / name)[..., :3] * 255).round().astype(int)
        return {tuple(int(v) for v in p) for p in img.reshape(-1, 3)}

    def rgb(key: str) -> tuple[int, int, int]:
        c = pal[key]
        return int(c[1:3], 16), int(c[3:5], 16), int(c[5:7], 16)

    main_px = colours("bits.png")
    assert rgb("int6:g32:fp32") in main_px and rgb("kept") in main_px
    assert rgb("int4:g32:fp32") not in main_px  # experts only: drawn in their own grids
    assert rgb("int4:g32:fp32") in colours("bits-block_sparse_moe.experts.w1.png")
    assert rgb("int8:ch:fp32") in colours("bits-block_sparse_moe.experts.w2.png")


def test_qwen_moe_router_shared_expert_and_groups(tmp_path: Path) -> None:
    """Qwen-MoE names: the router (mlp.gate) and the shared expert's gate before the shared
    expert's gate, up, down in the main grid; one grid per routed expert kind."""
    from report_models import MOE_EXPERTS, moe_checkpoint

    report = build_report(moe_checkpoint(tmp_path, "qwen"), worst=0)
    _, kinds = report.grid()
    assert kinds == ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                     "self_attn.o_proj", "mlp.gate", "mlp.shared_expert_gate",
                     "mlp.shared_expert.gate_proj", "mlp.shared_expert.up_proj",
                     "mlp.shared_expert.down_proj", "input_layernorm",
                     "post_attention_layernorm"]  # fmt: skip
    assert report.experts() == [(f"mlp.experts.*.{w}", list(range(MOE_EXPERTS)))
                                for w in ("gate_proj", "up_proj", "down_proj")]  # fmt: skip
    schemes = {r.kind: r.colour_key for r in report.rows if r.layer == 1}
    assert schemes["mlp.experts.2.down_proj"] == "int8:ch:fp32"
    assert schemes["mlp.experts.2.up_proj"] == "int4:g32:fp32"
    assert schemes["mlp.shared_expert_gate"] == "kept"


def test_sparse_grids_are_linear() -> None:
    """20,000 tensors, each its own layer and kind (a hostile file's names): the grids keep
    the recurring kinds, so the page costs what it shows (quadratic before: 18.8 s, 1.75 GB
    for a 1 MB file). Checked by what the grid holds, not by a clock (a loaded machine made
    the old 10 s bound fail); a dense model's grid is unchanged."""
    from lowbit.view import html
    from lowbit.view.report import Report, TensorRow

    def report(rows: list[TensorRow]) -> Report:
        return Report("x", "lowbit", None, None, tuple(rows), (), None, 0, None)

    n = 20_000
    rows = [
        TensorRow(f"blk.{i}.k{i}.weight", i, f"k{i}", (4, 4), "quantized", "int8:ch", None, 8.5)
        for i in range(n)
    ]
    rows += [
        TensorRow(f"blk.{i}.attn_q.weight", i, "attn_q", (4, 4), "quantized", "int8", None, 8.5)
        for i in range(0, n, 2)
    ]
    layers, kinds = report(rows).grid()
    page = html.render(report(rows))
    assert kinds == ["attn_q"] and len(layers) == n // 2
    assert page.count('class="cell"') == n // 2
    dense = [
        TensorRow(f"blk.{i}.{k}.weight", i, k, (4, 4), "quantized", "int8", None, 8.5)
        for i in range(3)
        for k in ("attn_q", "ffn_up")
    ]
    dense.append(TensorRow("blk.0.extra.weight", 0, "extra", (4, 4), "kept", "F32", None, 32.0))
    assert report(dense).grid() == ([0, 1, 2], ["attn_q", "ffn_up", "extra"])


def test_layer_numbers_past_the_digit_limit() -> None:
    """A 5,000-digit layer number (past int()'s limit) is no layer, not a ValueError."""
    from lowbit.plans.presets import tensor_group

    name = "model.layers." + "9" * 5000 + ".mlp.up_proj.weight"
    assert layer_and_kind(name)[0] is None
    assert tensor_group(name)[0] is None


def test_fp4_scale_rules_in_the_report(tmp_path: Path) -> None:
    """An NVFP4 checkpoint's report counts clipped blocks, underflowing scales and flushed
    values under every FP4 scale rule, per worst tensor and summed (what
    lowbit.quant.block_clipping gives on the source tensors), and the page shows them."""
    from lowbit.quant.block_clipping import FP4_SCALE_RULES, fp4_block_counts
    from lowbit.view.html import render

    src = save_hf_folder(tiny_llama(seed=2), tmp_path / "src")
    q = tmp_path / "q"
    assert main(["quantize", str(src), "--to", "nvfp4", "--out", str(q)]) == 0
    rep = build_report(q, worst=1)
    ckpt = open_checkpoint(src)
    fp4 = [r for r in rep.rows if r.stored == "quantized"]
    assert rep.scale_rule_tensors == len(fp4) > 0
    sums = {c.rule: c for c in rep.scale_rules}
    assert list(sums) == list(FP4_SCALE_RULES)
    per = [fp4_block_counts(np.asarray(ckpt.get(r.name), np.float32)) for r in fp4]
    for k, rule in enumerate(FP4_SCALE_RULES):
        assert sums[rule].clipped == sum(p[k].clipped for p in per)
        assert sums[rule].flushed == sum(p[k].flushed for p in per)
        assert sums[rule].blocks == sum(p[k].blocks for p in per)
    d = rep.details[0]
    assert [c.rule for c in d.scale_rules] == list(FP4_SCALE_RULES)
    assert d.scale_rules == tuple(fp4_block_counts(np.asarray(ckpt.get(d.name), np.float32)))
    assert sums["mxfp4:ceil"].clipped == 0 < sums["mxfp4"].clipped
    page = render(rep)
    assert 'id="scale-rules"' in page and page.count("nvfp4 without tensor scale") >= 2
