"""lowbit's import graph, read with ``ast``: layered, acyclic, no hidden imports.

Every ``import`` statement of ``src/lowbit`` counts, at module level and inside functions
(``from x import y`` names the submodule ``x.y`` when ``y`` is one). The rules:

(a) no cycle between the layers' packages (formats, codecs, quant, ...);
(b) no cycle between modules at all;
(c) no function-local import of a lowbit module, unless that module needs an optional
    dependency at import time (``lowbit.torch`` needs torch, ``lowbit.codecs._kernels`` numba):
    deferring such an import is deferring the optional dependency. The lazy ``__getattr__`` of a
    package ``__init__`` (``importlib.import_module`` of a name table) is not an import
    statement and is allowed;
(d) imports go down the layers, never up or sideways:

    cli -> jobs -> view -> planning, evaluation -> calibration -> models, training -> checkpoints
    -> methods -> plans -> quant, torch -> ggml -> formats -> codecs
    -> base (errors, enums, _arrays, _cpu, _parallel, _progress, _results, _files, _json, _optional, _version)

    The codecs sit below the formats: ``FloatFormat.encode`` calls them, and they read a format
    through the ``lowbit.codecs._common.FloatFields`` protocol. Training sits above the
    checkpoints (the train lab writes its outputs through ``lowbit.checkpoints.io.outputs``).
    Only the CLI may use the ``lowbit`` package facade; the library imports the module that
    defines a name.

There are no exceptions: a broken rule is fixed in the code, not listed here.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"

#: Layer of each top-level package or module of lowbit (higher may import lower).
LAYERS = {
    "cli": 13,
    "jobs": 12,
    "view": 11,
    "planning": 10,
    "evaluation": 10,
    "calibration": 9,
    "models": 8,
    "training": 8,
    "checkpoints": 7,
    "methods": 6,
    "plans": 5,
    "quant": 4,
    "torch": 4,
    "ggml": 3,
    "formats": 2,
    "codecs": 1,
    "errors": 0,
    "enums": 0,
    "_arrays": 0,
    "_cpu": 0,
    "_parallel": 0,
    "_progress": 0,
    "_results": 0,
    "_files": 0,
    "_json": 0,
    "_regex": 0,
    "_optional": 0,
    "_version": 0,
}
BASE = "base"  # the layer-0 modules, one group

#: Optional third-party dependencies: deferring their import is what local imports are for.
OPTIONAL = {
    "torch", "transformers", "tokenizers", "safetensors", "gguf", "numba", "llvmlite", "tqdm",
    "yaml", "matplotlib", "compressed_tensors", "accelerate", "gfloat", "bitsandbytes",
}  # fmt: skip


@dataclass(frozen=True)
class Edge:
    """One import statement: ``importer`` imports ``imported`` at ``line``."""

    importer: str
    imported: str
    line: int
    function: str | None  # the enclosing function, None at module level
    guarded: bool  # under a module-level ``if`` (TYPE_CHECKING, HAVE_NUMBA): may not run


def modules(src: Path) -> dict[str, Path]:
    """Every module of the packages under ``src``, by dotted name."""
    out = {}
    for path in sorted(src.rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _targets(node: ast.Import | ast.ImportFrom, module: str, is_pkg: bool, known: set[str]):
    """The dotted names one statement imports; ``from x import y`` gives ``x.y`` when that is
    a module, else ``x``."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    base = node.module or ""
    if node.level:
        pkg = module.split(".") if is_pkg else module.split(".")[:-1]
        pkg = pkg[: len(pkg) - node.level + 1]
        base = ".".join([*pkg, base] if base else pkg)
    return [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]


def import_edges(src: Path, root: str = "lowbit") -> tuple[list[Edge], dict[str, set[str]]]:
    """All import statements between modules of ``root``, and the third-party top-level
    names each module imports unconditionally at module level (its required dependencies)."""
    mods = modules(src)
    known = set(mods)
    edges: list[Edge] = []
    required: dict[str, set[str]] = defaultdict(set)
    for module, path in mods.items():
        if module != root and not module.startswith(root + "."):
            continue
        is_pkg = path.name == "__init__.py"

        def visit(
            node: ast.AST, function: str | None, guarded: bool, module: str = module,
            is_pkg: bool = is_pkg,
        ) -> None:  # fmt: skip
            for child in ast.iter_child_nodes(node):
                fn, guard = function, guarded
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) and fn is None:
                    fn = child.name
                if isinstance(child, ast.If) and fn is None:
                    guard = True
                if isinstance(child, (ast.Import, ast.ImportFrom)):
                    for name in _targets(child, module, is_pkg, known):
                        if name == root or name.startswith(root + "."):
                            edges.append(Edge(module, name, child.lineno, fn, guard))
                        elif fn is None and not guard:
                            required[module].add(name.split(".")[0])
                visit(child, fn, guard)

        visit(ast.parse(path.read_text(encoding="utf-8")), None, False)
    return edges, required


def needs_optional(edges: Iterable[Edge], required: dict[str, set[str]]) -> set[str]:
    """Modules that cannot be imported without an optional dependency (directly, or through
    the lowbit modules they import unconditionally at module level)."""
    deps = defaultdict(set)
    for e in edges:
        if e.function is None and not e.guarded:
            deps[e.importer].add(e.imported)
    heavy = {m for m, names in required.items() if names & OPTIONAL}
    grew = True
    while grew:
        grew = False
        for m, targets in deps.items():
            if m not in heavy and targets & heavy:
                heavy.add(m)
                grew = True
    return heavy


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def strong(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    nodes = set(graph) | {w for ws in graph.values() for w in ws}
    for v in sorted(nodes):
        if v not in index:
            strong(v)
    return found


def group(module: str) -> str:
    """The layer group of a module: its top-level package or module (layer 0: ``base``)."""
    parts = module.split(".")
    if len(parts) == 1:
        return "lowbit"  # the package facade
    return BASE if LAYERS.get(parts[1]) == 0 else parts[1]


def _rank(g: str) -> int:
    return 0 if g == BASE else LAYERS[g]


def violations(
    edges: list[Edge],
    required: dict[str, set[str]],
    allowed: Iterable[tuple[str, str, str]] = (),
) -> list[tuple[str, str, str]]:
    """Every broken rule as ``(rule, importer, imported)``.

    ``local`` and ``layer`` name one import; ``cycle`` (modules) and ``package-cycle`` name
    the members of one strongly connected component, space-separated, with ``imported``
    empty. Cycles are looked for after dropping the ``allowed`` edges (an allowed ``cycle``
    entry is the one import that closes a known cycle).
    """
    allowed = set(allowed)
    skip = {(a, b) for rule, a, b in allowed if rule in ("cycle", "layer")}
    found: set[tuple[str, str, str]] = set()
    heavy = needs_optional(edges, required)
    module_graph: dict[str, set[str]] = defaultdict(set)
    for e in edges:
        if e.importer != e.imported and (e.importer, e.imported) not in skip:
            module_graph[e.importer].add(e.imported)
        if e.function is not None and e.imported not in heavy:
            found.add(("local", e.importer, e.imported))
        gi, gt = group(e.importer), group(e.imported)
        if gi == gt or gi == "lowbit":  # within a group; the facade's own eager imports
            continue
        if gt == "lowbit":
            if gi != "cli":
                found.add(("layer", e.importer, e.imported))
        elif _rank(gt) >= _rank(gi):
            found.add(("layer", e.importer, e.imported))
    for component in cycles(module_graph):
        found.add(("cycle", " ".join(component), ""))
    group_graph: dict[str, set[str]] = defaultdict(set)
    for e in edges:
        gi, gt = group(e.importer), group(e.imported)
        if gi != gt and "lowbit" not in (gi, gt) and (e.importer, e.imported) not in skip:
            group_graph[gi].add(gt)
    for component in cycles(group_graph):
        found.add(("package-cycle", " ".join(component), ""))
    return sorted(found)


def test_lowbit_import_graph_follows_the_rules() -> None:
    """No cycle (packages or modules), no function-local import of a core lowbit module, no
    import up or across the layers, and no exception list."""
    edges, required = import_edges(SRC)
    assert len(edges) > 200, "the walk found too few imports: is SRC right?"
    broken = violations(edges, required)
    lines = {(e.importer, e.imported): f"{e.importer}:{e.line}" for e in edges}
    report = "\n".join(f"{rule}: {lines.get((a, b), a)} -> {b}" for rule, a, b in broken)
    assert not broken, f"import rules broken:\n{report}"


def test_every_layer_is_known() -> None:
    """Every top-level package or module of lowbit has a layer (a new one must be placed)."""
    names = {m.split(".")[1] for m in modules(SRC) if m.count(".") >= 1}
    assert names <= set(LAYERS), f"no layer for {sorted(names - set(LAYERS))}"


# ---- the checker itself can fail --------------------------------------------------------


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = tmp_path / "lowbit" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return tmp_path


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        (  # a module cycle hidden in a function, inside one package
            {
                "__init__.py": "",
                "formats/__init__.py": "",
                "formats/a.py": "from lowbit.formats import b\n",
                "formats/b.py": "def f():\n    from lowbit.formats.a import x\n",
            },
            {
                ("cycle", "lowbit.formats.a lowbit.formats.b", ""),
                ("local", "lowbit.formats.b", "lowbit.formats.a"),
            },
        ),
        (  # an upward import closing a cycle between packages
            {
                "__init__.py": "",
                "formats/__init__.py": "",
                "quant/__init__.py": "",
                "formats/f.py": "import lowbit.quant.q\n",
                "quant/q.py": "from lowbit.formats import f\n",
            },
            {
                ("cycle", "lowbit.formats.f lowbit.quant.q", ""),
                ("layer", "lowbit.formats.f", "lowbit.quant.q"),
                ("package-cycle", "formats quant", ""),
            },
        ),
        (  # the facade from the library; a deferred optional dependency is fine
            {
                "__init__.py": "",
                "torch.py": "import torch\n",
                "checkpoints/__init__.py": "",
                "checkpoints/c.py": "import lowbit\ndef f():\n    import lowbit.torch\n",
            },
            {("layer", "lowbit.checkpoints.c", "lowbit")},
        ),
    ],
)
def test_checker_catches_synthetic_violations(
    tmp_path: Path, files: dict[str, str], expected: set[tuple[str, str, str]]
) -> None:
    """The checker reports a planted cycle, local import, upward import and facade import."""
    src = _package(tmp_path, files)
    edges, required = import_edges(src)
    assert set(violations(edges, required)) == expected
