"""Precision plans: defaults, rule order, keep/cast, glob/regex/component/ndim, warnings, errors."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lowbit
from lowbit.errors import LowbitError
from lowbit.plans.plan import PrecisionPlan
from lowbit.plans.rules import Rule, action_label, parse_action, parse_rule
from lowbit.quant.scheme import Cast, Granularity, Scheme

# (name, shape, dtype, nbytes) of a llama in Hugging Face names, a GGUF file and a BERT
LLAMA = [
    ("model.embed_tokens.weight", (1000, 64), "BF16", 128_000),
    ("model.layers.0.input_layernorm.weight", (64,), "BF16", 128),
    ("model.layers.0.self_attn.q_proj.weight", (64, 64), "BF16", 8192),
    ("model.layers.0.self_attn.k_proj.weight", (32, 64), "BF16", 4096),
    ("model.layers.0.self_attn.q_proj.bias", (64,), "BF16", 128),
    ("model.layers.0.mlp.gate_proj.weight", (128, 64), "BF16", 16384),
    ("model.layers.0.mlp.down_proj.weight", (64, 128), "BF16", 16384),
    ("model.layers.1.mlp.down_proj.weight", (64, 128), "BF16", 16384),
    ("model.norm.weight", (64,), "BF16", 128),
    ("lm_head.weight", (1000, 64), "BF16", 128_000),
]
GGUF = [
    ("token_embd.weight", (1000, 64), "Q8_0", 68_000),
    ("blk.0.attn_norm.weight", (64,), "F32", 256),
    ("blk.0.attn_q.weight", (64, 64), "Q4_1", 2560),
    ("blk.0.ffn_down.weight", (64, 128), "Q4_1", 5120),
    ("output_norm.weight", (64,), "F32", 256),
]
BERT = [
    ("embeddings.position_ids", (1, 512), "I64", 4096),
    ("embeddings.word_embeddings.weight", (1000, 64), "F32", 256_000),
    ("encoder.layer.0.attention.self.query.weight", (64, 64), "F32", 16384),
    ("encoder.layer.0.attention.self.query.bias", (64,), "F32", 256),
    ("encoder.layer.0.intermediate.dense.weight", (128, 64), "F32", 32768),
    ("encoder.layer.0.output.LayerNorm.weight", (64,), "F32", 256),
    ("pooler.dense.weight", (64, 64), "F32", 16384),
]


def _actions(applied) -> dict[str, str]:  # type: ignore[no-untyped-def]
    return {t.name: t.label for t in applied}


# ------------------------------------------------------------------------- defaults


@pytest.mark.parametrize(
    ("tensors", "quantized"),
    [
        (
            LLAMA,
            {
                "model.layers.0.self_attn.q_proj.weight",
                "model.layers.0.self_attn.k_proj.weight",
                "model.layers.0.mlp.gate_proj.weight",
                "model.layers.0.mlp.down_proj.weight",
                "model.layers.1.mlp.down_proj.weight",
            },
        ),
        (GGUF, {"blk.0.attn_q.weight", "blk.0.ffn_down.weight"}),
        (
            BERT,
            {
                "encoder.layer.0.attention.self.query.weight",
                "encoder.layer.0.intermediate.dense.weight",
                "pooler.dense.weight",
            },
        ),
    ],
)
def test_defaults_quantize_only_linear_weights(tensors, quantized) -> None:  # type: ignore[no-untyped-def]
    """By default only 2-D linear weights are quantized; embeddings, lm_head, norms, biases,
    1-D and integer tensors are kept as stored."""
    applied = PrecisionPlan.uniform("int4", group_size=32).apply(tensors)
    got = {t.name for t in applied if t.action == "quantize"}
    assert got == quantized
    for t in applied:
        if t.name not in quantized:
            assert t.action == "keep" and t.scheme is None and t.reason.startswith("default:")
            assert t.nbytes == t.source_nbytes  # kept exactly as stored
    reasons = {t.name: t.reason for t in applied}
    if "lm_head.weight" in reasons:
        assert "LM head" in reasons["lm_head.weight"]
        assert "embeddings" in reasons["model.embed_tokens.weight"]
        assert "bias" in reasons["model.layers.0.self_attn.q_proj.bias"]


def test_uniform_options_build_the_scheme() -> None:
    """--to int4 --group 128 --asym --scale-method mse --scale-format fp16 is that Scheme."""
    plan = PrecisionPlan.uniform(
        "int4", group_size=128, asym=True, scale_method="mse", scale_format="fp16"
    )
    assert plan.default == Scheme(
        format="int4", group_size=128, symmetric=False, scale_method="mse", scale_format="float16"
    )
    assert action_label(plan.default) == "int4:g128:fp16:asym:mse"


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("int8", Scheme(format="int8", axis=0)),
        ("int8:ch", Scheme(format="int8", axis=0)),
        ("int4:g128", Scheme(format="int4", group_size=128)),
        ("int4:g128:asym", Scheme(format="int4", group_size=128, symmetric=False)),
        ("fp8_e4m3:ch", Scheme(format="fp8_e4m3", axis=0)),
        ("fp8_e4m3", Scheme(format="fp8_e4m3", axis=0)),
        ("fp8_e4m3:t", Scheme(format="fp8_e4m3")),
        ("nf4", Scheme(format="nf4", group_size=64)),
        ("nf4:dq", Scheme(format="nf4", group_size=64, double_quant=True)),
        ("nf4:g32", Scheme(format="nf4", group_size=32)),
        ("mxfp4", Scheme(format="mxfp4")),
        ("mxfp8", Scheme(format="mxfp8_e4m3")),
        ("q4_0", Scheme(format="int4", group_size=32, scale_format="float16", scale_method="ggml")),
        ("q8_0", Scheme(format="int8", group_size=32, scale_format="float16", scale_method="ggml")),
        ("int4:g64:bf16", Scheme(format="int4", group_size=64, scale_format="bfloat16")),
        ("bf16", Cast("bfloat16")),
        ("fp16", Cast("float16")),
        ("keep", None),
        ("KEEP", None),
    ],
)
def test_scheme_strings(spec: str, expected: object) -> None:
    """Scheme strings (the one text form) give the weight layouts users expect."""
    assert parse_action(spec) == expected
    assert PrecisionPlan.uniform(spec).default == expected


@pytest.mark.parametrize(
    ("spec", "kw", "message"),
    [
        ("int77", {}, "int77"),
        ("int4:g128:banana", {}, "unknown token 'banana'"),
        ("q4_1", {}, "FP16 minimum"),
        ("q5_1", {}, "not supported"),
        ("mxfp4", {"group_size": 16}, "MX block format"),
        ("fp8_e4m3", {"asym": True}, "integer format"),
        ("keep", {"group_size": 32}, "'keep' takes no"),
        ("bf16", {"scale_method": "mse"}, "plain cast"),
        ("int4", {"scale_method": "median"}, "unknown scale method"),
    ],
)
def test_bad_schemes(spec: str, kw: dict, message: str) -> None:
    """Bad schemes and option mixes are LowbitErrors naming the scheme and the problem."""
    with pytest.raises(LowbitError, match=message):
        PrecisionPlan.uniform(spec, **kw)


# ----------------------------------------------------------------------------- rules


def test_first_matching_rule_wins_and_keep_overrides() -> None:
    """Rules are tried in order; keep and casts override the default; rules reach kept tensors."""
    plan = PrecisionPlan.from_dict(
        {
            "default": "int4:g32",
            "rules": [
                {"match": "*.q_proj.weight", "format": "int8:ch"},
                {"match": ["*proj.weight"], "format": "nf4"},
                {"match": "model.layers.1.*", "format": "keep"},
                {"match": "lm_head.weight", "format": "bf16"},
                {"match": "model.embed_tokens.weight", "format": "int8"},
            ],
        }
    )
    with pytest.warns(UserWarning, match=r"rule 3 .*decides no tensor.*decided by rule 2"):
        acts = _actions(plan.apply(LLAMA))
    assert acts["model.layers.0.self_attn.q_proj.weight"] == "int8:ch:fp32"  # rule 1, not 2
    assert acts["model.layers.0.self_attn.k_proj.weight"] == "nf4:g64:fp32"
    assert acts["model.layers.0.mlp.down_proj.weight"] == "nf4:g64:fp32"
    assert acts["model.layers.1.mlp.down_proj.weight"] == "nf4:g64:fp32"  # rule 2 came first
    assert acts["lm_head.weight"] == "bf16"
    assert acts["model.embed_tokens.weight"] == "int8:ch:fp32"  # a rule quantizes a kept kind
    assert acts["model.norm.weight"] == "keep"
    reverse = PrecisionPlan.from_dict(
        {"default": "int4:g32", "rules": [{"match": "model.layers.1.*", "format": "keep"},
                                          {"match": "*proj.weight", "format": "nf4"}]}
    )  # fmt: skip
    assert _actions(reverse.apply(LLAMA))["model.layers.1.mlp.down_proj.weight"] == "keep"


def test_regex_glob_component_ndim() -> None:
    """regex is a full match (also written match: 're:...'); globs, components and ndim combine."""
    plan = PrecisionPlan.from_dict(
        {
            "rules": [
                {"regex": r"model\.layers\.0\.mlp\..*", "format": "int8:ch"},
                {"match": r"re:.*\.k_proj\.weight", "format": "fp8_e4m3:ch"},
                {"regex": "q_proj", "format": "nf4"},  # not a full match: matches nothing
                {"component": "mlp", "ndim": 2, "format": "int4:g32"},
                {"component": "attention", "format": "mxfp4", "ndim": 2},
            ]
        }
    )
    with pytest.warns(UserWarning, match="rule 3"):
        acts = _actions(plan.apply(LLAMA))
    assert acts["model.layers.0.mlp.gate_proj.weight"] == "int8:ch:fp32"
    assert acts["model.layers.0.self_attn.k_proj.weight"] == "fp8_e4m3:ch:fp32"
    assert acts["model.layers.1.mlp.down_proj.weight"] == "int4:g32:fp32"
    assert acts["model.layers.0.self_attn.q_proj.weight"] == "mxfp4"
    assert acts["model.layers.0.self_attn.q_proj.bias"] == "keep"  # ndim 2 leaves the bias
    assert acts["model.embed_tokens.weight"] == "keep"  # no default scheme, no rule


def test_unmatched_rule_warns_with_close_names() -> None:
    """A rule that matches nothing warns, naming the closest tensor names."""
    plan = PrecisionPlan.from_dict(
        {"rules": [{"match": "model.layers.*.mlp.gate", "format": "nf4"}]}
    )
    with pytest.warns(UserWarning, match="close names: model.layers.0.mlp.gate_proj.weight"):
        plan.apply(LLAMA, source="tiny")
    gguf_plan = PrecisionPlan.from_dict({"rules": [{"match": "*mlp*", "format": "nf4"}]})
    with pytest.warns(UserWarning, match="names look like: token_embd.weight"):
        gguf_plan.apply(GGUF)
    comp = PrecisionPlan.from_dict({"rules": [{"component": "lm_head", "format": "int8"}]})
    with pytest.warns(UserWarning, match="components present: attention, embeddings, mlp, norms"):
        comp.apply(GGUF)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        PrecisionPlan.uniform("int8", rules=[{"match": "*q_proj*", "format": "keep"}]).apply(LLAMA)


@pytest.mark.parametrize(
    ("rule", "tensor", "message"),
    [
        (
            {"ndim": 1, "format": "int4:g128"},
            "input_layernorm",
            "1-D tensor has no rows for groups of 128",
        ),
        ({"match": "*.bias", "format": "int8:ch"}, "q_proj.bias", "per-channel scales"),
        ({"match": "model.norm.weight", "format": "mxfp4"}, "model.norm.weight", "MX blocks"),
        (
            {"match": "*down_proj*", "format": "int4:g48", "pad": False},
            "down_proj",
            "does not divide",
        ),
        ({"match": "*down_proj*", "format": "int4:g32:ax2"}, "down_proj", "out of range"),
        ({"match": "embeddings.position_ids", "format": "int8"}, "position_ids", "I64 values"),
    ],
)
def test_unquantizable_tensor_is_an_error_naming_it(rule: dict, tensor: str, message: str) -> None:
    """A plan that makes a tensor unquantizable fails before any work, naming tensor and reason."""
    plan = PrecisionPlan.from_dict({"rules": [rule]})
    with pytest.raises(LowbitError, match=message) as info:
        plan.apply(LLAMA + BERT)
    assert tensor in str(info.value) and "shape" in str(info.value)


def test_one_d_tensor_per_tensor_scale_is_fine() -> None:
    """1-D tensors can take per-tensor schemes and casts; a padded ragged group is fine."""
    plan = PrecisionPlan.from_dict(
        {
            "rules": [
                {"ndim": 1, "format": "fp8_e4m3:t"},
                {"match": "*down_proj*", "format": "int4:g48"},
            ]
        }
    )
    acts = _actions(plan.apply(LLAMA))
    assert acts["model.norm.weight"] == "fp8_e4m3:t:fp32"
    assert acts["model.layers.0.mlp.down_proj.weight"] == "int4:g48:fp32"


# ------------------------------------------------------------------------ plan files


def test_plan_files_json_yaml_and_round_trip(tmp_path: Path) -> None:
    """Plan files (JSON, YAML, the planner's bare rule lists) load; to_dict round-trips exactly."""
    doc = {
        "version": 1,
        "default": "int4:g32:asym",
        "activations": "int8",
        "rules": [
            {"match": "*embed*", "format": "keep"},
            {"regex": r".*\.k_proj\.weight", "format": "int8:ch", "scale_method": "mse"},
            {"component": "mlp", "ndim": 2, "format": "nf4:dq", "activations": "fp8"},
            {"match": "lm_head.weight", "format": "bf16"},
            {"match": "*q_proj.weight", "format": "int4:g48", "pad": False},
            {
                "match": "*gate*",
                "format": Scheme(format="int4", group_size=32, rounding="nearest_away").to_dict(),
            },
        ],
    }
    (tmp_path / "plan.json").write_text(json.dumps(doc))
    yaml = pytest.importorskip("yaml")
    (tmp_path / "plan.yaml").write_text(yaml.safe_dump(doc))
    a = PrecisionPlan.from_file(tmp_path / "plan.json")
    b = PrecisionPlan.from_file(tmp_path / "plan.yaml")
    assert a == b
    assert a.activations == "int8" and a.rules[2].activations == "float8_e4m3fn"
    assert a.rules[1].action.scale_method.value == "mse"
    assert a.rules[4].action.pad is False
    assert a.rules[5].action.rounding == "nearest_away"
    again = PrecisionPlan.from_dict(json.loads(json.dumps(a.to_dict())))
    assert again == a
    (tmp_path / "planner.json").write_text(json.dumps([{"match": "*mlp*", "format": "int8:ch"}]))
    c = PrecisionPlan.from_file(tmp_path / "planner.json")
    assert c.rules == (Rule(parse_action("int8:ch"), match=("*mlp*",)),)


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"rules": [], "extra": 1}, "unknown key"),
        ({"version": 2}, "version 2"),
        ({"rules": [{"match": "*", "format": "int8", "colour": "red"}]}, "unknown rule field"),
        ({"rules": [{"match": "*"}]}, "needs a format"),
        ({"rules": [{"format": "int8"}]}, "needs match, regex, component or ndim"),
        ({"rules": [{"regex": "(", "format": "int8"}]}, "does not compile"),
        ({"rules": [{"component": "mlps", "format": "int8"}]}, "unknown component"),
        ({"rules": [{"match": "*", "format": "keep", "scale_method": "mse"}]}, "'keep' takes no"),
        ({"rules": [{"match": "*", "format": "int8", "activations": "nf4"}]}, "activations 'nf4'"),
        ({"rules": "*"}, "must be a list"),
    ],
)
def test_bad_plan_files(doc: dict, message: str, tmp_path: Path) -> None:
    """Malformed plans are LowbitErrors naming the file, the rule and the problem."""
    p = tmp_path / "plan.json"
    p.write_text(json.dumps(doc))
    with pytest.raises(LowbitError, match=message) as info:
        PrecisionPlan.from_file(p)
    assert str(p) in str(info.value)
    with pytest.raises(LowbitError, match="does not exist"):
        PrecisionPlan.from_file(tmp_path / "missing.json")


def test_parse_rule_needs_an_object() -> None:
    """A rule that is not a mapping is refused."""
    with pytest.raises(LowbitError, match="must be an object"):
        parse_rule("int8")


# ------------------------------------------------------------------------------ bytes

_SCHEMES = ["int8:ch", "int4:g32", "int4:g32:asym", "int3:g16:fp16:asym", "nf4", "nf4:dq",
            "mxfp4", "mxfp6", "fp8_e4m3:ch", "fp4:g16:bf16", "int8:t"]  # fmt: skip


@settings(max_examples=40, deadline=None)
@given(
    rows=st.integers(1, 40),
    cols=st.integers(1, 300),
    spec=st.sampled_from(_SCHEMES),
)
def test_planned_bytes_equal_quantized_bytes(rows: int, cols: int, spec: str) -> None:
    """The plan's bytes (known before quantizing) equal QuantizedTensor.nbytes, any shape."""
    scheme = parse_action(spec)
    t = PrecisionPlan(default=scheme).decide("x.weight", (rows, cols), "F32")
    assert t.action == "quantize"
    x = np.random.default_rng(rows * 1000 + cols).standard_normal((rows, cols)).astype(np.float32)
    qt = lowbit.quantize(x, scheme)
    assert t.nbytes == qt.nbytes
    assert t.bits == qt.bits_per_value
    assert scheme.granularity in (Granularity.CHANNEL, Granularity.GROUP, Granularity.BLOCK,
                                  Granularity.TENSOR)  # fmt: skip
