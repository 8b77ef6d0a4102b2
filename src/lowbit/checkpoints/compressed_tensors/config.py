"""The ``quantization_config`` block of a compressed-tensors ``config.json``.

One config group per distinct weight scheme, its targets compacted to regexes over layer
numbers where that is exact, keys as compressed-tensors' ``ModelCompressor.update_config``
writes them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from lowbit.checkpoints.compressed_tensors.fp4 import input_args, weights_args
from lowbit.checkpoints.compressed_tensors.tensor import CTTensor, _format

__all__ = ["CT_FORMAT_VERSION", "quantization_config"]

CT_FORMAT_VERSION = "0.20.1"
"""The compressed-tensors release whose on-disk format this writer follows (checked in tests)."""


def _scheme_key(t: CTTensor) -> tuple[Any, ...]:
    return (
        t.kind,
        t.num_bits,
        t.symmetric,
        t.resolved_strategy(),
        t.group_size,
        t.activations,
        t.block_structure,
    )


def _scheme_dict(key: tuple[Any, ...], targets: list[str]) -> dict[str, Any]:
    kind, bits, symmetric, strategy, group_size, activations, block = key
    if kind == "fp4" or strategy == "block":
        return {
            "targets": targets,
            "weights": weights_args(kind, bits, strategy, group_size, block),
            "input_activations": None if activations is None else input_args(activations, strategy),
            "output_activations": None,
            "format": _format(kind, activations, group_size),
        }
    weights = {
        "num_bits": bits,
        "type": kind,
        "symmetric": symmetric,
        "group_size": group_size,
        "strategy": strategy,
        "dynamic": False,
    }
    inputs = None
    if activations is not None:
        inputs = {
            "num_bits": 8,
            "type": "int" if activations == "int8" else "float",
            "symmetric": True,
            "group_size": None,
            "strategy": "token",
            "dynamic": True,
        }
    return {
        "targets": targets,
        "weights": weights,
        "input_activations": inputs,
        "output_activations": None,
        "format": _format(kind, activations),
    }


def _compact_targets(members: set[str], modules: set[str]) -> list[str]:
    """Targets naming exactly ``members`` among ``modules``: regexes over layer numbers if exact.

    ``model.layers.0.mlp.down_proj`` ... ``model.layers.29.mlp.down_proj`` become one
    ``re:model\\.layers\\.\\d+\\.mlp\\.down_proj$`` when that pattern matches no module outside
    ``members`` (compressed-tensors and vLLM match with ``re.match``); otherwise exact names.
    """
    by_pattern: dict[str, set[str]] = {}
    for name in members:
        parts = (r"\d+" if part.isdigit() else re.escape(part) for part in name.split("."))
        pattern = r"\.".join(parts)
        by_pattern.setdefault(pattern + "$", set()).add(name)
    targets: list[str] = []
    for pattern, names in sorted(by_pattern.items()):
        rx = re.compile(pattern)
        if len(names) > 1 and all(m in members for m in modules if rx.match(m)):
            targets.append("re:" + pattern)
        else:
            targets.extend(sorted(names))
    return targets


_W_TO_PROJ = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}
_EXPERT_W = re.compile(r"^(.*experts(?:\\)?\.(?:\\d\+|\d+)(?:\\)?\.)(w[123])(\$?)$")


def _expert_aliases(targets: list[str]) -> list[str]:
    """Mixtral-style expert targets (``...experts.N.w1``) again under the names vLLM's fused
    MoE layer asks the config for (``...experts.0.gate_proj``, ``up_proj`` for ``w3``,
    ``down_proj`` for ``w2``): it looks its scheme up by those, whatever the checkpoint calls
    them. compressed-tensors only warns about a target that matches no module."""
    out = []
    for t in targets:
        m = _EXPERT_W.match(t)
        if m:
            out.append(m.group(1) + _W_TO_PROJ[m.group(2)] + m.group(3))
    return out


def quantization_config(
    tensors: Mapping[str, Any], *, version: str = CT_FORMAT_VERSION
) -> dict[str, Any]:
    """The ``quantization_config`` block for these tensors (CTTensor values are the quantized).

    One config group per distinct scheme, targets naming its modules (see
    :func:`_compact_targets`), ``format`` the common format or ``"mixed-precision"``, status
    ``"compressed"``, keys as compressed-tensors' ``ModelCompressor.update_config`` writes them.
    """
    schemes = {}
    for name in tensors:
        value = tensors[name]
        schemes[str(name)] = _scheme_key(value) if isinstance(value, CTTensor) else None
    return _config(schemes, version)


def _config(schemes: Mapping[str, tuple[Any, ...] | None], version: str) -> dict[str, Any]:
    """quantization_config from tensor name -> scheme key (None: stored as it is)."""
    modules = {_module_name(n) for n in schemes if "." in n}
    groups: dict[tuple[Any, ...], set[str]] = {}
    for name, key in schemes.items():
        if key is not None:
            groups.setdefault(key, set()).add(_module_name(name))
    config_groups = {}
    for i, (key, members) in enumerate(sorted(groups.items(), key=lambda kv: sorted(kv[1])[0])):
        targets = _compact_targets(members, modules)
        config_groups[f"group_{i}"] = _scheme_dict(key, targets + _expert_aliases(targets))
    formats = {g["format"] for g in config_groups.values()}
    return {
        "config_groups": config_groups,
        "format": formats.pop() if len(formats) == 1 else "mixed-precision",
        "global_compression_ratio": None,
        "ignore": [],
        "kv_cache_scheme": None,
        "quant_method": "compressed-tensors",
        "quantization_status": "compressed",
        "sparsity_config": {},
        "transform_config": {},
        "version": version,
    }


def _module_name(tensor_name: str) -> str:
    return tensor_name.rsplit(".", 1)[0]
