"""Fixed mixed-precision rules (presets) and the tensor-name helpers mixed precision shares.

``q4_k_m_like`` is llama.cpp's Q4_K_M idea (``llama-quant.cpp``: the value projection and the
MLP down projection of the layers its ``use_more_bits`` picks -- the first and last eighth of
the layers and every third one between -- get 6 bits, the rest 4) in lowbit schemes:
``int6:g128`` there, ``int4:g128`` elsewhere.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from lowbit.errors import LowbitError
from lowbit.plans.plan import PrecisionPlan
from lowbit.plans.rules import Rule
from lowbit.quant.scheme_text import parse_scheme

__all__ = ["PRESETS", "preset_plan", "rule_selector", "tensor_group", "use_more_bits"]

#: Fixed mixed rules: name -> (what it is, base scheme, scheme of the promoted tensors).
PRESETS: dict[str, tuple[str, str, str]] = {
    "q4_k_m_like": (
        "llama.cpp Q4_K_M's rule: attention V and MLP down projections of the first and last "
        "eighth of the layers and every third layer between get more bits",
        "int4:g128",
        "int6:g128",
    ),
}

# at most 9 digits: a layer number past Python's 4,300-digit int() limit is no layer
_LAYER = re.compile(r"(?:^|\.)(?:layers|layer|blk|h|block|blocks)\.(\d{1,9})\.")


def tensor_group(name: str) -> tuple[int | None, str]:
    """``(layer, kind)`` of a tensor name: ``model.layers.3.mlp.down_proj.weight`` ->
    ``(3, "down_proj")``, ``blk.3.ffn_down.weight`` -> ``(3, "ffn_down")``; no layer: None."""
    m = _LAYER.search(name)
    rest = name[m.end() :] if m else name
    rest = re.sub(r"\.weight$", "", rest)
    for prefix in ("self_attn.", "mlp.", "attention.self.", "attn."):
        rest = rest.removeprefix(prefix)
    return (int(m.group(1)) if m else None), rest


def use_more_bits(layer: int, layers: int) -> bool:
    """llama.cpp's choice of layers that get more bits: the first and last eighth, and every
    third layer between (its ``use_more_bits``, in llama-quant.cpp)."""
    return layer < layers // 8 or layer >= 7 * layers // 8 or (layer - layers // 8) % 3 == 2


def preset_plan(
    name: str, tensors: Sequence[tuple[Any, ...]], *, base: str | None = None
) -> PrecisionPlan:
    """A fixed mixed plan (:data:`PRESETS`) for a checkpoint's tensors.

    Args:
        name: the preset (``q4_k_m_like``).
        tensors: ``(name, shape, dtype, nbytes[, alias])`` of the checkpoint
            (:func:`~lowbit.checkpoints.streaming.checkpoint_tensors`).
        base: the scheme of the tensors not promoted (default: the preset's).

    Returns:
        A plan: one rule giving the promoted tensors the higher scheme, the base as default.

    Raises:
        LowbitError: an unknown preset, a model with no numbered layers.
    """
    if name not in PRESETS:
        raise LowbitError(f"unknown plan preset {name!r}; presets: {', '.join(PRESETS)}")
    _, low, high = PRESETS[name]
    base_scheme = parse_scheme(base or low)
    layered = [(tensor_group(str(t[0]))[0], t) for t in tensors]
    layers = 1 + max((i for i, _ in layered if i is not None), default=-1)
    if layers == 0:
        raise LowbitError(f"preset {name}: the model has no numbered layers")
    picked = []
    for i, t in layered:
        kinds = {tensor_group(str(t[0]))[1]}
        if len(t) > 4 and t[4]:
            kinds.add(tensor_group(str(t[4]))[1])
        if i is not None and use_more_bits(i, layers) and kinds & {"v_proj", "attn_v", "down_proj",
                                                                  "ffn_down", "value"}:  # fmt: skip
            picked.append(str(t[0]))
    rules = (Rule(action=parse_scheme(high), **rule_selector(picked)),) if picked else ()
    return PrecisionPlan(rules=rules, default=base_scheme)


def rule_selector(names: Sequence[str]) -> dict[str, tuple[str, ...]]:
    """Rule fields that select exactly these tensor names (globs, or regexes for names with
    glob characters)."""
    globs = tuple(n for n in names if not re.search(r"[*?\[\]]", n))
    regex = tuple(re.escape(n) for n in names if re.search(r"[*?\[\]]", n))
    return {"match": globs, "regex": regex}
