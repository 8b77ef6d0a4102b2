"""What each tensor of a model costs in one row of ``lowbit plan``: the decision per tensor (rules or a plan file) and its stored bytes."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from lowbit.checkpoints.gguf.names import gguf_to_hf_name
from lowbit.errors import LowbitError
from lowbit.planning.modelspec import ModelSpec, TensorInfo
from lowbit.plans.components import COMPONENTS
from lowbit.plans.plan import PrecisionPlan
from lowbit.plans.rules import Rule
from lowbit.quant.scheme import Cast, Granularity, Scheme

_KEPT_BYTES = 2  # a kept tensor of a spec without stored sizes: BF16, as checkpoints are stored

Precision = Scheme | Cast  # what a row or a KV cache is stored as


def _price(action: Precision | None, t: TensorInfo) -> int:
    """Stored bytes of one tensor: kept as stored, cast, or quantized.

    Per-channel scales on a 1-D tensor (a norm, a bias, a bare parameter count) are priced as
    one scale: a 1-D tensor is one channel (``lowbit quantize`` keeps such tensors)."""
    if action is None:
        return t.nbytes if t.nbytes is not None else t.numel * _KEPT_BYTES
    if (
        isinstance(action, Scheme)
        and action.granularity is Granularity.CHANNEL
        and len(t.shape) < 2
    ):
        action = replace(action, granularity=Granularity.TENSOR, axis=None)
    return action.tensor_bytes(t.shape)


def _alias(spec: ModelSpec, name: str) -> str | None:
    """A GGUF tensor's transformers name (rules may use either, as in ``lowbit quantize``)."""
    if spec.source != "gguf":
        return None
    try:
        return gguf_to_hf_name(name)
    except LowbitError:
        return None


def tensor_decisions(
    spec: ModelSpec,
    scheme: Precision,
    rules: Sequence[Rule] = (),
    plan_file: PrecisionPlan | None = None,
) -> list[tuple[TensorInfo, int | None, Precision | None]]:
    """What each parameter of ``spec`` becomes in a row: ``(tensor, rule index, action)``.

    With a plan file, each tensor is decided as ``lowbit quantize --plan`` decides it (the
    plan's rules, then ``scheme`` for 2-D linear weights, the rest kept); otherwise the first
    matching rule decides, and ``scheme`` takes every other tensor. Action None: kept.
    """
    out: list[tuple[TensorInfo, int | None, Precision | None]] = []
    if plan_file is not None:
        plan = plan_file.with_default(scheme)
        for t in spec.parameters:
            d = plan.decide(t.name, t.shape, t.dtype or "F32", t.nbytes, _alias(spec, t.name))
            out.append((t, d.rule, d.decision))
        return out
    if not rules:  # the common case, without a generator per tensor (100,000 experts)
        return [(t, None, scheme) for t in spec.parameters]
    for t in spec.parameters:
        alias = _alias(spec, t.name)
        idx = next(
            (
                i
                for i, r in enumerate(rules)
                if r.matches(t.name, t.shape, alias, component=t.component)
            ),
            None,
        )
        out.append((t, idx, rules[idx].action if idx is not None else scheme))
    return out


def _weights(
    spec: ModelSpec,
    scheme: Precision,
    rules: Sequence[Rule],
    plan_file: PrecisionPlan | None,
) -> tuple[int, dict[str, int], float]:
    cache: dict[tuple[int | None, tuple[int, ...], int | None], int] = {}
    total, read = 0, 0.0
    comps = dict.fromkeys(COMPONENTS, 0)
    for t, idx, action in tensor_decisions(spec, scheme, rules, plan_file):
        key = (idx, t.shape, t.nbytes if action is None else None)
        if key not in cache or plan_file is not None:
            cache[key] = _price(action, t)
        b = cache[key]
        total += b
        comps[t.component] += b
        read += b * t.use
    return total, comps, read
