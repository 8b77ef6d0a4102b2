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
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

from lowbit.checkpoints import _safetensors_write as _safetensors
from lowbit.checkpoints._atomic import atomic_dir
from lowbit.checkpoints._write_arrays import as_numpy
from lowbit.errors import LowbitError

__all__ = [
    "CT_FORMAT_VERSION",
    "CTTensor",
    "from_quantized",
    "pack_int32",
    "quantization_config",
    "write_compressed_tensors",
]

CT_FORMAT_VERSION = "0.20.1"
"""The compressed-tensors release whose on-disk format this writer follows (checked in tests)."""

_KINDS = ("int", "float")
_STRATEGIES = ("tensor", "channel", "group")
_ACTIVATIONS = ("int8", "fp8")
_SCALE_DTYPES = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}
_FP8 = np.dtype(ml_dtypes.float8_e4m3fn)


@dataclass(frozen=True, eq=False)
class CTTensor:
    """One quantized 2-D weight ``[out, in]`` in compressed-tensors terms.

    Dequantized value: ``(codes - zero_point) * scale`` for ``kind="int"``, ``codes * scale``
    for ``kind="float"``, in float32.

    Attributes:
        codes: ``kind="int"``: signed integer codes in ``[-2^(b-1), 2^(b-1) - 1]``, shape
            ``[out, in]``. ``kind="float"``: float8_e4m3fn values (an ml_dtypes array) or their
            uint8 bit patterns.
        scale: one per tensor (size 1), per output channel (``[out]`` or ``[out, 1]``) or per
            group (``[out, in // group_size]``); real, positive, finite.
        kind: ``"int"`` or ``"float"`` (fp8 E4M3, the only float compressed-tensors packs here).
        num_bits: 1..8 for ``int``; 8 for ``float``.
        zero_point: integer codes like ``codes``, shaped like ``scale`` (asymmetric ``int``).
        group_size: ``G`` for group scales along the input axis.
        strategy: ``"tensor"``, ``"channel"`` or ``"group"``; derived from ``group_size`` and
            the scale's size when omitted.
        activations: ``None`` (weight-only), ``"int8"`` or ``"fp8"``: declares dynamic per-token
            symmetric quantization of the layer's inputs (W8A8), which also selects the
            ``int-quantized`` / ``float-quantized`` storage compressed-tensors uses for it.
    """

    codes: Any
    scale: Any
    kind: str = "int"
    num_bits: int = 8
    zero_point: Any = None
    group_size: int | None = None
    strategy: str | None = None
    activations: str | None = None

    @property
    def shape(self) -> tuple[int, ...]:
        """The weight's shape ``(out, in)``."""
        return tuple(np.shape(self.codes))

    @property
    def symmetric(self) -> bool:
        return self.zero_point is None

    def resolved_strategy(self) -> str:
        """The strategy, derived when not given: group if ``group_size``, else by scale size."""
        if self.strategy is not None:
            return self.strategy
        if self.group_size is not None:
            return "group"
        return "tensor" if np.size(self.scale) == 1 else "channel"

    def format(self) -> str:
        """The compressed-tensors storage format (as its ``infer_module_format`` chooses)."""
        return _format(self.kind, self.activations)

    def dequantize(self) -> np.ndarray:
        """float32 values, computed as compressed-tensors does with float32 scales."""
        codes, scale, zp = _checked(self, "<tensor>")
        if self.kind == "float":
            values = codes.view(_FP8).astype(np.float32)
        else:
            values = codes.astype(np.float32)
        if zp is not None:
            values = values - _expand(zp, self, codes.shape).astype(np.float32)
        return values * _expand(scale.astype(np.float32), self, codes.shape)


def _format(kind: str, activations: str | None) -> str:
    # compressed-tensors' priority order (compressors/format.py): weights with input
    # activations -> int-/float-quantized; integer weights alone -> pack-quantized; others naive
    if kind == "int":
        return "int-quantized" if activations else "pack-quantized"
    return "float-quantized" if activations else "naive-quantized"


def _expand(per: np.ndarray, t: CTTensor, shape: tuple[int, ...]) -> np.ndarray:
    """Scale/zero point in compressed-tensors' layout -> broadcast to the weight's shape."""
    strategy = t.resolved_strategy()
    if strategy == "group":
        return np.repeat(per, t.group_size, axis=1)
    return np.broadcast_to(per, shape)


def _layout(strategy: str, shape: tuple[int, ...], group_size: int | None) -> tuple[int, ...]:
    out, cols = shape
    if strategy == "tensor":
        return (1,)
    if strategy == "channel":
        return (out, 1)
    assert group_size is not None
    return (out, cols // group_size)


def _checked(t: CTTensor, name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Validate ``t``; return (codes: int8/uint8 fp8 bits, scale in CT layout, zp in CT layout)."""

    def bad(msg: str) -> LowbitError:
        return LowbitError(f"compressed-tensors weight {name!r}: {msg}")

    if t.kind not in _KINDS:
        raise bad(f"kind must be one of {list(_KINDS)}, got {t.kind!r}")
    lo, hi = -(1 << (t.num_bits - 1)), (1 << (t.num_bits - 1)) - 1
    if t.activations not in (None, *_ACTIVATIONS):
        raise bad(f"activations must be None or one of {list(_ACTIVATIONS)}, got {t.activations!r}")
    codes = as_numpy(t.codes)
    if codes.ndim != 2 or 0 in codes.shape:
        raise bad(f"codes must be a 2-D weight [out, in], got shape {codes.shape}")
    strategy = t.resolved_strategy()
    if strategy not in _STRATEGIES:
        raise bad(f"strategy must be one of {list(_STRATEGIES)}, got {strategy!r}")
    if (strategy == "group") != (t.group_size is not None):
        raise bad("group_size goes with strategy 'group' (and only with it)")
    if strategy == "group" and (
        not isinstance(t.group_size, (int, np.integer))
        or t.group_size <= 0
        or codes.shape[1] % t.group_size
    ):
        raise bad(f"group_size {t.group_size} does not divide the {codes.shape[1]} input columns")

    if t.kind == "int":
        if not 1 <= t.num_bits <= 8:
            raise bad(f"integer num_bits must be 1..8, got {t.num_bits}")
        if codes.dtype.kind not in "iu":
            raise bad(f"integer codes must have an integer dtype, got {codes.dtype}")
        if codes.min() < lo or codes.max() > hi:
            raise bad(
                f"int{t.num_bits} codes must lie in {lo}..{hi}, got {codes.min()}..{codes.max()}"
            )
        codes = codes.astype(np.int8)
    else:
        if t.num_bits != 8:
            raise bad(f"float weights are fp8 (num_bits 8), got {t.num_bits}")
        if t.zero_point is not None:
            raise bad("float weights are symmetric: no zero point")
        if strategy == "group":
            raise bad("fp8 weights take tensor or channel scales here")
        if codes.dtype == _FP8:
            codes = codes.view(np.uint8)
        elif codes.dtype != np.uint8:
            raise bad(f"fp8 codes must be float8_e4m3fn values or uint8 bits, got {codes.dtype}")
        if np.any((codes & 0x7F) == 0x7F):
            raise bad("fp8 codes contain NaN (0x7F/0xFF)")

    want = _layout(strategy, codes.shape, t.group_size)
    scale = as_numpy(t.scale)
    if scale.dtype.kind != "f" and scale.dtype.name != "bfloat16":
        raise bad(f"scale must be floating point, got {scale.dtype}")
    if scale.size != int(np.prod(want)):
        raise bad(
            f"{strategy} scales for shape {codes.shape} need shape {list(want)}, got {list(scale.shape)}"
        )
    scale = scale.astype(np.float32).reshape(want)
    if not (np.isfinite(scale).all() and (scale > 0).all()):
        raise bad("scales must be positive and finite")
    zp = None
    if t.zero_point is not None:
        zp = as_numpy(t.zero_point)
        if zp.dtype.kind not in "iu" or zp.size != scale.size:
            raise bad(f"zero_point must be integers shaped like the scale {list(want)}")
        if zp.min() < lo or zp.max() > hi:
            raise bad(f"zero points must lie in {lo}..{hi} like the codes")
        zp = zp.astype(np.int8).reshape(want)
    return codes, scale, zp


def pack_int32(codes: np.ndarray, num_bits: int, axis: int = 1) -> np.ndarray:
    """Pack signed ``num_bits`` codes of a 2-D array into int32 words, compressed-tensors style.

    Codes are offset by ``2^(num_bits-1)`` to unsigned, then along ``axis`` each row (column for
    ``axis=0``) becomes one little-endian bit stream: element ``i`` occupies bits
    ``[i*b, (i+1)*b)``, bit ``k`` of the stream is bit ``k % 32`` of word ``k // 32``, and the row
    ends after ``ceil(n*b/32)`` words (``compressors/pack_quantized/helpers.py: pack_to_int32``).
    Example, int4: codes ``[-8, -7, 0, 7, ...]`` are nibbles ``0, 1, 8, 15`` from the lowest bits
    of word 0 up.
    """
    codes = np.asarray(codes)
    if axis == 0:
        return pack_int32(codes.T, num_bits, axis=1).T.copy()
    rows, cols = codes.shape
    words = -(-cols * num_bits // 32)
    out = np.empty((rows, words), dtype=np.int32)
    step = max(1, _PACK_CHUNK // max(cols, 1))  # rows at a time: bounded temporaries
    for r in range(0, rows, step):
        out[r : r + step] = _pack_rows(codes[r : r + step], num_bits, words)
    return out


_PACK_CHUNK = 1 << 21  # codes per packing step


def _pack_rows(codes: np.ndarray, num_bits: int, words: int) -> np.ndarray:
    u = (codes.astype(np.int16) + (1 << (num_bits - 1))).astype(np.uint32)
    rows, cols = u.shape
    if 32 % num_bits == 0:  # whole elements per word (1, 2, 4, 8 bits): shift and add
        per = 32 // num_bits
        padded = np.zeros((rows, words * per), dtype=np.uint32)
        padded[:, :cols] = u
        shifts = (np.arange(per, dtype=np.uint32) * num_bits)[None, None, :]
        packed = (padded.reshape(rows, words, per) << shifts).sum(axis=2, dtype=np.uint32)
        return packed.view(np.int32)
    # elements straddle words: build the bit stream explicitly
    bits = ((u[:, :, None] >> np.arange(num_bits, dtype=np.uint32)) & 1).astype(np.uint8)
    stream = np.zeros((rows, words * 32), dtype=np.uint8)
    stream[:, : cols * num_bits] = bits.reshape(rows, -1)
    return np.packbits(stream, axis=1, bitorder="little").view("<u4").view(np.int32)


def _scheme_key(t: CTTensor) -> tuple[Any, ...]:
    return (
        t.kind,
        t.num_bits,
        t.symmetric,
        t.resolved_strategy(),
        t.group_size,
        t.activations,
    )


def _scheme_dict(key: tuple[Any, ...], targets: list[str]) -> dict[str, Any]:
    kind, bits, symmetric, strategy, group_size, activations = key
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
        config_groups[f"group_{i}"] = _scheme_dict(key, _compact_targets(members, modules))
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
        wdtype = np.dtype(np.int8) if t.kind == "int" else _FP8
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
    progress: bool = True,
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
        progress: show a tqdm progress bar (if tqdm is installed).

    Returns:
        The folder written.

    Raises:
        LowbitError: a weight compressed-tensors cannot hold (named, with the reason), a missing
            file to copy, or an existing folder without ``overwrite``.
    """
    if scale_dtype not in _SCALE_DTYPES:
        raise LowbitError(f"scale_dtype must be one of {list(_SCALE_DTYPES)}, got {scale_dtype!r}")
    if max_shard_size <= 0:
        raise LowbitError(f"max_shard_size must be positive, got {max_shard_size}")
    sdtype = _SCALE_DTYPES[scale_dtype]
    files = [Path(f) for f in copy_files]
    for f in files:
        if not f.is_file():
            raise LowbitError(f"file to copy into the checkpoint does not exist: {f}")
        if f.name in ("config.json", "model.safetensors.index.json") or f.suffix == ".safetensors":
            raise LowbitError(f"{f.name} is written by the exporter; do not copy it")

    planned = [_Unit(tensors, key, sdtype) for key in tensors]
    units = [u.entries for u in planned]
    seen: set[str] = set()
    for unit in units:
        for e in unit:
            if e.name in seen:
                raise LowbitError(f"tensor name {e.name!r} appears twice in the checkpoint")
            seen.add(e.name)
    cfg = dict(config or {})
    cfg["quantization_config"] = _config({u.name: u.scheme for u in planned}, CT_FORMAT_VERSION)
    shards = _shards(units, max_shard_size)
    names = (
        ["model.safetensors"]
        if len(shards) == 1
        else [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    )

    with atomic_dir(out_dir, overwrite=overwrite) as tmp:
        bar = _progress(progress, sum(len(u) for u in units), Path(out_dir).name)
        try:
            for fname, shard in zip(names, shards, strict=True):
                on = (lambda e: bar.update(1)) if bar is not None else None
                _safetensors.write_file(tmp / fname, shard, {"format": "pt"}, on_tensor=on)
        finally:
            if bar is not None:
                bar.close()
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


def _progress(enabled: bool, total: int, desc: str) -> Any:
    if not enabled:
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return None
    return tqdm(total=total, unit="tensor", desc=f"writing {desc}")


def from_quantized(qt: Any, *, activations: str | None = None) -> CTTensor:
    """Map a lowbit ``QuantizedTensor`` of a 2-D weight ``[out, in]`` to a :class:`CTTensor`.

    Supported (compressed-tensors' schemes): integer formats of 1..8 bits, symmetric or with a
    zero point, per tensor, per output channel (``axis=0``) or in groups along the input axis
    (``axis=-1``); ``float8_e4m3fn`` per tensor or per output channel. Unsigned integer codes
    (``uint4`` with a zero point) are shifted to the signed range, which changes no value.

    Raises:
        LowbitError: any other format or layout (NF4, MX blocks, fp4, e5m2, channels along the
            input axis, ...), naming what compressed-tensors would need.
    """
    fmt = qt.format
    name = getattr(fmt, "name", str(fmt))
    kind = getattr(fmt, "kind", None)
    shape = tuple(qt.shape)
    scheme = getattr(qt, "scheme", None)
    granularity = str(getattr(qt.granularity, "value", qt.granularity))
    if len(shape) != 2:
        raise LowbitError(f"compressed-tensors stores 2-D weights [out, in]; got shape {shape}")
    axis = getattr(scheme, "axis", None)
    axis = None if axis is None else axis % 2
    if granularity == "tensor":
        strategy, group_size = "tensor", None
    elif granularity == "channel" and axis in (None, 0):
        strategy, group_size = "channel", None
    elif granularity == "group" and axis in (None, 1):
        strategy, group_size = "group", int(scheme.group_size)
    else:
        raise LowbitError(
            f"compressed-tensors scales weights per tensor, per output channel (axis 0) or in "
            f"groups along the input axis (axis -1); got granularity {granularity} on axis {axis}"
        )
    codes = np.asarray(qt.unpack()).reshape(shape)
    scale = np.asarray(qt.scale, dtype=np.float32)
    zp = getattr(qt, "zero_point", None)
    if kind == "int" and getattr(fmt, "bits", 99) <= 8:
        bits = int(fmt.bits)
        codes = codes.astype(np.int16)
        if zp is not None:
            zpa = np.asarray(zp)
            if not np.array_equal(zpa, np.round(zpa)):
                raise LowbitError(
                    "compressed-tensors zero points are integers; got fractional ones"
                )
            zp = zpa.astype(np.int16)
        if not getattr(fmt, "signed", True):
            codes = codes - (1 << (bits - 1))
            zp = None if zp is None else zp - (1 << (bits - 1))
        t = CTTensor(
            codes=codes.astype(np.int8),
            scale=scale,
            kind="int",
            num_bits=bits,
            zero_point=None if zp is None else np.asarray(zp).astype(np.int8),
            group_size=group_size,
            strategy=strategy,
            activations=activations,
        )
    elif name == "float8_e4m3fn" and zp is None and strategy != "group":
        t = CTTensor(
            codes=codes.astype(np.uint8),
            scale=scale,
            kind="float",
            num_bits=8,
            strategy=strategy,
            activations=activations,
        )
    else:
        raise LowbitError(
            f"compressed-tensors has no scheme for {name} with {granularity} scales; it takes "
            "int1..int8 (tensor/channel/group) and float8_e4m3fn (tensor/channel)"
        )
    _checked(t, "<QuantizedTensor>")  # a ragged last group, out-of-range zero points, ...
    return t
