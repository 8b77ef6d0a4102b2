"""GPTQ: quantize a linear layer's weights to minimise the error of its *outputs*, for any scheme.

Frantar et al. 2023, "GPTQ: Accurate Post-Training Quantization for Generative Pre-trained
Transformers" (ICLR), Algorithm 1. For a weight ``W [out, in]`` and its inputs ``X [n, in]``,
GPTQ minimises ``||X W^T - X Ŵ^T||²`` column by column: each column is rounded, and its error,
weighted by the inverse Hessian ``H^-1`` of that objective (``H = 2 X^T X / n``), is pushed
onto the columns not yet rounded (optimal brain quantization). The implementation follows the
paper and its reference code:

* ``H`` is dampened by ``damp * mean(diag H)`` on the diagonal; *dead* inputs (``H_jj = 0``:
  never non-zero in the calibration data) get ``H_jj = 1`` and their weights are set to 0
  before rounding (their value cannot matter to the outputs the Hessian saw);
* the update uses the upper Cholesky factor ``U`` of ``H^-1`` (``H^-1 = U^T U``): column ``j``'s
  error ``(w_j - q_j) / U_jj`` times row ``j`` of ``U``;
* updates are applied lazily in blocks of ``block_size`` columns (within a block at once, to
  the rest of the matrix by one matrix product per block): the same arithmetic, reordered;
* act-order ``static`` processes columns in order of decreasing ``H_jj`` but computes every
  group's scale up front from the original weights, so the result is stored in the ordinary
  group layout and needs no ``g_idx``; without act-order (``none``) a group's scale is computed
  when the loop reaches its first column, from the group's weights as updated by every column
  before it (the paper's rule; the reference code reads the values of the block's start when
  groups are smaller than blocks).

The quantizer inside the loop is lowbit's own: scales come from ``lowbit.quant._engine``'s
scale choice (absmax, MSE, percentile ...; rounded to the scheme's scale format; MX shared
exponents; asymmetric zero points) and each column is encoded with the element codec
``lowbit.quant._elements.encode_chunk``, so with the same scales the codes are exactly those of
:func:`lowbit.quantize` and the result is an ordinary :class:`~lowbit.quant.quantized_tensor.QuantizedTensor`
every writer and ``dequantize`` handle unchanged. Supported layouts: per tensor, per output
channel (``axis=0``) and groups or MX blocks along the input axis (``axis=-1``, lowbit's
``int4:g128``), for every element format (int sym/asym, FP8/FP6/FP4, NF4, MX, binary/ternary).

Cost per layer: ``O(in³)`` for the inverse and ``O(out · in²)`` for the updates, in float64.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

import numpy as np

from lowbit.enums import Rounding, as_rounding
from lowbit.errors import LowbitError
from lowbit.methods._ggml_gptq import GgmlQuantized, GgmlTarget, _GgmlQuantizer
from lowbit.methods._gptq_quantizer import _Quantizer
from lowbit.methods._hessian_factor import _BLOCKED_FROM, _Factor, _factor
from lowbit.methods._iq_gptq import solve_lattice
from lowbit.methods._mlx_gptq import MLXTarget, _MLXQuantizer
from lowbit.plans.rules import parse_action
from lowbit.quant._choose import own_tensor_scale
from lowbit.quant.scheme import Granularity, ScaleMethod, Scheme

__all__ = ["GPTQ", "ActOrder", "Sequential", "gptq_quantize", "layer_error"]

#: grids GPTQ rounds onto besides lowbit's schemes: llama.cpp's block types and MLX's affine grid
_GRIDS = (GgmlTarget, MLXTarget)


class ActOrder(str, Enum):
    """The order GPTQ rounds columns in.

    ``none``: the input order. ``static``: decreasing ``diag(H)`` (the inputs with the most
    energy first, while most columns are still free to absorb their error), with every
    group's scale fixed up front on the original weights so the stored layout is unchanged.
    """

    NONE = "none"
    STATIC = "static"


class Sequential(str, Enum):
    """What a model's layers are calibrated on (GPTQ's sequential mode, block by block).

    ``layers`` (default): inside a block, each group of layers that reads one input (q/k/v,
    o, gate/up, down) sees the outputs of the groups before it already quantized, as
    AutoGPTQ's and GPTQModel's ``true_sequential``; in pre-norm residual blocks (llama) one
    forward pass per block computes the statistics and the next block's inputs, in other
    blocks (BERT's post-norm encoder layers) one pass per group, each stopped at the group's
    input, and one for the outputs. ``blocks``: every layer of a block sees the block's float
    weights, then the quantized block is run again for the next block's inputs (two passes per
    block; llm-compressor's order).
    """

    LAYERS = "layers"
    BLOCKS = "blocks"


def _act_order(value: Any) -> ActOrder:
    if isinstance(value, ActOrder):
        return value
    try:
        return ActOrder(str(value).strip().lower())
    except ValueError:
        allowed = ", ".join(m.value for m in ActOrder)
        raise LowbitError(f"unknown act_order {value!r}; allowed: {allowed}") from None


@dataclass(frozen=True, kw_only=True)
class GPTQ:
    """GPTQ's settings: a method of quantizing a layer given its input statistics.

    Args:
        damp: added to the Hessian's diagonal as a fraction of its mean (0.01 = the paper's
            1%); larger values are more stable and closer to round-to-nearest.
        block_size: columns per lazy batch (128 as in the paper; changes speed, not results
            beyond float64 rounding).
        act_order: ``static`` (default; decreasing ``diag(H)``, static groups) or ``none``.
        sequential: ``layers`` (default) or ``blocks``: see :class:`Sequential` (a whole-model
            setting; :meth:`quantize` of one layer ignores it).

    Raises:
        LowbitError: a negative or non-finite ``damp``, ``block_size`` < 1, an unknown
            ``act_order`` or ``sequential``.
    """

    damp: float = 0.01
    block_size: int = 128
    act_order: ActOrder = ActOrder.STATIC
    sequential: Sequential = Sequential.LAYERS

    def __post_init__(self) -> None:
        damp = float(self.damp)
        if not math.isfinite(damp) or damp < 0:
            raise LowbitError(f"damp must be a finite number >= 0, got {self.damp!r}")
        if isinstance(self.block_size, bool) or not isinstance(self.block_size, int):
            raise LowbitError(f"block_size must be a positive integer, got {self.block_size!r}")
        if self.block_size < 1:
            raise LowbitError(f"block_size must be >= 1, got {self.block_size}")
        object.__setattr__(self, "damp", damp)
        object.__setattr__(self, "act_order", _act_order(self.act_order))
        try:
            seq = Sequential(str(getattr(self.sequential, "value", self.sequential)).lower())
        except ValueError:
            allowed = ", ".join(m.value for m in Sequential)
            raise LowbitError(
                f"unknown sequential {self.sequential!r}; allowed: {allowed}"
            ) from None
        object.__setattr__(self, "sequential", seq)

    @property
    def name(self) -> str:
        """``gptq``: the method's name in tables and manifests."""
        return "gptq"

    def describe(self) -> str:
        """A short label, e.g. ``gptq (damp 0.01, act-order static, layers-sequential)``."""
        return (
            f"gptq (damp {self.damp:g}, act-order {self.act_order.value}, "
            f"{self.sequential.value}-sequential)"
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-able settings with the method's name."""
        return {
            "method": "gptq",
            "damp": self.damp,
            "block_size": self.block_size,
            "act_order": self.act_order.value,
            "sequential": self.sequential.value,
        }

    def quantize(self, W: Any, H: Any, scheme: Scheme | str) -> Any:
        """:func:`gptq_quantize` with these settings."""
        return self.quantize_shared({"weight": W}, H, {"weight": scheme})["weight"]

    def quantize_shared(
        self, weights: Mapping[str, Any], H: Any, schemes: Mapping[str, Scheme | str]
    ) -> dict[str, Any]:
        """Quantize several weights that read the same inputs (q/k/v, gate/up) with one
        Hessian, factored once.

        Args:
            weights: name -> weight ``[out, in]`` (every one with the same ``in``).
            H: their inputs' Hessian ``[in, in]``.
            schemes: name -> scheme, for every name of ``weights``.

        Returns:
            name -> :class:`~lowbit.quant.quantized_tensor.QuantizedTensor`.

        Raises:
            LowbitError: as :func:`gptq_quantize`; a name without a scheme.
        """
        checked = {}
        for name, W in weights.items():
            if name not in schemes:
                raise LowbitError(f"no scheme for weight {name!r}")
            scheme = _as_scheme(schemes[name])
            try:
                checked[name] = (*_check(W, H, scheme), scheme)
            except LowbitError as exc:
                raise LowbitError(f"{name}: {exc}") from None
        if not checked:
            return {}
        H64 = next(iter(checked.values()))[1]
        for name, (W64, H_, scheme) in checked.items():  # diag(H) as importance: undamped
            if isinstance(scheme, _GRIDS):
                checked[name] = (W64, H_, scheme.resolved(H64))
        factor = _factor(H64, self.damp, self.act_order is ActOrder.STATIC)
        out = {}
        for names in _stacks(checked):
            try:
                first = checked[names[0]][2]
                if isinstance(first, GgmlTarget) and first.lattice:  # vector codes: own walk
                    static = self.act_order is ActOrder.STATIC
                    W = np.concatenate([checked[n][0] for n in names])
                    data = solve_lattice(W, H64, first, self.damp, static)
                    r = 0
                    for n in names:
                        rows = checked[n][0].shape[0]
                        shape = (rows, W.shape[1])
                        out[n] = GgmlQuantized(first.qtype, data[r : r + rows], shape)
                        r += rows
                    continue
                if len(names) == 1:
                    out[names[0]] = _solve(checked[names[0]][0], factor, checked[names[0]][2], self)
                    continue
                # rows are independent: one loop over the stacked rows, then split
                W = np.concatenate([checked[n][0] for n in names])
                codes, quant = _solve_codes(W, factor, checked[names[0]][2], self)
                r = 0
                for n in names:
                    rows = checked[n][0].shape[0]
                    part = quant.rows(r, r + rows)
                    out[n] = part.result(codes[r : r + rows], (rows, W.shape[1]))
                    r += rows
            except LowbitError as exc:
                raise LowbitError(f"{', '.join(names)}: {exc}") from None
        return {n: out[n] for n in checked}


def _stacks(checked: Mapping[str, tuple[Any, Any, Scheme]]) -> list[list[str]]:
    """Names whose weights one loop can quantize together: the same scheme with scales per row
    (channels, groups, blocks; a per-tensor scale spans rows, so it stays alone)."""
    stacks: dict[Any, list[str]] = {}
    for name, (_, _, scheme) in checked.items():
        if isinstance(scheme, _GRIDS):  # llama.cpp's block types: grids per row
            stacks.setdefault(scheme.key(), []).append(name)
            continue
        per_row = scheme.granularity in (Granularity.CHANNEL, Granularity.GROUP, Granularity.BLOCK)
        key = scheme if per_row else ("alone", name)
        stacks.setdefault(key, []).append(name)
    return list(stacks.values())


# ---- checks and the inverse Hessian ------------------------------------------------------


def _as_scheme(scheme: Scheme | GgmlTarget | str) -> Any:
    if isinstance(scheme, (Scheme, *_GRIDS)):
        return scheme
    if isinstance(scheme, str):
        parsed = parse_action(scheme)
        if isinstance(parsed, Scheme):
            return parsed
        raise LowbitError(f"scheme {scheme!r} is not a quantization scheme (a cast or keep)")
    raise LowbitError(f"scheme must be a Scheme or a scheme string, got {type(scheme).__name__}")


def _check(W: Any, H: Any, scheme: Any) -> tuple[np.ndarray, np.ndarray]:
    """A float64 copy of W (the solve writes into it) and H as float64 (only read: no copy
    when it is float64 already, 1.6 GB saved at Llama-3.1-8B's down_proj), after checking
    shapes, values and the scheme's layout."""

    W64 = np.array(_numpy(W), dtype=np.float64, copy=True)
    H64 = np.asarray(_numpy(H), dtype=np.float64)
    if W64.ndim != 2 or 0 in W64.shape:
        raise LowbitError(f"GPTQ quantizes 2-D weights [out, in], got shape {W64.shape}")
    n = W64.shape[1]
    if H64.shape != (n, n):
        raise LowbitError(
            f"the Hessian must be [in, in] = [{n}, {n}] for weights of shape {W64.shape}, "
            f"got {H64.shape}"
        )
    if not np.isfinite(W64).all():
        raise LowbitError("GPTQ needs finite weights (the weights hold NaN or inf)")
    if not np.isfinite(H64).all():
        raise LowbitError("the Hessian holds NaN or inf (were the calibration inputs finite?)")
    if np.any(np.diag(H64) < 0):
        raise LowbitError("the Hessian has negative diagonal entries: it is not X^T X")
    if isinstance(scheme, _GRIDS):
        scheme.check(n)
        return W64, H64
    g = scheme.granularity
    axis = scheme.axis
    if g is Granularity.CHANNEL and axis % 2 != 0:  # type: ignore[operator]
        raise LowbitError(
            "GPTQ takes per-channel scales along the output axis (axis=0) of a [out, in] weight; "
            f"got axis={axis}"
        )
    if g in (Granularity.GROUP, Granularity.BLOCK) and axis % 2 != 1:  # type: ignore[operator]
        raise LowbitError(
            "GPTQ takes groups along the input axis (axis=-1) of a [out, in] weight, the axis "
            f"it walks; got axis={axis}"
        )
    if scheme.scale_method is ScaleMethod.GGML and (
        g is not Granularity.GROUP or scheme.group_size != 32 or n % 32
    ):
        raise LowbitError(
            f"{scheme.label} (llama.cpp's block type) takes rows that are a multiple of 32 "
            f"values in groups of 32; got {n} columns"
        )
    if as_rounding(scheme.rounding) is Rounding.STOCHASTIC:
        raise LowbitError("GPTQ rounds deterministically: use a rounding other than stochastic")
    if g is Granularity.TILE:
        raise LowbitError(
            f"GPTQ walks the input axis in groups, not 2-D tiles ({scheme.label}): use "
            "--method rtn, or groups (fp8_e4m3:g128)"
        )
    return W64, H64


def _numpy(x: Any) -> Any:
    if type(x).__module__.startswith("torch") and hasattr(x, "detach"):
        return x.detach().cpu().double().numpy()
    return x


# ---- GPTQ --------------------------------------------------------------------------------


def gptq_quantize(
    W: Any,
    H: Any,
    scheme: Scheme | str,
    *,
    damp: float = 0.01,
    block_size: int = 128,
    act_order: ActOrder | str = ActOrder.STATIC,
) -> Any:
    """Quantize a weight with GPTQ (Frantar et al. 2023, Algorithm 1) to a lowbit scheme.

    Args:
        W: the weight ``[out, in]`` (numpy or torch; any float dtype; not modified).
        H: the Hessian of the layer's output error, ``2 X^T X / n`` for inputs ``X [n, in]``
            (see :class:`lowbit.calibration.hessians.HessianCollector`), ``[in, in]``.
        scheme: a :class:`~lowbit.quant.scheme.Scheme` or scheme string (``int4:g128``):
            per tensor, per output channel, or groups/MX blocks along the input axis.
        damp: diagonal dampening as a fraction of ``mean(diag H)``.
        block_size: columns per lazy batch.
        act_order: ``static`` or ``none`` (see :class:`ActOrder`).

    Returns:
        A :class:`~lowbit.quant.quantized_tensor.QuantizedTensor` of ``W``'s shape in ``scheme``'s
        ordinary layout.

    Raises:
        LowbitError: shapes that do not match, non-finite values, a layout GPTQ cannot walk
            (channels along the input axis, groups along the output axis), stochastic
            rounding, or a Hessian that stays singular after dampening.
    """
    cfg = GPTQ(damp=damp, block_size=block_size, act_order=act_order)
    return cfg.quantize_shared({"weight": W}, H, {"weight": scheme})["weight"]


def _solve(W: np.ndarray, f: _Factor, scheme: Scheme, cfg: GPTQ) -> Any:
    """GPTQ of ``W`` (float64, modified) with a factored Hessian: a QuantizedTensor."""
    codes, quant = _solve_codes(W, f, scheme, cfg)
    return quant.result(codes, W.shape)


def _solve_codes(W: np.ndarray, f: _Factor, scheme: Scheme, cfg: GPTQ) -> tuple[Any, Any]:
    """GPTQ's loop over the columns of ``W`` (float64, modified): codes ``[out, in]`` and the
    quantizer holding the scales."""
    rows, cols = W.shape
    quant: Any
    if isinstance(scheme, _GRIDS):  # llama.cpp's block types: a grid per (super-)block
        W[:, f.dead] = 0.0
        quant = (_GgmlQuantizer if isinstance(scheme, GgmlTarget) else _MLXQuantizer)(scheme, W)
        grouped = True
    else:
        g = own_tensor_scale(W.astype(np.float32), scheme) if scheme.tensor_scale else None
        quant = _Quantizer(scheme, (rows, cols), g)
        W[:, f.dead] = 0.0
        grouped = scheme.granularity in (Granularity.GROUP, Granularity.BLOCK)
    static = cfg.act_order is ActOrder.STATIC
    if not grouped:
        quant.fit_whole(W)
    elif static:
        for k in range(quant.n_groups):
            a, b = quant.span(k)
            quant.fit_group(k, W[:, a:b])
    perm, U = f.perm, f.U
    Wt = np.ascontiguousarray(W.T[perm])  # row j = the j-th column processed
    codes = np.empty((cols, rows), dtype=quant.fmt.code_dtype)  # transposed, original order
    for i1 in range(0, cols, cfg.block_size):
        i2 = min(i1 + cfg.block_size, cols)
        W1 = Wt[i1:i2].copy()
        E1 = np.empty_like(W1)
        U1 = U[i1:i2, i1:i2]
        for i in range(i2 - i1):
            j = i1 + i
            col = int(perm[j])
            k = col // quant.group
            if grouped and not static and col % quant.group == 0:
                quant.fit_group(k, _current(Wt, W1, E1, U, i1, i2, i, quant.span(k)[1]).T)
            c, q = quant.round(W1[i], k, col)
            codes[col] = c
            err = (W1[i] - q) / U1[i, i]
            if i + 1 < i2 - i1:
                W1[i + 1 :] -= np.multiply.outer(U1[i, i + 1 :], err)
            E1[i] = err
        # from _BLOCKED_FROM columns by row chunks of _UPDATE_VALUES: the product's temporary
        # was the rest of the weight (0.94 GB at Llama-3.1-8B's stacked gate/up)
        step = cols if cols < _BLOCKED_FROM else max(64, _UPDATE_VALUES // rows)
        for c in range(i2, cols, step):
            Wt[c : c + step] -= U[i1:i2, c : c + step].T @ E1
    return np.ascontiguousarray(codes.T), quant


#: values per chunk of the lazy batch update from _BLOCKED_FROM columns (64 MB in float64)
_UPDATE_VALUES = 1 << 23


def _current(
    Wt: np.ndarray, W1: np.ndarray, E1: np.ndarray, U: np.ndarray, i1: int, i2: int, i: int, b: int
) -> np.ndarray:
    """Rows ``i1 + i .. b`` of the transposed weight as every column before ``i1 + i`` has
    updated them: in the block from ``W1``, beyond it with the block's pending updates."""
    j = i1 + i
    inside = W1[i : min(b, i2) - i1]
    if b <= i2:
        return inside
    pending = Wt[i2:b] - U[i1:j, i2:b].T @ E1[:i]
    return np.concatenate([inside, pending])


def layer_error(W: Any, Wq: Any, H: Any) -> float:
    """The output error GPTQ minimises: ``tr((W - Ŵ) H (W - Ŵ)^T)``.

    With ``H = 2 X^T X / n`` this is ``2/n · ||X W^T - X Ŵ^T||²_F``: twice the mean over the
    calibration inputs of the squared error of the layer's outputs.

    Args:
        W: the original weight ``[out, in]``.
        Wq: the quantized (dequantized) weight, same shape.
        H: the Hessian ``[in, in]``.
    """
    D = np.asarray(_numpy(W), dtype=np.float64) - np.asarray(_numpy(Wq), dtype=np.float64)
    H64 = np.asarray(_numpy(H), dtype=np.float64)
    if D.ndim != 2 or H64.shape != (D.shape[1], D.shape[1]):
        raise LowbitError(f"shapes do not match: weights {D.shape}, Hessian {H64.shape}")
    return float(np.einsum("ij,ij->", D @ H64, D))
