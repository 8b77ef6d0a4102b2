"""Mixed precision from a sensitivity scan: the budget, the constraints, the plan file, presets."""

from __future__ import annotations

import itertools
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lowbit.errors import LowbitError
from lowbit.evaluation.sensitivity import SensitivityEntry, SensitivityResult
from lowbit.plans.mixed import (
    parse_size,
    plan_for_budget,
    preset_plan,
    tensor_group,
    use_more_bits,
)
from lowbit.plans.plan import PrecisionPlan
from lowbit.quant.scheme_text import parse_scheme

SCHEMES = ("int3:g32", "int4:g32", "int8:ch")


def _tensors(n_layers: int = 2) -> list[tuple[str, tuple[int, int], str, int]]:
    out = [("model.embed_tokens.weight", (100, 64), "F32", 100 * 64 * 4)]
    for i in range(n_layers):
        for kind, shape in (("self_attn.q_proj", (64, 64)), ("self_attn.v_proj", (32, 64)),
                            ("mlp.down_proj", (64, 128))):  # fmt: skip
            out.append((f"model.layers.{i}.{kind}.weight", shape, "F32", math.prod(shape) * 4))
        out.append((f"model.layers.{i}.input_layernorm.weight", (64,), "F32", 256))
    return out


def _scan(tensors: list[tuple[str, tuple[int, int], str, int]], damages: list[float]) -> Any:
    """A scan with each scheme's true storage (the quantizer's arithmetic) and given damages."""
    linear = [t for t in tensors if len(t[1]) == 2 and "layers" in t[0]]
    entries, k = [], 0
    for s in SCHEMES:
        scheme = parse_scheme(s)
        for name, shape, *_ in linear:
            entries.append(SensitivityEntry(name, scheme.label, math.prod(shape),
                                            scheme.tensor_bytes(shape) * 8, 1.0, damages[k]))  # fmt: skip
            k += 1
    labels = tuple(parse_scheme(s).label for s in SCHEMES)
    return SensitivityResult("m", "causal", "exact", "kl", "c", labels, tuple(entries))


def _brute(result: Any, budget_bits: float) -> float:
    table = result.table()
    best = math.inf
    for combo in itertools.product(*(list(row.values()) for row in table.values())):
        if sum(e.bits for e in combo) <= budget_bits:
            best = min(best, sum(e.damage for e in combo))
    return best


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.floats(0, 10, allow_nan=False), min_size=18, max_size=18),
    st.floats(3.6, 8.1),
)
def test_budget_is_kept_and_choice_is_optimal(damages: list[float], bpw: float) -> None:
    """The plan's bits/weight never exceeds the budget and its damage is brute force's optimum
    (6 tensors x 3 schemes, every cost a whole number of bytes)."""
    tensors = _tensors()
    result = _scan(tensors, sorted(damages, reverse=True))
    try:
        mixed = plan_for_budget(result, tensors, bits_per_weight=bpw)
    except LowbitError as e:
        assert "below the cheapest plan" in str(e)
        return
    assert mixed.bits_per_weight <= bpw
    assert mixed.quantized_bits <= mixed.budget["bits"]
    assert mixed.predicted_damage == pytest.approx(
        _brute(result, math.floor(bpw * mixed.quantized_weights)), abs=1e-9
    )
    assert mixed.allocation.gap >= 0
    # the plan file says exactly what was chosen
    applied = mixed.plan.apply(tensors)
    chosen = {r.tensor: r.scheme for r in mixed.rows}
    assert {t.name: t.label for t in applied.quantized} == chosen
    assert applied.totals()["bits_per_weight"] == pytest.approx(mixed.bits_per_weight)
    again = PrecisionPlan.from_dict(mixed.plan.to_dict())
    assert again == mixed.plan


def test_size_budget_counts_every_tensor() -> None:
    """--size counts kept tensors (embeddings, norms) as stored; the output fits."""
    tensors = _tensors()
    result = _scan(tensors, [float(i) for i in range(18, 0, -1)])
    kept = 100 * 64 * 4 + 2 * 256
    for size in (kept + 15_000, kept + 20_000, kept + 60_000):
        mixed = plan_for_budget(result, tensors, size=size)
        assert mixed.total_bytes <= size
        assert mixed.plan.apply(tensors).totals()["bytes"] == mixed.total_bytes
    with pytest.raises(LowbitError, match="below the cheapest plan"):
        plan_for_budget(result, tensors, size=kept + 14_000)


def test_constraints_pin_and_restrict() -> None:
    """A --plan rule decides first (its bits count); candidates and a minimum format restrict."""
    tensors = _tensors()
    result = _scan(tensors, [float(i) for i in range(18, 0, -1)])
    base = PrecisionPlan.from_dict({"rules": [{"match": "*.v_proj.weight", "format": "int8:ch"}]})
    mixed = plan_for_budget(result, tensors, bits_per_weight=5.0, base=base)
    pinned = [r for r in mixed.rows if r.pinned]
    assert {r.tensor for r in pinned} == {
        f"model.layers.{i}.self_attn.v_proj.weight" for i in (0, 1)
    }
    assert all(r.scheme == "int8:ch:fp32" for r in pinned)
    assert mixed.bits_per_weight <= 5.0
    assert mixed.plan.rules[0] == base.rules[0]
    only = plan_for_budget(
        result, tensors, bits_per_weight=8.1, candidates=["int3:g32", "int4:g32"]
    )
    assert {r.scheme for r in only.rows} <= {"int3:g32:fp32", "int4:g32:fp32"}
    floor = plan_for_budget(result, tensors, bits_per_weight=8.1, min_scheme="int4:g32")
    assert "int3:g32:fp32" not in {r.scheme for r in floor.rows}
    with pytest.raises(LowbitError, match="were not scanned"):
        plan_for_budget(result, tensors, bits_per_weight=5, candidates=["nf4"])
    with pytest.raises(LowbitError, match="one budget"):
        plan_for_budget(result, tensors)


def test_method_is_written_on_every_rule() -> None:
    """method="gptq" puts the method on every quantized tensor of the written plan (the
    commonest scheme too) and on the user's rules that name none; a rule's own method stays;
    without it the plan names no method."""
    tensors = _tensors()
    result = _scan(tensors, [float(i) for i in range(18, 0, -1)])
    base = PrecisionPlan.from_dict({"rules": [
        {"match": "model.layers.0.self_attn.v_proj.weight", "format": "int8:ch"},
        {"match": "model.layers.1.self_attn.v_proj.weight", "format": "int8:ch", "method": "rtn"},
        {"match": "*embed*", "format": "keep"},
    ]})  # fmt: skip
    plain = plan_for_budget(result, tensors, bits_per_weight=5.0, base=base)
    mixed = plan_for_budget(result, tensors, bits_per_weight=5.0, base=base, method="gptq")
    methods = {t.name: t.method for t in mixed.plan.apply(tensors).quantized}
    assert methods.pop("model.layers.1.self_attn.v_proj.weight") == "rtn"
    assert len(methods) == 5 and set(methods.values()) == {"gptq"}
    assert [r.scheme for r in mixed.rows] == [r.scheme for r in plain.rows]
    assert {t.method for t in plain.plan.apply(tensors).quantized} == {None, "rtn"}
    assert PrecisionPlan.from_dict(mixed.plan.to_dict()) == mixed.plan
    with pytest.raises(LowbitError, match="unknown method"):
        plan_for_budget(result, tensors, bits_per_weight=5.0, method="smoothquant")


def test_scan_of_another_model_or_missing_tensors_is_refused() -> None:
    """A scan naming tensors the model lacks, or lacking tensors the plan quantizes, is an error."""
    tensors = _tensors()
    result = _scan(tensors, [1.0] * 18)
    with pytest.raises(LowbitError, match="another model"):
        plan_for_budget(result, _tensors()[:3], bits_per_weight=5)
    with pytest.raises(LowbitError, match="lacks 3 tensor"):
        plan_for_budget(result, _tensors(3), bits_per_weight=5)


def test_use_more_bits_and_preset() -> None:
    """llama.cpp's layer choice for 30 layers; the preset promotes only V and down there."""
    assert [i for i in range(30) if use_more_bits(i, 30)] == [
        0, 1, 2, 5, 8, 11, 14, 17, 20, 23, 26, 27, 28, 29
    ]  # fmt: skip
    tensors = _tensors(16)
    applied = preset_plan("q4_k_m_like", tensors).apply(tensors)
    high = {t.name for t in applied.quantized if t.label == "int6:g128:fp32"}
    layers = [i for i in range(16) if use_more_bits(i, 16)]
    assert high == {f"model.layers.{i}.{k}.weight" for i in layers
                    for k in ("self_attn.v_proj", "mlp.down_proj")}  # fmt: skip
    assert {t.label for t in applied.quantized} == {"int6:g128:fp32", "int4:g128:fp32"}
    gguf = [("blk.3.attn_v.weight", (64, 64), "F32", 0, "model.layers.3.self_attn.v_proj.weight")]
    assert preset_plan("q4_k_m_like", gguf).rules  # a GGUF name is matched too
    with pytest.raises(LowbitError, match="unknown plan preset"):
        preset_plan("q9", tensors)


def test_parse_size_and_groups() -> None:
    """Sizes in SI and binary units; a tensor name's layer and kind."""
    assert parse_size("80MB") == 80_000_000 and parse_size("1.5GiB") == 3 * 2**29
    assert parse_size(1234) == 1234 and parse_size("2k") == 2000
    for bad in ("80 furlongs", "-3MB", "0"):
        with pytest.raises(LowbitError):
            parse_size(bad)
    assert tensor_group("model.layers.3.mlp.down_proj.weight") == (3, "down_proj")
    assert tensor_group("blk.12.attn_v.weight") == (12, "attn_v")
    assert tensor_group("encoder.layer.1.attention.self.query.weight") == (1, "query")
    assert tensor_group("lm_head.weight") == (None, "lm_head")
