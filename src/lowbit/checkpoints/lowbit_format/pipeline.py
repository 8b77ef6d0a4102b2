"""The lowbit-format step of ``quantize_model``: each planned tensor packed, cast or kept, written
as a lowbit checkpoint with its manifest.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from lowbit._arrays import bfloat16
from lowbit.checkpoints._model_files import ModelFiles
from lowbit.checkpoints.io.safetensors_write import dtype_code
from lowbit.checkpoints.lowbit_format import checkpoint as lf
from lowbit.checkpoints.steps import Clock, raw_bytes, raw_shape, read_cast, read_quantized
from lowbit.errors import LowbitError
from lowbit.plans.plan import AppliedPlan, TensorPlan


def write_lowbit(
    ckpt: Any,
    applied: AppliedPlan,
    out: Path,
    overwrite: bool,
    max_shard_size: int | None,
    progress: bool | None,
    files: ModelFiles,
    done: Mapping[str, Any] | None = None,
    method: dict[str, Any] | None = None,
    clock: Clock | None = None,
) -> tuple[list[str], list[dict[str, str]]]:
    """Write a lowbit checkpoint; returns the files copied and those left out. Tensors in
    ``done`` (name -> QuantizedTensor, e.g. GPTQ's) are written as they are; ``clock``
    sums the seconds spent reading and quantizing."""
    clock = clock or Clock()
    units = []
    for t in applied.tensors:
        entry: dict[str, Any] = {
            "kind": {"quantize": "quantized", "keep": "kept", "cast": "cast"}[t.action],
            "shape": list(t.shape),
            "source_dtype": t.dtype,
            "label": t.label,
        }
        if t.action == "quantize":
            entry["activations"] = t.activations
            entry["rule"] = t.rule
            if done is not None and method is not None:
                entry["method"] = method["method"] if t.name in done else "rtn"
            units.append(
                lf.quantized_unit(
                    t.name,
                    t.shape,
                    t.scheme,
                    _bind(clock.timed(read_quantized), ckpt, t, done),
                    entry,
                )
            )
        elif t.action == "cast":
            dt = _cast_dtype(t.cast)  # type: ignore[arg-type]
            entry["dtype"] = t.cast
            make = _bind(clock.timed(_cast_unit), ckpt, t)
            units.append(lf.Unit(t.name, entry, [(t.name, dt, t.shape)], make))
        else:
            units.append(_kept_unit(ckpt, t, entry))
    manifest = {
        "source": {"path": str(ckpt.path), "format": ckpt.format},
        "plan": applied.plan.to_dict(),
        "config": ckpt.config,
        "totals": applied.totals(),
        "copied_files": files.copied_names,
        "left_out": files.left_out_list(),
    }
    if method is not None:
        manifest["method"] = method
    # read ahead: each unit, when made, hints the next unit's source tensor to the disk
    for unit, after in zip(units, [*applied.tensors[1:], None], strict=True):
        if after is not None and (done is None or after.name not in done):
            unit.produce = _ahead(ckpt, after.name, unit.produce)
    lf.write_lowbit_checkpoint(
        out,
        units,
        manifest,
        copy_files=files.copied,
        gguf_metadata_source=ckpt.path if ckpt.format == "gguf" else None,
        max_shard_size=max_shard_size or lf.DEFAULT_SHARD_SIZE,
        overwrite=overwrite,
        progress=progress,
    )
    return manifest["copied_files"], manifest["left_out"]


def _bind(fn: Any, *args: Any) -> Any:
    return lambda: fn(*args)


def _ahead(ckpt: Any, name: str, produce: Any) -> Any:
    """``produce``, which first asks the disk for tensor ``name`` (:meth:`Checkpoint.prefetch`):
    it is read while this unit is rounded."""

    def run() -> Any:
        ckpt.prefetch(name)
        return produce()

    return run


def _cast_dtype(name: str) -> np.dtype:
    return bfloat16() if name == "bfloat16" else np.dtype(name)


def _cast_unit(ckpt: Any, t: TensorPlan) -> dict[str, np.ndarray]:
    return {t.name: read_cast(ckpt, t)}


def _kept_unit(ckpt: Any, t: TensorPlan, entry: dict[str, Any]) -> Any:
    info = ckpt.info(t.name)
    if ckpt.format == "gguf" and t.dtype not in ("F32", "F16", "BF16", "F64", "I8", "I16", "I32",
                                                   "I64"):  # fmt: skip
        entry.update(dtype=t.dtype, encoding=f"gguf:{t.dtype}")

        def raw() -> dict[str, np.ndarray]:
            ckpt.close()
            return {t.name: raw_bytes(ckpt, t.name)}

        shape = raw_shape(t.shape, info.nbytes)
        return lf.Unit(t.name, entry, [(t.name, np.dtype("u1"), shape)], raw)
    sample = ckpt.get(t.name)
    dtype = sample.dtype
    del sample
    try:
        dtype_code(dtype)
    except LowbitError:
        raise LowbitError(f"tensor {t.name!r}: cannot store dtype {dtype} in safetensors") from None
    entry.update(dtype=t.dtype, encoding="array")

    def plain() -> dict[str, np.ndarray]:
        ckpt.close()
        return {t.name: ckpt.get(t.name)}

    return lf.Unit(t.name, entry, [(t.name, dtype, t.shape)], plain)
