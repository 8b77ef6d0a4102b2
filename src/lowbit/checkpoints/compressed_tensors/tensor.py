"""One quantized weight in compressed-tensors terms: :class:`CTTensor`, its checks, its packing.

:class:`CTTensor` holds codes, scales and zero points in compressed-tensors' layout and says
which storage format compressed-tensors infers for it; :func:`pack_int32` is its int32 bit
packing (``pack-quantized``); :func:`from_quantized` maps a lowbit ``QuantizedTensor`` onto it.
The files these end up in are described in :mod:`lowbit.checkpoints.compressed_tensors.writer`.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np

from lowbit._arrays import ml_dtype
from lowbit.checkpoints.compressed_tensors.fp4 import checked_fp4, e2m1_values
from lowbit.checkpoints.io.arrays import as_numpy
from lowbit.codecs.packing import unpack
from lowbit.errors import LowbitError
from lowbit.quant.quantized_tensor import QuantizedTensor

__all__ = ["CTTensor", "from_quantized", "pack_int32"]

_KINDS = ("int", "float", "fp4")
_STRATEGIES = ("tensor", "channel", "group", "tensor_group", "block")
_ACTIVATIONS = ("int8", "fp8", "nvfp4")


def _fp8() -> np.dtype:
    """ml_dtypes' float8_e4m3fn (imported on first use: its import is most of a cold start)."""
    return ml_dtype("float8_e4m3fn")


@dataclass(frozen=True, eq=False)
class CTTensor:
    """One quantized 2-D weight ``[out, in]`` in compressed-tensors terms.

    Dequantized value: ``(codes - zero_point) * scale`` for ``kind="int"``, ``codes * scale``
    for ``kind="float"``, in float32.

    The arrays are held, not copied, and an fp4 weight is validated once: change a weight
    by making a new CTTensor, not by writing into its arrays.

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
            symmetric quantization of the layer's inputs (W8A8; per group of 128 for FP8
            blocks), which also selects the ``int-quantized`` / ``float-quantized`` storage
            compressed-tensors uses for it; ``"nvfp4"`` (NVFP4 weights only): W4A4, NVFP4
            inputs with dynamic E4M3 group scales under the static ``input_global_scale``.
        global_scale: NVFP4 (``kind="fp4"``, groups of 16): the float32 tensor scale in
            compressed-tensors' direction, the encode factor ``448 * 6 / amax``: a value is
            ``code * scale / global_scale``. ``kind="fp4"`` without it is MXFP4 (groups of
            32, power-of-two ``scale``).
        input_global_scale: the static float32 tensor scale of NVFP4 inputs (W4A4), same
            direction.
        block_structure: FP8 blocks: ``(rows, columns)`` of each scale's tile (strategy
            ``block``, scales ``[ceil(out/rows), ceil(in/columns)]``).

    ``kind="fp4"`` codes are E2M1 nibbles (uint8 0..15, sign in bit 3) ``[out, in]``."""

    codes: Any
    scale: Any
    kind: str = "int"
    num_bits: int = 8
    zero_point: Any = None
    group_size: int | None = None
    strategy: str | None = None
    activations: str | None = None
    global_scale: Any = None
    input_global_scale: Any = None
    block_structure: tuple[int, int] | None = None

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
        if self.block_structure is not None:
            return "block"
        if self.group_size is not None:
            return "tensor_group" if self.global_scale is not None else "group"
        return "tensor" if np.size(self.scale) == 1 else "channel"

    def format(self) -> str:
        """The compressed-tensors storage format (as its ``infer_module_format`` chooses)."""
        return _format(self.kind, self.activations, self.group_size)

    def dequantize(self) -> np.ndarray:
        """float32 values, computed as compressed-tensors does with float32 scales (NVFP4:
        ``code * float32(scale / global_scale)``)."""
        codes, scale, zp = _checked(self, "<tensor>")
        if self.kind == "fp4":
            g = None if self.global_scale is None else np.float32(np.ravel(self.global_scale)[0])
            eff = scale if g is None else (scale / g).astype(np.float32)
            return e2m1_values(codes) * _expand(eff, self, codes.shape)
        if self.kind == "float":
            values = codes.view(_fp8()).astype(np.float32)
        else:
            values = codes.astype(np.float32)
        if zp is not None:
            values = values - _expand(zp, self, codes.shape).astype(np.float32)
        return values * _expand(scale.astype(np.float32), self, codes.shape)


def _format(kind: str, activations: str | None, group_size: int | None = None) -> str:
    # compressed-tensors' priority order (compressors/format.py): FP4 in groups of 32 ->
    # mxfp4-pack-quantized, of 16 -> nvfp4-pack-quantized; weights with input activations ->
    # int-/float-quantized; integer weights alone -> pack-quantized; others naive
    if kind == "fp4":
        return "mxfp4-pack-quantized" if group_size == 32 else "nvfp4-pack-quantized"
    if kind == "int":
        return "int-quantized" if activations else "pack-quantized"
    return "float-quantized" if activations else "naive-quantized"


def _expand(per: np.ndarray, t: CTTensor, shape: tuple[int, ...]) -> np.ndarray:
    """Scale/zero point in compressed-tensors' layout -> broadcast to the weight's shape."""
    strategy = t.resolved_strategy()
    if strategy in ("group", "tensor_group"):
        return np.repeat(per, t.group_size, axis=1)
    if strategy == "block":
        bh, bw = t.block_structure  # type: ignore[misc]
        return np.repeat(np.repeat(per, bh, axis=0)[: shape[0]], bw, axis=1)[:, : shape[1]]
    return np.broadcast_to(per, shape)


def _layout(
    strategy: str,
    shape: tuple[int, ...],
    group_size: int | None,
    block: tuple[int, int] | None = None,
) -> tuple[int, ...]:
    out, cols = shape
    if strategy == "tensor":
        return (1,)
    if strategy == "channel":
        return (out, 1)
    if strategy == "block":
        assert block is not None
        return (-(-out // block[0]), -(-cols // block[1]))
    assert group_size is not None
    return (out, cols // group_size)


#: fp4 weights already validated (a CTTensor is frozen): the writer asks three times per
#: weight (from_quantized, planning its entries, producing them), and each check reads every
#: code and scale. Only fp4's, whose checked codes are the tensor's own array (no copy held).
_VALID_FP4: weakref.WeakKeyDictionary[CTTensor, tuple[np.ndarray, np.ndarray, None]] = (
    weakref.WeakKeyDictionary()
)


def _checked(t: CTTensor, name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Validate ``t``; return (codes: int8/uint8 fp8 bits, scale in CT layout, zp in CT layout)."""
    got = _VALID_FP4.get(t)
    if got is not None:
        return got
    checked = _check(t, name)
    if t.kind == "fp4":
        _VALID_FP4[t] = checked  # type: ignore[assignment]
    return checked


def _check(t: CTTensor, name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
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
    if t.kind == "fp4":
        return checked_fp4(t, codes, strategy, bad)
    if (strategy == "block") != (t.block_structure is not None):
        raise bad("block_structure goes with strategy 'block' (and only with it)")
    if strategy == "tensor_group" or t.global_scale is not None or t.activations == "nvfp4":
        raise bad("tensor_group scales and global scales are NVFP4's (kind 'fp4')")
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
            raise bad("fp8 weights take tensor, channel or block scales here")
        if codes.dtype.kind == "V" and codes.dtype == _fp8():
            codes = codes.view(np.uint8)
        elif codes.dtype != np.uint8:
            raise bad(f"fp8 codes must be float8_e4m3fn values or uint8 bits, got {codes.dtype}")
        if np.any((codes & 0x7F) == 0x7F):
            raise bad("fp8 codes contain NaN (0x7F/0xFF)")

    if strategy == "block":
        bs = t.block_structure
        if (
            t.kind != "float"
            or not isinstance(bs, tuple)
            or len(bs) != 2
            or not all(isinstance(b, (int, np.integer)) and b > 0 for b in bs)
        ):
            raise bad(
                f"block scales are fp8 weights' with block_structure (rows, cols), got {bs!r}"
            )
    want = _layout(strategy, codes.shape, t.group_size, t.block_structure)
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
    wide = codes.astype(np.int16) + (1 << (num_bits - 1))
    rows, cols = wide.shape
    if 8 % num_bits == 0 and (not wide.size or (wide.min() >= 0 and wide.max() >> num_bits == 0)):
        # whole elements per byte (1, 2, 4, 8 bits), each within its bits: the stream's
        # bytes, element i at bits i*b % 8 of byte i*b // 8, and its words little-endian
        per = 8 // num_bits
        padded = np.zeros((rows, words * 4 * per), dtype=np.uint8)
        padded[:, :cols] = wide
        stream = padded[:, 0::per].copy()
        for k in range(1, per):
            stream |= padded[:, k::per] << np.uint8(k * num_bits)
        return stream.view("<i4")
    u = wide.astype(np.uint32)
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


def _int_zero_point(zp: Any, bits: int, signed: bool) -> np.ndarray | None:
    """compressed-tensors' int8 zero points from lowbit's (integers; unsigned codes are
    stored shifted by ``2**(bits-1)``, their zero points too)."""
    if zp is None:
        return None
    zpa = np.asarray(zp)
    if not np.array_equal(zpa, np.round(zpa)):
        raise LowbitError("compressed-tensors zero points are integers; got fractional ones")
    z = zpa.astype(np.int16)
    return (z if signed else z - (1 << (bits - 1))).astype(np.int8)


def _served(
    qt: Any, scheme: Any, name: str, granularity: str, activations: str | None, igs: Any
) -> CTTensor | None:
    """NVFP4, MXFP4 and FP8 blocks as compressed-tensors stores them (None: another kind)."""
    label = getattr(scheme, "label", "")
    if granularity == "tile":
        if name != "float8_e4m3fn" or scheme.scale_format not in ("float32", "float8_e8m0fnu"):
            raise LowbitError(
                f"compressed-tensors stores blocks of float8_e4m3fn weights with float scales; "
                f"got {label}"
            )
        t = CTTensor(codes=np.asarray(qt.unpack()).astype(np.uint8, copy=False), scale=np.asarray(qt.scale),
                     kind="float", num_bits=8, strategy="block", activations=activations,
                     block_structure=tuple(scheme.block_shape))  # fmt: skip
    elif name == "float4_e2m1fn" and getattr(scheme, "tensor_scale", False):
        if scheme.group_size != 16 or scheme.axis % 2 != 1:
            raise LowbitError(
                f"compressed-tensors' NVFP4 is groups of 16 along the rows; got {label}"
            )
        t = CTTensor(codes=np.asarray(qt.unpack()).astype(np.uint8, copy=False), scale=qt.group_scale,
                     kind="fp4", num_bits=4, group_size=16, activations=activations,
                     global_scale=np.array([qt.tensor_scale], np.float32),
                     input_global_scale=igs)  # fmt: skip
    elif getattr(scheme, "format", None) == "mxfp4":
        if scheme.axis % 2 != 1:
            raise LowbitError(
                f"compressed-tensors' MXFP4 is blocks of 32 along the rows; got {label}"
            )
        t = CTTensor(codes=np.asarray(qt.unpack()).astype(np.uint8, copy=False), scale=np.asarray(qt.scale),
                     kind="fp4", num_bits=4, group_size=32, activations=activations)  # fmt: skip
    else:
        return None
    _checked(t, "<QuantizedTensor>")
    return t


def from_quantized(
    qt: Any, *, activations: str | None = None, input_global_scale: Any = None
) -> CTTensor:
    """Map a lowbit ``QuantizedTensor`` of a 2-D weight ``[out, in]`` to a :class:`CTTensor`.

    Supported (compressed-tensors' schemes): integer formats of 1..8 bits, symmetric or with a
    zero point, per tensor, per output channel (``axis=0``) or in groups along the input axis
    (``axis=-1``); ``float8_e4m3fn`` per tensor, per output channel or in tiles (FP8 blocks);
    ``nvfp4`` (W4A4 with ``activations="nvfp4"`` and the static ``input_global_scale``,
    float32 in the encode direction) and ``mxfp4`` in blocks along the input axis. Unsigned
    integer codes (``uint4`` with a zero point) are shifted to the signed range, which changes
    no value.

    Raises:
        LowbitError: any other format or layout (NF4, other MX formats, e5m2, input-axis
            channels, a width a block cannot hold, ...), naming what compressed-tensors needs.
    """
    fmt = qt.format
    name = getattr(fmt, "name", str(fmt))
    kind = getattr(fmt, "kind", None)
    shape = tuple(qt.shape)
    scheme = getattr(qt, "scheme", None)
    granularity = str(getattr(qt.granularity, "value", qt.granularity))
    if len(shape) != 2:
        raise LowbitError(f"compressed-tensors stores 2-D weights [out, in]; got shape {shape}")
    served = _served(qt, scheme, name, granularity, activations, input_global_scale)
    if served is not None:
        return served
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
    scale = np.asarray(qt.scale, dtype=np.float32)
    zp = getattr(qt, "zero_point", None)
    if kind == "int" and getattr(fmt, "bits", 99) <= 8 and isinstance(qt, QuantizedTensor):
        # the stored codes as signed int8 in one uint8 pass: what unpack() and the shift
        # below give (two's complement c - 2**b for c >= 2**(b-1), less 2**(b-1) unsigned)
        bits = int(fmt.bits)
        c = unpack(qt.codes, bits, qt.numel).reshape(shape)
        half = np.uint8(1 << (bits - 1))
        if fmt.signed and bits < 8:
            c = (c ^ half) - half
        elif not fmt.signed:
            c = c - half
        t = CTTensor(
            codes=c.view(np.int8),
            scale=scale,
            kind="int",
            num_bits=bits,
            zero_point=_int_zero_point(zp, bits, fmt.signed),
            group_size=group_size,
            strategy=strategy,
            activations=activations,
        )
        _checked(t, "<QuantizedTensor>")
        return t
    codes = np.asarray(qt.unpack()).reshape(shape)
    if kind == "int" and getattr(fmt, "bits", 99) <= 8:
        bits = int(fmt.bits)
        signed = getattr(fmt, "signed", True)
        codes = codes.astype(np.int16)
        if not signed:
            codes = codes - (1 << (bits - 1))
        t = CTTensor(
            codes=codes.astype(np.int8),
            scale=scale,
            kind="int",
            num_bits=bits,
            zero_point=_int_zero_point(zp, bits, signed),
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
