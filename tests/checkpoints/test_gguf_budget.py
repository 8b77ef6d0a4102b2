"""lowbit.checkpoints.gguf.budget, lowbit.evaluation.gguf_sensitivity and `lowbit quantize
--budget/--size --out-format gguf`: llama.cpp types per tensor in exact file bytes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from lowbit.checkpoints.gguf.budget import (
    budget_options,
    file_overhead,
    parse_types,
    solve_gguf,
    type_bytes,
    write_gguf_types,
)
from lowbit.checkpoints.gguf.mix import gguf_mix_types, write_gguf_mix
from lowbit.checkpoints.opener import open_checkpoint
from lowbit.cli import main
from lowbit.errors import LowbitError
from lowbit.evaluation.gguf_sensitivity import gguf_sensitivity, roundtrip
from lowbit.evaluation.scan_samples import ScanSamples
from lowbit.ggml import blocks

gguf = pytest.importorskip("gguf")
pytest.importorskip("transformers")

from tiny_models import save_gguf, tiny_llama  # noqa: E402


def _llama(hidden: int, inter: int, tie: bool = False) -> Any:
    """A random 2-layer llama whose rows are ``hidden`` and ``inter`` values long."""
    return tiny_llama(tie=tie, hidden=hidden, inter=inter)


def _windows(n: int = 2, length: int = 24) -> ScanSamples:
    rng = np.random.default_rng(3)
    ids = rng.integers(0, 256, size=(n, length))
    return ScanSamples("test windows", windows=tuple(tuple(int(i) for i in w) for w in ids))


@pytest.fixture(scope="module")
def l256(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Rows of 256 and 512: every K-quant fits, no fallback; untied output."""
    path = tmp_path_factory.mktemp("gbudget") / "l256.gguf"
    return save_gguf(_llama(256, 512), path, embedding="F32")


@pytest.fixture(scope="module")
def scan(l256: Path) -> tuple[Any, dict, Any]:
    ckpt = open_checkpoint(l256)
    options = budget_options(ckpt, ("Q2_K", "Q4_K", "Q6_K", "Q8_0"))  # Q4_K_M's types among them
    return ckpt, options, gguf_sensitivity(ckpt, options, _windows())


def _read_back(path: Path) -> dict[str, tuple[str, int]]:
    r = gguf.GGUFReader(path)
    return {t.name: (t.tensor_type.name, int(t.n_bytes)) for t in r.tensors}


def test_size_budget_file_is_within_and_holds_the_plan(scan: Any, tmp_path: Path) -> None:
    """--size: the file written is <= the size, exactly the bytes counted, and holds the
    chosen types with the counted bytes per tensor (read back with gguf's GGUFReader)."""
    ckpt, options, sens = scan
    lo = solve_gguf(ckpt, options, sens.damages, bits_per_weight=2.7)  # near the cheapest
    size = lo.file_bytes + 120_000
    plan = solve_gguf(ckpt, options, sens.damages, size=size)
    out = write_gguf_types(ckpt, tmp_path / "b.gguf", plan)
    assert out["bytes"] <= size
    assert out["bytes"] == plan.file_bytes
    back = _read_back(tmp_path / "b.gguf")
    assert {n: t for n, (t, _) in back.items()} == plan.types
    assert {n: b for n, (_, b) in back.items()} == {r.tensor: r.nbytes for r in plan.rows}
    assert len(set(plan.types.values())) > 2  # a real mix, not one type everywhere
    # the quantized bytes are llama.cpp's of the source's floats
    n = "blk.1.ffn_down.weight"
    want = blocks.quantize(np.asarray(ckpt.get(n), np.float32), plan.types[n])
    got = gguf.GGUFReader(tmp_path / "b.gguf").get_tensor(
        [t.name for t in gguf.GGUFReader(tmp_path / "b.gguf").tensors].index(n)
    )
    assert np.asarray(got.data).tobytes() == want.tobytes()


def test_more_bytes_less_damage(scan: Any) -> None:
    """A larger budget never gives more predicted damage (exact DP at this size)."""
    ckpt, options, sens = scan
    lo = solve_gguf(ckpt, options, sens.damages, bits_per_weight=3.5)
    hi = solve_gguf(ckpt, options, sens.damages, bits_per_weight=6.0)
    assert hi.predicted_damage < lo.predicted_damage
    assert lo.bits_per_weight <= 3.5 and hi.bits_per_weight <= 6.0


def test_budget_of_a_mix_damages_no_more_than_the_mix(
    scan: Any, l256: Path, tmp_path: Path
) -> None:
    """At the bytes of llama-quantize's Q4_K_M file, the solver's choice has summed measured
    damage <= the mix's (the mix is one of the plans it chose among), in a file no larger."""
    ckpt, options, sens = scan
    mix = gguf_mix_types(ckpt, "q4_k_m")
    quantized = {n: t for n, t in mix.items() if n in options}
    assert all(t in options[n] for n, t in quantized.items())  # the mix is a candidate plan
    mix_damage = sum(sens.damages[n][t] for n, t in quantized.items())
    mix_file = write_gguf_mix(ckpt, tmp_path / "m.gguf", "q4_k_m", progress=False)
    # the byte accounting gives the mix's file size exactly
    overhead = file_overhead(ckpt)
    counted = overhead + sum(-(-type_bytes(ckpt.info(n).shape, t) // 32) * 32
                             for n, t in mix.items())  # fmt: skip
    assert counted == mix_file["bytes"]
    plan = solve_gguf(ckpt, options, sens.damages, size=mix_file["bytes"], overhead=overhead)
    assert plan.file_bytes <= mix_file["bytes"]
    assert plan.predicted_damage <= mix_damage + 1e-12
    assert plan.allocation.unit == 256  # the DP was exact


def test_damage_is_zero_for_lossless_and_grows_with_fewer_bits(scan: Any) -> None:
    """Q8_0 damages less than Q2_K on every tensor (measured, not assumed)."""
    _, _, sens = scan
    for n, d in sens.damages.items():
        assert 0 <= d["Q8_0"] < d["Q2_K"], n


def test_fallback_costs_and_measures_as_the_fallback(tmp_path: Path) -> None:
    """Rows of 64 (not whole 256-blocks): Q4_K becomes llama.cpp's Q5_0 and costs Q5_0's
    bytes; Q6_K becomes Q8_0; the tied token embedding drops K-quants (it keeps Q8_0)."""
    ckpt = open_checkpoint(save_gguf(_llama(64, 128, tie=True), tmp_path / "l64.gguf",
                                     embedding="F32"))  # fmt: skip
    options = budget_options(ckpt, parse_types(["q4_k", "Q6_K", "Q8_0"]))
    assert options["blk.0.attn_q.weight"] == {"Q5_0": ("Q4_K",), "Q8_0": ("Q6_K", "Q8_0")}
    assert options["token_embd.weight"] == {"Q8_0": ("Q8_0",)}
    assert "output.weight" not in options and "blk.0.attn_norm.weight" not in options
    shape = ckpt.info("blk.0.ffn_gate.weight").shape  # (128, 64)
    assert type_bytes(shape, "Q5_0") == 128 * 2 * 22
    damages = {n: {t: (1.0 if t == "Q5_0" else 0.1) for t in o} for n, o in options.items()}
    cheapest = solve_gguf(ckpt, options, damages, bits_per_weight=6.06)
    assert {t for n, t in cheapest.types.items() if n in options} == {"Q5_0", "Q8_0"}
    assert cheapest.types["blk.0.ffn_gate.weight"] == "Q5_0"
    out = write_gguf_types(ckpt, tmp_path / "f.gguf", cheapest)
    back = _read_back(tmp_path / "f.gguf")
    assert back["blk.0.ffn_gate.weight"] == ("Q5_0", 128 * 2 * 22)
    assert out["bytes"] == Path(tmp_path / "f.gguf").stat().st_size
    with pytest.raises(LowbitError, match="fit none of the candidates"):
        budget_options(ckpt, ["Q4_K"])  # the embedding cannot hold Q4_K and has no fallback
    # the trial measures the fallback's rounding: Q5_0's dequantized values
    w = np.asarray(ckpt.get("blk.0.ffn_gate.weight"), np.float32)
    np.testing.assert_array_equal(roundtrip(w, "Q5_0"), blocks.dequantize(
        blocks.quantize(w, "Q5_0"), "Q5_0").reshape(w.shape))  # fmt: skip


def test_bad_inputs_are_errors(scan: Any) -> None:
    """Unknown types, a budget below the smallest candidates' total, no budget."""
    ckpt, options, sens = scan
    with pytest.raises(LowbitError, match="unknown GGUF type 'Q7_K'"):
        parse_types(["Q4_K", "Q7_K"])
    with pytest.raises(LowbitError, match="below the smallest candidates' total"):
        solve_gguf(ckpt, options, sens.damages, size=100_000)
    with pytest.raises(LowbitError, match="below the smallest candidates' total"):
        solve_gguf(ckpt, options, sens.damages, bits_per_weight=2.0)
    with pytest.raises(LowbitError, match="one budget"):
        solve_gguf(ckpt, options, sens.damages)


def _one_line(capsys: pytest.CaptureFixture[str], argv: list[str], needle: str) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert needle in err, err


def test_cli_bad_inputs(l256: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Each bad GGUF-budget command is one LowbitError line (exit 2), before any trial."""
    base = ["quantize", str(l256), "--out-format", "gguf", "--out", str(tmp_path / "x.gguf")]
    _one_line(capsys, [*base, "--size", "1MB", "--candidates", "q4_k,q7_k"], "unknown GGUF type")
    _one_line(
        capsys,
        [*base, "--size", "1MB", "--candidates", "q4_k,int4:g128"],
        "candidates mix GGUF types",
    )
    _one_line(capsys, [*base, "--budget", "q4_k_m_like"], "a number of bits per quantized")
    _one_line(capsys, [*base, "--size", "1MB", "--method", "awq"], "no other --method")
    _one_line(capsys, [*base, "--size", "1MB", "--budget", "4"], "not both")
    assert not (tmp_path / "x.gguf").exists()


def test_cli_size_json(l256: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`lowbit quantize --size N --out-format gguf --json`: the file is <= N; per tensor the
    type, bytes and damage it reports are what the file holds."""
    out = tmp_path / "c.gguf"
    size = 800_000
    rc = main(["quantize", str(l256), "--size", str(size), "--out-format", "gguf", "--out",
               str(out), "--candidates", "Q3_K,Q6_K", "--calib-samples", "1",
               "--calib-len", "16", "--json"])  # fmt: skip
    assert rc == 0
    doc = json.loads(capsys.readouterr().out)
    assert out.stat().st_size == doc["bytes"] == doc["file_bytes"] <= size
    back = _read_back(out)
    for row in doc["tensors"]:
        assert back[row["tensor"]] == (row["type"], row["bytes"]), row
        assert (row["damage"] is None) == (row["tensor"].endswith("norm.weight"))
        if row["damage"] is not None:  # the chosen option's damage, among all measured
            assert doc["damages"][row["tensor"]][row["type"]] == row["damage"]
            assert set(doc["damages"][row["tensor"]]) == {"Q3_K", "Q6_K"}
    assert abs(doc["file_bits_per_weight"] - 8 * doc["file_bytes"] / sum(
        int(np.prod(t.shape)) for t in gguf.GGUFReader(out).tensors)) < 1e-9  # fmt: skip
    assert {t for t, _ in back.values()} <= {"Q3_K", "Q6_K", "F32"}


def test_importance_vectors_checked_as_llama_quantize(l256: Path) -> None:
    """--imatrix: each tensor's vector must have one weight per column (a wrong token
    embedding is quantized without one); a matrix naming no tensor is an error."""
    from lowbit.checkpoints.gguf.budget import budget_vectors

    ckpt = open_checkpoint(l256)
    names = list(budget_options(ckpt, ["Q4_K"]))
    good = {"blk.0.attn_q.weight": np.ones(256), "token_embd.weight": np.ones(3)}
    got = budget_vectors(ckpt, names, good)
    assert list(got) == ["blk.0.attn_q.weight"] and got["blk.0.attn_q.weight"].dtype == np.float32
    with pytest.raises(LowbitError, match="has 3 values"):
        budget_vectors(ckpt, names, {"blk.0.attn_q.weight": np.ones(3)})
    with pytest.raises(LowbitError, match="names none"):
        budget_vectors(ckpt, names, {"other.weight": np.ones(256)})
    # the trial rounds with the vector, as the writer does
    w = np.asarray(ckpt.get("blk.0.attn_q.weight"), np.float32)
    im = np.linspace(0.1, 5.0, 256, dtype=np.float32)
    with_im = blocks.dequantize(blocks.quantize(w, "Q4_K", imatrix=im), "Q4_K").reshape(w.shape)
    np.testing.assert_array_equal(roundtrip(w, "Q4_K", im), with_im)
    assert not np.array_equal(roundtrip(w, "Q4_K"), with_im)
