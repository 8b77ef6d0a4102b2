"""The precision plan applied to a checkpoint: what each tensor becomes.

A :class:`PrecisionPlan` is an ordered list of rules and a default. Each tensor of a checkpoint
gets the first rule that matches it; tensors no rule names follow the defaults a user expects:

- 2-D floating-point weights of linear layers (attention, MLP, other ``*.weight`` matrices)
  get the plan's ``default`` scheme;
- embeddings, the LM head, norms, mixture-of-experts routers (``component: router``: Mixtral's
  ``block_sparse_moe.gate``, Qwen-MoE's ``mlp.gate`` and ``shared_expert_gate``), biases,
  1-D tensors, integer tensors and buffers are kept exactly as stored.

Rules (:class:`~lowbit.plans.rules.Rule`: ``match`` globs, ``regex``, ``component``, ``ndim``,
``format``, ``scale_method``, ``activations``, ``pad``) come from the one plan-file reader,
:func:`~lowbit.plans.rules.load_plan_file`, which ``lowbit plan --plan-file`` uses too::


    version: 1
    default: int4:g128            # scheme for the 2-D linear weights no rule names ("keep": none)
    activations: int8             # optional: simulate per-token INT8 inputs (W8A8) everywhere
    rules:
      - match: "*embed*"          # glob(s) on tensor names; "re:..." makes it a regex
        format: keep              # keep as stored
      - regex: 'model\\.layers\\.(0|1)\\..*'   # regex (full match) on tensor names
        format: int8:ch
        scale_method: mse         # absmax | percentile | meanstd | mse
      - component: mlp            # embeddings, attention, mlp, norms, lm_head, router, other
        ndim: 2
        format: nf4:g64:dq
        activations: fp8_e4m3     # this rule's tensors also get FP8 activations
      - match: lm_head.weight
        format: bf16              # a plain cast (float32 / float16 / bfloat16)

Scheme strings are :func:`lowbit.quant.scheme_text.parse_scheme`'s
(``FORMAT[:gN|:ch|:t][:SCALEFMT][:asym][:dq]``, MX names, presets ``q8_0``/``q4_0``); a format
given without granularity gets the weight layout: one scale per output channel
(``int8`` = ``int8:ch``), NF4 in QLoRA's blocks of 64, MX in blocks of 32. A rule matching no
tensor is a warning naming the closest tensor names; a rule that makes a tensor unquantizable
(a 1-D tensor into group-128 or per-channel scales, integers, an axis the tensor lacks, a group
that does not divide its row with ``pad: false``) is an error naming the tensor.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import re
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lowbit.errors import LowbitError
from lowbit.plans.components import classify
from lowbit.plans.rules import (
    KEEP,
    PLAN_VERSION,
    Action,
    Rule,
    action_dict,
    action_label,
    activation_format,
    load_plan_file,
    parse_action,
    parse_plan,
    parse_rule,
)
from lowbit.quant.layout import make_layout
from lowbit.quant.scheme import Cast, Granularity, Scheme

__all__ = [
    "DEFAULT_COMPONENTS",
    "KEEP",
    "AppliedPlan",
    "PrecisionPlan",
    "TensorPlan",
    "is_float_dtype",
    "unquantizable",
]

#: Tensors the defaults quantize: 2-D weights of these components.
DEFAULT_COMPONENTS = ("attention", "mlp", "other")


# ---------------------------------------------------------------------------------------
# Applying a plan to tensors
# ---------------------------------------------------------------------------------------

#: Plans with more rules than this find each tensor's candidate rules through an index.
_INDEX_FROM = 64
#: Rules that match nothing are named one warning each up to here, then counted in one more.
_MAX_RULE_WARNINGS = 20
_FLOAT_DTYPES = ("F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2")


def is_float_dtype(dtype: str) -> bool:
    """Whether a stored type (safetensors or GGUF name) holds real numbers lowbit can quantize."""
    d = str(dtype).upper()
    if d in _FLOAT_DTYPES:
        return True
    # GGUF block types, compressed-tensors and MLX weights (CT_INT4, MLX_AFFINE4), read dequantized
    return bool(re.match(r"^(Q\d|IQ\d|TQ\d|MXFP|CT_|MLX_)", d))


@dataclass(frozen=True)
class TensorPlan:
    """What one tensor becomes.

    Attributes:
        name, shape, dtype: the source tensor (dtype as the file names it: ``F32``, ``Q4_1``).
        action: ``"quantize"``, ``"cast"`` or ``"keep"``.
        scheme: the quantization scheme (quantize), else None.
        cast: the float type (cast), else None.
        activations: per-token activation format for this layer's input (W8A8), or None.
        rule: index of the rule that decided (None: the defaults).
        reason: why, in words (``rule 2: match '*mlp*'``, ``default: 2-D linear weight``).
        source_nbytes: bytes the tensor takes in the source file.
        method: how a quantized tensor is quantized when its rule names it (``rtn``,
            ``gptq``, ``awq``: :data:`~lowbit.plans.rules.METHODS`), else None (the caller's method).
    """

    name: str
    shape: tuple[int, ...]
    dtype: str
    action: str
    scheme: Scheme | None
    cast: str | None
    activations: str | None
    rule: int | None
    reason: str
    source_nbytes: int
    method: str | None = None

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def decision(self) -> Action:
        """What the tensor becomes: its Scheme, a Cast, or None (keep)."""
        if self.action == "quantize":
            return self.scheme
        if self.action == "cast":
            return Cast(self.cast)  # type: ignore[arg-type]
        return None

    @property
    def label(self) -> str:
        """The decision's label: a scheme's (``int4:g128``), a cast's (``bf16``) or ``keep``."""
        return action_label(self.decision)

    @property
    def nbytes(self) -> int:
        """Bytes in a lowbit checkpoint: codes + scales (+ zero points), or the cast/kept data
        (:meth:`~lowbit.quant.scheme.Scheme.tensor_bytes`, the planner's arithmetic)."""
        decision = self.decision
        if decision is None:
            return self.source_nbytes
        return decision.tensor_bytes(self.shape)

    @property
    def bits(self) -> float:
        """Stored bits per value (every byte of codes, scales and zero points counted)."""
        return self.nbytes * 8 / self.numel if self.numel else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "shape": list(self.shape),
            "dtype": self.dtype,
            "action": self.action,
            "format": self.label,
            "scheme": self.scheme.to_dict() if self.scheme is not None else None,
            "activations": self.activations,
            **({"method": self.method} if self.method else {}),
            "rule": self.rule,
            "reason": self.reason,
            "bits": self.bits,
            "bytes": self.nbytes,
            "source_bytes": self.source_nbytes,
        }


@dataclass(frozen=True)
class AppliedPlan:
    """A plan applied to a checkpoint's tensors (file order), with totals."""

    tensors: tuple[TensorPlan, ...]
    plan: PrecisionPlan

    def __iter__(self) -> Any:
        return iter(self.tensors)

    def __len__(self) -> int:
        return len(self.tensors)

    @property
    def quantized(self) -> tuple[TensorPlan, ...]:
        return tuple(t for t in self.tensors if t.action == "quantize")

    def totals(self) -> dict[str, Any]:
        """Counts and bytes: all tensors, the quantized ones, and their bits per weight."""
        q = self.quantized
        q_numel = sum(t.numel for t in q)
        q_bytes = sum(t.nbytes for t in q)
        return {
            "tensors": len(self.tensors),
            "quantized": len(q),
            "cast": sum(t.action == "cast" for t in self.tensors),
            "kept": sum(t.action == "keep" for t in self.tensors),
            "params": sum(t.numel for t in self.tensors),
            "quantized_params": q_numel,
            "source_bytes": sum(t.source_nbytes for t in self.tensors),
            "bytes": sum(t.nbytes for t in self.tensors),
            "quantized_bytes": q_bytes,
            "quantized_source_bytes": sum(t.source_nbytes for t in q),
            "bits_per_weight": q_bytes * 8 / q_numel if q_numel else None,
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "plan": self.plan.to_dict(),
            "tensors": [t.to_dict() for t in self.tensors],
            "totals": self.totals(),
        }


@dataclass(frozen=True)
class PrecisionPlan:
    """Ordered rules plus a default scheme for the 2-D linear weights no rule names.

    Attributes:
        rules: checked in order; the first that matches a tensor decides it.
        default: what default-quantized tensors (2-D float ``*.weight`` matrices of attention,
            MLP and other linear layers) become: a Scheme, a Cast, or None (keep everything no
            rule names).
        activations: per-token activation format for every quantized layer (W8A8), unless its
            rule names another.
    """

    rules: tuple[Rule, ...] = ()
    default: Action = None
    activations: str | None = None

    # -- construction ---------------------------------------------------------------------

    @classmethod
    def uniform(
        cls,
        to: Any,
        *,
        group_size: int | None = None,
        scale_method: str | None = None,
        asym: bool | None = None,
        scale_format: str | None = None,
        pad: bool = True,
        activations: str | None = None,
        rules: Iterable[Any] = (),
        group: int | None = None,
    ) -> PrecisionPlan:
        """The ``lowbit quantize --to FORMAT [--group N] [--scale-method M] [--asym]`` plan.

        Args:
            to: a scheme string as ``--to`` takes it (``int4:g128``, ``nvfp4``, ``q4_0``),
                ``keep``, a dict or a :class:`~lowbit.quant.scheme.Scheme`.
            group_size: values per scale along each row (``--group``).
            scale_method, asym, scale_format, pad: as the options of the same names.
            activations: per-token activation format (W8A8 simulation), or None.
            rules: plan rules decided before the default.
            group: the older name of ``group_size`` (deprecated: warns).

        Raises:
            LowbitError: a bad scheme or rule; a llama.cpp mix (``q4_k_m``), which is not
                one scheme but a type per tensor: the message names
                ``lowbit.quantize_model(model, "q4_k_m", out, out_format="gguf")``.
        """
        if group is not None:
            # the older name; group_size is the Scheme field's (one name per concept)
            warnings.warn(
                "PrecisionPlan.uniform(group=...) is deprecated: write group_size=",
                DeprecationWarning,
                stacklevel=2,
            )
            if group_size is not None and group_size != group:
                raise LowbitError(f"group={group} and group_size={group_size} disagree")
            group_size = group
        default = parse_action(
            to,
            group_size=group_size,
            scale_method=scale_method,
            symmetric=False if asym else None,
            scale_format=scale_format,
            pad=None if pad else False,
        )
        return cls(
            rules=tuple(parse_rule(r) for r in rules),
            default=default,
            activations=activation_format(activations),
        )

    @classmethod
    def from_dict(cls, data: Any, *, where: str = "plan") -> PrecisionPlan:
        """A plan from ``{"version": 1, "default": ..., "activations": ..., "rules": [...]}``
        or a bare list of rules (the planner's plan files read as they are).

        Raises:
            LowbitError: unknown keys, a newer version, bad rules.
        """
        return cls(*parse_plan(data, where))

    @classmethod
    def from_file(cls, path: str | Path) -> PrecisionPlan:
        """Read a plan file (JSON, or YAML for ``.yaml``/``.yml``).

        Raises:
            LowbitError: a missing or malformed file, or a bad plan.
        """
        return cls(*load_plan_file(path))

    def with_default(self, default: Action, activations: str | None = None) -> PrecisionPlan:
        """The same rules with another default (``--plan FILE --to FORMAT``)."""
        return dataclasses.replace(
            self, default=default, activations=activations or self.activations
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form with ``version`` (parses back with :meth:`from_dict`)."""
        default = action_dict(self.default)
        return {
            "version": PLAN_VERSION,
            "default": default["format"] if len(default) == 1 else default,
            "activations": self.activations,
            "rules": [r.to_dict() for r in self.rules],
        }

    # -- deciding -----------------------------------------------------------------------

    def decide(
        self,
        name: str,
        shape: Sequence[int],
        dtype: str = "F32",
        nbytes: int | None = None,
        alias: str | None = None,
    ) -> TensorPlan:
        """What one tensor becomes (no checks; :meth:`apply` checks). ``alias`` is another name
        rules may match it by (a GGUF tensor's transformers name)."""
        shape = tuple(int(s) for s in shape)
        if nbytes is None:
            nbytes = math.prod(shape) * 4
        order = self._candidates(name, alias) if len(self.rules) > _INDEX_FROM else None
        for i in order if order is not None else range(len(self.rules)):
            rule = self.rules[i]
            if rule.matches(name, shape, alias):
                return self._plan(
                    name, shape, dtype, nbytes, rule.action, rule.activations, i,
                    f"rule {i + 1}: {rule.describe()}", rule.method,
                )  # fmt: skip
        component = classify(name, len(shape))
        if (
            len(shape) == 2
            and component in DEFAULT_COMPONENTS
            and name.endswith("weight")
            and is_float_dtype(dtype)
            and math.prod(shape) > 0
        ):
            return self._plan(
                name, shape, dtype, nbytes, self.default, None, None, "default: 2-D linear weight"
            )
        why = {
            "embeddings": "embeddings",
            "lm_head": "LM head",
            "norms": "norm",
            "router": "MoE router",
            "buffer": "buffer",
        }.get(component)
        if why is None:
            if not is_float_dtype(dtype):
                why = f"{dtype} values"
            elif len(shape) < 2:
                why = "bias" if name.endswith("bias") else f"{len(shape)}-D tensor"
            else:
                why = f"{len(shape)}-D tensor" if len(shape) != 2 else "not a linear weight"
        return self._plan(name, shape, dtype, nbytes, None, None, None, f"default: {why} kept")

    @functools.cached_property
    def _index(self) -> tuple[list[int], dict[str, list[int]], list[int]]:
        """Rules that may match any name, and the glob-only rules by a literal piece every
        name they match holds (each glob's longest), with the piece lengths present."""
        always: list[int] = []
        by_piece: dict[str, list[int]] = {}
        for i, r in enumerate(self.rules):
            pieces = [g.key_piece() for g in r._globs] if r.match else []
            if r.regex or r.component or r.ndim is not None or not pieces or "" in pieces:
                always.append(i)
                continue
            for piece in set(pieces):
                by_piece.setdefault(piece, []).append(i)
        return always, by_piece, sorted({len(k) for k in by_piece})

    def _candidates(self, name: str, alias: str | None) -> list[int]:
        """The rules that can match ``name`` (or ``alias``), in order: with thousands of
        rules, one dictionary look-up per substring of a piece's length, not a match per rule
        (20,000 glob rules x 100 tensors took seconds)."""
        always, by_piece, lengths = self._index
        found = set(always)
        for text in (name,) if alias is None else (name, alias):
            for n in lengths:
                for j in range(len(text) - n + 1):
                    hit = by_piece.get(text[j : j + n])
                    if hit is not None:
                        found.update(hit)
        return sorted(found)

    def _plan(
        self,
        name: str,
        shape: tuple[int, ...],
        dtype: str,
        nbytes: int,
        action: Action,
        activations: str | None,
        rule: int | None,
        reason: str,
        method: str | None = None,
    ) -> TensorPlan:
        if action is None:
            return TensorPlan(name, shape, dtype, "keep", None, None, None, rule, reason, nbytes)
        if isinstance(action, Cast):
            return TensorPlan(
                name, shape, dtype, "cast", None, action.dtype, None, rule, reason, nbytes
            )
        acts = activations or self.activations
        return TensorPlan(
            name, shape, dtype, "quantize", action, None, acts, rule, reason, nbytes, method
        )

    def apply(
        self, tensors: Iterable[tuple[str, Sequence[int], str, int]], *, source: str = "the model"
    ) -> AppliedPlan:
        """Decide every tensor, warn about rules that match nothing, refuse unquantizable ones.

        Args:
            tensors: ``(name, shape, dtype, nbytes[, alias])`` in file order
                (``lowbit.checkpoints.streaming.checkpoint_tensors`` gives them for an open
                checkpoint).
            source: how to name the model in messages.

        Returns:
            An :class:`AppliedPlan`.

        Raises:
            LowbitError: a tensor the plan cannot quantize, naming it, its shape, the rule and
                the reason (and how many more there are).

        Warns:
            UserWarning: for each rule that matches no tensor, with the closest names.
        """
        items = [
            (str(t[0]), tuple(int(s) for s in t[1]), str(t[2]), int(t[3]), *t[4:5]) for t in tensors
        ]
        plans = tuple(self.decide(*item) for item in items)
        aliases = {item[0]: item[4] for item in items if len(item) > 4}
        used = {p.rule for p in plans if p.rule is not None}
        unused = [i for i in range(len(self.rules)) if i not in used]
        hints = _Hints(items)
        for i in unused[:_MAX_RULE_WARNINGS]:
            rule = self.rules[i]
            hit = next(
                (p for p in plans if rule.matches(p.name, p.shape, aliases.get(p.name))), None
            )
            if hit is None:
                msg = f"matches no tensor of {source}{hints.close(rule)}"
            else:
                msg = (
                    f"decides no tensor: earlier rules take every tensor it matches (e.g. "
                    f"{hit.name!r}, decided by rule {hit.rule + 1})"  # type: ignore[operator]
                )
            warnings.warn(f"plan rule {i + 1} ({rule.describe()}) {msg}", UserWarning, stacklevel=2)
        if len(unused) > _MAX_RULE_WARNINGS:  # one line, not one per rule (and no O(rules^2))
            warnings.warn(
                f"{len(unused) - _MAX_RULE_WARNINGS} more plan rules decide no tensor (rules "
                f"{', '.join(str(i + 1) for i in unused[_MAX_RULE_WARNINGS:][:5])} ...)",
                UserWarning,
                stacklevel=2,
            )
        problems = [(p, why) for p in plans if (why := unquantizable(p)) is not None]
        if problems:
            p, why = problems[0]
            more = f" ({len(problems) - 1} more tensors like it)" if len(problems) > 1 else ""
            raise LowbitError(
                f"the plan makes tensor {p.name!r} (shape {p.shape}, {p.dtype}) unquantizable "
                f"with {p.label} ({p.reason}): {why}{more}"
            )
        return AppliedPlan(plans, self)


def unquantizable(p: TensorPlan) -> str | None:
    """Why the plan's choice for this tensor cannot be carried out, or None when it can."""
    if p.action == "keep":
        return None
    if not is_float_dtype(p.dtype):
        return f"it holds {p.dtype} values, not real numbers"
    if p.numel == 0:
        return "it is empty"
    if p.action == "cast":
        return None
    s = p.scheme
    assert s is not None
    if s.granularity is not Granularity.TENSOR and len(p.shape) < 2:
        what = {
            Granularity.CHANNEL: "per-channel scales (one scale per value)",
            Granularity.GROUP: f"groups of {s.group_size} along rows",
            Granularity.BLOCK: "MX blocks of 32 along rows",
        }[s.granularity]  # type: ignore[index]
        return (
            f"a {len(p.shape)}-D tensor has no rows for {what}; keep it, use a per-tensor "
            f"scheme (e.g. fp8_e4m3:t), or narrow the rule with ndim: 2"
        )
    try:
        make_layout(p.shape, s)
    except LowbitError as exc:
        return str(exc)
    return None


def _in_order(pieces: list[str], text: str) -> bool:
    """Whether ``text`` holds every piece, in order (leftmost finds: linear, no regex)."""
    pos = 0
    for p in pieces:
        j = text.find(p, pos)
        if j < 0:
            return False
        pos = j + len(p)
    return True


class _Hints:
    """'; close names: ...' for a rule that matched nothing (the name templates built once).

    Names that contain every literal piece of a pattern in order come first (``*.mlp.gate``
    finds ``model.layers.0.mlp.gate_proj.weight``), then difflib's closest, per layer-number
    template so that one layer's names stand for all."""

    def __init__(self, items: list[tuple[Any, ...]]) -> None:
        self.items = items
        self.names = [n for n, *_ in items] + [t[4] for t in items if len(t) > 4 and t[4]]
        self.templates = list(dict.fromkeys(re.sub(r"\d+", "*", n) for n in self.names))

    def close(self, rule: Rule) -> str:
        names, templates, items = self.names, self.templates, self.items
        probes = [(g, r"[*?\[\]]+") for g in rule.match] + [
            (r, r"[\\^$.*+?()\[\]{}|]+") for r in rule.regex
        ]
        close: list[str] = []
        for probe, meta in probes:
            pieces = [p for p in re.split(meta, probe[:200]) if p][:20]
            if pieces:
                close += [t for t in templates if _in_order(pieces, t)][:3]
            if len(probe) <= 200:  # difflib is quadratic in the lengths it compares
                close += difflib.get_close_matches(probe, templates, n=3, cutoff=0.5)
        close = list(dict.fromkeys(close))[:3]
        if close:
            examples = []
            for t in close:
                rx = re.compile("^" + re.escape(t).replace(r"\*", r"\d+") + "$")
                examples.append(next(n for n in names if rx.match(n)))
            return f"; close names: {', '.join(examples)}"
        if rule.component:
            present = sorted({classify(n, len(sh)) for n, sh, *_ in items} - {"buffer"})
            return f"; components present: {', '.join(present)}"
        return f"; names look like: {', '.join(n for n, *_ in items[:3])}"
