"""Mixed precision from measured sensitivity: one scheme per tensor under a bits budget.

:func:`plan_for_budget` takes a sensitivity scan (every quantizable tensor under every
candidate scheme: its stored bits and its damage, see :mod:`lowbit.evaluation.sensitivity`),
the checkpoint's tensors, a budget and the user's constraints, and solves the multiple-choice
knapsack (:func:`lowbit.plans.budget.solve`): least summed damage within the budget. It
returns an ordinary :class:`~lowbit.plans.plan.PrecisionPlan` (``lowbit quantize --plan``
reproduces the choice from the file), the solver's :class:`~lowbit.plans.budget.Allocation`
(with its optimality gap) and one row per tensor.

Budgets:

- ``bits_per_weight``: stored bits (codes, scales, zero points) over the weights of every
  tensor the plan quantizes, as ``lowbit quantize`` reports ``bits/weight``;
- ``size``: bytes of every tensor of the output (quantized, cast and kept), lowbit's layout.

Constraints, applied before solving:

- ``base``: a plan whose rules decide first (``lowbit quantize --plan FILE``): every tensor a
  rule matches is pinned to that rule's choice and its bytes count against the budget;
- ``candidates``: only these of the scanned schemes may be chosen;
- ``min_scheme``: no tensor gets fewer stored bits than this scheme would give it.

``method`` (``gptq``) is how the tensors will be quantized: the written plan names it on every
rule (the commonest scheme gets a rule too), so ``lowbit quantize --plan`` of the file
quantizes them the same way without ``--method``; a ``base`` rule naming its own method keeps it.

:data:`PRESETS` (:mod:`lowbit.plans.presets`, re-exported here) are fixed rules of the
kind people use today, to compare with at the same bits/weight (``q4_k_m_like``: llama.cpp's
Q4_K_M rule in lowbit schemes).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from lowbit.errors import LowbitError
from lowbit.plans.budget import Allocation, solve
from lowbit.plans.plan import PrecisionPlan
from lowbit.plans.presets import PRESETS, preset_plan, rule_selector, tensor_group, use_more_bits
from lowbit.plans.rules import Rule, method_name
from lowbit.quant.scheme import Scheme
from lowbit.quant.scheme_text import parse_scheme

__all__ = [
    "PRESETS",
    "MixedPlan",
    "TensorChoice",
    "parse_size",
    "plan_for_budget",
    "preset_plan",
    "tensor_group",
    "use_more_bits",
]

_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([kmgt]?i?b?)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9,
          "gb": 10**9, "t": 10**12, "tb": 10**12, "kib": 2**10, "mib": 2**20, "gib": 2**30,
          "tib": 2**40, "ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40}  # fmt: skip


class _Entry(Protocol):
    tensor: str
    scheme: str
    numel: int
    bits: int


class _Scan(Protocol):
    """What :func:`plan_for_budget` reads of a scan (a ``SensitivityResult``)."""

    @property
    def entries(self) -> Sequence[Any]: ...

    @property
    def measure(self) -> str: ...

    @property
    def metric(self) -> str: ...

    def score(self, e: Any) -> float: ...


def parse_size(text: str | int) -> int:
    """Bytes from ``80MB``, ``1.5GB``, ``300MiB`` or a plain number (MB = 10^6, MiB = 2^20).

    Raises:
        LowbitError: anything else, or a size <= 0.
    """
    if isinstance(text, int) and not isinstance(text, bool):
        n = text
    else:
        m = _SIZE.match(str(text))
        unit = (m.group(2) or "").lower() if m else None
        if m is None or unit not in _UNITS:
            raise LowbitError(f"size {text!r}: write a number of bytes or e.g. 80MB, 1.5GB, 300MiB")
        n = int(float(m.group(1)) * _UNITS[unit])
    if n <= 0:
        raise LowbitError(f"size must be positive, got {text!r}")
    return n


@dataclass(frozen=True)
class TensorChoice:
    """What one tensor became in a mixed plan.

    Attributes:
        tensor: its name. layer, kind: from the name (:func:`tensor_group`).
        scheme: the chosen label (``keep``/a cast for a pinned tensor that is not quantized).
        numel: weights. bits: stored bits (lowbit's layout).
        damage: the scan's damage of this choice (the exact measure, else the proxy); None for
            a pinned choice the scan did not measure.
        pinned: the rule that pinned it (None: chosen by the solver).
    """

    tensor: str
    layer: int | None
    kind: str
    scheme: str
    numel: int
    bits: int
    damage: float | None
    pinned: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "tensor": self.tensor,
            "layer": self.layer,
            "kind": self.kind,
            "scheme": self.scheme,
            "numel": self.numel,
            "bits": self.bits,
            "bits_per_weight": self.bits / self.numel if self.numel else None,
            "damage": self.damage,
            "pinned": self.pinned,
        }


@dataclass(frozen=True)
class MixedPlan:
    """A mixed plan, how it was chosen, and what it is predicted to cost.

    Attributes:
        plan: the plan file's content (``lowbit quantize --plan`` reproduces the choice).
        allocation: the solver's answer for the free tensors (damage, bound, gap).
        rows: every scanned or pinned tensor, in model order.
        budget: ``{"kind": "bits_per_weight"|"size", "value": ..., "bits": total bits}``.
        quantized_bits, quantized_weights: over every tensor the plan quantizes.
        total_bytes: every tensor of the output (kept ones as stored), lowbit's layout.
        measure: what the damages are (``exact`` or ``proxy``), metric: in words.
    """

    plan: PrecisionPlan
    allocation: Allocation
    rows: tuple[TensorChoice, ...]
    budget: dict[str, Any]
    quantized_bits: int
    quantized_weights: int
    total_bytes: int
    measure: str
    metric: str

    @property
    def bits_per_weight(self) -> float:
        return self.quantized_bits / self.quantized_weights if self.quantized_weights else 0.0

    @property
    def predicted_damage(self) -> float:
        """Summed damage of every measured choice (the first-order prediction)."""
        return float(sum(r.damage for r in self.rows if r.damage is not None))

    def by_scheme(self) -> list[dict[str, Any]]:
        """Per chosen scheme: tensors, weights, bits/weight and summed damage."""
        out: dict[str, dict[str, Any]] = {}
        for r in self.rows:
            d = out.setdefault(r.scheme, {"scheme": r.scheme, "tensors": 0, "weights": 0,
                                          "bits": 0, "damage": 0.0})  # fmt: skip
            d["tensors"] += 1
            d["weights"] += r.numel
            d["bits"] += r.bits
            d["damage"] += r.damage or 0.0
        for d in out.values():
            d["bits_per_weight"] = d["bits"] / d["weights"] if d["weights"] else None
        return sorted(out.values(), key=lambda d: -d["bits_per_weight"] if d["weights"] else 0)

    def to_dict(self) -> dict[str, Any]:
        a = self.allocation
        return {
            "version": 1,
            "budget": dict(self.budget),
            "measure": self.measure,
            "metric": self.metric,
            "bits_per_weight": self.bits_per_weight,
            "quantized_bits": self.quantized_bits,
            "quantized_weights": self.quantized_weights,
            "total_bytes": self.total_bytes,
            "predicted_damage": self.predicted_damage,
            "solver": {
                "damage": a.damage,
                "bound": a.bound,
                "gap": a.gap,
                "unit_bits": a.unit,
                "cost_bits": a.cost,
                "budget_bits": a.budget,
            },
            "by_scheme": self.by_scheme(),
            "plan": self.plan.to_dict(),
            "tensors": [r.to_dict() for r in self.rows],
        }


def plan_for_budget(
    result: _Scan,
    tensors: Sequence[tuple[Any, ...]],
    *,
    bits_per_weight: float | None = None,
    size: int | str | None = None,
    base: PrecisionPlan | None = None,
    candidates: Sequence[str] | None = None,
    min_scheme: str | None = None,
    resolution: int = 8192,
    method: str | None = None,
) -> MixedPlan:
    """The least-damage choice of one scanned scheme per tensor within a budget.

    Args:
        result: a sensitivity scan of this checkpoint (``SensitivityResult``).
        tensors: ``(name, shape, dtype, nbytes[, alias])`` of every tensor of the checkpoint
            (:func:`~lowbit.checkpoints.streaming.checkpoint_tensors`).
        bits_per_weight: budget in stored bits per quantized weight (give this or ``size``).
        size: budget in bytes of the whole output (``80MB`` or a number).
        base: a plan whose rules decide first (their tensors are pinned); its default is not
            used.
        candidates: schemes that may be chosen (default: every scanned scheme).
        min_scheme: no tensor gets fewer stored bits than this scheme gives it.
        resolution: the solver's budget units (:func:`lowbit.plans.budget.solve`).
        method: how the plan's tensors are quantized (``gptq``, ``rtn``:
            :data:`~lowbit.plans.rules.METHODS`), written on every rule of the plan that
            quantizes and names no method; None: the plan names none (``lowbit quantize``'s
            ``--method`` decides when the plan is used).

    Returns:
        A :class:`MixedPlan`.

    Raises:
        LowbitError: not exactly one budget, a scan of another model, a candidate that was
            not scanned, a tensor left with no option, a budget below the cheapest plan, an
            unknown method.
    """
    method = method_name(method)
    if (bits_per_weight is None) == (size is None):
        raise LowbitError("give one budget: bits per weight (--budget) or a size (--size)")
    if bits_per_weight is not None and not (0 < bits_per_weight < 64):
        raise LowbitError(f"bits per weight must be between 0 and 64, got {bits_per_weight}")
    size_bytes = parse_size(size) if size is not None else None
    items = [(str(t[0]), tuple(int(s) for s in t[1]), str(t[2]), int(t[3]), *t[4:5])
             for t in tensors]  # fmt: skip
    shapes = {t[0]: t[1] for t in items}
    options: dict[str, dict[str, Any]] = {}
    for e in result.entries:
        if e.tensor not in shapes:
            raise LowbitError(f"the sensitivity scan names tensor {e.tensor!r}, which this model "
                              "lacks: it was measured on another model")  # fmt: skip
        options.setdefault(e.tensor, {})[e.scheme] = e
    scanned = {lab for opts in options.values() for lab in opts}
    allowed = scanned
    if candidates:
        allowed = {_label(c) for c in candidates}
        missing = sorted(allowed - scanned)
        if missing:
            raise LowbitError(f"candidate(s) {', '.join(missing)} were not scanned; scanned: "
                              f"{', '.join(sorted(scanned))}")  # fmt: skip
    floor_scheme = parse_scheme(min_scheme) if min_scheme else None
    if floor_scheme is not None and not isinstance(floor_scheme, Scheme):
        raise LowbitError(f"--min-format {min_scheme!r} is a plain cast, not a scheme")

    # the user's rules decide first; the rest of the output is fixed too
    rules = base.rules if base else ()
    probe = PrecisionPlan(rules=rules, default=parse_scheme("int8"))
    unscanned = [
        t[0] for t in items
        if t[0] not in options and probe.decide(*t).reason.startswith("default: 2-D linear")
    ]  # fmt: skip
    if unscanned:
        raise LowbitError(
            f"the sensitivity scan lacks {len(unscanned)} tensor(s) the plan quantizes (e.g. "
            f"{unscanned[0]!r}); scan every tensor, or pin them with --plan rules"
        )
    pins = PrecisionPlan(rules=rules).apply(items, source="the model")
    fixed_q_bits = fixed_q_weights = fixed_bytes = 0
    free: list[str] = []
    pinned_rows: dict[str, TensorChoice] = {}
    for p in pins.tensors:
        if p.name in options and p.rule is None:
            free.append(p.name)
            continue
        fixed_bytes += p.nbytes
        if p.action == "quantize":
            fixed_q_bits += p.nbytes * 8
            fixed_q_weights += p.numel
        if p.rule is not None:
            layer, kind = tensor_group(p.name)
            known = options.get(p.name, {}).get(p.label)
            pinned_rows[p.name] = TensorChoice(
                p.name, layer, kind, p.label, p.numel, p.nbytes * 8,
                result.score(known) if known is not None else None, p.reason,
            )  # fmt: skip
    costs, damages, labels = [], [], []
    for name in free:
        opts = [e for lab, e in options[name].items() if lab in allowed]
        if floor_scheme is not None:
            least = floor_scheme.tensor_bytes(shapes[name]) * 8
            opts = [e for e in opts if e.bits >= least]
        if not opts:
            raise LowbitError(f"tensor {name!r}: no candidate scheme is left (candidates "
                              f"{', '.join(sorted(allowed))}; minimum {min_scheme})")  # fmt: skip
        scores = [result.score(e) for e in opts]
        if not all(math.isfinite(s) for s in scores):
            raise LowbitError(f"tensor {name!r}: the scan has no finite damage for it "
                              f"(proxy without input moments?)")  # fmt: skip
        costs.append([e.bits for e in opts])
        damages.append(scores)
        labels.append(opts)
    q_weights = fixed_q_weights + sum(math.prod(shapes[n]) for n in free)
    if bits_per_weight is not None:
        total = math.floor(bits_per_weight * q_weights)
        budget = {"kind": "bits_per_weight", "value": bits_per_weight, "bits": total}
        free_budget = total - fixed_q_bits
    else:
        total = 8 * size_bytes  # type: ignore[operator]
        budget = {"kind": "size", "value": size_bytes, "bits": total}
        free_budget = total - 8 * fixed_bytes
    cheapest = sum(min(c) for c in costs)
    if free_budget < cheapest:
        least = (fixed_q_bits + cheapest) / q_weights if bits_per_weight is not None else None
        need = (f"{least:.4f} bits/weight" if least is not None
                else f"{fixed_bytes + cheapest // 8:,} bytes")  # fmt: skip
        raise LowbitError(f"the budget is below the cheapest plan: these candidates and "
                          f"pinned tensors need at least {need}")  # fmt: skip
    alloc = solve(costs, damages, free_budget, resolution=resolution)
    chosen = {name: labels[i][j] for i, (name, j) in enumerate(zip(free, alloc.choice,
                                                                      strict=True))}  # fmt: skip
    plan = _write_plan(base, chosen, method)
    rows = []
    for name, *_ in items:
        if name in chosen:
            e = chosen[name]
            layer, kind = tensor_group(name)
            rows.append(TensorChoice(name, layer, kind, e.scheme, e.numel, e.bits,
                                     result.score(e)))  # fmt: skip
        elif name in pinned_rows:
            rows.append(pinned_rows[name])
    _check(plan, items, chosen, method)
    q_bits = fixed_q_bits + sum(e.bits for e in chosen.values())
    return MixedPlan(
        plan=plan,
        allocation=alloc,
        rows=tuple(rows),
        budget=budget,
        quantized_bits=q_bits,
        quantized_weights=q_weights,
        total_bytes=fixed_bytes + sum(e.bits // 8 for e in chosen.values()),
        measure=result.measure,
        metric=result.metric,
    )


def _label(spec: str) -> str:
    s = parse_scheme(spec)
    return s.label


def _write_plan(
    base: PrecisionPlan | None, chosen: dict[str, Any], method: str | None
) -> PrecisionPlan:
    """The user's rules, then one rule per chosen scheme but the commonest, which becomes the
    default (the defaults quantize exactly the scanned tensors no rule names). With a
    ``method``, the commonest scheme gets a rule too (a default cannot name a method) and every
    quantizing rule without a method gets this one."""
    counts = Counter(e.scheme for e in chosen.values())
    default = counts.most_common(1)[0][0] if counts else None
    rules = list(base.rules) if base else []
    if method is not None:
        rules = [dataclasses.replace(r, method=method)
                 if isinstance(r.action, Scheme) and r.method is None else r
                 for r in rules]  # fmt: skip
    for label in sorted(counts, key=lambda lab: (-counts[lab], lab)):
        if label == default and method is None:
            continue
        names = [n for n, e in chosen.items() if e.scheme == label]
        rules.append(Rule(action=parse_scheme(label), method=method, **rule_selector(names)))
    return PrecisionPlan(
        rules=tuple(rules),
        default=parse_scheme(default) if default else None,
        activations=base.activations if base else None,
    )


def _check(
    plan: PrecisionPlan, items: list[tuple[Any, ...]], chosen: dict[str, Any], method: str | None
) -> None:
    """The plan file must give every chosen tensor its scheme and method (else the file would
    lie)."""
    applied = plan.apply(items, source="the model")
    labels: dict[str, str] = {}  # a scan's scheme as typed ("int4") -> its full label
    for p in applied.tensors:
        if p.name not in chosen:
            continue
        typed = chosen[p.name].scheme
        if typed not in labels:
            labels[typed] = parse_scheme(typed).label
        if (p.label, p.method) != (labels[typed], method):
            raise LowbitError(
                f"internal: the written plan gives {p.name!r} {p.label} (method {p.method}), "
                f"the solver chose {chosen[p.name].scheme} (method {method})"
            )
