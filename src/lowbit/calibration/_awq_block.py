"""One block of AWQ / SmoothQuant (``lowbit.calibration.awq``): the folds of the block in
table order, AWQ's clipping, quantization, the per-layer errors and the model update."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from lowbit.calibration.blocks import _model_layout, _set_weight
from lowbit.errors import LowbitError
from lowbit.methods.awq import awq_clip, awq_search, output_error, rounded
from lowbit.methods.folds import NO_CLIP, FoldKind, fold_scales, head_reduce, head_repeat
from lowbit.methods.smoothquant import GROUPED_ACTIVATIONS, SmoothQuant, smoothquant_search
from lowbit.models.act_quant import fake_quantize_rows
from lowbit.quant.tensor import quantize_dynamic

__all__ = ["do_block"]


class _Block:
    """One block's tensors as folded so far, in the checkpoint's layout (float64), with the
    row and column scales each linear carries (``W_now = diag(1/r) W diag(c)``)."""

    def __init__(self, ckpt: Any) -> None:
        self.ckpt = ckpt
        self.now: dict[str, np.ndarray] = {}
        self.rows: dict[str, np.ndarray] = {}
        self.cols: dict[str, np.ndarray] = {}

    def get(self, name: str) -> np.ndarray:
        if name not in self.now:
            self.now[name] = np.array(self.ckpt.get(name), dtype=np.float64)
        return self.now[name]


def do_block(
    net: Any, ckpt: Any, i: int, lead: str, mine: dict[str, str], todo: dict[str, Any],
    names: dict[str, str], folds: Any, head_dim: int, col: Any, method: Any, run: Any,
    sec: dict[str, float],
) -> None:  # fmt: skip
    """Folds, clipping, quantization and the model update of one block."""
    sq = isinstance(method, SmoothQuant)
    blk = _Block(ckpt)
    hess: dict[str, np.ndarray] = {}
    inv = {v: k for k, v in names.items()}  # parameter path -> checkpoint name
    t = time.perf_counter()
    for f in folds:
        rec: dict[str, Any] = {"block": i, "prev": lead + f.prev, "linears": list(f.linears)}
        run.folds.append(rec)
        why = _fold(net, blk, lead, f, mine, todo, inv, head_dim, col, method, hess, rec)
        if why:
            rec["skipped"] = why
    sec["search"] += time.perf_counter() - t
    for path, name in mine.items():
        t = time.perf_counter()
        scheme = todo[name].scheme
        W = blk.get(name)
        if not sq and method.clip and not path.endswith(NO_CLIP):
            H = hess.get(path)
            H = col.hessian(path) if H is None else H
            W = awq_clip(W, H, scheme, method)
        qt = rounded(W, scheme)
        deq = qt.dequantize(np.float64)
        sec["quantize"] += time.perf_counter() - t
        t = time.perf_counter()
        r = blk.rows.get(path, np.ones(deq.shape[0]))
        c = blk.cols.get(path, np.ones(deq.shape[1]))
        run.layers[name] = _errors(np.array(ckpt.get(name), dtype=np.float64), deq, r, c,
                                   col, path, scheme, method)  # fmt: skip
        _set_weight(net.get_submodule(path), _model_layout(ckpt, name, deq, net))
        run.weights[name] = qt
        run.methods[name] = method.name
        if path in blk.rows or path in blk.cols:
            run.scales[name] = (r, c)
        blk.now.pop(name, None)
        sec["report"] += time.perf_counter() - t
    for name, arr in blk.now.items():  # folded, not quantized: norms, biases, kept linears
        if name in ckpt and not np.array_equal(arr, ckpt.get(name)):
            run.replaced[name] = arr.astype(np.float32)
            _set_param(net, names, name, _model_layout(ckpt, name, arr, net))


def _fold(
    net: Any, blk: _Block, lead: str, f: Any, mine: dict[str, str], todo: dict[str, Any],
    inv: dict[str, str], head_dim: int, col: Any, method: Any, hess: dict[str, np.ndarray],
    rec: dict[str, Any],
) -> str | None:  # fmt: skip
    """Search and apply one fold; the reason it was skipped, or None."""
    paths = [lead + lin for lin in f.linears]
    if any(p + ".weight" not in inv for p in paths):
        return "its linear layers are not all in the checkpoint"
    if not any(p in mine for p in paths):
        return f"the plan quantizes none of its linear layers by {method.name}"
    if len({col.group_of.get(p) for p in paths}) != 1 or col.tokens(paths[0]) == 0:
        return "its linear layers do not read one input"
    prev_w = inv.get(lead + f.prev + ".weight")
    if prev_w is None:
        return "the operation before is not in the checkpoint"
    touched = [prev_w, *(inv[p + ".weight"] for p in paths)]
    other = [n for n in touched if n in todo and n not in mine.values()]
    if other:  # rounded to nearest as stored (method: rtn), so its weights must not change
        return f"it would change {other[0]}, which the plan rounds to nearest"
    prev = {"weight": blk.get(prev_w)}
    prev_b = inv.get(lead + f.prev + ".bias")
    if prev_b is not None:
        prev["bias"] = blk.get(prev_b)
    width = blk.get(inv[paths[0] + ".weight"]).shape[1]
    c = prev["weight"].shape[0]
    expand = reduce_mean = reduce_max = None
    if f.kind is FoldKind.HEADS:
        try:
            head_repeat(np.ones(c), width, head_dim)
        except LowbitError as exc:
            return f"heads do not fit: {exc}"

        def expand(s: np.ndarray) -> np.ndarray:
            return head_repeat(s, width, head_dim)

        def reduce_mean(v: np.ndarray) -> np.ndarray:
            return head_reduce(v, c, head_dim, "mean")

        def reduce_max(v: np.ndarray) -> np.ndarray:
            return head_reduce(v, c, head_dim, "max")
    elif c != width:
        return f"the operation before has {c} outputs, its linear layers read {width}"
    quant = {p: blk.get(mine[p]) for p in paths if p in mine}
    schemes = {p: todo[mine[p]].scheme for p in quant}
    if isinstance(method, SmoothQuant):
        res = smoothquant_search(
            quant, col.rows(paths[0]), _apply(reduce_max, col.max_abs(paths[0])), schemes,
            method, expand=expand, reduce=reduce_max, simulate=_simulate,
        )  # fmt: skip
    else:
        H = col.hessian(paths[0])
        res = awq_search(quant, H, _apply(reduce_mean, col.mean_abs(paths[0])), schemes,
                         method, expand=expand)  # fmt: skip
    alpha = None if res.alpha < 0 else res.alpha  # SmoothQuant: no smoothing won
    rec.update(alpha=alpha, before=res.before, after=res.after)
    s_in = _apply(expand, res.scales)
    ws = {p: blk.get(inv[p + ".weight"]) for p in paths}
    new_prev, new_lin = fold_scales(prev, ws, res.scales, s_in)
    blk.now[prev_w] = new_prev["weight"]
    if prev_b is not None:
        blk.now[prev_b] = new_prev["bias"]
    if f.kind is not FoldKind.NORM:
        p = lead + f.prev
        blk.rows[p] = blk.rows.get(p, np.ones(c)) * res.scales
    for p in paths:
        blk.now[inv[p + ".weight"]] = new_lin[p]
        blk.cols[p] = blk.cols.get(p, np.ones(width)) * s_in
        if not isinstance(method, SmoothQuant):
            hess[p] = col.hessian(p) / np.outer(blk.cols[p], blk.cols[p])
    return None


def _apply(fn: Any, v: np.ndarray) -> np.ndarray:
    return v if fn is None else fn(v)


def _errors(
    W: np.ndarray, deq: np.ndarray, r: np.ndarray, c: np.ndarray, col: Any, path: str,
    scheme: Any, method: Any,
) -> dict[str, float]:  # fmt: skip
    """Relative output errors of round to nearest and of the method, in the original space."""
    eff = r[:, None] * deq / c[None, :]
    rtn = rounded(W, scheme).dequantize(np.float64)
    out: dict[str, float] = {"tokens": col.tokens(path)}
    if isinstance(method, SmoothQuant):
        X = col.rows(path).astype(np.float64)
        act = method.activations
        ref = X @ W.T
        base = float(np.sum(ref**2)) or 1.0
        xr = _simulate(X.astype(np.float32), act).astype(np.float64)
        xs = _simulate((X / c).astype(np.float32), act).astype(np.float64)
        out["rtn"] = float(np.sum((ref - xr @ rtn.T) ** 2)) / base
        out[method.name] = float(np.sum((ref - (xs @ deq.T) * r[None, :]) ** 2)) / base
        return out
    H = col.hessian(path)
    base = output_error(W, np.zeros_like(W), H) or 1.0
    out["rtn"] = output_error(W, rtn, H) / base
    out[method.name] = output_error(W, eff, H) / base
    return out


def _simulate(x: np.ndarray, act: str) -> np.ndarray:
    """Rows as the layers will see them: per token by lowbit's codec (W8A8), grouped
    ``--act`` modes as ``lowbit eval`` simulates them."""
    if act in GROUPED_ACTIVATIONS:
        return fake_quantize_rows(x, act)
    return quantize_dynamic(x, act).dequantize(np.float32)


def _set_param(net: Any, names: dict[str, str], name: str, arr: np.ndarray) -> None:
    import torch

    param = net.get_parameter(names[name])
    with torch.inference_mode(False), torch.no_grad():
        param.copy_(torch.from_numpy(np.ascontiguousarray(arr, dtype=np.float32)))
