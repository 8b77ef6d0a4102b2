"""Plan rules: which tensors of a model get which scheme, and the one plan-file reader.

A :class:`Rule` selects tensors by name globs (``match``), full-match regular expressions
(``regex``, or a glob written ``re:...``), component (:data:`~lowbit.plans.components.COMPONENTS`)
and rank (``ndim``); what they become (its *action*) is a :class:`~lowbit.quant.scheme.Scheme`,
a plain :class:`~lowbit.quant.scheme.Cast`, or None (keep as stored). The first matching rule
wins. ``lowbit quantize --plan``, ``lowbit plan --plan-file`` and ``PrecisionPlan.from_file``
all read plan files with :func:`load_plan_file`::

    version: 1
    default: int4:g128          # what the 2-D linear weights no rule names become
    activations: int8           # optional: per-token activation format (W8A8 simulation)
    rules:
      - {match: "*embed*", format: keep}
      - {regex: 'model\\.layers\\.0\\..*', format: "int8:ch", scale_method: mse}
      - {component: mlp, ndim: 2, format: "nf4:g64:dq", activations: fp8_e4m3}
      - {match: lm_head.weight, format: bf16}
      - {component: attention, ndim: 2, format: int4:g128, method: gptq}

A rule's ``method`` (:data:`METHODS`: ``rtn`` round to nearest, ``gptq`` or ``awq`` calibrated)
says how its tensors are quantized; a rule without one follows the command's ``--method``. One
run calibrates with one method: a plan naming both ``gptq`` and ``awq`` is refused
(:func:`calibrated_method`).

Formats are scheme strings (:func:`lowbit.quant.scheme_text.parse_scheme`), ``keep``, or
``Scheme.to_dict()`` dicts; ``scale_method`` and ``pad`` set those Scheme fields.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lowbit._files import read_data_file
from lowbit._json import path_exists
from lowbit._regex import Glob, check_plan_patterns, compile_bounded
from lowbit.errors import LowbitError
from lowbit.formats.catalog import format as _lookup
from lowbit.plans.components import COMPONENTS, classify
from lowbit.quant.scheme import Cast, ScaleMethod, Scheme
from lowbit.quant.scheme_text import _field_names, parse_scheme

__all__ = [
    "KEEP",
    "METHODS",
    "PLAN_VERSION",
    "Action",
    "Rule",
    "action_dict",
    "action_label",
    "activation_format",
    "calibrated_method",
    "load_plan_file",
    "method_name",
    "parse_action",
    "parse_plan",
    "parse_rule",
]

KEEP = "keep"
PLAN_VERSION = 1
_RULE_KEYS = {"match", "regex", "component", "ndim", "format", "scheme", "scale_method",
              "activations", "pad", "method"}  # fmt: skip
#: How a rule's tensors may be quantized: ``rtn`` (round to nearest, from the weights alone),
#: ``gptq`` (calibrated, ``lowbit.methods.gptq``), ``awq`` (calibrated scales folded into the
#: operation before, ``lowbit.methods.awq``). A new method is one more entry here.
METHODS = ("rtn", "gptq", "awq")
_PLAN_KEYS = {"version", "default", "activations", "rules"}

Action = Scheme | Cast | None  # None: keep as stored


def parse_action(spec: Any, **overrides: Any) -> Action:
    """What a plan entry's ``format`` says: ``keep`` (None), or a scheme through
    :func:`~lowbit.quant.scheme_text.parse_scheme` with its field overrides.

    Raises:
        LowbitError: a bad scheme, or options given with ``keep``.
    """
    if spec is None or (isinstance(spec, str) and spec.strip().lower() == KEEP):
        given = sorted(k for k, v in overrides.items() if v is not None)
        if given:
            raise LowbitError(f"'keep' takes no scheme options (got {', '.join(given)})")
        return None
    return parse_scheme(spec, **overrides)


def method_name(value: Any) -> str | None:
    """A rule's ``method`` (one of :data:`METHODS`), or None when not given.

    Raises:
        LowbitError: a value that is not one of :data:`METHODS`.
    """
    if value is None:
        return None
    name = value.strip().lower() if isinstance(value, str) else value
    if name not in METHODS:
        raise LowbitError(f"unknown method {value!r}; allowed: {', '.join(METHODS)}")
    return name


def calibrated_method(
    methods: Iterable[str | None], default: str = "rtn", *, run: str | None = None
) -> str:
    """The one calibrated method (``gptq`` or ``awq``) a run needs for tensors whose rules name
    ``methods`` (None: the rule names none, so ``default`` applies), or ``rtn`` when none is.

    Args:
        methods: each quantized tensor's rule method (``TensorPlan.method``).
        default: the method of tensors whose rule names none (``--method``).
        run: the calibrated method the caller runs, or None; given, a plan needing the other
            one is an error too.

    Raises:
        LowbitError: an unknown method, both ``gptq`` and ``awq`` (a run calibrates with one:
            AWQ's folds change the weights GPTQ would solve for), or not ``run``'s method.
    """
    default = method_name(default) or "rtn"
    used = {method_name(m) or default for m in methods} - {"rtn"}
    if len(used) > 1:
        raise LowbitError(
            f"the plan asks for {' and '.join(sorted(used))} (rule methods or --method): one "
            "run calibrates with one method; give the tensors of one of them method: rtn"
        )
    got = used.pop() if used else "rtn"
    if run is not None and got not in ("rtn", method_name(run)):
        raise LowbitError(
            f"this run calibrates with {run}, but the plan asks for {got} (rule methods or the "
            f"default method): one method per run; give those rules method: rtn or {run}"
        )
    return got


def action_label(action: Action) -> str:
    """``keep``, a cast's ``bf16``, or the scheme's label (``int4:g128:fp16:mse``)."""
    return KEEP if action is None else action.label


def action_dict(action: Action) -> dict[str, Any]:
    """The plan-file form of an action, ``{"format": LABEL}`` (plus ``pad: false``), which
    :func:`parse_action` reads back to exactly ``action``; a Scheme whose label cannot say
    everything (percentile, k_std, rounding) as ``{"format": Scheme.to_dict()}``."""
    if action is None or isinstance(action, Cast):
        return {"format": action_label(action)}
    out: dict[str, Any] = {"format": action.label}
    if not action.pad:
        out["pad"] = False
    try:
        again = parse_action(out["format"], pad=action.pad)
    except LowbitError:
        again = None
    if again != action:
        return {"format": action.to_dict()}
    return out


def activation_format(name: str | None) -> str | None:
    """Canonical name of a layer input's format: a per-token one for W8A8 simulation
    (``int8``, ``fp8`` = E4M3), or ``nvfp4``: NVFP4 in groups of 16 under a static tensor
    scale calibrated on data (W4A4; compressed-tensors output with NVFP4 weights only).

    Raises:
        LowbitError: a format the per-token simulation cannot take (value sets, unsigned).
    """
    if name is None:
        return None
    key = str(name).strip().lower()
    if key == "nvfp4":
        return "nvfp4"
    fmt = _lookup({"fp8": "float8_e4m3fn"}.get(key, key))
    ok = (fmt.kind == "int" and getattr(fmt, "signed", False) and fmt.bits <= 16) or (
        fmt.kind == "float" and getattr(fmt, "signed", True) and getattr(fmt, "subnormals", True)
    )
    if not ok:
        raise LowbitError(
            f"activations {name!r}: per-token simulation takes signed integers (int8) or signed "
            f"floats with subnormals (fp8_e4m3, fp8_e5m2), not {fmt.name}; W4A4 is nvfp4"
        )
    return fmt.name


@dataclass(frozen=True)
class Rule:
    """Tensors matching every given condition get ``action``; the first matching rule wins.

    Attributes:
        action: a :class:`~lowbit.quant.scheme.Scheme`, a :class:`~lowbit.quant.scheme.Cast`,
            or None (keep as stored).
        match: glob(s) on tensor names (``fnmatch``, case-sensitive).
        regex: regular expression(s), each matched against the whole name.
        component: component name(s) (:data:`~lowbit.plans.components.COMPONENTS`).
        ndim: tensor rank (1 selects norms and biases).
        activations: per-token activation format for the layers this rule quantizes.
        method: how they are quantized (:data:`METHODS`), or None (the caller's choice).

    Raises:
        LowbitError: no condition, a regex that does not compile, an unknown component, an
            unknown method or a method on a rule that does not quantize.
    """

    action: Action
    match: tuple[str, ...] = ()
    regex: tuple[str, ...] = ()
    component: tuple[str, ...] = ()
    ndim: int | None = None
    activations: str | None = None
    method: str | None = None

    def __post_init__(self) -> None:
        for name in ("match", "regex", "component"):
            object.__setattr__(self, name, _as_tuple(getattr(self, name)))
        object.__setattr__(self, "method", method_name(self.method))
        if self.method is not None and not isinstance(self.action, Scheme):
            raise LowbitError(
                f"method {self.method!r} needs a quantization format, not {action_label(self.action)}"
            )
        if not (self.match or self.regex or self.component or self.ndim is not None):
            raise LowbitError("a plan rule needs match, regex, component or ndim")
        # linear-time matchers (lowbit._regex): a rule's regex may come from a file
        compiled = tuple(compile_bounded(r, "plan rule") for r in self.regex)
        object.__setattr__(self, "_compiled", compiled)
        object.__setattr__(self, "_globs", tuple(Glob(g) for g in self.match))
        bad = [c for c in self.component if c not in COMPONENTS]
        if bad:
            raise LowbitError(f"unknown component(s) {bad}; choose from {', '.join(COMPONENTS)}")
        if self.ndim is not None and (
            isinstance(self.ndim, bool) or not isinstance(self.ndim, int)
        ):
            raise LowbitError(f"rule ndim must be an integer, got {self.ndim!r}")

    def matches(
        self,
        name: str,
        shape: Sequence[int],
        alias: str | None = None,
        component: str | None = None,
    ) -> bool:
        """Whether a tensor falls under the rule.

        Args:
            name: the tensor's name.
            shape: its shape.
            alias: another name it may be matched by (a GGUF tensor's transformers name).
            component: its component when the caller knows it (the planner's model spec);
                default: :func:`~lowbit.plans.components.classify` of the name.
        """
        for g in self._globs:  # plain loops: called rules x tensors times
            if g.test(name) or (alias is not None and g.test(alias)):
                break
        else:
            if self._globs:
                return False
        for r in self._compiled:
            if r.fullmatch(name) or (alias is not None and r.fullmatch(alias)):
                break
        else:
            if self._compiled:
                return False
        if self.component:
            comp = component if component is not None else classify(name, len(shape))
            if comp not in self.component:
                return False
        return self.ndim is None or len(shape) == self.ndim

    def describe(self) -> str:
        """``match '*mlp*' -> int4:g128`` (for messages and tables; ``by gptq`` when the rule
        names a method)."""
        by = f" by {self.method}" if self.method else ""
        return f"{self.selector()} -> {action_label(self.action)}{by}"

    def selector(self) -> str:
        """What the rule selects, in words: ``match '*mlp*' ndim 2``."""
        parts = []
        if self.match:
            parts.append("match " + ", ".join(repr(g) for g in self.match))
        if self.regex:
            parts.append("regex " + ", ".join(repr(r) for r in self.regex))
        if self.component:
            parts.append("component " + ", ".join(self.component))
        if self.ndim is not None:
            parts.append(f"ndim {self.ndim}")
        return " ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        """The rule in plan-file form (parses back with :func:`parse_rule`)."""
        out: dict[str, Any] = {}
        if self.match:
            out["match"] = list(self.match)
        if self.regex:
            out["regex"] = list(self.regex)
        if self.component:
            out["component"] = list(self.component)
        if self.ndim is not None:
            out["ndim"] = self.ndim
        out.update(action_dict(self.action))
        if self.activations:
            out["activations"] = self.activations
        if self.method:
            out["method"] = self.method
        return out


@functools.lru_cache(maxsize=256)
def _parse_text_action(spec: str, method: ScaleMethod | None, pad: bool | None) -> Action:
    return parse_action(spec, scale_method=method, pad=pad)  # frozen results: safe to share


def parse_rule(d: Any) -> Rule:
    """A :class:`Rule` from a plan-file entry (fields: see the module docstring).

    Raises:
        LowbitError: unknown fields, a missing format, a bad scheme, regex, component or ndim.
    """
    if isinstance(d, Rule):
        return d
    if not isinstance(d, Mapping):
        raise LowbitError(f"a plan rule must be an object, got {d!r}")
    unknown = set(d) - _RULE_KEYS
    if unknown:
        raise LowbitError(
            f"unknown rule field(s) {', '.join(_field_names(unknown))}; allowed: "
            f"{', '.join(sorted(_RULE_KEYS))}"
        )
    spec = d.get("format", d.get("scheme"))
    if spec is None:
        raise LowbitError(f"plan rule {_rule_text(d)} needs a format (a scheme, or 'keep')")
    globs, regexes = [], list(_as_tuple(d.get("regex")))
    for g in _as_tuple(d.get("match")):
        (regexes if g.startswith("re:") else globs).append(g[3:] if g.startswith("re:") else g)
    pad = d.get("pad")
    if pad is not None and not isinstance(pad, bool):
        raise LowbitError(f"plan rule {_rule_text(d)}: pad must be true or false, got {pad!r}")
    method = d.get("scale_method")
    if method is not None:
        try:
            method = ScaleMethod(str(method).strip().lower())
        except ValueError:
            allowed = ", ".join(m.value for m in ScaleMethod)
            raise LowbitError(
                f"plan rule {_rule_text(d)}: unknown scale_method {method!r}; allowed: {allowed}"
            ) from None
    try:
        if isinstance(spec, str):  # 10,000 rules of one format parse it once
            action = _parse_text_action(spec, method, pad)
        else:
            action = parse_action(spec, scale_method=method, pad=pad)
        if action is None and d.get("activations"):
            raise LowbitError("'keep' takes no activations")
        return Rule(
            action=action,
            match=tuple(globs),
            regex=tuple(regexes),
            component=_as_tuple(d.get("component")),
            ndim=d.get("ndim"),
            activations=activation_format(d.get("activations")),
            method=d.get("method"),
        )
    except LowbitError as exc:
        raise LowbitError(f"plan rule {_rule_text(d)}: {exc}") from None


def parse_plan(data: Any, where: str = "plan") -> tuple[tuple[Rule, ...], Action, str | None]:
    """The parts of a plan: ``{"version": 1, "default": ..., "activations": ..., "rules":
    [...]}``, or a bare list of rules.

    Returns:
        ``(rules, default, activations)``; the default is None (keep) when not given.

    Raises:
        LowbitError: unknown keys, another version, bad rules (named by number).
    """
    if isinstance(data, list):
        data = {"rules": data}
    if not isinstance(data, Mapping):
        raise LowbitError(f"{where}: a plan is an object with 'rules' (and 'default')")
    unknown = set(data) - _PLAN_KEYS
    if unknown:
        raise LowbitError(
            f"{where}: unknown key(s) {', '.join(sorted(unknown))}; "
            f"allowed: {', '.join(sorted(_PLAN_KEYS))}"
        )
    if data.get("version", PLAN_VERSION) != PLAN_VERSION:
        raise LowbitError(
            f"{where}: plan version {data.get('version')!r}; this lowbit reads {PLAN_VERSION}"
        )
    rules = data.get("rules") or []
    if not isinstance(rules, list):
        raise LowbitError(f"{where}: 'rules' must be a list")
    check_plan_patterns(rules, where)  # before any is compiled
    parsed = []
    for i, r in enumerate(rules):
        try:
            parsed.append(parse_rule(r))
        except LowbitError as exc:
            raise LowbitError(f"{where}: rule {i + 1}: {exc}") from None
    try:
        default = _parse_default(data.get("default"))
    except LowbitError as exc:
        raise LowbitError(f"{where}: default: {exc}") from None
    return tuple(parsed), default, activation_format(data.get("activations"))


def load_plan_file(path: str | Path) -> tuple[tuple[Rule, ...], Action, str | None]:
    """Read a plan file (JSON, or YAML for ``.yaml``/``.yml``): see :func:`parse_plan`.

    Raises:
        LowbitError: a missing or malformed file, or a bad plan.
    """
    p = Path(path)
    if not path_exists(p):  # other non-files (a FIFO) are refused by the reader
        raise LowbitError(f"plan file {p} does not exist")
    return parse_plan(read_data_file(p), where=str(p))


def _parse_default(default: Any) -> Action:
    """A plan's default: a scheme string, ``keep``, a Scheme dict, or ``{format,
    scale_method, pad}``."""
    if default is None:
        return None
    if (
        isinstance(default, Mapping)
        and "format" in default
        and set(default) <= {"format", "scale_method", "pad"}
    ):
        return parse_action(
            default["format"], scale_method=default.get("scale_method"), pad=default.get("pad")
        )
    return parse_action(default)


def _rule_text(d: Mapping[str, Any]) -> str:
    keys = [k for k in ("match", "regex", "component", "ndim") if k in d]
    return "{" + ", ".join(f"{k}: {d[k]!r}" for k in keys) + "}"


def _as_tuple(v: Any) -> tuple[str, ...]:
    if v is None:
        return ()
    if isinstance(v, str):
        return (v,)
    if not isinstance(v, (list, tuple)) or not all(isinstance(x, str) for x in v):
        raise LowbitError(f"expected a string or a list of strings, got {v!r:.60}")
    return tuple(v)
