"""Read one weight of a compressed-tensors folder back to float32 for ``lowbit report``: the
packed int32 words (``pack-quantized``), int8 or float8 weights (FP8 blocks included), with
their scales (and symmetric or int8 zero points), and NVFP4/MXFP4 nibbles, as
compressed-tensors' decompressors define them."""

from __future__ import annotations

from typing import Any

import numpy as np

from lowbit.checkpoints.compressed_tensors.fp4 import FP4_FORMATS, read_fp4
from lowbit.checkpoints.compressed_tensors.layout import ct_candidates, ct_groups
from lowbit.checkpoints.compressed_tensors.tensor import CTTensor
from lowbit.errors import LowbitError

__all__ = ["ct_scheme", "ct_weight"]

_GROUPS: dict[int, tuple[Any, Any]] = {}  # the last config's parsed groups (it is kept alive)
_NO_MODULES: set[str] = set()


def ct_scheme(ckpt: Any, qc: dict[str, Any], module: str) -> dict[str, Any] | None:
    """The config group whose targets name ``module`` (None: no group, or a malformed config)."""

    held = _GROUPS.get(id(qc))
    if held is None or held[0] is not qc:  # parsed once per config, not once per module
        try:
            held = (qc, ct_groups(qc, str(ckpt.path)))
        except LowbitError:
            held = (qc, None)
        _GROUPS.clear()
        _GROUPS[id(qc)] = held
    groups = held[1]
    if groups is None:
        return None
    found = ct_candidates(module, groups, _NO_MODULES)
    return found[0][1] if len(found) == 1 else None


def label(g: dict[str, Any]) -> str:
    """``int4:g32 (pack-quantized)``, ``fp8:ch (float-quantized)``, ``int8:t:asym ...``,
    ``nvfp4 (nvfp4-pack-quantized)``, ``fp8:b128x128 (float-quantized)``."""
    if g["format"] in FP4_FORMATS:
        return f"{g['format'].split('-')[0]} ({g['format']})"
    fmt = "fp8" if g["type"] == "float" else f"int{g['bits']}"
    gran = {"tensor": "t", "channel": "ch"}.get(g["strategy"], f"g{g['group_size']}")
    if g["strategy"] == "block":
        gran = f"b{g['block'][0]}x{g['block'][1]}"
    asym = "" if g["symmetric"] else ":asym"
    return f"{fmt}:{gran}{asym} ({g['format']})"


def _unpack(words: np.ndarray, bits: int, cols: int) -> np.ndarray:
    """Inverse of ``lowbit.checkpoints.compressed_tensors.tensor.pack_int32`` along rows: signed codes."""
    stream = np.unpackbits(
        np.ascontiguousarray(words).view("<u4").view(np.uint8), axis=1, bitorder="little"
    )
    rows = words.shape[0]
    b = stream[:, : cols * bits].reshape(rows, cols, bits).astype(np.int32)
    u = (b << np.arange(bits, dtype=np.int32)).sum(axis=2)
    return u - (1 << (bits - 1))


def ct_weight(ckpt: Any, module: str, g: dict[str, Any]) -> np.ndarray | None:
    """The dequantized weight of ``module`` (None where this reader does not follow it, e.g.
    packed asymmetric zero points)."""
    names = set(ckpt.names())
    if f"{module}.weight_scale" not in names:
        return None
    if g["format"] in FP4_FORMATS:
        return CTTensor(**read_fp4(ckpt.get, module, g)).dequantize()
    if f"{module}.weight_packed" in names and f"{module}.weight_shape" in names:
        out, cols = (int(v) for v in np.asarray(ckpt.get(f"{module}.weight_shape")))
        codes = _unpack(np.asarray(ckpt.get(f"{module}.weight_packed")), g["bits"], cols)
        if not g["symmetric"]:
            return None
        zp = None
    elif f"{module}.weight" in names:
        codes = np.asarray(ckpt.get(f"{module}.weight", np.float32), dtype=np.float32)
        out, cols = codes.shape
        zp = (
            np.asarray(ckpt.get(f"{module}.weight_zero_point", np.float32))
            if f"{module}.weight_zero_point" in names
            else None
        )
    else:
        return None
    scale = np.asarray(ckpt.get(f"{module}.weight_scale", np.float32), dtype=np.float32)
    if g["strategy"] == "group":
        gs = int(g["group_size"])
        scale = np.repeat(scale.reshape(out, -1), gs, axis=1)[:, :cols]
        if zp is not None:
            zp = np.repeat(zp.reshape(out, -1), gs, axis=1)[:, :cols]
    elif g["strategy"] == "block":
        bh, bw = g["block"]
        scale = np.repeat(np.repeat(scale, bh, axis=0)[:out], bw, axis=1)[:, :cols]
    elif g["strategy"] == "channel":
        scale = scale.reshape(out, 1)
        zp = None if zp is None else zp.reshape(out, 1)
    else:
        scale = scale.reshape(1, 1)
        zp = None if zp is None else zp.reshape(1, 1)
    x = codes.astype(np.float32)
    if zp is not None:
        x = x - zp
    return (x * scale).astype(np.float32)
