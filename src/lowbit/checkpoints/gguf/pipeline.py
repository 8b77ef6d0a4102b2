"""The GGUF step of ``quantize_model``: each planned tensor as its GGML block type or kept dtype,
named as llama.cpp names it, written with the source's metadata and tokenizer.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from lowbit.checkpoints.gguf import writer as gguf_writer
from lowbit.checkpoints.gguf.checks import GGUF_Q, _gguf_exact
from lowbit.checkpoints.gguf.writer import GGUFTensor
from lowbit.checkpoints.readers import ReplacedCheckpoint
from lowbit.checkpoints.steps import Clock, LazyMapping, raw_bytes, read_cast
from lowbit.errors import LowbitError
from lowbit.plans.plan import AppliedPlan
from lowbit.quant.tensor import quantize


def write_gguf(
    ckpt: Any,
    applied: AppliedPlan,
    out: Path,
    overwrite: bool,
    progress: bool | None,
    rounding: str,
    done: Mapping[str, Any] | None = None,
    clock: Clock | None = None,
) -> None:
    """Write a GGUF file; tensors in ``done`` (QuantizedTensors in a Q4_0/Q8_0 layout, e.g.
    GPTQ's) are stored as they are."""
    by_name = {t.name: t for t in applied.tensors}
    planned: set[str] = set()
    replaced = ckpt.replaced if isinstance(ckpt, ReplacedCheckpoint) else {}
    for name in replaced:
        stored = ckpt.base.info(name).dtype
        if by_name[name].action == "keep" and stored not in ("F32", "F16", "BF16"):
            raise LowbitError(
                f"{name}: changed in memory (e.g. by AWQ's folds) but kept, and the source "
                f"stores it as {stored}: GGUF keeps a tensor as stored, so the file would hold "
                f"the unchanged values; quantize it too (a plan rule), or write --out-format "
                f"lowbit or compressed-tensors"
            )

    def make(name: str) -> Any:
        t = by_name[name]
        ckpt.close()
        if t.action == "keep" and name in replaced:  # float32: exact, whatever was stored
            return GGUFTensor(replaced[name], "F32")
        if t.action == "keep":
            return GGUFTensor(raw_bytes(ckpt, name), t.dtype, raw=True)
        gtype = {"float32": "F32", "float16": "F16", "bfloat16": "BF16"}.get(t.cast or "")
        if t.action != "cast":
            assert t.scheme is not None
            gtype = GGUF_Q[t.scheme.element_format.bits]
        if name not in planned:
            # The writer's first look plans the header from the shape and type alone (it
            # checks that its second look, whose data it writes, agrees): a stand-in of the
            # shape with no memory, so the source is read and dequantized once, not twice.
            planned.add(name)
            return GGUFTensor(np.broadcast_to(np.float32(0), t.shape), gtype)
        if t.action == "cast":
            return GGUFTensor(read_cast(ckpt, t), gtype)
        s = t.scheme
        assert s is not None
        if done is not None and name in done:
            if not _gguf_exact(done[name].scheme):
                raise LowbitError(f"{name}: {done[name].scheme.label} is not a GGUF block type")
            return done[name]
        if rounding == "auto" and _gguf_exact(s):
            return quantize(ckpt.get(name), s)
        return GGUFTensor(np.asarray(ckpt.get(name), dtype=np.float32), gtype)

    gguf_writer.write_gguf(
        out,
        LazyMapping(list(by_name), (clock or Clock()).timed(make)),
        source=ckpt.path,
        overwrite=overwrite,
        progress=progress,
    )
