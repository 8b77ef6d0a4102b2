"""mlx-lm's stacked experts: a mixture of experts as ``switch_mlp`` tensors, both ways.

mlx-lm holds a block's experts as one ``SwitchLinear`` per projection: its ``sanitize`` stacks
the per-expert weights of a Hugging Face checkpoint (``<block>.experts.{e}.<proj>.weight``,
``[out, in]`` each) into ``<block>.switch_mlp.<proj>.weight`` ``[experts, out, in]``, and
``mlx_lm.convert`` quantizes that stack along its last axis, so its words, scales and biases are
those of each expert's matrix stacked in expert order (``[experts, out, in * bits / 32]`` and
``[experts, out, in / group]``). The families, with their names (mlx-lm's
``models/<family>.py``):

- ``mixtral``: ``block_sparse_moe.experts.{e}.w1 / w3 / w2`` -> ``block_sparse_moe.switch_mlp.
  gate_proj / up_proj / down_proj``; the router ``block_sparse_moe.gate`` (transformers 5's
  fused state dict calls it ``mlp.gate``; mlx-lm only reads the former);
- ``qwen2_moe``, ``qwen3_moe``: ``mlp.experts.{e}.<proj>`` -> ``mlp.switch_mlp.<proj>``, the
  router ``mlp.gate`` and (Qwen2-MoE) ``mlp.shared_expert`` / ``mlp.shared_expert_gate`` kept
  as they are. Qwen3-MoE's own ``quant_predicate`` quantizes the router at 8 bits in groups of
  64 (its config entry ``{"group_size": 64, "bits": 8}``: affine, as mlx-lm reads it).

The writer streams: one stacked projection of one layer is built at a time, quantized expert by
expert into its words, scales and biases. The reader presents the stacks again as per-expert
weights under the checkpoint names above, so eval, verify and re-quantization see the model as
any per-expert checkpoint.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any

from lowbit.checkpoints.mlx.params import MLXParams
from lowbit.errors import LowbitError

__all__ = [
    "MOE_FAMILIES",
    "family_entry",
    "layout",
    "switch_of",
]

#: model_type -> (the block's module name, {checkpoint projection: mlx-lm projection})
MOE_FAMILIES: dict[str, tuple[str, dict[str, str]]] = {
    "mixtral": ("block_sparse_moe", {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}),
    "qwen2_moe": ("mlp", {p: p for p in ("gate_proj", "up_proj", "down_proj")}),
    "qwen3_moe": ("mlp", {p: p for p in ("gate_proj", "up_proj", "down_proj")}),
}

_EXPERT = re.compile(r"^(.+)\.(mlp|block_sparse_moe)\.experts\.(\d+)\.([A-Za-z0-9_]+)\.([a-z_]+)$")
_SWITCH = re.compile(r"^(.+)\.(mlp|block_sparse_moe)\.switch_mlp\.([A-Za-z0-9_]+)\.([a-z_]+)$")


def _family(cfg: dict[str, Any]) -> tuple[str, dict[str, str]] | None:
    return MOE_FAMILIES.get(cfg.get("model_type"))  # type: ignore[arg-type]


def layout(names: Iterable[str], cfg: dict[str, Any]) -> list[tuple[str, tuple[str, ...]]]:
    """The output's tensors in source order: (mlx-lm name, its source names): one source for
    a tensor kept or quantized as it is, every expert's (in expert order) for a stack.

    Args:
        names: the source's tensor names (transformers names).
        cfg: the model's config.json (``model_type`` picks the family).

    Raises:
        LowbitError: experts in a family mlx-lm does not stack (or that lowbit does not know),
            experts with biases or unknown projections, or a stack with experts missing.
    """
    fam = _family(cfg)
    out: list[tuple[str, tuple[str, ...]]] = []
    stacks: dict[str, dict[int, str]] = {}
    for n in names:
        m = _EXPERT.match(n)
        if m is None and ".experts." not in n:
            if fam is not None and fam[0] == "block_sparse_moe":
                n2 = re.sub(r"\.mlp\.gate\.weight$", ".block_sparse_moe.gate.weight", n)
            else:
                n2 = n
            out.append((n2, (n,)))
            continue
        if fam is None or m is None:
            raise LowbitError(
                f"{n}: experts of model_type {cfg.get('model_type')!r}; lowbit stacks experts "
                f"into mlx-lm's switch_mlp for {', '.join(MOE_FAMILIES)} only: write lowbit, "
                "compressed-tensors or gguf"
            )
        prefix, block, e, proj, part = m.groups()
        block_name, projs = fam
        if block != block_name or proj not in projs or part != "weight":
            raise LowbitError(
                f"{n}: mlx-lm's {cfg.get('model_type')} stacks "
                f"{block_name}.experts.N.{{{','.join(projs)}}}.weight only (no expert biases)"
            )
        key = f"{prefix}.{block}.switch_mlp.{projs[proj]}.weight"
        if key not in stacks:
            stacks[key] = {}
            out.append((key, ()))
        stacks[key][int(e)] = n
    result = []
    for name, srcs in out:
        if srcs:
            result.append((name, srcs))
            continue
        got = stacks[name]
        if sorted(got) != list(range(len(got))):
            missing = sorted(set(range(max(got) + 1)) - set(got))
            raise LowbitError(f"{name}: experts {missing} missing from the source")
        result.append((name, tuple(got[e] for e in range(len(got)))))
    return result


def family_entry(module: str, cfg: dict[str, Any]) -> tuple[MLXParams, dict[str, int]] | None:
    """A family's own quantization of a module (mlx-lm's model ``quant_predicate``), with the
    config entry mlx-lm writes for it; None where the default applies."""
    if cfg.get("model_type") == "qwen3_moe" and module.endswith("mlp.gate"):
        return MLXParams(bits=8, group_size=64), {"group_size": 64, "bits": 8}
    return None


def switch_of(
    name: str, cfg: dict[str, Any], where: str
) -> tuple[str, Callable[[int], str]] | None:
    """For a stored ``<block>.switch_mlp.<proj>.weight``: its module path and the per-expert
    checkpoint name of expert ``e``; None for any other tensor.

    Raises:
        LowbitError: a ``switch_mlp`` tensor in a family lowbit does not un-stack, or one that
            is not a projection's weight, scales or biases.
    """
    m = _SWITCH.match(name)
    if m is None:
        return None
    prefix, block, proj, part = m.groups()
    fam = _family(cfg)
    back = {v: k for k, v in fam[1].items()} if fam else {}
    if fam is None or block != fam[0] or proj not in back:
        raise LowbitError(
            f"{where}: {name}: stacked experts of model_type {cfg.get('model_type')!r}; lowbit "
            f"reads mlx-lm's switch_mlp of {', '.join(MOE_FAMILIES)}"
        )
    if part not in ("weight", "scales", "biases"):
        raise LowbitError(f"{where}: {name}: switch_mlp holds weight, scales and biases only")
    if part != "weight":
        return None
    module = name[: -len(".weight")]
    return module, lambda e: f"{prefix}.{block}.experts.{e}.{back[proj]}.weight"
