"""lowbit._results: result objects show one line, JSON, a Jupyter table and a DataFrame
(SensitivityResult, GgufSensitivity, Imatrix)."""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest

from lowbit.calibration.imatrix import Imatrix
from lowbit.errors import LowbitError
from lowbit.evaluation.gguf_sensitivity import GgufSensitivity
from lowbit.evaluation.sensitivity_result import SensitivityEntry, SensitivityResult


def _scan(tensors: int) -> SensitivityResult:
    schemes = ("int4:g32:fp32", "int8:ch:fp32")
    entries = tuple(
        SensitivityEntry(
            f"model.layers.{i}.mlp.up_proj.weight", s, 4096, 4096 * b, 0.5 * i, 0.1 * i
        )
        for i in range(tensors)
        for s, b in zip(schemes, (4, 8), strict=True)
    )
    return SensitivityResult(
        model="m", kind="causal", measure="exact", metric="KL", calibration="text",
        schemes=schemes, entries=entries, seconds={"trials": 2.0, "build": 1.0},
    )  # fmt: skip


def _imatrix(weights: int) -> Imatrix:
    rng = np.random.default_rng(0)
    sums = {f"blk.{i}.ffn_up.weight": rng.random(576).astype(np.float32) for i in range(weights)}
    counts = {k: np.array([512.0], np.float32) for k in sums}
    return Imatrix(sums=sums, counts=counts, dataset="calib.txt", chunks=4, chunk_size=128)


def test_reprs_are_one_short_line() -> None:
    """However much they hold (a 135 M model's scan and imatrix ran to 89 k and 1.7 M
    characters), the reprs are one line saying what they hold."""
    scan, imat = _scan(3000), _imatrix(400)
    gs = GgufSensitivity({"blk.0.ffn_up.weight": {"Q4_K": 0.1, "Q6_K": 0.01}}, "text")
    for obj, want in [
        (scan, "SensitivityResult(3000 tensors x 2 schemes (int4:g32:fp32, int8:ch:fp32), 6000 "
               "trials, exact (causal), model='m', 3.0 s)"),
        (imat, "Imatrix(400 weights, 4 chunks x 128 tokens, dataset='calib.txt')"),
        (gs, "GgufSensitivity(1 tensors x 2 types (Q4_K, Q6_K), calibration='text')"),
    ]:  # fmt: skip
        assert repr(obj) == want


def test_to_json_round_trips_the_scan() -> None:
    scan = _scan(3)
    d = json.loads(scan.to_json())
    assert d == json.loads(json.dumps(scan.to_dict()))
    assert SensitivityResult.from_dict(d).to_dict() == scan.to_dict()


def test_html_table_shows_first_rows() -> None:
    """The Jupyter table: a header of the row keys, at most 20 rows, a count of the rest."""
    html = _scan(30)._repr_html_()
    assert html.count("<tr>") == 21  # header + 20 rows
    assert "<th>tensor</th>" in html and "<th>damage</th>" in html and "<th>score</th>" in html
    assert "... 40 more rows" in html
    small = _imatrix(2)._repr_html_()
    assert small.count("<tr>") == 3 and "more rows" not in small
    assert "<td>blk.1.ffn_up.weight</td><td>576</td><td>512</td>" in small


def test_imatrix_importance_and_dict() -> None:
    """importance() is sums / counts as llama-quantize uses it (ones where nothing was
    counted); to_dict has a row per weight, and the arrays on request."""
    imat = _imatrix(2)
    name = "blk.0.ffn_up.weight"
    assert np.array_equal(imat.importance(name), imat.sums[name] / np.float32(512))
    imat.counts[name] = np.array([0.0], np.float32)
    assert np.array_equal(imat.importance(name), np.ones(576, np.float32))
    d = imat.to_dict()
    assert [r["weight"] for r in d["weights"]] == list(imat.sums) and "sums" not in d
    full = json.loads(imat.to_json())
    assert full["chunks"] == 4
    assert imat.to_dict(arrays=True)["sums"][name] == imat.sums[name].tolist()
    with pytest.raises(LowbitError, match="no 'x'"):
        imat.importance("x")


def test_to_pandas() -> None:
    """One DataFrame row per trial; without pandas, an ImportError naming the install."""
    scan = _scan(4)
    if importlib.util.find_spec("pandas") is None:
        with pytest.raises(ImportError, match="pip install pandas"):
            scan.to_pandas()
        return
    df = scan.to_pandas()
    assert len(df) == 8 and list(df["scheme"][:2]) == list(scan.schemes)
    assert _imatrix(3).to_pandas()["columns"].tolist() == [576] * 3
