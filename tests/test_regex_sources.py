"""Every regex lowbit compiles with Python's backtracking ``re`` has a pattern written in the
source: a pattern from a file or a user (plan rules, compressed-tensors ``targets`` and
``transform_config`` targets, ``--tensor-type``) goes through the bounded subset
(``lowbit._regex``), never ``re`` (issue 41: ``re:`` targets of a transform_config hung
``lowbit eval``).

The scan reads every module of ``src/lowbit`` with ``ast`` and finds each call of ``re``'s
pattern functions. A call passes when its pattern is a literal, a module constant bound to a
literal (or to ``re.compile`` of one), or an expression whose only non-literal parts go
through ``re.escape`` (a name made literal). Anything else must be in :data:`ALLOWED` with
the reason it cannot come from a file.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from lowbit.errors import LowbitError

SRC = Path(__file__).resolve().parents[1] / "src" / "lowbit"

PATTERN_FUNCS = {
    "compile", "match", "search", "fullmatch", "sub", "subn", "split", "findall", "finditer",
}  # fmt: skip

#: (module path under src/lowbit, the pattern's source text) -> why it is not from a file.
ALLOWED = {
    ("_regex.py", "fnmatch.translate(glob)"): (
        "a plan glob holding ? or [: fnmatch.translate emits only literals, '.', classes and "
        "'.*' wrapped in atomic-group emulation (no nested quantifiers), so it is linear"
    ),
    ("models/moe.py", "a"): "the patterns of _RENAMES, a constant table in the module",
    ("plans/plan.py", "meta"): "one of two constant character classes written beside the call",
    ("checkpoints/compressed_tensors/config.py", "pattern"): (
        "built from a module name split on '.', each piece re.escape()d or \\d+"
    ),
}


def _constants(tree: ast.Module) -> set[str]:
    """Module-level names bound to a literal pattern or to re.compile(literal)."""
    names = set()
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
            if isinstance(target, ast.Name) and (_literal(value, set()) or _re_call(value)):
                names.add(target.id)
    return names


def _re_call(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "re"
        and node.func.attr == "compile"
        and bool(node.args)
        and _literal(node.args[0], set())
    )


def _literal(node: ast.AST, consts: set[str]) -> bool:
    """A pattern made only of literals, module constants and re.escape()d values."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, (str, bytes))
    if isinstance(node, ast.Name):
        return node.id in consts
    if isinstance(node, ast.JoinedStr):
        return all(_literal(v, consts) for v in node.values)
    if isinstance(node, ast.FormattedValue):
        return _literal(node.value, consts)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _literal(node.left, consts) and _literal(node.right, consts)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        owner = node.func.value
        if isinstance(owner, ast.Name) and owner.id == "re" and node.func.attr == "escape":
            return True
        if node.func.attr in ("replace", "join"):  # "...".join(escaped) / escaped.replace(...)
            return _literal(owner, consts) and all(_literal(a, consts) for a in node.args)
    if isinstance(node, ast.GeneratorExp):
        return _literal(node.elt, consts)
    if isinstance(node, ast.IfExp):
        return _literal(node.body, consts) and _literal(node.orelse, consts)
    return False


def _calls() -> list[tuple[str, int, str, bool]]:
    """(module, line, pattern source, passes) for every re pattern call in src/lowbit."""
    found = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        text = path.read_text(encoding="utf-8")
        tree = ast.parse(text)
        consts = _constants(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module == "re":
                found.append((rel, node.lineno, "from re import ...", False))
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name == "re" and alias.asname not in (None, "re"):
                        found.append((rel, node.lineno, f"import re as {alias.asname}", False))
            if not (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "re"
                and node.func.attr in PATTERN_FUNCS
            ):
                continue
            arg = node.args[0] if node.args else None
            for kw in node.keywords:
                if kw.arg == "pattern":
                    arg = kw.value
            src = ast.get_source_segment(text, arg) if arg is not None else ""
            ok = arg is not None and _literal(arg, consts)
            found.append((rel, node.lineno, src or "", ok))
    return found


def test_every_re_pattern_is_a_constant_or_allowed() -> None:
    calls = _calls()
    assert len(calls) > 40  # the scan sees the code base (about 70 calls today)
    bad = [
        f"{mod}:{line}: re pattern {src!r} is not a literal; route it through "
        "lowbit._regex (compile_bounded / compile_search) or add it to ALLOWED with a reason"
        for mod, line, src, ok in calls
        if not ok and (mod, src) not in ALLOWED
    ]
    assert not bad, "\n".join(bad)


def test_every_allowed_entry_is_still_used() -> None:
    seen = {(mod, src) for mod, _, src, ok in _calls() if not ok}
    assert set(ALLOWED) <= seen, set(ALLOWED) - seen


def test_the_scan_catches_a_pattern_from_a_variable(tmp_path: Path) -> None:
    """The checker itself: a pattern from a parameter fails, literals and escapes pass."""
    code = "import re\nP = re.compile('a+')\ndef f(x, y):\n    return re.match(y, x)\n"
    tree = ast.parse(code)
    consts = _constants(tree)
    assert "P" in consts
    call = next(n for n in ast.walk(tree) if isinstance(n, ast.Call) and n.func.attr == "match")  # type: ignore[attr-defined]
    assert not _literal(call.args[0], consts)
    assert _literal(ast.parse("'^' + re.escape(t) + '$'", mode="eval").body, consts)


def test_transform_config_targets_are_bounded() -> None:
    """A catastrophic ``re:`` target of a transform_config answers at once, and a
    back-reference is one line naming the group."""
    import time

    from lowbit.checkpoints.compressed_tensors.transforms import input_transforms

    def qc(target: str) -> dict:
        apply = [{"location": "input", "targets": [target], "ignore": []}]
        groups = {"g": {"type": "hadamard", "apply": apply}}
        return {"transform_config": {"config_groups": groups}}

    [t] = input_transforms(qc("re:(.*.*)*z"), "config.json")
    start = time.perf_counter()
    assert not t.matches("model.layers.0.mlp." + "a" * 3000, ("Linear",))
    assert time.perf_counter() - start < 1.0  # Python's re: exponential (hours)
    with pytest.raises(LowbitError, match=r"transform_config group 'g'.*does not compile"):
        input_transforms(qc(r"re:(a)\1"), "config.json")


def test_tensor_type_patterns_are_bounded() -> None:
    """``--tensor-type`` patterns search in linear time, with re.search's meaning."""
    import time

    from lowbit._regex import compile_search

    rx = compile_search("(a|aa)*b", "--tensor-type")
    start = time.perf_counter()
    assert not rx.search("a" * 5000)
    assert time.perf_counter() - start < 1.0
    assert compile_search(r"attn_v", "x").search("blk.0.attn_v.weight")
    assert not compile_search(r"^attn_v", "x").search("blk.0.attn_v.weight")
    assert compile_search(r"^blk\.0\.", "x").search("blk.0.attn_v.weight")
    with pytest.raises(LowbitError, match="does not compile"):
        compile_search("a)(b", "x")
