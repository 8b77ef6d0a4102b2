"""GPTQ's ``layers`` order through any block (``lowbit.calibration.gptq``): its linear
layers grouped by the input they read, found by one forward pass, then calibrated group by
group with the groups before already quantized."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lowbit.calibration.hessians import HessianCollector, _same_tensor

__all__ = ["linear_groups", "walk_groups"]


class _Seen(Exception):
    """Raised by the discovery hooks once every layer asked about has been called."""


def linear_groups(block: Any, states: list[Any], linears: dict[str, Any]) -> list[list[str]]:
    """The groups of ``linears`` that read one input tensor, in the order the block first
    calls them.

    Forward passes of ``block`` with forward pre-hooks on ``linears``: a layer whose input is
    the very tensor another layer read in the same pass (same storage, shape and strides, as
    :class:`~lowbit.calibration.hessians.HessianCollector` shares a Hessian) joins that layer's
    group. A pass stops once every layer has been called, so a dense block costs part of one
    pass of ``states[0]``; a layer the first sample does not reach (a data-dependent branch)
    is looked for in the next samples, as the ``blocks`` order's collector would see it.

    Args:
        block: a torch module (one transformer block).
        states: per sample, the block's inputs (hidden states, other args, kwargs).
        linears: module path -> ``torch.nn.Linear`` inside ``block``.

    Returns:
        Lists of module paths, in the order of first call; layers never called are left out.
    """
    groups: list[list[str]] = []
    group_of: dict[str, int] = {}
    seen: list[tuple[Any, int]] = []  # this pass's (input tensor, group): kept alive for it

    def hook(name: str) -> Any:
        def pre(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            x = args[0] if args else kwargs["input"]
            g = group_of.get(name)
            if g is None:
                g = next((g for t, g in seen if _same_tensor(t, x)), None)
                if g is None:
                    g = len(groups)
                    groups.append([])
                groups[g].append(name)
                group_of[name] = g
            if all(h != g for _, h in seen):  # a group's first call in the pass, as the collector
                seen.append((x, g))
            if len(group_of) == len(linears):
                raise _Seen

        return pre

    handles = [m.register_forward_pre_hook(hook(n), with_kwargs=True) for n, m in linears.items()]
    try:
        for hidden, args, kwargs in states:
            seen.clear()
            try:
                block(hidden, *args, **kwargs)
            except _Seen:
                break
    finally:
        for h in handles:
            h.remove()
    return groups


def walk_groups(
    block: Any,
    states: list[Any],
    samples: list[Any],
    linears: dict[str, Any],
    solve: Callable[[HessianCollector, dict[str, Any]], None],
) -> list[list[str]]:
    """Quantize ``linears`` of ``block`` group by group, each group calibrated on the block's
    forward passes with the groups before it already quantized.

    Per group (:func:`linear_groups`, found on ``states[0]``, or more where a layer is not
    reached there): run the block on every sample with a
    :class:`~lowbit.calibration.hessians.HessianCollector` on that group alone (each pass stops
    once the group's input is summed), then ``solve(collector, group's linears)``, which
    quantizes the group and writes its weights into the block. The block's outputs are left to
    the caller (one more pass, as the ``blocks`` order's). Memory: the samples' inputs (the
    caller's) and one group's Hessian at a time.

    Args:
        block: the block (a torch module).
        states: per sample, the block's inputs (hidden states, other args, kwargs).
        samples: per sample, (model inputs, mask of the tokens that count or None).
        linears: module path -> linear layer of this block that GPTQ quantizes.
        solve: quantizes one collector's groups and updates the model.

    Returns:
        The groups, in the order they were calibrated.
    """
    if not linears or not states:
        return []
    groups = linear_groups(block, states, linears)
    for group in groups:
        mine = {n: linears[n] for n in group}
        with HessianCollector(mine) as col:
            # the collector learns on its first pass where to stop; stop that one too, once
            # the group's last layer has been called (its hooks run before this one)
            stop = mine[group[-1]].register_forward_pre_hook(_stop)
            try:
                for (hidden, args, kwargs), (_, mask) in zip(states, samples, strict=True):
                    col.next_sample(mask)
                    try:
                        col.run(block, hidden, *args, **kwargs)
                    except _Stop:
                        pass
            finally:
                stop.remove()
        solve(col, mine)
    return groups


class _Stop(Exception):
    """Raised once a group's last layer is called: the rest of the pass is not needed."""


def _stop(module: Any, args: tuple[Any, ...]) -> None:
    raise _Stop
