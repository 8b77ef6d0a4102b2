"""GPTQ's quantizer: a layer's scales per group (or channel, tensor) and lowbit's element codec,
one column at a time (``lowbit.methods.gptq``'s loop calls it)."""

from __future__ import annotations

from typing import Any

import numpy as np

from lowbit.codecs.packing import _pack_unchecked
from lowbit.enums import as_rounding
from lowbit.errors import LowbitError
from lowbit.ggml.legacy import _F16_MAX, _inverse, _round_half_away
from lowbit.quant._choose import effective_scale, value_table
from lowbit.quant._elements import encode_chunk
from lowbit.quant._engine import _scales_for
from lowbit.quant.layout import make_layout
from lowbit.quant.nf4 import double_dequantize, double_quantize
from lowbit.quant.quantized_tensor import QuantizedTensor
from lowbit.quant.scheme import Granularity, ScaleMethod, Scheme

__all__: list[str] = []


class _Quantizer:
    """Scales per group (or channel/tensor) and lowbit's element codec, column by column."""

    def __init__(self, scheme: Scheme, shape: tuple[int, int], tensor_scale: Any = None) -> None:

        self.scheme = scheme
        # NVFP4: the tensor scale, fixed from the original weights before the walk; ``block``
        # keeps the stored E4M3 group scales, ``scale`` what the codes multiply (block / g)
        self.g = tensor_scale
        self.fmt = scheme.element_format
        self.mode = as_rounding(scheme.rounding)
        self.table = value_table(self.fmt, np.float64)
        rows, cols = shape
        g = scheme.granularity
        self.group = int(scheme.group_size) if g in (Granularity.GROUP, Granularity.BLOCK) else cols
        self.n_groups = -(-cols // self.group)
        self.cols = cols
        self.scale = np.ones((rows, self.n_groups), dtype=np.float32)
        self.zero = None if scheme.symmetric else np.zeros((rows, self.n_groups), dtype=np.int32)
        self.thresh: np.ndarray | None = None
        # llama.cpp's Q4_0/Q5_0/Q8_0 rule: codes from the unrounded float32 block scale d
        self.ggml = scheme.scale_method is ScaleMethod.GGML
        self.d_raw = np.zeros((rows, self.n_groups), dtype=np.float32) if self.ggml else None
        self.block = (
            None if tensor_scale is None else np.ones((rows, self.n_groups), dtype=np.float32)
        )

    def span(self, k: int) -> tuple[int, int]:
        """Columns of group ``k``."""
        return k * self.group, min((k + 1) * self.group, self.cols)

    def fit_group(self, k: int, values: np.ndarray) -> None:
        """Choose group ``k``'s scales from its current values ``[out, columns]``."""
        if self.ggml:
            self._fit_ggml(k, values)
            return
        s, z, t = self._params(np.ascontiguousarray(values).reshape(values.shape[0], 1, -1, 1))
        if self.block is not None:
            self.block[:, k] = s.reshape(-1)
            s = effective_scale(s, self.g)
        self.scale[:, k] = s.reshape(-1)
        if self.zero is not None:
            assert z is not None
            self.zero[:, k] = z.reshape(-1)
        if t is not None:
            if self.thresh is None:
                self.thresh = np.zeros(self.scale.shape, dtype=np.float64)
            self.thresh[:, k] = t.reshape(-1)

    def fit_whole(self, W: np.ndarray) -> None:
        """Per-tensor or per-output-channel scales from the whole weight."""
        rows = W.shape[0]
        if self.scheme.granularity is Granularity.TENSOR:
            V = np.ascontiguousarray(W).reshape(1, 1, -1, 1)
            axes: tuple[int, ...] = (2,)
        else:  # channel, axis 0
            V = np.ascontiguousarray(W).reshape(1, rows, 1, -1)
            axes = (0, 2, 3)
        s, z, t = self._params(V, axes)
        self.scale[:, 0] = np.broadcast_to(s.reshape(-1), (rows,))
        if self.zero is not None:
            assert z is not None
            self.zero[:, 0] = np.broadcast_to(z.reshape(-1), (rows,))
        if t is not None:
            self.thresh = np.broadcast_to(t.reshape(-1), (rows,)).reshape(rows, 1).astype(float)

    def _params(
        self, V: np.ndarray, axes: tuple[int, ...] = (2,)
    ) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:

        s32, zp, thresh, _, _ = _scales_for(V, axes, self.scheme, self.fmt, "raise", self.g)
        return s32, zp, thresh

    def _fit_ggml(self, k: int, values: np.ndarray) -> None:
        """llama.cpp's block scale (``lowbit.ggml.legacy``): ``d = max|x| / 127`` (Q8_0) or
        ``m / -2^(bits-1)`` with ``m`` the first value of largest magnitude (Q4_0, Q5_0), in
        float32; stored rounded to float16."""
        x = np.asarray(values, dtype=np.float32)
        if self.fmt.bits == 8:
            d = np.abs(x).max(axis=1) / np.float32(127)
        else:
            m = np.take_along_axis(x, np.abs(x).argmax(axis=1)[:, None], axis=1)[:, 0]
            d = m / -np.float32(1 << (self.fmt.bits - 1))
        d = d.astype(np.float32)
        if np.any(np.abs(d) > _F16_MAX):
            raise LowbitError(f"{self.scheme.label}: a block scale overflows float16")
        self.d_raw[:, k] = d  # type: ignore[index]
        self.scale[:, k] = d.astype(np.float16).astype(np.float32)

    def _round_ggml(self, w: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """llama.cpp's rounding of one column with the unrounded scale: Q8_0
        ``round_half_away(x / d)``, Q4_0/Q5_0 ``trunc(x / d + 2^(bits-1) + 0.5)``; clipped to the
        codes the block type stores (GPTQ's updates can carry a value past the block's
        original largest one)."""
        bits = self.fmt.bits
        x = w.astype(np.float32) * _inverse(self.d_raw[:, k])  # type: ignore[index]
        if bits == 8:
            q = np.clip(_round_half_away(x), -128, 127)
        else:
            half = np.float32(1 << (bits - 1))
            u = np.trunc((x + (half + np.float32(0.5))).astype(np.float32))
            q = np.clip(u, 0, (1 << bits) - 1) - half
        q = q.astype(np.int16)
        codes = (q & np.int16((1 << bits) - 1)).astype(self.fmt.code_dtype)
        return codes, q.astype(np.float64) * self.scale[:, k].astype(np.float64)

    def round(self, w: np.ndarray, k: int, col: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """(codes, dequantized float64 values) of one column ``w [out]`` in group ``k`` (the
        column's index ``col`` does not matter: one scale per group)."""
        if self.ggml:
            return self._round_ggml(w, k)

        S = self.scale[:, k : k + 1]
        Z = None if self.zero is None else self.zero[:, k : k + 1].astype(np.float64)
        T = None if self.thresh is None else self.thresh[:, k : k + 1]
        codes = encode_chunk(w.reshape(-1, 1), S, Z, T, self.fmt, self.scheme, self.mode, None)
        codes = codes.reshape(-1)
        q = np.take(self.table, codes)
        if Z is not None:
            q = q - Z[:, 0]
        return codes, q * S[:, 0].astype(np.float64)

    def rows(self, a: int, b: int) -> _Quantizer:
        """The same quantizer for rows ``a..b`` only (scales per row: channel, group, block)."""
        part = object.__new__(_Quantizer)
        part.__dict__.update(self.__dict__)
        part.scale = self.scale[a:b]
        part.zero = None if self.zero is None else self.zero[a:b]
        part.thresh = None if self.thresh is None else self.thresh[a:b]
        part.d_raw = None if self.d_raw is None else self.d_raw[a:b]
        part.block = None if self.block is None else self.block[a:b]
        return part

    def result(self, codes: np.ndarray, shape: tuple[int, int]) -> Any:
        """The :class:`QuantizedTensor` of ``codes [out, in]`` with these scales."""

        sshape = make_layout(shape, self.scheme).scale_shape
        scale, zero = self.scale, self.zero
        if self.scheme.granularity is Granularity.TENSOR:  # one scale, kept once per row here
            scale, zero = scale[:1, :1], None if zero is None else zero[:1, :1]
        scale = np.ascontiguousarray(scale).reshape(sshape)
        zero = None if zero is None else np.ascontiguousarray(zero).reshape(sshape)
        dq = None
        if self.scheme.double_quant:
            dq = double_quantize(scale)
            scale = double_dequantize(*dq).reshape(sshape)
        ts = None
        if self.block is not None:
            ts = (np.ascontiguousarray(self.block).reshape(sshape), np.float32(self.g))
        return QuantizedTensor(
            codes=_pack_unchecked(codes.reshape(-1), self.fmt.bits),
            scale=scale,
            zero_point=zero,
            shape=shape,
            scheme=self.scheme,
            dq=dq,
            ts=ts,
        )
