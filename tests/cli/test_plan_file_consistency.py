"""One plan file, one reader: every plan-file example in the docs and in ``lowbit quantize
--help`` is accepted by ``lowbit quantize --plan``, ``lowbit plan --plan-file`` and
``PrecisionPlan.from_file``, with the same decision for every tensor."""

from __future__ import annotations

import contextlib
import io
import json
import re
import textwrap
from pathlib import Path
from typing import Any

import pytest

from lowbit.checkpoints.streaming import checkpoint_tensors, open_model
from lowbit.cli import cmd_quantize, main
from lowbit.planning.archs import load_spec
from lowbit.planning.estimate import tensor_decisions
from lowbit.plans.plan import PrecisionPlan
from lowbit.plans.rules import action_label
from lowbit.quant.scheme_text import parse_scheme

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("gguf")
yaml = pytest.importorskip("yaml")

from tiny_models import save_gguf, save_hf_folder, tiny_llama  # noqa: E402

DOCS = Path(__file__).parents[2] / "docs"


def _doc_examples() -> list[tuple[str, str, str]]:
    """(id, suffix, text) of every plan file the docs and the --help epilog show."""
    out = []
    for path in [*sorted(DOCS.glob("*.md")), DOCS.parent / "README.md"]:
        doc = path.name
        text = path.read_text(encoding="utf-8")
        for i, (lang, body) in enumerate(re.findall(r"```(yaml|json)\n(.*?)```", text, re.S)):
            if '"rules"' in body or "rules:" in body:
                out.append((f"{doc}#{i}", lang, body))
    epilog = cmd_quantize._EPILOG
    block = re.search(r"\n(  rules:\n(?:    .*\n)+)", epilog)
    assert block is not None, "the quantize --help epilog shows a plan file"
    out.append(("quantize --help", "yaml", textwrap.dedent(block.group(1))))
    return out


EXAMPLES = _doc_examples()


def _cli(*argv: str) -> Any:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main([*argv, "--json"])
    assert rc == 0, err.getvalue()
    return json.loads(out.getvalue())


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The tiny llama as a Hugging Face folder and as a GGUF file (llama.cpp's names)."""
    root = tmp_path_factory.mktemp("planfiles")
    llama = tiny_llama()
    return {
        "hf": save_hf_folder(llama, root / "tiny"),
        "gguf": save_gguf(llama, root / "tiny.gguf"),
    }


def test_the_docs_show_every_rule_field() -> None:
    """The examples cover regex, scale_method, activations, component, ndim, match, keep."""
    allowed = "\n".join(body for _, _, body in EXAMPLES)
    for field in ("regex", "scale_method", "activations", "component", "ndim", "match", "keep",
                  "method"):  # fmt: skip
        assert field in allowed, field


@pytest.mark.parametrize("kind", ["hf", "gguf"])
@pytest.mark.parametrize(("name", "lang", "body"), EXAMPLES, ids=[e[0] for e in EXAMPLES])
def test_one_plan_file_one_decision_per_tensor(
    models: dict[str, Path], tmp_path: Path, name: str, lang: str, body: str, kind: str
) -> None:
    """quantize --plan, plan --plan-file and PrecisionPlan.from_file read the example alike."""
    data = yaml.safe_load(body) if lang == "yaml" else json.loads(body)
    f = tmp_path / ("plan.yaml" if lang == "yaml" else "plan.json")
    f.write_text(body)
    model = models[kind]
    names = {t[0] for t in checkpoint_tensors(open_model(str(model)))}
    globs = [r["match"] for r in data["rules"] if isinstance(r.get("match"), str)]
    if not any(re.fullmatch(g.replace(".", r"\.").replace("*", ".*"), n) for g in globs
               for n in names) and any(g.startswith(("token_embd", "blk.")) for g in globs):  # fmt: skip
        pytest.skip(f"{name} names llama.cpp tensors; {kind} has none")

    # a plan without a default gets one from --to (quantize) or --precisions (plan)
    plan = PrecisionPlan.from_file(f)
    to = [] if plan.default is not None else ["--to", "int4:g128"]
    default = plan.default if plan.default is not None else parse_scheme("int4:g128")
    plan = plan.with_default(default)

    # lowbit quantize --plan FILE --dry-run
    doc = _cli("quantize", str(model), "--plan", str(f), *to, "--dry-run")
    quantize = {t["name"]: (t["rule"], t["format"], t.get("method")) for t in doc["tensors"]}

    # PrecisionPlan.from_file
    api = {}
    for n, shape, dtype, nbytes, alias in checkpoint_tensors(open_model(str(model))):
        d = plan.decide(n, shape, dtype, nbytes, alias)
        api[n] = (d.rule, d.label, d.method)
    assert api == quantize

    # lowbit plan --plan-file FILE: the same decisions, and the bytes lowbit quantize plans
    spec = load_spec(str(model))
    planner = {  # the planner's rule index names the same rule, so the same method
        t.name: (rule, action_label(action), None if rule is None else plan.rules[rule].method)
        for t, rule, action in tensor_decisions(spec, default, plan_file=plan)
    }
    assert planner == {n: quantize[n] for n in planner}
    assert set(quantize) - set(planner) <= {n for n in quantize if "rope" in n}  # buffers
    extra = ["--precisions", "int4:g128"] if to else []
    row = _cli("plan", str(model), "--plan-file", str(f), *extra)["rows"][0]
    assert row["format"] == action_label(default)
    planned = sum(
        plan.decide(n, s, d, b, a).nbytes
        for n, s, d, b, a in checkpoint_tensors(open_model(str(model)))
        if n in planner
    )
    assert row["weight_bytes"] == planned


def test_regex_rules_work_in_the_planner(models: dict[str, Path], tmp_path: Path) -> None:
    """The issue's case: a regex rule used to fail in lowbit plan ("unknown rule field(s)")."""
    f = tmp_path / "p.json"
    f.write_text(json.dumps({"default": "int4:g32",
                             "rules": [{"regex": r"model\.layers\.0\..*proj\.weight",
                                        "format": "int8:ch", "scale_method": "mse",
                                        "activations": "int8"}]}))  # fmt: skip
    row = _cli("plan", str(models["hf"]), "--plan-file", str(f))["rows"][0]
    doc = _cli("quantize", str(models["hf"]), "--plan", str(f), "--dry-run")
    assert row["weight_bytes"] == doc["totals"]["bytes"]
    labels = {t["format"] for t in doc["tensors"] if t["rule"] == 0}
    assert labels == {"int8:ch:fp32:mse"}
