"""The planner: weight bytes with scales, KV cache, activations, training, fit and speed."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from contextlib import redirect_stdout
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lowbit
from lowbit.checkpoints.streaming import checkpoint_tensors
from lowbit.cli import main
from lowbit.errors import LowbitError
from lowbit.planning.estimate import (
    TRAINING_REGIMES,
    compute_precision,
    inference_activation_bytes,
    kv_cache_bytes,
    plan,
    training_activation_bytes,
)
from lowbit.planning.hardware import load_hardware, select_devices
from lowbit.planning.modelspec import ModelSpec, TensorInfo
from lowbit.plans.plan import PrecisionPlan
from lowbit.plans.rules import Rule, load_plan_file, parse_rule
from lowbit.quant.scheme import Cast, Scheme
from lowbit.quant.scheme_text import parse_scheme
from strategies import granularities, model_shapes, quant_arrays

CONFIGS = Path(__file__).parents[1] / "fixtures" / "configs"
REGIMES = {r.name: r for r in TRAINING_REGIMES}

# A tiny llama: hidden 8, 2 layers, 2 query heads of 4, 1 KV head, MLP 16, vocab 10.
TINY = {
    "model_type": "llama", "hidden_size": 8, "num_hidden_layers": 2, "num_attention_heads": 2,
    "num_key_value_heads": 1, "intermediate_size": 16, "vocab_size": 10,
    "tie_word_embeddings": False,
}  # fmt: skip

# One made-up device with round numbers, so the speed bounds can be checked by hand.
TEST_DEVICE = {
    "id": "test-dev", "name": "Test device", "memory_gb": 1, "bandwidth_gbs": 1000,
    "tflops": {"fp32": 10, "bf16": 100, "fp16": 100}, "source": "tests",
}  # fmt: skip


@pytest.fixture
def hw_file(tmp_path: Path) -> Path:
    p = tmp_path / "hw.json"
    p.write_text(json.dumps({"devices": [TEST_DEVICE]}))
    return p


def run_cli(*argv: str) -> tuple[int, str]:
    buf = io.StringIO()
    with redirect_stdout(buf):
        rc = main(list(argv))
    return rc, buf.getvalue()


# ---- weight schemes --------------------------------------------------------------------


def test_per_billion_table_is_exact() -> None:
    """1B parameters: 4 / 2 / 1 / 0.5 GB in fp32 / bf16 / int8 / int4, to the byte (+ the one
    FP32 scale a per-channel layout gives a 1-D count); NF4 in blocks of 64: 4.5 bits."""
    p = lowbit.plan("1B")
    got = {r.label: r.weight_bytes for r in p.rows}
    assert got["fp32"] == 4 * 10**9
    assert got["bf16"] == got["fp16"] == 2 * 10**9
    assert got["int8:ch:fp32"] == got["fp8_e4m3:ch:fp32"] == 10**9 + 4
    assert got["int4:ch:fp32"] == got["fp4:ch:fp32"] == 5 * 10**8 + 4
    assert got["nf4:g64:fp32"] == 10**9 * 4.5 / 8
    assert p.row("int8") is p.row("int8:ch:fp32")


@pytest.mark.parametrize(
    ("spec", "bits"),
    [("int4:g128:fp16", 4.125), ("int4:g128:fp16:asym", 4 + 16 / 128 + 4 / 128),
     ("nf4:g64", 4.5), ("mxfp4", 4.25), ("mxfp6", 6.25), ("mxfp8", 8.25), ("mxint8", 8.25),
     ("q8_0", 8.5), ("q4_0", 4.5), ("q5_0", 5.5), ("int8:ch:fp16", 8.0), ("bf16", 16.0),
     ("fp32", 32.0), ("int3:g64:bf16:asym", 3 + 19 / 64)],
)  # fmt: skip
def test_scale_aware_bits_at_one_billion(spec: str, bits: float) -> None:
    """Scaled schemes cost element bits + (scale + zero point) bits per group, exactly."""
    row = plan(10**9, precisions=[spec]).rows[0]
    if "ch" not in spec:  # per-channel overhead depends on the row length
        assert row.bits_per_weight == bits
    assert parse_scheme(spec).bits_per_value == bits


def test_nf4_double_quant_by_hand() -> None:
    """QLoRA double quantization: 8-bit scales, one FP32 per 256 of them, one FP32 offset."""
    n = 10**9
    scales = n // 64
    expect_bits = 4 * n + 8 * scales + -(-scales // 256) * 32 + 32
    row = plan(n, precisions=["nf4:g64:dq"]).rows[0]
    assert row.weight_bytes == expect_bits // 8
    assert abs(row.bits_per_weight - 4.127) < 1e-3
    assert parse_scheme("nf4:g64:dq").bits_per_value == 4 + 8 / 64 + 32 / (64 * 256)


def test_double_quant_without_groups() -> None:
    """``nf4:dq`` means QLoRA's blocks of 64 (as the dict form does); dq on other formats
    is refused, naming NF4."""
    assert parse_scheme("nf4:dq") == parse_scheme("nf4:g64:dq")
    assert parse_scheme("nf4:dq") == parse_scheme({"format": "nf4", "double_quant": True})
    with pytest.raises(LowbitError, match="NF4 option"):
        parse_scheme("int4:dq")


@pytest.mark.parametrize(
    ("spec", "why"),
    [("q4_1", "FP16 minimum"), ("q5_1", "FP16 minimum"),
     ("int4:g16:e4m3", "scales cannot be stored in float8_e4m3fn")],
)  # fmt: skip
def test_planner_refuses_what_the_quantizer_cannot_make(spec: str, why: str) -> None:
    """q4_1/q5_1 and E4M3 scales without a tensor scale are refused by plan, as by quantize,
    with the reason."""
    with pytest.raises(LowbitError, match=why):
        plan(10**9, precisions=[spec])
    rc, _ = run_cli("plan", "--params", "1B", "--precisions", spec)
    assert rc == 2


@pytest.mark.parametrize(
    ("spec", "shape", "nbytes"),
    [("int4:g64:fp16", (3, 130), 195 + 18),  # 3 rows x ceil(130/64)=3 groups of fp16
     ("int4:g64:fp16:asym", (3, 130), 195 + 18 + 5),  # + 9 four-bit zero points = 36 bits
     ("int8:ch:fp32", (5, 7), 35 + 20),  # one fp32 scale per row
     ("fp8_e4m3:t", (5, 7), 35 + 4),  # one fp32 scale per tensor
     ("mxfp4", (2, 33), 33 + 4),  # 66 nibbles; 2 rows x 2 blocks of E8M0
     ("int2:t", (7,), 2 + 4), ("int3:t", (3,), 2 + 4),  # codes packed to whole bytes
     ("int2", (7,), 2 + 7 * 4)],  # per channel on a 1-D tensor: a scale per value, as stored
)  # fmt: skip
def test_tensor_bytes_by_hand(spec: str, shape: tuple[int, ...], nbytes: int) -> None:
    """Small tensors' bytes, worked out by hand: codes, then scales, then zero points."""
    assert parse_scheme(spec).tensor_bytes(shape) == nbytes


@settings(max_examples=40, deadline=None)
@given(data=st.data(), x=quant_arrays())
def test_tensor_bytes_equal_quantized_nbytes(data: st.DataObject, x: object) -> None:
    """The planner's bytes equal what lowbit.quantize stores, for any shape and granularity."""
    fmt = data.draw(st.sampled_from(["int4", "int8", "uint4", "int2", "nf4", "fp8_e4m3", "fp4"]))
    kw = data.draw(granularities(x.shape))  # type: ignore[attr-defined]
    if fmt.startswith(("int", "uint")):
        kw["symmetric"] = data.draw(st.booleans())
    kw["scale_format"] = data.draw(st.sampled_from(["float32", "float16", "bfloat16"]))
    if fmt == "nf4" and kw.get("group_size") and kw["scale_format"] == "float32":
        kw["double_quant"] = data.draw(st.booleans())
    scheme = Scheme(format=fmt, **kw)
    try:  # data up to 2**31 can need a scale beyond float16's: that is an error now
        qt = lowbit.quantize(x, scheme, underflow="ignore")
    except LowbitError as exc:
        assert "overflows float16" in str(exc) and kw["scale_format"] == "float16"
        return
    assert scheme.tensor_bytes(x.shape) == qt.nbytes  # type: ignore[attr-defined]


@pytest.mark.parametrize("fmt", ["mxfp4", "mxfp6_e2m3", "mxfp8_e5m2", "mxint8"])
def test_mx_bytes_equal_quantized_nbytes(fmt: str) -> None:
    """MX blocks: 32 elements + one E8M0 per block, as lowbit.quantize stores them."""
    import numpy as np

    x = np.linspace(-3, 3, 5 * 70, dtype=np.float32).reshape(5, 70)
    assert Scheme(format=fmt).tensor_bytes(x.shape) == lowbit.quantize(x, fmt).nbytes


def test_scheme_matches_lowbit_scheme_bits() -> None:
    """A lowbit.Scheme (object or to_dict) parses to itself."""
    for kw in [{"format": "int4", "group_size": 128, "scale_format": "fp16"},
               {"format": "nf4", "double_quant": True}, {"format": "mxfp4"},
               {"format": "int4", "group_size": 32, "symmetric": False}]:  # fmt: skip
        s = Scheme(**kw)
        assert parse_scheme(s) is s
        assert parse_scheme(s.to_dict()) == s


@pytest.mark.parametrize(
    "spec",
    ["bf16", "fp8_e5m2", "int4:g128:fp16", "int4:g128:fp16:asym", "int4:g32:fp16:asym",
     "nf4:g64:fp32:dq", "int8:ch:fp16", "int8:ch:ax1:fp32", "fp8_e4m3:t:fp32", "mxfp6_e2m3",
     "q4_0", "int4:g64:ax0:bf16"],
)  # fmt: skip
def test_label_round_trip(spec: str) -> None:
    """Every scheme's label parses back to the same scheme."""
    s = parse_scheme(spec)
    assert parse_scheme(s.label) == s
    assert parse_scheme(s.to_dict()).tensor_bytes((64, 256)) == s.tensor_bytes((64, 256))


@pytest.mark.parametrize(
    ("spec", "match"),
    [("int4:g0", "group_size must be >= 1"), ("int4:q7", "unknown token 'q7'"),
     ("float99", "unknown format"), ("mxfp4:g16", "MX block format"),
     ("bf16:ch:fp16", None), ({"format": "int4", "colour": 1}, "unknown field")],
)  # fmt: skip
def test_bad_schemes(spec: object, match: str | None) -> None:
    """Bad schemes are LowbitErrors naming the bad part (a full but odd scheme is allowed)."""
    if match is None:
        parse_scheme(spec)
        return
    with pytest.raises(LowbitError, match=match):
        parse_scheme(spec)


# ---- KV cache and activations ----------------------------------------------------------


def test_kv_cache_by_hand() -> None:
    """KV bytes = 2 * layers * kv_heads * head_dim * context * batch * bytes, GQA-aware."""
    from lowbit.planning.archs import spec_from_config

    spec = spec_from_config(TINY)
    assert kv_cache_bytes(spec, 3, 2, parse_scheme("bf16")) == 2 * 2 * 1 * 4 * 3 * 2 * 2
    smol = spec_from_config(CONFIGS / "smollm2-135m.json")
    expect = 2 * 30 * 3 * 64 * 8192 * 8
    assert kv_cache_bytes(smol, 8192, 8, parse_scheme("bf16")) == 2 * expect
    assert kv_cache_bytes(smol, 8192, 8, parse_scheme("fp8:t")) == expect + 4
    # int4 alone is per channel: one fp32 scale per 64-value head vector
    assert kv_cache_bytes(smol, 8192, 8, parse_scheme("int4")) == expect * (4 + 32 / 64) / 8
    # int4 with an fp16 scale per 64-value head vector: 4 + 16/64 bits
    assert kv_cache_bytes(smol, 8192, 8, parse_scheme("int4:g64:fp16")) == expect * 4.25 / 8


def test_kv_cache_options_in_plan() -> None:
    """The plan lists the KV cache at bf16, fp8, int8 and int4 and uses the one asked for."""
    p = plan(CONFIGS / "meta-llama-3-8b.json", context=8192, batch=8, kv="fp8")
    per_row = 1 + 4 / 128  # one fp32 scale per 128-value head vector (the weight layout)
    assert p.kv_options == {"bf16": 8 * 2**30, "fp8_e4m3:ch:fp32": 4 * 2**30 * per_row,
                            "int8:ch:fp32": 4 * 2**30 * per_row,
                            "int4:ch:fp32": 2 * 2**30 + 4 * 2**30 * (per_row - 1)}  # fmt: skip
    assert all(r.kv_bytes == 4 * 2**30 * per_row for r in p.rows)


def test_inference_activations_by_hand() -> None:
    """B*S*(2h + 3i)*2 bytes (gated MLP) + B*V*4 for the last logits."""
    from lowbit.planning.archs import spec_from_config

    spec = spec_from_config(TINY)
    assert inference_activation_bytes(spec, 3, 2) == 2 * 3 * (2 * 8 + 3 * 16) * 2 + 2 * 10 * 4


@pytest.mark.parametrize(
    ("regime", "ckpt", "expect"),
    [("mixed_bf16", False, 3216), ("mixed_bf16", True, 1968), ("fp8", False, 2736),
     ("fp32", False, 6192), ("adam8bit", True, 1968)],
)  # fmt: skip
def test_training_activations_by_hand(regime: str, ckpt: bool, expect: int) -> None:
    """Saved activations on the tiny llama (h 8, q 8, kv 4, i 16, V 10; B 2, S 3), by hand.

    Per layer E = 4h+2q+2kv+4i = 120 values, 40 of them GEMM inputs; mixed: 240 B/token/layer;
    + embedding output h*a per token; + B*S*V*4 logits (240). Checkpointing keeps h*a per
    layer plus one layer's E.
    """
    from lowbit.planning.archs import spec_from_config

    spec = spec_from_config(TINY)
    assert training_activation_bytes(spec, 3, 2, REGIMES[regime], ckpt) == expect


def test_training_state_bytes_per_param() -> None:
    """Adam: FP32 16 B/param; mixed 2+2+4+8 = 16; FP8 1+2+4+8 = 15; 8-bit Adam about 10."""
    p = plan("1B", train=True)
    totals = {(t.regime.name, t.checkpointing): t for t in p.training}
    assert totals[("fp32", False)].total_bytes == 16 * 10**9
    mixed = totals[("mixed_bf16", True)]
    assert (mixed.weights, mixed.grads, mixed.master, mixed.optimizer) == (
        2 * 10**9, 2 * 10**9, 4 * 10**9, 8 * 10**9,
    )  # fmt: skip
    assert totals[("fp8", False)].total_bytes == 15 * 10**9
    assert totals[("adam8bit", False)].optimizer == 2 * 10**9 + 2 * 4 * 10**9 // 2048
    assert mixed.activations is None  # a bare count has no architecture


# ---- mixed plans -----------------------------------------------------------------------


def test_keep_embeddings_bf16() -> None:
    """Embeddings and lm_head in bf16, the rest int4: bytes add up by component."""
    p = plan(CONFIGS / "llama-2-7b-hf.json", precisions=["int4"], keep_embeddings="bf16")
    row = p.rows[0]
    emb = 32000 * 4096
    assert row.component_bytes["embeddings"] == row.component_bytes["lm_head"] == 2 * emb
    # int4 alone is per output channel: codes + one fp32 scale per row (a 1-D tensor: one)
    others = [t for t in p.model.parameters if t.component not in ("embeddings", "lm_head")]
    scales = sum(t.shape[0] if len(t.shape) == 2 else 1 for t in others)
    assert row.weight_bytes == 4 * emb + sum(t.numel // 2 for t in others) + 4 * scales


def test_plan_file_prices_what_quantize_writes(tmp_path: Path) -> None:
    """A plan file is priced tensor by tensor as PrecisionPlan decides it (the plan lowbit
    quantize --plan applies): the same bytes as the applied plan, rows replacing the default."""
    from lowbit.checkpoints.streaming import open_model

    f = tmp_path / "plan.json"
    f.write_text(json.dumps({"version": 1, "default": "q8_0", "rules": [
        {"match": "token_embd.weight", "format": "int8:ch"}, {"ndim": 1, "format": "fp32"}]}))  # fmt: skip
    p = plan("smollm2", rules=f)
    assert [r.label for r in p.rows] == ["q8_0"]
    tensors = checkpoint_tensors(open_model("smollm2"))
    for row, spec in zip(plan("smollm2", rules=f, precisions=["q8_0", "int4:g64"]).rows,
                         ["q8_0", "int4:g64"], strict=True):  # fmt: skip
        applied = PrecisionPlan.from_file(f).with_default(parse_scheme(spec)).apply(tensors)
        assert row.weight_bytes == sum(t.nbytes for t in applied.tensors)
    assert (
        p.rows[0].weight_bytes == plan("smollm2", rules=f, precisions=["q8_0"]).rows[0].weight_bytes
    )


def test_plan_file_yaml_and_first_match(tmp_path: Path) -> None:
    """YAML plan files work; the first matching rule wins; rules apply to every row."""
    pytest.importorskip("yaml")
    f = tmp_path / "plan.yaml"
    f.write_text(
        "rules:\n"
        "  - {match: '*mlp.down_proj*', format: int8:ch:fp16}\n"
        "  - {component: mlp, format: bf16}\n"
    )
    rules, default, activations = load_plan_file(f)
    assert default is None and activations is None and len(rules) == 2
    p = plan(CONFIGS / "tinyllama-1.1b.json", precisions=["int4", "fp8"], rules=f)
    down = 22 * (2048 * 5632 + 2048 * 2)  # int8 codes + fp16 scale per row
    gate_up = 22 * 2 * 5632 * 2048 * 2
    for row in p.rows:
        assert row.component_bytes["mlp"] == down + gate_up


@pytest.mark.parametrize(
    ("rule", "match"),
    [({"match": "*", "format": "int4", "dtype": "x"}, "unknown rule field"),
     ({"format": "int4"}, "needs match, regex, component or ndim"),
     ({"component": "heads", "format": "int4"}, "unknown component"),
     ({"match": "*"}, "needs a format")],
)  # fmt: skip
def test_bad_rules(rule: dict, match: str) -> None:
    """Malformed rules say what is wrong."""
    with pytest.raises(LowbitError, match=match):
        parse_rule(rule)


def test_rule_matching_nothing_warns() -> None:
    """A rule that matches no tensor (a typo in a glob, embeddings of a bare count) warns."""
    with pytest.warns(UserWarning, match="matches no tensor"):
        plan("1B", precisions=["int4"], keep_embeddings="bf16")


def test_bad_plan_file(tmp_path: Path) -> None:
    """A plan file that is not JSON, or has unknown keys, is a clear error."""
    f = tmp_path / "p.json"
    f.write_text("{oops")
    with pytest.raises(LowbitError, match="not valid JSON"):
        load_plan_file(f)
    f.write_text('{"rulez": []}')
    with pytest.raises(LowbitError, match="unknown key"):
        load_plan_file(f)


@settings(max_examples=60, deadline=None)
@given(
    shapes=model_shapes(), spec=st.sampled_from(["int4:g32:fp16", "bf16", "mxfp4", "nf4:g64:dq"])
)
def test_weight_bytes_are_additive(shapes: list[tuple[int, ...]], spec: str) -> None:
    """A plan's weight bytes are the sum over tensors and over components, for any shapes."""
    comps = ["embeddings", "attention", "mlp", "norms"]
    tensors = tuple(
        TensorInfo(f"t{i}", s, comps[i % 4]) for i, s in enumerate(shapes)
    )  # fmt: skip
    spec_all = ModelSpec(name="m", source="params", tensors=tensors)
    row = plan(spec_all, precisions=[spec], devices=["h100"]).rows[0]
    scheme = parse_scheme(spec)
    assert row.weight_bytes == sum(scheme.tensor_bytes(s) for s in shapes)
    assert sum(row.component_bytes.values()) == row.weight_bytes
    halves = [ModelSpec(name="a", source="params", tensors=tensors[::2]),
              ModelSpec(name="b", source="params", tensors=tensors[1::2])]  # fmt: skip
    assert row.weight_bytes == sum(
        plan(h, precisions=[spec], devices=["h100"]).rows[0].weight_bytes
        for h in halves
        if h.tensors
    )
    assert plan(spec_all, precisions=["int8"], devices=["h100"]).rows[0].weight_bytes >= (
        plan(spec_all, precisions=["int4"], devices=["h100"]).rows[0].weight_bytes
    )


# ---- fit and speed ---------------------------------------------------------------------


def test_speed_bounds_by_hand(hw_file: Path) -> None:
    """Decode = bandwidth x n / bytes per token; prefill = peak x n / (2 x params)."""
    p = plan("1B", precisions=["bf16", "fp32"], devices=["test-dev"], hardware_file=hw_file)
    bf16, fp32 = p.rows
    assert bf16.devices_needed["test-dev"] == 3  # 2e9 B on 0.9 GiB devices
    assert bf16.decode_tokens_per_s["test-dev"] == 3 * 1e12 / 2e9
    assert bf16.prefill_tokens_per_s["test-dev"] == 3 * 100e12 / 2e9
    assert fp32.compute_precision["test-dev"] == "fp32"
    assert fp32.devices_needed["test-dev"] == 5  # 4e9 / (0.9 * 2^30) = 4.14
    assert fp32.prefill_tokens_per_s["test-dev"] == 5 * 10e12 / 2e9


def test_decode_counts_the_kv_cache(hw_file: Path) -> None:
    """With a context, each decode step also reads the whole KV cache."""
    p = plan(CONFIGS / "smollm2-135m.json", precisions=["bf16"], context=4096, batch=4,
             devices=["test-dev"], hardware_file=hw_file, memory_fraction=1.0)  # fmt: skip
    r = p.rows[0]
    kv = 2 * 30 * 3 * 64 * 4096 * 4 * 2
    assert r.kv_bytes == kv
    n = r.devices_needed["test-dev"]
    assert n == -(-r.total_bytes // 2**30)
    assert r.decode_tokens_per_s["test-dev"] == n * 1e12 / (2 * 134_515_008 + kv)


def test_encoder_has_no_decode_bound() -> None:
    """An encoder gets a prefill (encode) bound but no decode bound."""
    r = plan("minilm", precisions=["fp32"], context=128, devices=["h100"]).rows[0]
    assert r.decode_tokens_per_s["h100-sxm"] is None and r.kv_bytes is None
    assert r.prefill_tokens_per_s["h100-sxm"] > 0


def test_compute_precision_fallbacks() -> None:
    """FP8 runs as BF16 on A100; MXFP4 runs in FP4 on B200; weight-only INT4 in BF16; CPUs FP32."""
    cat = load_hardware()
    a100, b200, h100, cpu = select_devices(["a100-80gb", "b200", "h100-sxm", "cpu-desktop"], cat)
    assert compute_precision(parse_scheme("fp8"), a100) == "bf16"
    assert compute_precision(parse_scheme("fp8"), h100) == "fp8"
    assert compute_precision(parse_scheme("mxfp4"), b200) == "fp4"
    assert compute_precision(parse_scheme("mxfp4"), h100) == "bf16"
    assert compute_precision(parse_scheme("int4:g128:fp16"), h100) == "bf16"
    assert compute_precision(parse_scheme("int8:ch:fp16"), a100) == "int8"
    assert compute_precision(parse_scheme("bf16"), cpu) == "fp32"


# ---- hardware catalog ------------------------------------------------------------------


def test_catalog_rows() -> None:
    """Every required device is there with a source; A100 figures as NVIDIA states them."""
    cat = {d.id: d for d in load_hardware()}
    for want in ["a100-40gb", "a100-80gb", "h100-sxm", "h200", "b200", "l4", "l40s", "rtx4090",
                 "rtx3090", "mi300x", "m2-ultra", "cpu-desktop"]:  # fmt: skip
        assert want in cat and cat[want].source
    a100 = cat["a100-80gb"]
    assert (a100.peak("fp32"), a100.peak("tf32"), a100.peak("bf16"), a100.peak("fp16")) == (
        19.5, 156, 312, 312)  # fmt: skip
    assert (cat["a100-40gb"].memory_gb, a100.memory_gb) == (40, 80)
    assert cat["b200"].peak("fp4") and cat["h100-sxm"].peak("fp8")


def test_user_hardware_file_overrides(tmp_path: Path) -> None:
    """User rows add devices, replace rows with the same id, and are validated."""
    f = tmp_path / "hw.json"
    f.write_text(json.dumps([{**TEST_DEVICE, "id": "h100-sxm", "memory_gb": 94}, TEST_DEVICE]))
    cat = {d.id: d for d in load_hardware(f)}
    assert cat["h100-sxm"].memory_gb == 94 and "test-dev" in cat
    f.write_text(json.dumps([{**TEST_DEVICE, "tflops": {"fp9": 1}}]))
    with pytest.raises(LowbitError, match="unknown precision 'fp9'"):
        load_hardware(f)
    f.write_text(json.dumps([{"name": "x"}]))
    with pytest.raises(LowbitError, match="lacks memory_gb, bandwidth_gbs, tflops"):
        load_hardware(f)


def test_select_devices() -> None:
    """Devices are found by id, name or unique prefix; ambiguity and misses are errors."""
    cat = load_hardware()
    assert [d.id for d in select_devices(["H100", "mi300x"], cat)] == ["h100-sxm", "mi300x"]
    with pytest.raises(LowbitError, match="matches several"):
        select_devices(["a100"], cat)
    with pytest.raises(LowbitError, match="matches no device"):
        select_devices(["tpu"], cat)


# ---- CLI -------------------------------------------------------------------------------


def test_cli_params_1b_prints_the_table() -> None:
    """`lowbit plan --params 1B`: 4/2/1/0.5 GB rows with scaled figures beside them."""
    rc, out = run_cli("plan", "--params", "1B")
    assert rc == 0
    lines: dict[str, list[str]] = {}
    for ln in out.split("Fit")[0].splitlines():  # the weights table comes first
        if ln.strip():
            lines.setdefault(ln.split()[0], ln.split())
    assert lines["fp32"][1:3] == ["32", "4.000"]
    assert lines["bf16"][1:3] == ["16", "2.000"]
    assert lines["int8:ch:fp32"][1:3] == ["8", "1.000"]
    assert lines["int4:ch:fp32"][1:3] == ["4", "0.500"]
    assert lines["int4:ch:fp32"][4:7] == ["int4:g128:fp16", "4.125", "0.516"]
    assert "nvfp4" not in out
    assert "UPPER BOUND" in out


def test_cli_config_inference_and_training() -> None:
    """--config --context --batch prints KV cache, fit, both speed bounds; --train the states."""
    rc, out = run_cli("plan", "--config", str(CONFIGS / "meta-llama-3-8b.json"), "--context",
                      "8192", "--batch", "8", "--train", "--precisions", "bf16,int4:g128:fp16")  # fmt: skip
    assert rc == 0
    assert (
        "KV cache GB by precision: bf16 8.590, fp8_e4m3:ch:fp32 4.429, int8:ch:fp32 4.429, "
        "int4:ch:fp32 2.282" in out
    )
    assert "8 KV heads x 128 of 32 query heads" in out
    assert "Decode tokens/s per sequence, UPPER BOUND" in out
    assert "Prefill tokens/s, UPPER BOUND" in out
    for regime in ("fp32", "mixed_bf16", "fp8", "adam8bit"):
        assert f"\n{regime} " in out
    assert "h100-sxm" in out


def test_cli_json_equals_api() -> None:
    """--json prints exactly the numbers plan() returns (one row per precision)."""
    rc, out = run_cli("plan", "smollm2", "--context", "2048", "--keep-embeddings", "bf16", "--json")
    assert rc == 0
    data = json.loads(out)
    api = plan("smollm2", context=2048, keep_embeddings="bf16").to_dict()
    assert data["rows"] == json.loads(json.dumps(api["rows"]))
    for row in data["rows"]:
        assert {"format", "bits_per_weight", "weight_bytes"} <= set(row)
    assert data["model"]["params"] == 134_515_008


def test_cli_plot(tmp_path: Path) -> None:
    """--plot writes a PNG bar chart."""
    pytest.importorskip("matplotlib")
    out = tmp_path / "plan.png"
    rc, _ = run_cli("plan", "smollm2", "--context", "8192", "--batch", "8", "--precisions",
                    "bf16,int8,int4:g128:fp16", "--plot", str(out))  # fmt: skip
    assert rc == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_hardware() -> None:
    """`lowbit hardware` lists the catalog; --json gives every row with its source."""
    rc, out = run_cli("hardware")
    assert rc == 0 and "mi300x" in out and "1307.4" in out
    rc, out = run_cli("hardware", "--json", "a100-40gb")
    assert json.loads(out)[0]["tflops"]["tf32"] == 156


@pytest.mark.parametrize(
    "argv",
    [["plan"], ["plan", "--params", "1B", "--config", "x.json"], ["plan", "--params", "lots"],
     ["plan", "--params", "1B", "--devices", "tpu"], ["plan", "--params", "1B", "--precisions", "int4:zz"],
     ["plan", "--params", "1B", "--batch", "0"], ["plan", "--params", "1B", "--context", "-5"]],
)  # fmt: skip
def test_cli_bad_input(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """Bad input exits 2 with a one-line message."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("lowbit plan: error:") and err.count("\n") == 1


def test_planning_loads_no_heavy_modules() -> None:
    """Planning a config or a checkpoint imports no torch, transformers or matplotlib."""
    code = (
        "import sys, lowbit; from lowbit.cli import build_parser; build_parser();"
        f"lowbit.plan({str(CONFIGS / 'gpt2.json')!r}, context=64, train=True); lowbit.plan('minilm');"
        "print(','.join(m for m in ('torch', 'transformers', 'matplotlib') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_rule_objects_and_plan_row_lookup() -> None:
    """Rule objects pass through; plan.row finds rows by label or by an equivalent spec."""
    rule = Rule(Cast("bf16"), component=("norms",))
    p = plan(CONFIGS / "gpt2.json", precisions=["int8", "int4:g128:float16"], rules=[rule])
    assert p.row("int4:g128:fp16") is p.rows[1]
    assert p.row("int8").component_bytes["norms"] == 2 * (12 * 2 * 2 * 768 + 2 * 768)
    with pytest.raises(LowbitError, match="no row"):
        p.row("fp4")
