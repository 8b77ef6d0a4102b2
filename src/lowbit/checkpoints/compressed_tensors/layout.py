"""The layout of a compressed-tensors checkpoint: its config groups, which group a weight
belongs to, and whether a weight's arrays fit its group (shared by ``lowbit verify`` and the
compressed-tensors reader)."""

from __future__ import annotations

from typing import Any

import numpy as np

from lowbit._regex import compile_bounded
from lowbit.checkpoints.compressed_tensors.fp4 import FP4_FORMATS, check_fp4_weight
from lowbit.checkpoints.readers import Checkpoint
from lowbit.errors import LowbitError

__all__: list[str] = []


_CT_FORMATS = ("pack-quantized", "int-quantized", "float-quantized", "naive-quantized",
               *FP4_FORMATS)  # fmt: skip
_CT_STRATEGIES = ("tensor", "channel", "group", "tensor_group", "block")


def ct_groups(qc: dict[str, Any], where: str) -> list[tuple[str, dict[str, Any]]]:
    """``[(group name, {targets, bits, type, symmetric, strategy, group_size, format})]``."""
    groups = qc.get("config_groups")
    if not isinstance(groups, dict) or not groups:
        raise LowbitError(f"{where}: quantization_config.config_groups is missing or empty")
    out = []
    for gname, g in groups.items():
        field = f"{where}: quantization_config.config_groups.{gname}"
        if not isinstance(g, dict):
            raise LowbitError(f"{field} is not an object")
        targets = g.get("targets")
        if (
            not isinstance(targets, list)
            or not targets
            or not all(isinstance(t, str) for t in targets)
        ):
            raise LowbitError(f"{field}.targets is not a non-empty list of strings")
        w = g.get("weights")
        if not isinstance(w, dict):
            raise LowbitError(
                f"{field}.weights is missing (lowbit verify checks quantized weights)"
            )
        bits, kind = w.get("num_bits"), w.get("type")
        if type(bits) is not int or not 1 <= bits <= 8:
            raise LowbitError(f"{field}.weights.num_bits {bits!r} is not an integer 1..8")
        if kind not in ("int", "float") or (kind == "float" and bits not in (4, 8)):
            raise LowbitError(f"{field}.weights.type {kind!r} is not int or float (fp8, fp4)")
        strategy = w.get("strategy")
        if strategy not in _CT_STRATEGIES:
            raise LowbitError(
                f"{field}.weights.strategy {strategy!r}: lowbit verify knows "
                f"{', '.join(_CT_STRATEGIES)}"
            )
        group_size = w.get("group_size")
        if strategy == "group" and (type(group_size) is not int or group_size < 1):
            raise LowbitError(
                f"{field}.weights.group_size {group_size!r} is not a positive integer"
            )
        block = w.get("block_structure")
        if strategy == "block" and (
            not isinstance(block, list)
            or len(block) != 2
            or not all(type(b) is int and b > 0 for b in block)
        ):
            raise LowbitError(
                f"{field}.weights.block_structure {block!r} is not two positive integers"
            )
        symmetric = w.get("symmetric", True)
        if not isinstance(symmetric, bool):
            raise LowbitError(f"{field}.weights.symmetric {symmetric!r} is not true or false")
        fmt = g.get("format") or qc.get("format")
        if fmt not in _CT_FORMATS:
            raise LowbitError(
                f"{field}.format {fmt!r}: lowbit verify knows {', '.join(_CT_FORMATS)}"
            )
        patterns = []
        for t in targets:
            if t.startswith("re:"):  # linear-time: a downloaded config must not hang us
                patterns.append(("re", compile_bounded(t[3:], f"{field}.targets")))
            else:
                patterns.append(("name", t))
        out.append(
            (
                str(gname),
                {
                    "targets": patterns,
                    # for ct_candidates: a set look-up per module, not a scan of every target
                    "names": frozenset(t for k, t in patterns if k == "name"),
                    "regexes": [t for k, t in patterns if k == "re"],
                    "bits": bits,
                    "type": kind,
                    "symmetric": symmetric,
                    "strategy": strategy,
                    "group_size": group_size,
                    "format": fmt,
                    "block": tuple(block) if strategy == "block" else None,
                },
            )
        )
    return out


def ct_candidates(
    module: str, groups: list[tuple[str, dict[str, Any]]], modules: set[str]
) -> list[tuple[str, dict[str, Any]]]:
    """The groups whose targets name ``module`` (exactly or by ``re:`` match); failing that,
    those whose targets are layer class names (``Linear``), which need the model to resolve."""
    named = [
        (n, g)
        for n, g in groups
        if module in g["names"] or any(r.match(module) for r in g["regexes"])
    ]
    if named:
        return named
    return [(n, g) for n, g in groups if _names_a_class(g, modules)]


def _names_a_class(g: dict[str, Any], modules: set[str]) -> bool:
    """Whether a group has a target that is no module's name (a layer class such as
    ``Linear``); once per group and module set (the caller's set is kept alive with it)."""
    held = g.get("_class_like")
    if held is None or held[0] is not modules:
        held = (modules, any(t not in modules for t in g["names"]))
        g["_class_like"] = held
    return held[1]


def ct_check_weight(ckpt: Checkpoint, module: str, g: dict[str, Any]) -> str | None:
    """What is wrong with one quantized weight under a group's scheme (None: nothing)."""
    names = set(ckpt.names())
    bits, fmt = g["bits"], g["format"]

    def info(suffix: str) -> Any:
        key = f"{module}.{suffix}"
        return ckpt.info(key) if key in names else None

    if fmt in FP4_FORMATS:
        return check_fp4_weight(info, module, g)
    if fmt == "pack-quantized":
        if g["type"] != "int":
            return "pack-quantized holds integer weights only"
        packed, shp = info("weight_packed"), info("weight_shape")
        if packed is None or shp is None:
            return "needs weight_packed and weight_shape"
        if shp.dtype not in ("I64", "I32") or shp.shape != (2,):
            return f"weight_shape is {shp.dtype}{list(shp.shape)}, not a 2-element integer array"
        out, cols = (int(v) for v in np.asarray(ckpt.get(f"{module}.weight_shape")))
        if out < 0 or cols < 0:
            return f"weight_shape [{out}, {cols}] is negative"
        want = (out, -(-cols * bits // 32))
        if packed.dtype != "I32" or packed.shape != want:
            return (
                f"weight_packed is {packed.dtype}{list(packed.shape)}, but int{bits} weights of "
                f"shape [{out}, {cols}] pack to I32{list(want)}"
            )
    else:
        w = info("weight")
        wdtype = "I8" if g["type"] == "int" else "F8_E4M3"
        if w is None:
            return f"{fmt} needs {module}.weight"
        if w.dtype != wdtype or len(w.shape) != 2:
            return f"weight is {w.dtype}{list(w.shape)}, {fmt} {g['type']} stores 2-D {wdtype}"
        out, cols = w.shape
    scale = info("weight_scale")
    if scale is None:
        return "has no weight_scale"
    if scale.dtype not in ("F32", "F16", "BF16"):
        return f"weight_scale is {scale.dtype}, not F32, F16 or BF16"
    strategy = g["strategy"]
    if strategy == "tensor":
        ok = scale.numel == 1
        want_s = "one value"
    elif strategy == "channel":
        ok = scale.shape in ((out, 1), (out,))
        want_s = f"[{out}, 1]"
    elif strategy == "block":
        want_b = (-(-out // g["block"][0]), -(-cols // g["block"][1]))
        ok = scale.shape == want_b
        want_s = str(list(want_b))
    else:
        groups = -(-cols // g["group_size"])
        ok = scale.shape == (out, groups)
        want_s = f"[{out}, {groups}]"
    if not ok:
        return f"weight_scale has shape {list(scale.shape)}, {strategy} scales of [{out}, {cols}] are {want_s}"
    zp = info("weight_zero_point")
    if not g["symmetric"]:
        if zp is None:
            return "asymmetric but has no weight_zero_point"
        if fmt == "pack-quantized" and strategy != "tensor":
            want_z = (-(-out * bits // 32), scale.shape[1] if len(scale.shape) == 2 else 1)
            if zp.dtype != "I32" or zp.shape != want_z:
                return f"weight_zero_point is {zp.dtype}{list(zp.shape)}, packed it is I32{list(want_z)}"
        elif zp.dtype != "I8" or zp.numel != scale.numel:
            return f"weight_zero_point is {zp.dtype}{list(zp.shape)}, expected I8 like the scale"
    return None
