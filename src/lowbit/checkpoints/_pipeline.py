"""The per-tensor work behind ``lowbit.checkpoints.quantize_model``: reading, quantizing, checking what an
output format can hold, and the three writers (lowbit, compressed-tensors, GGUF).

Every function here touches one tensor at a time and drops its memory map before reading the
next (``Checkpoint.close()``; mapped pages that were read count as resident memory).
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from lowbit._arrays import bfloat16
from lowbit.checkpoints._model_files import ModelFiles
from lowbit.checkpoints._output_checks import GGUF_Q, _gguf_exact, _plain_dtype
from lowbit.checkpoints.compressed_tensors.fp4 import fused_siblings
from lowbit.checkpoints.compressed_tensors.writer import from_quantized, write_compressed_tensors
from lowbit.checkpoints.gguf import writer as gguf_writer
from lowbit.checkpoints.gguf.names import gguf_to_hf_array, gguf_to_hf_name
from lowbit.checkpoints.gguf.tokenizer import write_tokenizer
from lowbit.checkpoints.gguf.writer import GGUFTensor
from lowbit.checkpoints.io.safetensors_write import dtype_code
from lowbit.checkpoints.lowbit_format import checkpoint as lf
from lowbit.checkpoints.readers import ReplacedCheckpoint
from lowbit.codecs.packing import _pack_unchecked, unpack
from lowbit.errors import LowbitError
from lowbit.plans.plan import AppliedPlan, TensorPlan
from lowbit.quant.layout import quantized_arrays
from lowbit.quant.shared_scale import tensor_scale_of
from lowbit.quant.tensor import QuantizedTensor, quantize


def kept_dense(arr: Any) -> np.ndarray:
    """A kept tensor the source stores in a GGUF block type (Q8_0, Q4_K ...), for a format that
    holds only plain dtypes (compressed-tensors): float16 when every value is within float16's
    range, else bfloat16; never float32, which would double or quadruple the source's size.

    float16 rounds each value to 11 significant bits (relative error at most 2**-11), far
    below the block type's own step (Q8_0: 1/127 of the block's largest value); a block
    type's scales are float16, so its values exceed float16's range only in blocks whose
    largest value is above 65504.
    """
    a = np.asarray(arr, dtype=np.float32)
    return a.astype(_dense_dtype(a))


def _dense_dtype(a: np.ndarray) -> np.dtype:
    """kept_dense's choice for float32 ``a``: float16 when every value is within its range
    (a NaN is not), else bfloat16. Two reductions, no temporary of ``a``'s size."""
    top = np.float32(np.finfo(np.float16).max)
    if a.size == 0 or (a.max() <= top and a.min() >= -top):
        return np.dtype(np.float16)
    return bfloat16()


# ---------------------------------------------------------------------------------------
# Streaming
# ---------------------------------------------------------------------------------------


def read_quantized(checkpoint: Any, t: TensorPlan, done: Mapping[str, Any] | None = None) -> Any:
    """Read one tensor and quantize it; its memory map is dropped before the next read.
    A tensor in ``done`` (name -> QuantizedTensor, e.g. from GPTQ) is taken from there."""
    if done is not None and t.name in done:
        qt = done[t.name]
        if qt.shape != tuple(t.shape) or qt.scheme != t.scheme:
            raise LowbitError(f"tensor {t.name!r}: the given quantized tensor is not as planned")
        return qt
    checkpoint.close()  # unmap the previous tensor's pages (they count as resident memory)
    arr = checkpoint.get(t.name)
    try:
        return quantize(arr, t.scheme)
    except LowbitError as exc:
        raise LowbitError(f"tensor {t.name!r}: {exc}") from None
    finally:
        del arr


def read_cast(checkpoint: Any, t: TensorPlan) -> np.ndarray:
    checkpoint.close()
    arr = checkpoint.get(t.name)
    if t.cast == "bfloat16":
        return np.asarray(arr, dtype=np.float32).astype(bfloat16())
    with np.errstate(over="ignore"):
        out = np.asarray(arr).astype(t.cast)
    if not np.isfinite(out).all() and np.isfinite(np.asarray(arr, dtype=np.float32)).all():
        raise LowbitError(f"tensor {t.name!r}: values overflow {t.cast} when cast")
    return out


def raw_bytes(checkpoint: Any, name: str) -> np.ndarray:
    """The stored bytes of one tensor, uint8 ``[rows, bytes per row]`` (memory-mapped)."""
    info = checkpoint.info(name)
    shape = _raw_shape(info.shape, info.nbytes)
    if info.nbytes == 0:
        return np.zeros(shape, dtype=np.uint8)
    if info.offset < 0:  # no span of its own on disk (an expert of a fused tensor): its values
        arr = np.ascontiguousarray(checkpoint.get(name))
        return arr.view(np.uint8).reshape(_raw_shape(arr.shape, arr.nbytes))
    raw = np.memmap(info.file, dtype=np.uint8, mode="r", offset=info.offset, shape=(info.nbytes,))
    return np.asarray(raw).reshape(shape)


def _raw_shape(shape: tuple[int, ...], nbytes: int) -> tuple[int, ...]:
    """``[rows, bytes per row]`` for 2-D+ tensors, ``[bytes]`` for 1-D ones."""
    if len(shape) <= 1:
        return (nbytes,)
    rows = math.prod(shape[:-1])
    return (rows, nbytes // rows) if rows else (0, 0)


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


class Clock:
    """Seconds spent making the tensors a writer writes (reading the source, rounding it,
    casting), summed over every call of the functions :meth:`timed` wraps; the rest of a
    write is packing, hashing and writing files."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def timed(self, fn: Any) -> Any:
        def run(*args: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(*args)
            finally:
                self.seconds += time.perf_counter() - start

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

        shape = _raw_shape(t.shape, info.nbytes)
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


class _Lazy(Mapping):
    """A Mapping whose values are made when looked up (the exporters look each one up twice,
    planning and writing, and keep none in between)."""

    def __init__(self, keys: list[str], make: Any) -> None:
        self._keys = keys
        self._index = set(keys)
        self._make = make

    def __getitem__(self, key: str) -> Any:
        if key not in self._index:
            raise KeyError(key)
        return self._make(key)

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)


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
        if t.action == "quantize" and done is not None and t.name in done:
            qt = done[t.name]
            if is_gguf and (".q_proj." in hf or ".k_proj." in hf):
                qt = _rows_permuted(qt, lambda a: unpermute(hf, a))
            return ct(qt, t, hf)
        if t.action == "quantize" and first:
            return ct(_layout_of(t), t, hf)
        if t.action == "quantize":
            arr = unpermute(hf, ckpt.get(t.name))
            qt = quantize(arr, t.scheme, tensor_scale=shared_scale(t))
            del arr
            return ct(qt, t, hf)
        if t.action == "cast":
            return unpermute(hf, read_cast(ckpt, t))
        if is_gguf and not _plain_dtype(t.dtype) and first:  # the dtype kept_dense chooses
            return np.broadcast_to(np.zeros((), _dense_dtype(ckpt.get(t.name))), t.shape)
        if is_gguf and not _plain_dtype(t.dtype):  # kept in a block type: 16 bits, not 32
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
            _Lazy(list(by_out), (clock or Clock()).timed(make)),
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


def _rows_permuted(qt: Any, permute: Any) -> Any:
    """A 2-D QuantizedTensor with its rows reordered by ``permute`` (a function on arrays
    with rows first): codes, scales and zero points; a per-tensor scale stays."""
    rows, cols = qt.shape
    raw = unpack(qt.codes, qt.format.bits, qt.numel).reshape(rows, cols)
    order = np.asarray(permute(np.arange(rows)))

    def move(a: Any) -> Any:
        return a if a is None or a.shape[0] != rows else np.ascontiguousarray(a[order])

    if qt._dq is not None:
        raise LowbitError("double-quantized scales cannot be reordered; write a lowbit checkpoint")
    ts = None if qt.tensor_scale is None else (move(qt.group_scale), qt.tensor_scale)
    return QuantizedTensor(
        codes=_pack_unchecked(np.ascontiguousarray(raw[order]).reshape(-1), qt.format.bits),
        scale=move(qt.scale),
        zero_point=move(qt.zero_point),
        shape=qt.shape,
        scheme=qt.scheme,
        ts=ts,  # NVFP4: the group scales move with their rows, the tensor scale stays
    )


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
        _Lazy(list(by_name), (clock or Clock()).timed(make)),
        source=ckpt.path,
        overwrite=overwrite,
        progress=progress,
    )
