"""A tensor in a low-bit format: packed codes, scales, zero points, shape and scheme
(:class:`QuantizedTensor`), its dequantization and its serialised form."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from lowbit import _json
from lowbit.codecs.packing import pack, packed_nbytes, unpack
from lowbit.errors import LowbitError
from lowbit.formats.base import Format
from lowbit.quant._engine import decode_tensor
from lowbit.quant.layout import Layout, _load_scale, _store_scale, make_layout
from lowbit.quant.nf4 import DQ_BLOCK, double_dequantize
from lowbit.quant.scheme import Granularity, Scheme


class QuantizedTensor:
    """Packed codes + scales (+ zero points) + shape + scheme: a tensor in a low-bit format.

    Attributes:
        codes: uint8 bit-packed codes (``lowbit.codecs.packing`` order), C order of ``shape``.
        scale: float32 scales, already rounded to ``scheme.scale_format``; shape as in
            ``lowbit.quant.layout`` (tensor ``(1,)*ndim``; channel: C at the axis; group:
            the axis length replaced by the number of groups).
        zero_point: int32 zero points (asymmetric integers) of ``scale``'s shape, or None.
        tensor_scale: two-level schemes (NVFP4): the float32 tensor scale ``g`` in the encode
            direction (values are ``code * group_scale / g``), else None; ``scale`` is then
            ``float32(group_scale / g)`` and :attr:`group_scale` holds the stored E4M3 values.
        shape: the tensor's shape.
        format: the element format (MX: the element format; MXINT8: ``int8`` with the
            scale ``X * 2**-6``).
        scheme: the :class:`~lowbit.quant.scheme.Scheme` used.
        granularity: ``scheme.granularity``.
    """

    def __init__(
        self,
        *,
        codes: np.ndarray,
        scale: np.ndarray,
        zero_point: np.ndarray | None,
        shape: tuple[int, ...],
        scheme: Scheme,
        dq: tuple[np.ndarray, np.ndarray, np.float32] | None = None,
        source_torch: bool = False,
        ts: tuple[np.ndarray, np.float32] | None = None,
    ) -> None:
        self.codes = codes
        self.scale = scale
        self.zero_point = zero_point
        self.shape = tuple(int(s) for s in shape)
        self.scheme = scheme
        self.format: Format = scheme.element_format
        self.granularity: Granularity = scheme.granularity  # type: ignore[assignment]
        self._dq = dq
        self._source_torch = source_torch
        if scheme.tensor_scale and ts is None:
            raise LowbitError(f"a {scheme.label} tensor needs its group scales and tensor scale")
        self._ts = ts

    @property
    def tensor_scale(self) -> np.float32 | None:
        """The float32 tensor scale of a two-level scheme (encode direction), else None."""
        return None if self._ts is None else self._ts[1]

    @property
    def group_scale(self) -> np.ndarray:
        """The scales as stored: a two-level scheme's group scales (before dividing by the
        tensor scale); ``scale`` otherwise."""
        return self.scale if self._ts is None else self._ts[0]

    # ---- sizes -----------------------------------------------------------------------

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def layout(self) -> Layout:
        return make_layout(self.shape, self.scheme)

    @property
    def nbytes(self) -> int:
        """Bytes as stored: packed codes + scales (+ zero points, + NF4 double-quant state)."""
        n = self.codes.nbytes
        if self._dq is not None:
            c, a2, _ = self._dq
            n += c.nbytes + a2.size * 4 + 4
        else:
            n += self.scale.size * self.scheme.scale_bits // 8
        if self._ts is not None:
            n += 4
        if self.zero_point is not None:
            n += packed_nbytes(self.zero_point.size, self.format.bits)
        return int(n)

    @property
    def bits_per_value(self) -> float:
        """``nbytes * 8 / numel``: every stored bit counted (int4 g128 fp16 = 4.125)."""
        return self.nbytes * 8 / self.numel

    # ---- views -----------------------------------------------------------------------

    def unpack(self) -> np.ndarray:
        """One integer per element, in ``shape``: the signed value for integer formats
        (int8/int16), the bit pattern (code) for every other format."""
        codes = unpack(self.codes, self.format.bits, self.numel).reshape(self.shape)
        if self.format.kind == "int":
            return self.format.to_signed(codes)  # type: ignore[attr-defined]
        return codes

    def dequantize(self, dtype: Any = np.float32) -> Any:
        """The values ``(value(code) - zp) * scale`` in ``dtype``.

        float32 (default) rounds each product once to float32; ``float64`` is exact.
        Returns a torch tensor when the input was torch (``dtype`` may be a torch dtype).
        """
        torch_dtype = None
        if _is_torch_dtype(dtype):
            torch_dtype = dtype
            dtype = np.float64 if str(dtype) == "torch.float64" else np.float32
        np_dtype = np.dtype(dtype)
        if np_dtype.kind != "f":
            raise LowbitError(f"dequantize needs a float dtype, got {np_dtype}")
        work = np.float64 if np_dtype == np.float64 else np.float32
        out = decode_tensor(self.codes, self.scale, self.zero_point, self.shape, self.scheme, work)
        if self.zero_point is not None:  # an asymmetric overshoot past ±max (±3.4e38 gave -inf)
            _saturate(out, self.scale, self.zero_point)
        if np_dtype != work:
            out = out.astype(np_dtype)
        if self._source_torch or torch_dtype is not None:
            import torch

            t = torch.from_numpy(out)
            return t.to(torch_dtype) if torch_dtype is not None else t
        return out

    # ---- storage ----------------------------------------------------------------------

    def to_arrays(self, prefix: str = "") -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """Flat named numpy arrays (safetensors-ready) and JSON-able metadata.

        Arrays: ``codes`` (uint8 packed); ``scale`` stored in its format (float32,
        float16, bfloat16 as uint16 bit patterns, E8M0 as uint8 codes); ``zero_point``
        (uint8, packed at the element width, two's complement); for NF4 double
        quantization ``scale_codes`` (uint8), ``scale_absmax`` (float32, one per 256
        scales) and ``scale_offset`` (float32, one) instead of ``scale``. Names carry
        ``prefix``. Metadata: ``version``, ``shape``, ``scale_shape``, ``scheme``.
        """
        arrays: dict[str, np.ndarray] = {prefix + "codes": self.codes}
        if self._dq is not None:
            c, a2, off = self._dq
            arrays[prefix + "scale_codes"] = c
            arrays[prefix + "scale_absmax"] = a2
            arrays[prefix + "scale_offset"] = np.array([off], dtype=np.float32)
        else:
            arrays[prefix + "scale"] = _store_scale(self.group_scale, self.scheme)
        if self._ts is not None:
            arrays[prefix + "tensor_scale"] = np.array([self._ts[1]], dtype=np.float32)
        if self.zero_point is not None:
            bits = self.format.bits
            zp = self.zero_point.astype(np.int64) & ((1 << bits) - 1)
            arrays[prefix + "zero_point"] = pack(zp.astype(np.uint32), bits)
        meta = {
            "version": FORMAT_VERSION,
            "shape": list(self.shape),
            "scale_shape": list(self.scale.shape),
            "scheme": self.scheme.to_dict(),
        }
        if self._ts is not None:
            meta["tensor_scale"] = TENSOR_SCALE_DIRECTION
        return arrays, meta

    @classmethod
    def from_arrays(
        cls, arrays: dict[str, np.ndarray], meta: dict[str, Any], prefix: str = ""
    ) -> QuantizedTensor:
        """Rebuild a QuantizedTensor saved by :meth:`to_arrays` (bit for bit).

        Raises:
            LowbitError: unknown version, missing arrays, or shapes/dtypes that do not
                match the metadata.
        """
        if isinstance(meta, str):
            meta = _json.loads(meta, "quantized tensor metadata")
        version = meta.get("version")
        if version != FORMAT_VERSION:
            raise LowbitError(
                f"quantized tensor version {version!r} is not supported (expected {FORMAT_VERSION})"
            )
        try:
            shape = tuple(int(s) for s in meta["shape"])
            scheme = Scheme.from_dict(meta["scheme"])
        except KeyError as exc:
            raise LowbitError(f"quantized tensor metadata lacks {exc}") from None
        layout = make_layout(shape, scheme)
        fmt = scheme.element_format
        numel = math.prod(shape)

        def get(name: str, dtype: Any) -> np.ndarray:
            key = prefix + name
            if key not in arrays:
                raise LowbitError(f"missing array {key!r} for a quantized tensor")
            a = np.asarray(arrays[key])
            if a.dtype != np.dtype(dtype):
                raise LowbitError(f"array {key!r} has dtype {a.dtype}, expected {np.dtype(dtype)}")
            return a

        codes = get("codes", np.uint8).reshape(-1)
        need = packed_nbytes(numel, fmt.bits)
        if codes.size != need:
            raise LowbitError(
                f"array {prefix}codes has {codes.size} bytes but shape {shape} at "
                f"{fmt.bits} bits needs {need}: shapes do not match"
            )
        sshape = layout.scale_shape
        nscale = math.prod(sshape)
        dq = None
        if scheme.double_quant:
            c = get("scale_codes", np.uint8).reshape(-1)
            a2 = get("scale_absmax", np.float32).reshape(-1)
            off = get("scale_offset", np.float32).reshape(-1)
            if c.size != nscale or a2.size != -(-nscale // DQ_BLOCK) or off.size != 1:
                raise LowbitError(
                    f"double-quantized scales do not match shape {shape}: expected "
                    f"{nscale} codes and {-(-nscale // DQ_BLOCK)} second-level scales"
                )
            dq = (c, a2, np.float32(off[0]))
            scale = double_dequantize(c, a2, dq[2]).reshape(sshape)
        else:
            stored = arrays.get(prefix + "scale")
            if stored is None:
                raise LowbitError(f"missing array {prefix + 'scale'!r} for a quantized tensor")
            scale = _load_scale(np.asarray(stored), scheme, prefix)
            if scale.size != nscale:
                raise LowbitError(
                    f"array {prefix}scale has {scale.size} values but shape {shape} with "
                    f"{scheme.describe()} needs {nscale} (shape {sshape}): shapes do not match"
                )
            scale = scale.reshape(sshape)
        ts = None
        if scheme.tensor_scale:
            direction = meta.get("tensor_scale")
            if direction != TENSOR_SCALE_DIRECTION:
                raise LowbitError(
                    f"quantized tensor {prefix or '<tensor>'}: tensor_scale direction "
                    f"{direction!r} is not {TENSOR_SCALE_DIRECTION!r} (the only one lowbit writes)"
                )
            g = get("tensor_scale", np.float32).reshape(-1)
            if g.size != 1 or not (np.isfinite(g[0]) and g[0] > 0):
                raise LowbitError(f"array {prefix}tensor_scale must be one positive finite float32")
            ts = (scale, np.float32(g[0]))
            scale = (scale / ts[1]).astype(np.float32)
        zero_point = None
        if not scheme.symmetric:
            zp_packed = get("zero_point", np.uint8)
            if zp_packed.size != packed_nbytes(nscale, fmt.bits):
                raise LowbitError(f"array {prefix}zero_point does not match shape {sshape}")
            raw = unpack(zp_packed, fmt.bits, nscale)
            zero_point = fmt.to_signed(raw).astype(np.int32).reshape(sshape)  # type: ignore[attr-defined]
        return cls(
            codes=codes, scale=scale, zero_point=zero_point, shape=shape, scheme=scheme, dq=dq,
            ts=ts,
        )  # fmt: skip

    def __repr__(self) -> str:
        return (
            f"QuantizedTensor(shape={self.shape}, scheme={self.scheme.describe()!r}, "
            f"bits_per_value={self.bits_per_value:.4g}, nbytes={self.nbytes})"
        )


FORMAT_VERSION = 1


#: How a two-level scheme's tensor scale is applied, written into every file that stores one:
#: compressed-tensors' direction (the encode factor ``448 * 6 / amax``), not ModelOpt's or
#: torchao's reciprocal.
TENSOR_SCALE_DIRECTION = "value = code * scale / tensor_scale"


def _is_torch_dtype(dtype: Any) -> bool:
    return type(dtype).__module__.startswith("torch")


def _saturate(out: np.ndarray, scale: np.ndarray, zp: np.ndarray) -> None:
    """Clamp values past ±max to it when every scale and zero point is finite (then no decoded
    value can be infinite; ``(q - z) * s`` for a range near ±FLT_MAX rounds past it)."""
    if np.isfinite(scale).all() and np.isfinite(zp).all():
        big = np.finfo(out.dtype).max
        np.clip(out, -big, big, out=out)
