"""Write compressed-tensors checkpoints: the format llm-compressor writes and vLLM serves.

A compressed-tensors checkpoint is a Hugging Face folder (``config.json`` + safetensors) whose
``config.json`` carries a ``quantization_config`` with ``quant_method: "compressed-tensors"``,
``config_groups`` (each a scheme: weight args, optional input-activation args, targets, format)
and ``quantization_status: "compressed"``. Per quantized module ``M`` the safetensors hold
(compressed-tensors 0.20 ``compressors/``):

``pack-quantized`` (integer weights, no activation quantization)
    ``M.weight_packed`` int32 ``[out, ceil(in*b/32)]``: codes ``q + 2^(b-1)`` (made unsigned) as
    one little-endian bit stream per row, element ``i`` at bits ``[i*b, (i+1)*b)`` of the row's
    int32 words (int4: element 0 in the lowest nibble of word 0; int8: four per word);
    ``M.weight_scale``; ``M.weight_shape`` int64 ``[out, in]``; when asymmetric,
    ``M.weight_zero_point`` packed the same way but down the rows (``[ceil(out*b/32), groups]``).
``int-quantized`` / ``float-quantized`` (weights with dynamic input-activation quantization)
``naive-quantized`` (fp8 weights alone)
    ``M.weight`` int8 codes or float8_e4m3fn values, ``M.weight_scale`` (+ int8
    ``M.weight_zero_point`` when asymmetric).

Scales have shape ``[1]`` (tensor), ``[out, 1]`` (channel) or ``[out, in/G]`` (group of ``G``
along the input axis). A weight dequantizes as ``(q - zp) * scale`` computed in the scale's dtype
(``compressed_tensors.quantization.lifecycle.forward._dequantize``): scales are stored float32 by
default, so the result is exactly lowbit's float32 dequantization. The format chosen for a scheme
is the one compressed-tensors itself infers (``infer_module_format``), so its model-free
dequantizer and its model loaders agree with the file.

The jobs live in three modules: :mod:`lowbit.checkpoints.compressed_tensors.tensor` (:class:`CTTensor`, its
checks, :func:`pack_int32`, :func:`from_quantized`), :mod:`lowbit.checkpoints.compressed_tensors.config`
(:func:`quantization_config`) and this one (the writer: safetensors entries, shards, the folder).
"""

from __future__ import annotations

import functools
import json
import os
import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from lowbit._arrays import bfloat16
from lowbit._progress import progress_bar
from lowbit.checkpoints.compressed_tensors.config import (
    CT_FORMAT_VERSION,
    _compact_targets,
    _config,
    _module_name,
    _scheme_key,
    quantization_config,
)
from lowbit.checkpoints.compressed_tensors.fp4 import e8m0_bytes, pack_fp4
from lowbit.checkpoints.compressed_tensors.tensor import (
    CTTensor,
    _checked,
    _fp8,
    from_quantized,
    pack_int32,
)
from lowbit.checkpoints.compressed_tensors.transforms import transform_entries
from lowbit.checkpoints.io import safetensors_write as _safetensors
from lowbit.checkpoints.io.arrays import as_numpy
from lowbit.checkpoints.io.atomic import atomic_dir
from lowbit.checkpoints.io.outputs import writer_metadata
from lowbit.errors import LowbitError

__all__ = [
    "CT_FORMAT_VERSION",
    "CTTensor",
    "from_quantized",
    "pack_int32",
    "quantization_config",
    "write_compressed_tensors",
]

_SCALE_DTYPES = {"float32": np.float32, "float16": np.float16, "bfloat16": None}  # None: bfloat16()


class _Parts:
    """A weight's validated (codes, scale, zero point), made when its first tensor is written
    and dropped after its last, so only one weight's arrays are held at a time."""

    def __init__(self, t: CTTensor, name: str) -> None:
        self.t, self.name = t, name
        self.value: tuple[np.ndarray, np.ndarray, np.ndarray | None] | None = None

    def get(self) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        if self.value is None:
            self.value = _checked(self.t, self.name)
        return self.value

    def release(self, arr: np.ndarray) -> np.ndarray:
        self.value = None
        return arr


def _entries(name: str, t: CTTensor, scale_dtype: Any) -> list[_safetensors.Entry]:
    """The safetensors entries for one quantized weight (data produced when written)."""
    if not name.endswith(".weight"):
        raise LowbitError(
            f"quantized tensor names end in '.weight' (the module's weight), got {name!r}"
        )
    module = name[: -len(".weight")]
    _, scale, _ = _checked(t, name)  # validate now: nothing is written for bad input
    if t.kind == "fp4":
        return _fp4_entries(module, t, name)
    if not np.array_equal(scale.astype(scale_dtype).astype(np.float32), scale):
        raise LowbitError(
            f"compressed-tensors weight {name!r}: its scales are not exact in "
            f"{np.dtype(scale_dtype).name}; store them as float32 or quantize with that scale format"
        )
    out, cols = t.shape
    sshape = scale.shape
    p = _Parts(t, name)
    b = t.num_bits
    E = _safetensors.Entry

    def scale_() -> np.ndarray:
        return p.get()[1].astype(scale_dtype)

    if t.format() == "pack-quantized":
        entries = [
            E(
                f"{module}.weight_packed",
                np.dtype(np.int32),
                (out, -(-cols * b // 32)),
                lambda: pack_int32(p.get()[0], b, axis=1),
            ),
            E(f"{module}.weight_scale", np.dtype(scale_dtype), sshape, scale_),
            E(
                f"{module}.weight_shape",
                np.dtype(np.int64),
                (2,),
                lambda: np.array([out, cols], dtype=np.int64),
            ),
        ]
        if t.zero_point is not None and t.resolved_strategy() != "tensor":
            # group/channel zero points are packed down the rows (pack_to_int32 packed_dim=0)
            entries.append(
                E(
                    f"{module}.weight_zero_point",
                    np.dtype(np.int32),
                    (-(-out * b // 32), sshape[1]),
                    lambda: pack_int32(p.get()[2], b, axis=0),
                )
            )
        elif t.zero_point is not None:
            entries.append(
                E(f"{module}.weight_zero_point", np.dtype(np.int8), sshape, lambda: p.get()[2])
            )
    else:
        wdtype = np.dtype(np.int8) if t.kind == "int" else _fp8()
        entries = [
            E(f"{module}.weight", wdtype, (out, cols), lambda: p.get()[0].view(wdtype)),
            E(f"{module}.weight_scale", np.dtype(scale_dtype), sshape, scale_),
        ]
        if t.zero_point is not None:
            entries.append(
                E(f"{module}.weight_zero_point", np.dtype(np.int8), sshape, lambda: p.get()[2])
            )
    last = entries[-1]
    make_last = last.produce
    last.produce = lambda: p.release(make_last())
    return entries


def _fp4_entries(module: str, t: CTTensor, name: str) -> list[_safetensors.Entry]:
    """NVFP4 / MXFP4: ``weight_packed`` uint8 ``[out, in/2]``, ``weight_scale`` (E4M3 values,
    or E8M0 bytes for MXFP4), NVFP4's float32 ``weight_global_scale`` (and W4A4's
    ``input_global_scale``), as compressed-tensors' NVFP4/MXFP4 compressors write them."""
    out, cols = t.shape
    p = _Parts(t, name)
    E = _safetensors.Entry
    groups = cols // int(t.group_size)  # type: ignore[arg-type]
    nv = t.global_scale is not None

    def scale_() -> np.ndarray:
        s = p.get()[1]
        return s.astype(_fp8()) if nv else e8m0_bytes(s)

    entries = [
        E(f"{module}.weight_packed", np.dtype(np.uint8), (out, cols // 2),
          lambda: pack_fp4(p.get()[0])),
        E(f"{module}.weight_scale", _fp8() if nv else np.dtype(np.uint8), (out, groups), scale_),
    ]  # fmt: skip
    if nv:
        g = np.asarray(as_numpy(t.global_scale), np.float32).reshape(1)
        entries.append(E(f"{module}.weight_global_scale", np.dtype(np.float32), (1,), lambda: g))
    if t.input_global_scale is not None:
        ig = np.asarray(as_numpy(t.input_global_scale), np.float32).reshape(1)
        entries.append(E(f"{module}.input_global_scale", np.dtype(np.float32), (1,), lambda: ig))
    last = entries[-1]
    make_last = last.produce
    last.produce = lambda: p.release(make_last())
    return entries


def _plain_entry(name: str, value: Any) -> _safetensors.Entry:
    arr = as_numpy(value)
    try:
        _safetensors.dtype_code(arr.dtype)
    except LowbitError:
        raise LowbitError(f"tensor {name!r}: safetensors cannot store dtype {arr.dtype}") from None
    return _safetensors.Entry(name, arr.dtype, tuple(arr.shape), lambda: arr)


class _Unit:
    """One item of the tensors Mapping: planned from a first look at its value, written from a
    second (the value is not kept in between, so a lazy Mapping keeps about one tensor)."""

    def __init__(self, tensors: Mapping[str, Any], key: Any, scale_dtype: Any) -> None:
        self.tensors, self.key, self.name, self.scale_dtype = tensors, key, str(key), scale_dtype
        value = tensors[key]
        self.scheme = _scheme_key(value) if isinstance(value, CTTensor) else None
        self.shape = tuple(getattr(value, "shape", ()))
        planned = self._build(value)
        del value
        self.entries = [
            _safetensors.Entry(e.name, e.dtype, e.shape, functools.partial(self._data, i))
            for i, e in enumerate(planned)
        ]
        self._fresh: list[_safetensors.Entry] | None = None

    def _build(self, value: Any) -> list[_safetensors.Entry]:
        if isinstance(value, CTTensor):
            return _entries(self.name, value, self.scale_dtype)
        return [_plain_entry(self.name, value)]

    def _data(self, i: int) -> np.ndarray:
        if self._fresh is None:
            fresh = self._build(self.tensors[self.key])
            same = [(e.name, e.dtype, e.shape) for e in fresh] == [
                (e.name, e.dtype, e.shape) for e in self.entries
            ]
            if not same:
                raise LowbitError(f"tensor {self.name!r} changed while the checkpoint was written")
            self._fresh = fresh
        arr = self._fresh[i].produce()
        if i == len(self.entries) - 1:
            self._fresh = None
        return arr


def _shards(
    units: list[list[_safetensors.Entry]], max_bytes: int
) -> list[list[_safetensors.Entry]]:
    """Group units (one weight's tensors stay together) into shards of at most ``max_bytes``."""
    shards: list[list[_safetensors.Entry]] = [[]]
    size = 0
    for unit in units:
        n = sum(e.nbytes for e in unit)
        if shards[-1] and size + n > max_bytes:
            shards.append([])
            size = 0
        shards[-1].extend(unit)
        size += n
    return shards


def write_compressed_tensors(
    out_dir: str | os.PathLike[str],
    tensors: Mapping[str, Any],
    config: Mapping[str, Any] | None = None,
    *,
    scale_dtype: str = "float32",
    max_shard_size: int = 5 * 2**30,
    copy_files: Iterable[str | os.PathLike[str]] = (),
    overwrite: bool = False,
    progress: bool | None = None,
    transforms: Mapping[str, int] | None = None,
) -> Path:
    """Write a compressed-tensors checkpoint folder (config.json + safetensors).

    Args:
        out_dir: the folder to create. It is written as ``DIR.tmp-XXXX`` beside it and renamed
            when complete; on any error nothing is left behind.
        tensors: name -> value, in file order. :class:`CTTensor` values (named
            ``<module>.weight``) are stored compressed; arrays and torch tensors (biases, norms,
            embeddings, unquantized weights) are stored as they are, in their dtype. Each value
            is looked up twice, for its shapes when planning the file headers and for its data
            when written, and not kept in between: a Mapping that loads or quantizes on access
            keeps memory to about one tensor.
        config: the model's Hugging Face ``config.json`` contents; its ``quantization_config``
            is replaced by the one built from ``tensors`` (:func:`quantization_config`).
        scale_dtype: ``"float32"`` (default: exact, compressed-tensors then dequantizes in
            float32), ``"float16"`` or ``"bfloat16"`` (the model dtype vLLM keeps scales in;
            refused when a scale would change).
        max_shard_size: bytes per safetensors shard; more than one shard adds
            ``model.safetensors.index.json``.
        copy_files: files copied into the folder unchanged (tokenizer files, generation config).
        overwrite: replace an existing folder.
        progress: a tqdm progress bar: ``True``, ``False``, or ``None`` (default) for "only on
            a terminal" (none without tqdm).
        transforms: layer (module) name -> block: layers whose weights ``tensors`` holds in a
            block-Hadamard-rotated basis (``W R``, ``lowbit.methods.hadamard``), so their inputs
            must be rotated at run time. Declared as ``transform_config`` with each layer's
            ``<layer>.v_input.weight`` (``lowbit.checkpoints.compressed_tensors.transforms``), which vLLM reads.

    Returns:
        The folder written.

    Raises:
        LowbitError: a weight compressed-tensors cannot hold (named, with the reason), a missing
            file to copy, an existing folder without ``overwrite``, or a transform of a layer
            without a 2-D weight among ``tensors`` or whose block does not divide its width.
    """
    if scale_dtype not in _SCALE_DTYPES:
        raise LowbitError(f"scale_dtype must be one of {list(_SCALE_DTYPES)}, got {scale_dtype!r}")
    if max_shard_size <= 0:
        raise LowbitError(f"max_shard_size must be positive, got {max_shard_size}")
    sdtype = _SCALE_DTYPES[scale_dtype] or bfloat16()
    files = [Path(f) for f in copy_files]
    for f in files:
        if not f.is_file():
            raise LowbitError(f"file to copy into the checkpoint does not exist: {f}")
        if f.name in ("config.json", "model.safetensors.index.json") or f.suffix == ".safetensors":
            raise LowbitError(f"{f.name} is written by the exporter; do not copy it")

    planned = [_Unit(tensors, key, sdtype) for key in tensors]
    tconfig = None
    if transforms:
        shapes = {u.name: u.shape for u in planned}
        for layer, block in transforms.items():
            shape = shapes.get(f"{layer}.weight", ())
            if len(shape) != 2 or not isinstance(block, int) or block < 1 or shape[1] % block:
                raise LowbitError(
                    f"a rotation of {layer!r} in blocks of {block!r}: the tensors hold no 2-D "
                    f"weight {layer}.weight whose width those blocks divide"
                )
        modules = {_module_name(n) for n in tensors if "." in str(n)}
        tconfig, matrices = transform_entries(
            transforms, lambda members: _compact_targets(members, modules)
        )
        planned += [_Unit(matrices, key, sdtype) for key in matrices]
    units = [u.entries for u in planned]
    seen: set[str] = set()
    for unit in units:
        for e in unit:
            if e.name in seen:
                raise LowbitError(f"tensor name {e.name!r} appears twice in the checkpoint")
            seen.add(e.name)
    cfg = dict(config or {})
    cfg["quantization_config"] = _config({u.name: u.scheme for u in planned}, CT_FORMAT_VERSION)
    if tconfig is not None:
        cfg["quantization_config"]["transform_config"] = tconfig
    shards = _shards(units, max_shard_size)
    names = (
        ["model.safetensors"]
        if len(shards) == 1
        else [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    )

    # the lowbit mark (and this folder's file list) lets a later overwrite tell it from others
    index = ["model.safetensors.index.json"] if len(shards) > 1 else []
    meta = {"format": "pt", **writer_metadata([*names, *index, "config.json"] +
                                              [f.name for f in files])}  # fmt: skip
    with atomic_dir(out_dir, overwrite=overwrite) as tmp:
        total = sum(len(u) for u in units)
        with progress_bar(total, progress, f"writing {Path(out_dir).name}", "tensor") as bar:
            for fname, shard in zip(names, shards, strict=True):
                _safetensors.write_file(tmp / fname, shard, meta, on_tensor=lambda e: bar.update(1))
        if len(shards) > 1:
            index = {
                "metadata": {"total_size": sum(e.nbytes for s in shards for e in s)},
                "weight_map": {
                    e.name: fname for fname, s in zip(names, shards, strict=True) for e in s
                },
            }
            (tmp / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
        for f in files:
            shutil.copyfile(f, tmp / f.name)
    return Path(out_dir)
