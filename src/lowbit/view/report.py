"""The data of ``lowbit report``: where the bits of a quantized checkpoint went and what they
cost, tensor by tensor.

:func:`build_report` reads a quantized checkpoint (a lowbit folder, a compressed-tensors folder
or a GGUF file) and, when the source model is at hand, the source, one tensor at a time: it
never holds more than one tensor pair in memory. Errors are ``lowbit.error``'s metrics (relative
Frobenius error and SQNR of the dequantized against the source weights). For the tensors with
the largest error it also quantizes the source tensor with a few candidate schemes, giving the
error-vs-bits frontier that tensor could have had, and keeps a histogram of one scale group
with that group's levels. :mod:`lowbit.view.html` renders the result as one self-contained
page, :mod:`lowbit.view.png` as PNG figures.
"""

from __future__ import annotations

import math
import os
import time
from collections import Counter
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from lowbit.checkpoints import open_checkpoint
from lowbit.errors import LowbitError, UnderflowWarning
from lowbit.evaluation.rotated import fold_checkpoint
from lowbit.evaluation.sensitivity import SensitivityResult
from lowbit.methods.hadamard import rotate_blocks
from lowbit.quant.block_clipping import BlockCounts, fp4_block_counts
from lowbit.quant.metrics import error
from lowbit.quant.quantized_tensor import QuantizedTensor
from lowbit.quant.scheme import Granularity, Scheme
from lowbit.quant.scheme_text import parse_scheme
from lowbit.quant.tensor import quantize
from lowbit.view._order import block_order, expert_groups, split_expert
from lowbit.view._reading import QuantizedReader
from lowbit.view.palette import KEPT, Palette, palette

__all__ = [
    "DEFAULT_CANDIDATES",
    "Candidate",
    "Report",
    "TensorDetail",
    "TensorRow",
    "build_report",
    "group_levels",
    "layer_and_kind",
]

#: The schemes each worst tensor is re-quantized with for its error-vs-bits frontier.
DEFAULT_CANDIDATES = ("int8:ch", "fp8_e4m3:ch", "int4:g128", "int4:g32", "nf4", "mxfp4", "fp4:g32")

_LAYER_WORDS = frozenset(("layers", "layer", "blk", "h", "block", "blocks"))
#: Grids with more cells than this, and more than 4 per tensor shown, keep only the kinds that
#: recur (a hostile file's one-kind-per-layer names made the grids quadratic: 1 MB, 18.8 s).
_GRID_CELLS = 4096


def layer_and_kind(name: str) -> tuple[int | None, str]:
    """The layer index and tensor kind of a tensor name (``model.layers.3.mlp.up_proj.weight``
    -> ``(3, "mlp.up_proj")``, ``blk.3.ffn_up.weight`` -> ``(3, "ffn_up")``); tensors outside
    the repeated layers give ``(None, name without .weight)``. The first ``layers.N.``
    segment pair counts; N has at most 9 digits (one split, linear in the name)."""
    parts = name.split(".")
    for i in range(len(parts) - 2):
        n = parts[i + 1]
        if parts[i] in _LAYER_WORDS and n.isdecimal() and len(n) <= 9:
            return int(n), ".".join(parts[i + 2 :]).removesuffix(".weight")
    return None, name.removesuffix(".weight")


@dataclass(frozen=True)
class TensorRow:
    """One tensor of the checkpoint.

    Attributes:
        name: its name in the checkpoint.
        layer: the layer index, None outside the repeated layers.
        kind: the tensor kind (``self_attn.q_proj``, ``ffn_up``, ...; the name outside layers).
        shape: numpy order.
        stored: ``quantized``, ``kept`` or ``cast``.
        scheme: the scheme label (``int4:g128:fp32``) or the stored dtype.
        rule: the plan rule that chose the scheme (None: the plan's default or kept).
        bits: stored bits per weight, scales and zero points included.
        source_bits: the source's bits per weight (None without a source).
        rel_fro: ‖x - x̂‖_F / ‖x‖_F against the source (None without a source).
        sqnr_db: 10·log10(Σx² / Σ(x-x̂)²), inf when exact (None without a source).
    """

    name: str
    layer: int | None
    kind: str
    shape: tuple[int, ...]
    stored: str
    scheme: str
    rule: str | None
    bits: float
    source_bits: float | None = None
    rel_fro: float | None = None
    sqnr_db: float | None = None

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def colour_key(self) -> str:
        """What sets its colour in every figure: its scheme, or ``kept`` when kept as stored."""
        return KEPT if self.stored == "kept" else self.scheme


@dataclass(frozen=True)
class Candidate:
    """One scheme tried on a tensor: its cost and error (``chosen``: the checkpoint's own)."""

    scheme: str
    bits: float
    rel_fro: float
    sqnr_db: float
    chosen: bool = False


@dataclass(frozen=True)
class TensorDetail:
    """A worst tensor in depth: one scale group's histogram and levels, and the frontier.

    Attributes:
        name: the tensor.
        scheme: its scheme label.
        group: which values the histogram shows (``row 0, values 0..127``).
        edges: histogram bin edges of the group's source values.
        counts: histogram counts.
        levels: the values that group can take (its scale applied), ascending.
        candidates: the schemes tried, the checkpoint's own first.
        scale_rules: for a block-scaled FP4 tensor, the source tensor's clipped blocks,
            underflowing scales and flushed values under each FP4 scale rule
            (:func:`lowbit.quant.block_clipping.fp4_block_counts`); empty otherwise.
    """

    name: str
    scheme: str
    group: str
    edges: tuple[float, ...]
    counts: tuple[int, ...]
    levels: tuple[float, ...]
    candidates: tuple[Candidate, ...]
    scale_rules: tuple[BlockCounts, ...] = ()


@dataclass(frozen=True)
class Report:
    """Everything the report page shows (see :func:`build_report`)."""

    path: str
    format: str
    source: str | None
    source_format: str | None
    rows: tuple[TensorRow, ...]
    details: tuple[TensorDetail, ...]
    plan: dict[str, Any] | None
    size_bytes: int
    source_bytes: int | None
    evaluation: Any = None
    sensitivity: dict[str, Any] | None = None
    seconds: dict[str, float] = field(default_factory=dict)
    #: the FP4 scale rules' counts summed over every block-scaled FP4 tensor (with a source)
    scale_rules: tuple[BlockCounts, ...] = ()
    #: how many tensors ``scale_rules`` sums
    scale_rule_tensors: int = 0

    @property
    def quantized(self) -> list[TensorRow]:
        return [r for r in self.rows if r.stored == "quantized"]

    @property
    def bits_per_weight(self) -> float:
        """Stored bits per weight over every tensor (scales included)."""
        n = sum(r.numel for r in self.rows)
        return sum(r.bits * r.numel for r in self.rows) / n if n else math.nan

    @property
    def quantized_bits_per_weight(self) -> float:
        """Stored bits per weight over the quantized tensors."""
        q = self.quantized
        n = sum(r.numel for r in q)
        return sum(r.bits * r.numel for r in q) / n if n else math.nan

    def formats(self) -> list[tuple[str, int, int]]:
        """``(scheme, tensors, weights)`` per scheme, most weights first."""
        tensors: Counter[str] = Counter()
        weights: Counter[str] = Counter()
        for r in self.rows:
            tensors[r.scheme] += 1
            weights[r.scheme] += r.numel
        return sorted(((s, tensors[s], weights[s]) for s in tensors), key=lambda t: -t[2])

    def rules_fired(self) -> list[tuple[str, int]]:
        """``(rule, tensors it chose the scheme of)``, in the order rules first fired."""
        return list(Counter(r.rule for r in self.rows if r.rule).items())

    def grid(self) -> tuple[list[int], list[str]]:
        """The layers and tensor kinds of the layer x kind grid, kinds in the order data flows
        through a block (``lowbit.view._order``); one expert's tensors are left to
        :meth:`experts`."""
        in_layers = [r for r in self.rows if r.layer is not None]
        layers = sorted({r.layer for r in in_layers})  # type: ignore[type-var]
        kinds = block_order(k for k in (r.kind for r in in_layers) if split_expert(k) is None)
        if len(layers) * len(kinds) > max(_GRID_CELLS, 4 * len(in_layers)):
            # sparse: only kinds present in a quarter of the layers (then cells <= 4 x shown)
            count = Counter(r.kind for r in in_layers)
            kinds = [k for k in kinds if 4 * count[k] >= len(layers)]
            keep = set(kinds)
            layers = sorted({r.layer for r in in_layers if r.kind in keep})  # type: ignore[type-var]
        return layers, kinds

    def experts(self) -> list[tuple[str, list[int]]]:
        """``(expert kind, experts)`` of a mixture-of-experts checkpoint, one grid of layers x
        experts each, in block order (``block_sparse_moe.experts.*.w1`` before ``*.w3``
        before ``*.w2``)."""
        groups = expert_groups(r.kind for r in self.rows if r.layer is not None)
        cells = self.expert_cells()
        layers = len({r.layer for r in self.rows if r.layer is not None})
        # a grid of layers x experts costs no more than 4 cells per tensor it shows (as grid())
        return [
            (kind, experts)
            for kind, experts in groups
            if layers * len(experts) <= max(_GRID_CELLS, 4 * len(cells.get(kind, ())))
        ]

    def expert_cells(self) -> dict[str, dict[tuple[int, str], TensorRow]]:
        """Per expert kind of :meth:`experts`: ``(layer, expert as text) -> row``, in one pass
        over the rows."""
        cells: dict[str, dict[tuple[int, str], TensorRow]] = {}
        for r in self.rows:
            s = split_expert(r.kind) if r.layer is not None else None
            if s is not None:
                cells.setdefault(s[0], {})[(r.layer, str(s[1]))] = r  # type: ignore[index]
        return cells

    @cached_property
    def _palette(self) -> Palette:
        bits: dict[str, float] = {}
        weights: Counter[str] = Counter()
        for r in self.rows:
            bits[r.colour_key] = bits.get(r.colour_key, 0.0) + r.bits * r.numel
            weights[r.colour_key] += r.numel
        return palette([(k, b / weights[k] if weights[k] else math.nan) for k, b in bits.items()])

    def palette(self) -> Palette:
        """The colour of every scheme on the page (and in the PNGs): one per scheme, ordered
        by its mean bits per weight, ``kept`` in grey (``lowbit.view.palette``)."""
        return self._palette


# ------------------------------------------------------------------------------- details


def group_levels(qt: Any) -> tuple[np.ndarray, np.ndarray, str]:
    """The values of a quantized tensor's first scale group and the levels that group can
    take (element values with that group's scale and zero point applied).

    Args:
        qt: a :class:`~lowbit.quant.quantized_tensor.QuantizedTensor`.

    Returns:
        ``(level values ascending, flat indices of the group's elements, description)``.
    """

    fmt = qt.format
    vals = np.unique(fmt.values().astype(np.float64)) if fmt.bits <= 16 else np.array([])
    vals = vals[np.isfinite(vals)]
    s = float(np.asarray(qt.scale, dtype=np.float64).reshape(-1)[0])
    zp = float(np.asarray(qt.zero_point).reshape(-1)[0]) if qt.zero_point is not None else 0.0
    lay = qt.layout
    idx = np.arange(lay.numel).reshape(lay.shape)
    if lay.tiles is not None:
        bh, bw = lay.tiles
        first = idx.reshape(-1, lay.shape[-1])[:bh, :bw].reshape(-1)
        return np.unique((vals - zp) * s), first, f"tile 0: the first {bh}x{bw} block"
    part = lay.parts[0]
    v = lay.view(idx, part)
    if lay.granularity is Granularity.TENSOR:
        members, what = v.reshape(-1), "the whole tensor (one scale)"
    elif lay.granularity is Granularity.CHANNEL:
        members, what = v[:, 0, 0, :].reshape(-1), f"channel 0 along axis {lay.axis}"
    else:
        members = v[0, 0, :, 0].reshape(-1)
        what = f"group 0: the first {members.size} values along axis {lay.axis}"
    return np.unique((vals - zp) * s), members, what


def _candidates(
    x: np.ndarray, own: Candidate, names: tuple[str, ...], seed: int
) -> tuple[Candidate, ...]:
    import warnings

    out = [own]
    for spec in names:
        try:
            scheme = parse_scheme(spec)
            if not isinstance(scheme, Scheme):
                continue
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UnderflowWarning)
                qt = quantize(x, scheme, seed=seed)
        except LowbitError:
            continue  # a scheme that does not fit this tensor's shape is no candidate
        if qt.scheme.label == own.scheme:
            continue
        e = error(x, qt)
        out.append(Candidate(qt.scheme.label, qt.bits_per_value, e["rel_fro"], e["sqnr_db"]))
    return tuple(out)


def _detail(
    row: TensorRow, qt: Any, x: np.ndarray, candidates: tuple[str, ...], seed: int
) -> TensorDetail:
    levels, members, what = group_levels(qt)
    group = np.asarray(x, dtype=np.float64).reshape(-1)[members]
    lo = min(float(group.min()), float(levels.min()) if levels.size else 0.0)
    hi = max(float(group.max()), float(levels.max()) if levels.size else 0.0)
    counts, edges = np.histogram(group, bins=min(60, max(10, group.size // 4)), range=(lo, hi))
    own = Candidate(row.scheme, row.bits, float(row.rel_fro), float(row.sqnr_db), chosen=True)
    return TensorDetail(
        name=row.name,
        scheme=row.scheme,
        group=what,
        edges=tuple(float(e) for e in edges),
        counts=tuple(int(c) for c in counts),
        levels=tuple(float(v) for v in levels),
        candidates=_candidates(x, own, candidates, seed),
        scale_rules=tuple(_rule_counts(qt, x)),
    )


def _rule_counts(qt: Any, x: np.ndarray) -> list[BlockCounts]:
    """The FP4 scale rules' counts of the source tensor ``x`` when ``qt`` is block-scaled FP4
    (``lowbit.quant.block_clipping``), else none."""
    scheme = getattr(qt, "scheme", None)
    if not isinstance(scheme, Scheme) or scheme.element_format.name != "float4_e2m1fn":
        return []
    if scheme.granularity not in (Granularity.GROUP, Granularity.BLOCK) or scheme.axis not in (
        -1,
        len(qt.shape) - 1,
    ):
        return []
    try:
        return fp4_block_counts(x)
    except LowbitError:
        return []  # non-finite values: the errors already say so


# ------------------------------------------------------------------------------- building


def build_report(
    path: str | os.PathLike[str],
    *,
    against: str | os.PathLike[str] | None = None,
    evaluation: Any = None,
    sensitivity: dict[str, Any] | None = None,
    worst: int = 3,
    candidates: tuple[str, ...] = DEFAULT_CANDIDATES,
    seed: int = 0,
) -> Report:
    """Read a quantized checkpoint (and its source) tensor by tensor into a :class:`Report`.

    Args:
        path: a lowbit checkpoint folder, a compressed-tensors folder or a GGUF file.
        against: the source model to measure errors against; default: the source a lowbit
            checkpoint names in its ``lowbit.json`` (when it still exists). Without a source
            the report has bits but no errors.
        evaluation: ``lowbit eval --json`` results to show in the summary (any JSON value).
        sensitivity: ``SensitivityResult.to_dict()`` (``lowbit sensitivity --json``), checked
            by reading it back.
        worst: how many of the tensors with the largest relative error get a histogram and a
            frontier of candidate schemes.
        candidates: the schemes of that frontier.
        seed: the seed of stochastic-rounding candidates.

    Returns:
        The :class:`Report`.

    Raises:
        LowbitError: an unreadable checkpoint or source, a source that lacks a tensor or has
            it in another shape, a sensitivity document that is not one.
    """

    t0 = time.perf_counter()
    q = QuantizedReader(Path(path))
    if sensitivity is not None:
        sensitivity = SensitivityResult.from_dict(sensitivity).to_dict()
    src_path = str(against) if against is not None else q.source()
    src = None
    if src_path is not None and (against is not None or Path(src_path).exists()):
        src = open_checkpoint(src_path)
    fold = ((q.manifest or {}).get("method") or {}).get("fold")
    if src is not None and isinstance(fold, dict):
        # --method hadamard-fold: the output's v/o are the folded source's (exactly the same
        # model), so they are measured against those, not the unfolded weights
        src, _ = fold_checkpoint(src, int(fold.get("block", 0)))
    rows: list[TensorRow] = []
    held: dict[str, Any] = {}
    rule_sums: dict[str, BlockCounts] = {}
    rule_tensors = 0
    try:
        for name in q.names():
            stored, scheme, rule, shape, bits, qt = q.tensor(name)
            layer, kind = layer_and_kind(name)
            numel = max(1, math.prod(shape))
            row = TensorRow(name, layer, kind, shape, stored, scheme, rule, bits / numel)
            if src is not None and name in src.names() and stored != "kept":
                x = src.get(name)
                if tuple(x.shape) != shape:
                    raise LowbitError(
                        f"{name}: {src_path} has shape {list(x.shape)}, the checkpoint "
                        f"{list(shape)}; is --against the model it was quantized from?"
                    )
                # stored rotated (W M): measured against the rotated source, the same error
                # as the weight the layer computes with (M is orthogonal)
                x = _rotated(x, q.input_rotation(name, shape))
                approx = qt if qt is not None else q.values(name, qt)
                if approx is not None:
                    rel, sqnr = _errors(x, approx)
                    row = _with_error(row, src, name, rel, sqnr)
                counted = _rule_counts(qt, x)
                rule_tensors += bool(counted)
                for c in counted:
                    rule_sums[c.rule] = rule_sums[c.rule] + c if c.rule in rule_sums else c
            elif src is not None and name in src.names():
                row = _with_error(row, src, name, 0.0, math.inf)
            rows.append(row)
            if qt is not None:
                held[name] = row
        t1 = time.perf_counter()
        ranked = sorted(
            (r for r in rows if r.rel_fro is not None and r.name in held and r.rel_fro > 0),
            key=lambda r: -float(r.rel_fro),  # type: ignore[arg-type]
        )
        details = []
        for r in ranked[: max(0, worst)]:
            x = np.asarray(src.get(r.name), dtype=np.float32)  # type: ignore[union-attr]
            x = _rotated(x, q.input_rotation(r.name, r.shape))
            details.append(_detail(r, q.ckpt.quantized(r.name), x, candidates, seed))  # type: ignore[attr-defined]
        stored_src = getattr(src, "base", src)  # a folded source's bytes are the source's
        source_bytes = (
            sum(stored_src.info(r.name).nbytes for r in rows if r.name in src.names())
            if src
            else None
        )
    finally:
        if src is not None:
            src.close()
    t2 = time.perf_counter()
    size = sum(int(r.bits * max(1, r.numel)) for r in rows) // 8
    return Report(
        path=str(path),
        format=q.format,
        source=src_path,
        source_format=src.format if src is not None else None,
        rows=tuple(rows),
        details=tuple(details),
        plan=q.plan(),
        size_bytes=size,
        source_bytes=source_bytes,
        evaluation=evaluation,
        sensitivity=sensitivity,
        seconds={"tensors": t1 - t0, "details": t2 - t1},
        scale_rules=tuple(rule_sums.values()),
        scale_rule_tensors=rule_tensors,
    )


def _rotated(x: Any, m: np.ndarray | None) -> Any:
    """``x`` (rows of a weight ``[out, in]``) with each block of ``m.shape[0]`` values
    multiplied by ``m`` (None: ``x`` as it is)."""
    return x if m is None else rotate_blocks(np.asarray(x, dtype=np.float32), m)


def _errors(x: np.ndarray, approx: Any) -> tuple[float, float]:
    """``lowbit.error``'s ``rel_fro`` and ``sqnr_db``, the same float64 sums, without the
    metrics the report does not show (3x faster on SmolLM2); falls back to ``lowbit.error``
    when a sum is not finite (NaN or inf weights, which it skips)."""

    a = np.asarray(x).astype(np.float64).ravel()
    b = approx.dequantize(np.float64) if isinstance(approx, QuantizedTensor) else approx
    b = np.asarray(b).astype(np.float64, copy=False).ravel()
    if a.shape != b.shape or a.size == 0:
        e = error(x, approx)  # raises its own error for these
        return e["rel_fro"], e["sqnr_db"]
    sig = float(np.dot(a, a))
    np.subtract(a, b, out=a)
    noise = float(np.dot(a, a))
    if not (math.isfinite(sig) and math.isfinite(noise)):
        e = error(x, approx)
        return e["rel_fro"], e["sqnr_db"]
    if noise == 0:
        sqnr = math.inf
    elif sig == 0:
        sqnr = -math.inf
    else:
        sqnr = 10 * math.log10(sig / noise)
    rel = math.sqrt(noise / sig) if sig > 0 else (0.0 if noise == 0 else math.inf)
    return rel, sqnr


def _with_error(row: TensorRow, src: Any, name: str, rel: float, sqnr: float) -> TensorRow:
    from dataclasses import replace

    info = src.info(name)
    return replace(row, source_bits=info.nbytes * 8 / max(1, info.numel), rel_fro=rel, sqnr_db=sqnr)
