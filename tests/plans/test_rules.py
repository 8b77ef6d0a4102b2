"""The one Rule type and plan-file reader: matching, fields, round trips, errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lowbit.errors import LowbitError
from lowbit.planning import modelspec
from lowbit.plans import components
from lowbit.plans.rules import (
    Rule,
    action_dict,
    action_label,
    load_plan_file,
    parse_action,
    parse_plan,
    parse_rule,
)
from lowbit.quant.scheme import Cast, Scheme
from lowbit.quant.scheme_text import parse_scheme

INT8 = parse_scheme("int8")


@pytest.mark.parametrize(
    ("rule", "name", "shape", "hit"),
    [
        (Rule(INT8, match=("*mlp*",)), "model.layers.0.mlp.up_proj.weight", (8, 4), True),
        (Rule(INT8, match=("*mlp*",)), "model.layers.0.self_attn.q_proj.weight", (8, 4), False),
        (Rule(INT8, match=("*MLP*",)), "model.layers.0.mlp.up_proj.weight", (8, 4), False),
        (Rule(INT8, regex=(r"model\.layers\.0\..*",)), "model.layers.0.mlp.w", (8, 4), True),
        (Rule(INT8, regex=(r"model\.layers\.0",)), "model.layers.0.mlp.w", (8, 4), False),
        (Rule(INT8, component=("norms",)), "model.norm.weight", (8,), True),
        (Rule(INT8, component=("attention",)), "model.layers.1.self_attn.o_proj.weight", (8, 8),
         True),
        (Rule(INT8, ndim=1), "model.layers.0.self_attn.q_proj.bias", (8,), True),
        (Rule(INT8, ndim=1), "model.layers.0.self_attn.q_proj.weight", (8, 8), False),
        (Rule(INT8, match=("*proj*",), ndim=2), "x.q_proj.bias", (8,), False),
    ],
)  # fmt: skip
def test_matches(rule: Rule, name: str, shape: tuple[int, ...], hit: bool) -> None:
    """Every given condition must hold: globs (case-sensitive), full-match regex, component,
    rank."""
    assert rule.matches(name, shape) is hit


def test_alias_and_given_component() -> None:
    """A GGUF tensor matches by its transformers alias; a known component beats classify."""
    rule = Rule(INT8, match=("*mlp.down_proj*",))
    assert rule.matches(
        "blk.0.ffn_down.weight", (8, 4), alias="model.layers.0.mlp.down_proj.weight"
    )
    assert not rule.matches("blk.0.ffn_down.weight", (8, 4))
    by_comp = Rule(INT8, component=("embeddings",))
    assert not by_comp.matches("*", (10,))
    assert by_comp.matches("*", (10,), component="embeddings")


def test_components_live_in_quant() -> None:
    """classify and COMPONENTS have one home (quant), re-exported by planning.modelspec."""
    assert modelspec.classify is components.classify
    assert modelspec.COMPONENTS is components.COMPONENTS
    assert components.classify("model.layers.0.mlp.gate_proj.weight") == "mlp"
    assert components.classify("blk.0.attn_norm.weight", 1) == "norms"
    assert components.classify("model.embed_tokens.weight") == "embeddings"
    assert components.classify("lm_head.weight") == "lm_head"
    assert components.classify("model.rotary_emb.inv_freq", 1) == "buffer"


def test_parse_rule_fields() -> None:
    """match / re: globs / regex / component / ndim / format / scale_method / activations / pad."""
    r = parse_rule(
        {"match": ["*q_proj*", "re:.*k_proj.*"], "regex": r"x\.\d+", "component": "attention",
         "ndim": 2, "format": "int4:g32", "scale_method": "mse", "activations": "fp8",
         "pad": False}
    )  # fmt: skip
    assert r.match == ("*q_proj*",) and r.regex == (r"x\.\d+", ".*k_proj.*")
    assert r.component == ("attention",) and r.ndim == 2
    assert r.action == Scheme(format="int4", group_size=32, scale_method="mse", pad=False)
    assert r.activations == "float8_e4m3fn"
    assert parse_rule({"match": "*", "scheme": "keep"}).action is None
    assert parse_rule({"match": "*", "format": "bf16"}).action == Cast("bfloat16")


@pytest.mark.parametrize(
    "rule",
    [
        Rule(INT8, match=("*mlp*",)),
        Rule(None, regex=(r"lm_head\.weight",)),
        Rule(Cast("fp16"), component=("embeddings", "lm_head")),
        Rule(parse_scheme("nf4:dq"), ndim=2, activations="int8"),
        Rule(parse_scheme("int4:g32", scale_method="percentile", pad=False), match=("a",)),
        Rule(parse_scheme("int4:g32", percentile=99.0, scale_method="percentile"), match=("a",)),
        Rule(parse_scheme("mxfp4"), match=("*",), component=("mlp",)),
        Rule(parse_scheme("int4:g128"), component=("attention",), method="gptq"),
        Rule(INT8, match=("*down*",), method="rtn"),
    ],
)
def test_rule_dict_round_trip(rule: Rule) -> None:
    """A rule's plan-file form reads back to the same rule (through JSON)."""
    assert parse_rule(json.loads(json.dumps(rule.to_dict()))) == rule


def test_action_helpers() -> None:
    """keep, casts and schemes: labels, and plan-file dicts that parse back exactly."""
    assert action_label(None) == "keep" and action_label(Cast("bf16")) == "bf16"
    assert action_label(INT8) == "int8:ch:fp32"
    assert action_dict(INT8) == {"format": "int8:ch:fp32"}
    odd = parse_scheme("int4:g32", rounding="nearest_away")
    assert action_dict(odd) == {"format": odd.to_dict()}
    assert parse_action(action_dict(odd)["format"]) == odd
    with pytest.raises(LowbitError, match="'keep' takes no"):
        parse_action("keep", group_size=32)


@pytest.mark.parametrize(
    ("entry", "fragment"),
    [
        ({"match": "*", "format": "int8", "colour": "red"}, "unknown rule field(s) colour"),
        ({"match": "*"}, "needs a format"),
        ({"format": "int8"}, "needs match, regex, component or ndim"),
        ({"regex": "(", "format": "int8"}, "does not compile"),
        ({"component": "mlps", "format": "int8"}, "unknown component"),
        ({"ndim": "2", "format": "int8"}, "ndim must be an integer"),
        ({"match": "*", "format": "int8", "pad": "no"}, "pad must be true or false"),
        ({"match": "*", "format": "int8", "scale_method": "median"}, "unknown scale_method"),
        ({"match": "*", "format": "keep", "scale_method": "mse"}, "'keep' takes no"),
        ({"match": "*", "format": "keep", "activations": "int8"}, "'keep' takes no activations"),
        ({"match": "*", "format": "int8", "activations": "nf4"}, "activations 'nf4'"),
        ({"match": "*", "format": "q5_1"}, "q5_1 is not supported"),
        ({"match": "*", "format": "fp8_e4m3", "scale_method": "meanabs"}, None),
        ({"match": "*", "format": "int4", "method": "awq2"}, "unknown method 'awq2'; allowed: rtn"),
        ({"match": "*", "format": "int4", "method": 1}, "unknown method 1"),
        (
            {"match": "*", "format": "keep", "method": "gptq"},
            "needs a quantization format, not keep",
        ),
        ({"match": "*", "format": "bf16", "method": "gptq"}, "not bf16"),
        ({"match": "*", "format": "int4", "method": " GPTQ "}, None),
    ],
)
def test_bad_rules(entry: dict, fragment: str | None) -> None:
    """Malformed rules are LowbitErrors naming the rule and the problem."""
    if fragment is None:
        parse_rule(entry)  # odd but valid
        return
    with pytest.raises(LowbitError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        parse_rule(entry)


def test_plan_files_json_yaml_and_list(tmp_path: Path) -> None:
    """One reader: JSON and YAML give the same plan; a bare list is the rules."""
    doc = {
        "version": 1,
        "default": "int4:g128",
        "activations": "int8",
        "rules": [
            {"match": "*embed*", "format": "keep"},
            {"regex": r"model\.layers\.0\..*", "format": "int8:ch", "scale_method": "mse"},
            {"component": "mlp", "ndim": 2, "format": "nf4:g64:dq", "activations": "fp8_e4m3"},
        ],
    }
    (tmp_path / "p.json").write_text(json.dumps(doc))
    a = load_plan_file(tmp_path / "p.json")
    assert a == parse_plan(doc)
    rules, default, acts = a
    assert default == parse_scheme("int4:g128") and acts == "int8" and len(rules) == 3
    yaml = pytest.importorskip("yaml")
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(doc))
    assert load_plan_file(tmp_path / "p.yaml") == a
    (tmp_path / "l.json").write_text(json.dumps(doc["rules"]))
    assert load_plan_file(tmp_path / "l.json") == (rules, None, None)


@pytest.mark.parametrize(
    ("doc", "fragment"),
    [
        ({"rules": [], "extra": 1}, "unknown key(s) extra"),
        ({"version": 2}, "plan version 2"),
        ({"rules": "*"}, "'rules' must be a list"),
        ({"rules": [{"match": "*", "format": "int8"}, {"match": "*"}]}, "rule 2"),
        ({"default": "int4:xyz"}, "default: scheme 'int4:xyz': unknown token 'xyz'"),
        (7, "a plan is an object"),
    ],
)
def test_bad_plans(doc: object, fragment: str, tmp_path: Path) -> None:
    """Bad plans name the file, the rule number or the default, and the problem."""
    p = tmp_path / "bad.json"
    p.write_text(json.dumps(doc))
    with pytest.raises(LowbitError) as info:
        load_plan_file(p)
    assert fragment in str(info.value) and str(p) in str(info.value)
    with pytest.raises(LowbitError, match="does not exist"):
        load_plan_file(tmp_path / "missing.json")


def test_rule_methods_reach_the_plan() -> None:
    """A rule's method is each tensor's TensorPlan.method (None where no rule names one, and
    for the defaults); METHODS lists what a rule may say."""
    from lowbit.plans.plan import PrecisionPlan
    from lowbit.plans.rules import METHODS, method_name

    assert METHODS == ("rtn", "gptq", "awq") and method_name(" Gptq") == "gptq"
    assert method_name(None) is None
    plan = PrecisionPlan.from_dict(
        {
            "default": "int4:g128",
            "rules": [
                {"match": "*down*", "format": "int4:g128", "method": "rtn"},
                {"component": "attention", "ndim": 2, "format": "int8:ch", "method": "gptq"},
                {"match": "*up*", "format": "int4:g64"},
            ],
        }
    )
    decide = {
        n: plan.decide(n, (64, 64))
        for n in ("model.layers.0.mlp.down_proj.weight", "model.layers.0.self_attn.q_proj.weight",
                  "model.layers.0.mlp.up_proj.weight", "model.layers.0.mlp.gate_proj.weight")
    }  # fmt: skip
    assert [d.method for d in decide.values()] == ["rtn", "gptq", None, None]
    assert [d.rule for d in decide.values()] == [0, 1, 2, None]
    assert decide["model.layers.0.self_attn.q_proj.weight"].to_dict()["method"] == "gptq"
    assert "method" not in decide["model.layers.0.mlp.up_proj.weight"].to_dict()
    assert "by gptq" in decide["model.layers.0.self_attn.q_proj.weight"].reason
    assert plan.to_dict()["rules"][1]["method"] == "gptq"


def test_calibrated_method_is_one_per_run() -> None:
    """calibrated_method: the one calibrated method the rules' methods (None: the default)
    need, rtn when none; gptq beside awq is one error naming both."""
    from lowbit.plans.rules import calibrated_method

    assert calibrated_method([None, "rtn"]) == "rtn"
    assert calibrated_method(["awq", None, "rtn"]) == "awq"
    assert calibrated_method([None], "gptq") == "gptq"
    assert calibrated_method(["rtn"], "awq") == "rtn"
    with pytest.raises(LowbitError, match="asks for awq and gptq"):
        calibrated_method(["awq", None], "gptq")
    with pytest.raises(LowbitError, match="unknown method"):
        calibrated_method(["smoothquant"])
    assert calibrated_method(["gptq", "rtn"], run="gptq") == "gptq"
    assert calibrated_method([None], "rtn", run="awq") == "rtn"
    with pytest.raises(LowbitError, match="calibrates with awq, but the plan asks for gptq"):
        calibrated_method([None, "gptq"], "rtn", run="awq")
