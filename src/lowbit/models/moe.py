"""Mixture-of-experts blocks as one linear layer per expert, and checkpoint names onto them.

Recent transformers (5.x) hold a block's experts fused: one 3-D ``gate_up_proj``
``[experts, 2 * intermediate, hidden]`` and one ``down_proj`` ``[experts, hidden,
intermediate]`` parameter (``transformers.integrations.moe.use_experts_implementation``),
while checkpoints on disk keep one tensor per expert (``mlp.experts.3.gate_proj.weight``;
Mixtral's ``block_sparse_moe.experts.3.w1.weight``). :func:`unfuse_experts` replaces every
such fused module by ``Experts``: the same computation (same routing, the same
accumulation order into the output) with one ``torch.nn.Linear`` per expert projection, at the
per-expert names checkpoints and vLLM use. So every lowbit path that works on linear layers
(round-to-nearest per tensor, GPTQ's Hessians, AWQ's scales, sensitivity) works per expert.

:func:`checkpoint_rename` maps a checkpoint's names onto those modules (Mixtral's ``w1/w3/w2``
are ``gate_proj/up_proj/down_proj``), and :func:`split_fused` cuts a fused 3-D tensor into the
per-expert weights. Fused tensors on disk usually arrive already split: ``open_checkpoint``
reads them per expert (``lowbit.checkpoints.experts_view``); :func:`split_fused` remains for a
checkpoint that still holds fused names (a lowbit checkpoint written before that kept them),
and :func:`check_layouts` checks the reader's gate/up order against the model's.

``Experts.route_all`` (set by :func:`route_all_tokens`) sends every token through every
expert while the output still sums only the routed ones: what GPTQ's and AWQ's calibration
use so that each expert's linear layers see all calibration tokens (``--moe-calibrate all``).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from lowbit.checkpoints.experts_view import expert_slices
from lowbit.errors import LowbitError

__all__ = [
    "check_layouts",
    "checkpoint_rename",
    "expert_of",
    "fused_base",
    "route_all_tokens",
    "split_fused",
    "unfuse_experts",
]

#: Per family (``model_type``): (checkpoint regex, model name) renames onto the unfused modules.
_RENAMES: dict[str, tuple[tuple[str, str], ...]] = {
    "mixtral": (
        (r"\.block_sparse_moe\.", ".mlp."),
        (r"\.experts\.(\d+)\.w1\.", r".experts.\1.gate_proj."),
        (r"\.experts\.(\d+)\.w3\.", r".experts.\1.up_proj."),
        (r"\.experts\.(\d+)\.w2\.", r".experts.\1.down_proj."),
    ),
}
_RENAMES["minimax"] = _RENAMES["mixtral"]

_EXPERT = re.compile(r"\.experts\.(\d+)\.(gate_proj|up_proj|down_proj|w1|w2|w3)\.weight$")
_FUSED = re.compile(r"^(.*\.experts)\.(gate_up_proj|down_proj)(_bias)?$")


def expert_of(name: str) -> tuple[int, str] | None:
    """``(expert index, projection)`` of a per-expert weight name, else None
    (``model.layers.0.mlp.experts.3.up_proj.weight`` -> ``(3, "up_proj")``)."""
    m = _EXPERT.search(name)
    return (int(m.group(1)), m.group(2)) if m else None


def checkpoint_rename(model_type: str | None) -> Any:
    """The function mapping a checkpoint name onto the model's (identity for most families)."""
    pairs = [(re.compile(a), b) for a, b in _RENAMES.get(model_type or "", ())]
    if not pairs:
        return lambda n: n

    def rename(name: str) -> str:
        for pattern, repl in pairs:
            name = pattern.sub(repl, name)
        return name

    return rename


class _Expert:
    """Factory of one expert's three linear layers (a plain ``torch.nn.Module`` is built)."""

    @staticmethod
    def build(hidden: int, inter: int, bias: bool, dtype: Any) -> Any:
        import torch

        mod = torch.nn.Module()
        mod.gate_proj = torch.nn.Linear(hidden, inter, bias=bias, dtype=dtype)
        mod.up_proj = torch.nn.Linear(hidden, inter, bias=bias, dtype=dtype)
        mod.down_proj = torch.nn.Linear(inter, hidden, bias=bias, dtype=dtype)
        return mod


@functools.cache
def _experts_class() -> Any:
    """The ``Experts`` class (built on first use: torch is imported then, not with lowbit)."""
    import torch

    class Experts(torch.nn.ModuleList):
        """A block's experts as linear layers: child ``e`` holds ``gate_proj``, ``up_proj``,
        ``down_proj``; called as transformers' fused module, ``(hidden_states [tokens, hidden],
        top_k_index [tokens, k], top_k_weights [tokens, k])``."""

        def __init__(self, fused: Any) -> None:
            gu = fused.gate_up_proj
            transposed = bool(getattr(fused, "is_transposed", False))
            n, two_i, hidden = (gu.shape[0], gu.shape[2], gu.shape[1]) if transposed else gu.shape
            bias = bool(getattr(fused, "has_bias", False))
            super().__init__(
                _Expert.build(int(hidden), int(two_i) // 2, bias, gu.dtype) for _ in range(n)
            )
            self.num_experts = int(n)
            self.route_all = False
            self.is_transposed = transposed
            self.is_concatenated = bool(getattr(fused, "is_concatenated", True))
            self._plain = type(fused)._apply_gate.__name__ == "_default_apply_gate"
            # the fused module keeps only what its gate function reads (act_fn, alpha, limit)
            for pname in [p for p, _ in fused.named_parameters(recurse=False)]:
                delattr(fused, pname)
            object.__setattr__(self, "_fused", fused)
            # not a child module: the list's children are the experts only
            object.__setattr__(self, "_act", getattr(fused, "act_fn", None))

        def _gate(self, g: Any, u: Any) -> Any:
            if self._plain:
                return self._act(g) * u
            if self.is_concatenated:
                both = torch.cat([g, u], dim=-1)
            else:
                both = torch.stack([g, u], dim=-1).flatten(-2)
            return type(self._fused)._apply_gate(self._fused, both)

        def expert(self, e: int, x: Any) -> Any:
            """Expert ``e`` on the tokens ``x`` (unweighted)."""
            mod = self[e]
            return mod.down_proj(self._gate(mod.gate_proj(x), mod.up_proj(x)))

        def forward(self, hidden_states: Any, top_k_index: Any, top_k_weights: Any) -> Any:
            out = torch.zeros_like(hidden_states)
            with torch.no_grad():
                mask = torch.nn.functional.one_hot(top_k_index, num_classes=self.num_experts + 1)
                mask = mask.permute(2, 1, 0)
                hit = torch.greater(mask.sum(dim=(-1, -2)), 0).nonzero()
            order = range(self.num_experts) if self.route_all else [int(e[0]) for e in hit]
            for e in order:
                if e == self.num_experts:
                    continue
                pos, tok = torch.where(mask[e])
                if self.route_all:  # every token through the expert; only the routed ones count
                    y = self.expert(e, hidden_states)[tok]
                else:
                    y = self.expert(e, hidden_states[tok])
                y = y * top_k_weights[tok, pos, None]
                out.index_add_(0, tok, y.to(out.dtype))
            return out

    return Experts


def _is_fused(mod: Any) -> bool:
    import torch

    gu, down = getattr(mod, "gate_up_proj", None), getattr(mod, "down_proj", None)
    return (
        isinstance(gu, torch.nn.Parameter)
        and isinstance(down, torch.nn.Parameter)
        and gu.ndim == 3
        and down.ndim == 3
        and hasattr(type(mod), "_apply_gate")
    )


def unfuse_experts(model: Any) -> list[str]:
    """Replace every fused experts module of ``model`` by :class:`Experts` (in place).

    Returns:
        The module paths replaced (empty for a dense model).

    Raises:
        LowbitError: a fused experts module of a layout lowbit does not know (no gate).
    """
    cls = _experts_class()
    done: list[str] = []
    for name, mod in list(model.named_modules()):
        if not _is_fused(mod):
            continue
        if not getattr(mod, "has_gate", True):
            raise LowbitError(f"{name}: experts without a gate projection are not supported")
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, cls(mod))
        done.append(name)
    return done


def fused_base(key: str) -> str | None:
    """The experts module path of a fused experts tensor name (``...mlp.experts``), or None."""
    m = _FUSED.match(key)
    return m.group(1) if m else None


def split_fused(key: str, arr: np.ndarray, model: Any) -> list[tuple[str, np.ndarray]] | None:
    """A fused experts tensor (``...experts.gate_up_proj`` ``[E, 2I, H]``, ``down_proj``
    ``[E, H, I]``, their ``_bias``) as per-expert ``(model key, array)`` pairs, or None when
    ``key`` is not one or ``model`` has no unfused experts module there.

    The module's flags say the layout: ``is_transposed`` (``[E, H, 2I]`` / ``[E, I, H]``) and
    ``is_concatenated`` (gate then up; else interleaved gate0, up0, gate1, ...).
    """
    m = _FUSED.match(key)
    if m is None:
        return None
    base, what, bias = m.group(1), m.group(2), m.group(3)
    try:
        mod = model.get_submodule(base)
    except AttributeError:
        return None
    if not hasattr(mod, "route_all"):
        return None
    transposed, concatenated = mod.is_transposed, mod.is_concatenated
    kind = "bias" if bias else "weight"
    if arr.ndim != (2 if bias else 3):
        raise LowbitError(f"fused experts tensor {key!r} has shape {arr.shape}")
    out = []
    for e in range(arr.shape[0]):
        parts = expert_slices(
            what, arr[e], rows_out=not transposed, interleaved=not concatenated, bias=bool(bias)
        )
        out += [(f"{base}.{e}.{proj}.{kind}", a) for proj, a in parts]
    return out


def check_layouts(model: Any, layouts: dict[str, dict[str, Any]]) -> None:
    """Refuse a checkpoint whose fused experts were split with another gate/up order than the
    model's experts use (``lowbit.checkpoints.experts_view.ExpertsView.layouts``: the order
    comes from the family's ``model_type`` there, from the module's ``is_concatenated`` here).

    Raises:
        LowbitError: the two disagree for some experts module.
    """
    mods = {n: m for n, m in model.named_modules() if hasattr(m, "route_all")}
    for base, lay in layouts.items():
        for name, mod in mods.items():
            if not (base == name or base.endswith("." + name) or name.endswith("." + base)):
                continue
            if bool(mod.is_concatenated) == bool(lay["interleaved"]):
                said = "interleaved" if lay["interleaved"] else "concatenated"
                raise LowbitError(
                    f"{base}: the checkpoint's gate/up rows were read as {said}, but the "
                    f"model's experts {name!r} want them "
                    f"{'concatenated' if mod.is_concatenated else 'interleaved'}"
                )


@contextmanager
def route_all_tokens(model: Any, on: bool = True) -> Iterator[int]:
    """Within the block, every :class:`Experts` of ``model`` runs every token through every
    expert (its output unchanged: only routed tokens are summed). Yields how many were set."""
    mods = [m for m in model.modules() if hasattr(m, "route_all") and hasattr(m, "num_experts")]
    old = [m.route_all for m in mods]
    for m in mods:
        m.route_all = on
    try:
        yield len(mods)
    finally:
        for m, o in zip(mods, old, strict=True):
            m.route_all = o
