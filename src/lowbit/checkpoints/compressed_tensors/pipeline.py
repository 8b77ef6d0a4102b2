"""The compressed-tensors step of ``quantize_model``: each planned tensor quantized (or taken from GPTQ),
fused siblings given one global scale, input scales attached, and the folder written.
"""

from __future__ import annotations

import itertools
import warnings
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from lowbit.checkpoints._model_files import ModelFiles
from lowbit.checkpoints.compressed_tensors.fp4 import fused_siblings
from lowbit.checkpoints.compressed_tensors.writer import from_quantized, write_compressed_tensors
from lowbit.checkpoints.gguf.names import gguf_to_hf_array, gguf_to_hf_name
from lowbit.checkpoints.output_bytes import plain_dtype
from lowbit.checkpoints.steps import (
    Clock,
    LazyMapping,
    dense_dtype,
    kept_dense,
    read_cast,
    read_quantized,
    rows_permuted,
)
from lowbit.checkpoints.tokenizer import write_tokenizer
from lowbit.errors import LowbitError
from lowbit.plans.plan import AppliedPlan, TensorPlan
from lowbit.quant.layout import quantized_arrays
from lowbit.quant.quantized_tensor import QuantizedTensor
from lowbit.quant.shared_scale import tensor_scale_of
from lowbit.quant.tensor import quantize


def write_ct(
    ckpt: Any,
    applied: AppliedPlan,
    out: Path,
    overwrite: bool,
    max_shard_size: int | None,
    progress: bool | None,
    model_files: ModelFiles,
    done: Mapping[str, Any] | None = None,
    clock: Clock | None = None,
    input_scales: Mapping[str, Any] | None = None,
    rotations: Mapping[str, int] | None = None,
) -> tuple[list[str], list[dict[str, str]]]:
    """Write a compressed-tensors folder; returns the files copied and those left out.

    Tensors in ``done`` (name -> QuantizedTensor, e.g. GPTQ's) are written as they are (a GGUF
    source's q/k rows put back in the transformers order, codes and scales alike).
    ``input_scales``: the output's weight name -> NVFP4 ``input_global_scale`` of every tensor
    the plan gives NVFP4 activations (W4A4; ``lowbit.calibration.input_scales``).
    ``rotations``: checkpoint name -> Hadamard block of the weights stored rotated, declared
    as ``transform_config`` (``lowbit.checkpoints.compressed_tensors.transforms``)."""
    import tempfile

    is_gguf = ckpt.format == "gguf"
    cfg = dict(ckpt.config or {})
    by_out: dict[str, TensorPlan] = {}
    for t in applied.tensors:
        if is_gguf:
            by_out[gguf_to_hf_name(t.name, cfg)] = t
        else:
            by_out[t.name] = t

    def unpermute(hf: str, arr: np.ndarray) -> np.ndarray:
        """The transformers layout (q/k rows, Gemma's norms) of a GGUF source's tensor."""
        return gguf_to_hf_array(hf, np.asarray(arr), cfg) if is_gguf else arr

    planned: set[str] = set()
    shared_scale = _SharedScales(ckpt, applied)

    def layout_key(t: TensorPlan) -> tuple[Any, ...] | None:
        """Stand-ins of one shape, scheme and activations plan alike (None: not shared; an
        NVFP4-activation stand-in carries its own input scale)."""
        if t.action != "quantize" or t.activations == "nvfp4":
            return None
        return (tuple(t.shape), t.scheme, t.activations)

    # the first look's stand-ins, made once per layout that repeats (an 8B model's 32 blocks
    # of 7 shapes: making and checking each was a quarter of an NVFP4 write), dropped when
    # the writing starts
    repeats = Counter(k for t in by_out.values() if (k := layout_key(t)) is not None)
    stand_ins: dict[tuple[Any, ...], Any] = {}
    order = list(by_out)
    next_of = dict(itertools.pairwise(order))
    scales = dict(input_scales or {})

    def ct(qt: Any, t: TensorPlan, hf: str) -> Any:
        if t.activations != "nvfp4":
            return from_quantized(qt, activations=_CT_ACTS[t.activations])
        if hf not in scales:
            raise LowbitError(
                f"tensor {t.name!r}: NVFP4 activations (W4A4) need a calibrated input scale "
                "and none was given: run lowbit quantize --activations nvfp4, which calibrates it"
            )
        return from_quantized(qt, activations="nvfp4", input_global_scale=scales[hf])

    def make(hf: str) -> Any:
        t = by_out[hf]
        # The writer's first look plans the files from shapes and types alone (it checks
        # that its second look, whose data it writes, agrees): quantized weights and
        # GGUF-kept tensors get a stand-in of their layout, so each is read, decoded and
        # quantized once, not twice.
        first = hf not in planned
        planned.add(hf)
        ckpt.close()
        if not first:
            stand_ins.clear()
            after = next_of.get(hf)  # read ahead: the disk works while this one is rounded
            if after is not None and (done is None or by_out[after].name not in done):
                ckpt.prefetch(by_out[after].name)
        if t.action == "quantize" and done is not None and t.name in done:
            qt = done[t.name]
            if is_gguf and (".q_proj." in hf or ".k_proj." in hf):
                qt = rows_permuted(qt, lambda a: unpermute(hf, a))
            return ct(qt, t, hf)
        if t.action == "quantize" and first:
            key = layout_key(t)
            if key is None or repeats[key] < 2:
                return ct(_layout_of(t), t, hf)
            if key not in stand_ins:
                stand_ins[key] = ct(_layout_of(t), t, hf)
            return stand_ins[key]
        if t.action == "quantize":
            arr = unpermute(hf, ckpt.get(t.name))
            qt = quantize(arr, t.scheme, tensor_scale=shared_scale(t))
            del arr
            return ct(qt, t, hf)
        if t.action == "cast":
            return unpermute(hf, read_cast(ckpt, t))
        if is_gguf and not plain_dtype(t.dtype) and first:  # the dtype kept_dense chooses
            return np.broadcast_to(np.zeros((), dense_dtype(ckpt.get(t.name))), t.shape)
        if is_gguf and not plain_dtype(t.dtype):  # kept in a block type: 16 bits, not 32
            return unpermute(hf, kept_dense(ckpt.get(t.name)))
        return unpermute(hf, ckpt.get(t.name))

    with tempfile.TemporaryDirectory() as extra:
        # config.json is rewritten by the exporter; it copies top-level files only
        files = [f for f, rel in model_files.copied if "/" not in rel and rel != "config.json"]
        names = ["config.json", *(f.name for f in files)]
        left = model_files.left_out_list() + [
            {"file": rel, "why": "compressed-tensors output takes top-level files only"}
            for _, rel in model_files.copied
            if "/" in rel
        ]
        if is_gguf:
            try:
                write_tokenizer(ckpt, extra)
            except (LowbitError, OSError, ValueError, KeyError) as exc:
                warnings.warn(
                    f"{ckpt.path.name}: no tokenizer written ({exc})", UserWarning, stacklevel=3
                )
            files = sorted(p for p in Path(extra).iterdir() if p.is_file())
            names = ["config.json", *(p.name for p in files)]
        write_compressed_tensors(
            out,
            LazyMapping(list(by_out), (clock or Clock()).timed(make)),
            cfg,
            max_shard_size=max_shard_size or 5 * 2**30,
            copy_files=files,
            overwrite=overwrite,
            progress=progress,
            transforms={
                (gguf_to_hf_name(n, cfg) if is_gguf else n).removesuffix(".weight"): b
                for n, b in (rotations or {}).items()
            },
        )
    return names, left


#: compressed-tensors' names of the plan's activation formats.
_CT_ACTS = {"int8": "int8", "float8_e4m3fn": "fp8", None: None}


class _SharedScales:
    """NVFP4: one tensor scale for q/k/v and for gate/up (the smallest of theirs), as
    llm-compressor writes them and vLLM, which fuses those layers, requires; ``None`` for a
    scheme without a tensor scale. Each group's scale is computed once."""

    def __init__(self, ckpt: Any, applied: AppliedPlan) -> None:
        self.ckpt = ckpt
        self.plans = {t.name: t for t in applied.quantized}
        self.shared: dict[tuple[str, ...], Any] = {}

    def __call__(self, t: TensorPlan) -> Any:
        assert t.scheme is not None
        if not t.scheme.tensor_scale:
            return None
        plans = self.plans
        group = tuple(
            n for n in fused_siblings(t.name) if n in plans and plans[n].scheme == t.scheme
        ) or (t.name,)
        if group not in self.shared:
            self.shared[group] = min(tensor_scale_of(self.ckpt.get(n), t.scheme) for n in group)
        return self.shared[group]


def ct_weights(
    ckpt: Any, applied: AppliedPlan, done: Mapping[str, Any] | None = None
) -> dict[str, QuantizedTensor]:
    """Every tensor the plan quantizes as :func:`write_ct` writes it (checkpoint name ->
    QuantizedTensor, the checkpoint's layout): ``done``'s as given, the others rounded to
    nearest with NVFP4's shared tensor scales. A model built from them is the written one
    (what NVFP4 input scales are calibrated on)."""
    shared_scale = _SharedScales(ckpt, applied)
    out: dict[str, QuantizedTensor] = {}
    for t in applied.quantized:
        if done is not None and t.name in done:
            out[t.name] = read_quantized(ckpt, t, done)
            continue
        assert t.scheme is not None
        ckpt.close()
        try:
            out[t.name] = quantize(ckpt.get(t.name), t.scheme, tensor_scale=shared_scale(t))
        except LowbitError as exc:
            raise LowbitError(f"tensor {t.name!r}: {exc}") from None
    return out


def _layout_of(t: TensorPlan) -> QuantizedTensor:
    """A QuantizedTensor of ``t``'s shape and scheme holding zero codes and unit scales:
    the layout ``quantize(..., t.scheme)`` gives (``quantized_arrays``), none of its work."""
    assert t.scheme is not None
    arrays = {a.suffix: a for a in quantized_arrays(t.shape, t.scheme)}
    scale = arrays["scale"]  # compressed-tensors output has no double-quantized scales
    ones = np.ones(scale.shape, dtype=np.float32)
    return QuantizedTensor(
        codes=np.zeros(arrays["codes"].shape, dtype=np.uint8),
        scale=ones,
        zero_point=np.zeros(scale.shape, dtype=np.uint8) if "zero_point" in arrays else None,
        shape=t.shape,
        scheme=t.scheme,
        ts=(ones, np.float32(1.0)) if t.scheme.tensor_scale else None,
    )
