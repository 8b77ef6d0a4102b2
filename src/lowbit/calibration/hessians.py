"""The statistics calibrated methods collect: Hessians and activation statistics of linear layers.

(:class:`HessianCollector`) for each linear layer the Hessian of its output
error, ``H = 2 X^T X / n`` over the ``n`` calibration tokens it sees (padding excluded): float32
products of one sample at a time (the upper block triangle only), summed in float32 over
windows of 16 passes (passes 0-15, 16-31, ...) and then in float64, window after window. A
calibration worker (``lowbit.calibration._workers``) that holds a shard of whole windows keeps
each window's float32 sum apart (:func:`parts_kept`, :meth:`HessianCollector.parts`); the
driver adds every worker's windows in sample order (:func:`add_parts`), the very additions one
process makes, so the Hessians are bitwise the same. Each collecting pass stops at the block's last linear layer. Layers that read the same input
tensor (q/k/v, gate/up) share one ``H``. ``lowbit.calibration.gptq`` collects them one
block at a time (GPTQ's sequential mode: block ``i`` sees the outputs of the already quantized
blocks before it), so the peak memory is about

    model (float32) + N * L * d * 4 bytes (one block's inputs for every sample)
      + sum over the block's distinct inputs of in² * 8 bytes (the Hessians)
      + one sample's forward temporaries through one block

for ``N`` samples of ``L`` tokens and hidden size ``d``: SmolLM2-135M (d = 576, inputs of 576
and 1,536) with 128 x 512 takes 0.54 GB + 151 MB + 3 x 2.7 MB + 19 MB + tens of MB.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import numpy as np

from lowbit.errors import LowbitError
from lowbit.models._compute import exact

__all__ = ["HessianCollector", "add_parts", "parts_kept"]

# Whether collectors made in this context keep their sums in parts (a calibration worker's
# run): how the sums are kept, never what they are.
_KEEP_PARTS: ContextVar[bool] = ContextVar("lowbit_keep_parts", default=False)


@contextmanager
def parts_kept() -> Iterator[None]:
    """Collectors made inside keep each window's float32 ``X^T X`` and each pass's ``|x|``
    sums apart (:meth:`HessianCollector.parts`) instead of adding them up: what a calibration
    worker hands its driver. Memory: its windows' sums, ``in² x 4`` bytes each."""
    token = _KEEP_PARTS.set(True)
    try:
        yield
    finally:
        _KEEP_PARTS.reset(token)


class HessianCollector:
    """Forward pre-hooks that sum ``X^T X`` of the inputs of named linear layers.

    Layers that receive the very same input tensor in a forward pass share one sum. Use as a
    context manager around forward passes; call :meth:`next_sample` before each pass with
    the mask of the tokens that count (``None``: all of them), and run the pass through
    :meth:`run` to stop it as soon as the last layer's input is summed (its output and what
    follows are not needed; learned on the first pass).

    The sums are float32 products ``X^T X`` of one pass, only the upper block triangle
    computed (blocks of ``in / 4`` columns: about 35 % fewer operations than the full
    product), added in float32 and moved into a float64 total every :attr:`FLUSH` passes.

    With ``stats`` it also keeps, per input channel, the sum and the maximum of ``|x|`` (AWQ's
    and SmoothQuant's statistics), and with ``rows`` up to that many input rows of each pass,
    drawn with ``seed`` (SmoothQuant measures activation quantization on them); with
    ``hessian=False`` it skips ``X^T X``.

    Args:
        linears: name -> ``torch.nn.Linear``.
        hessian: sum ``X^T X`` (default).
        stats: keep per-channel ``sum |x|`` and ``max |x|``.
        rows: input rows kept per forward pass (0: none).
        seed: the draw of those rows.
    """

    #: passes summed in float32 before the sum is added to the float64 total (a window).
    FLUSH = 16

    def __init__(
        self,
        linears: dict[str, Any],
        *,
        hessian: bool = True,
        stats: bool = False,
        rows: int = 0,
        seed: int = 0,
    ) -> None:
        self.linears = dict(linears)
        self.group_of: dict[str, str] = {}
        self._sum: dict[str, Any] = {}
        self._total: dict[str, np.ndarray] = {}
        self._pending: dict[str, int] = {}
        self._count: dict[str, int] = {}
        self._hessian, self._stats, self._rows = hessian, stats, int(rows)
        self._abs_sum: dict[str, Any] = {}
        self._abs_max: dict[str, Any] = {}
        self._kept: dict[str, list[Any]] = {}
        self._gen: Any = None
        self._seed = seed
        self._seen: list[tuple[Any, str]] = []
        self._done: set[str] = set()
        self._order: list[str] = []
        self._last: str | None = None
        self._passes = 0
        self._stop = False
        self._mask: Any = None
        self._handles: list[Any] = []
        self._keep = _KEEP_PARTS.get()
        self._windows: dict[str, list[np.ndarray]] = {}  # kept parts (parts_kept)
        self._abs_parts: dict[str, list[Any]] = {}

    def __enter__(self) -> HessianCollector:
        for name, mod in self.linears.items():
            self._handles.append(mod.register_forward_pre_hook(self._hook(name), with_kwargs=True))
        return self

    def __exit__(self, *exc: Any) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self._seen.clear()

    def next_sample(self, mask: Any = None) -> None:
        """Start a forward pass; ``mask`` (bool, the input's leading shape) marks real tokens."""
        if self._passes == 1 and self._order and len(self.group_of) == len(self.linears):
            # the first pass showed which group comes last; where it did not reach every layer
            # (a mixture's routing sent no token to some expert) passes are never cut short
            self._last = self._order[-1]
        if self._passes and self._passes % self.FLUSH == 0:  # a new window of passes
            for group in list(self._sum):
                self._flush(group)
        self._passes += 1
        self._seen.clear()  # references kept during a pass, so a data pointer is never reused
        self._done.clear()
        self._mask = mask

    def run(self, forward: Any, *args: Any, **kwargs: Any) -> None:
        """Call ``forward(*args, **kwargs)`` (one pass), stopping it once the last layer's
        input is summed."""
        self._stop = True
        try:
            forward(*args, **kwargs)
        except _Done:
            pass
        finally:
            self._stop = False

    def _hook(self, name: str) -> Any:
        def hook(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            x = args[0] if args else kwargs["input"]
            group = self.group_of.get(name)
            if group is None:
                group = next((g for t, g in self._seen if _same_tensor(t, x)), name)
                self.group_of[name] = group
            if group in self._done:
                return
            self._seen.append((x, group))
            self._done.add(group)
            if group not in self._order:
                self._order.append(group)
            if self._mask is not None:
                x = x[self._mask]
            x2 = x.reshape(-1, x.shape[-1]).float()
            if self._hessian:
                self._add(group, x2)
            self._count[group] = self._count.get(group, 0) + int(x2.shape[0])
            if self._stats or self._rows:
                self._more(group, x2)
            if self._stop and group == self._last:
                raise _Done

        return _float32(hook)

    def _add(self, group: str, x: Any) -> None:
        import torch

        d = int(x.shape[1])
        acc = self._sum.get(group)
        if acc is None:
            acc = self._sum[group] = torch.zeros((d, d), dtype=torch.float32)
        step = -(-d // 4)
        for a in range(0, d, step):  # the upper block triangle: rows a..a+step, columns a..
            acc[a : a + step, a:].addmm_(x[:, a : a + step].T, x[:, a:])
        self._pending[group] = self._pending.get(group, 0) + 1

    def _flush(self, group: str) -> None:
        if not self._pending.get(group):
            return
        part = self._sum.pop(group).numpy()
        self._pending[group] = 0
        if self._keep:
            self._windows.setdefault(group, []).append(part)
            return
        _add_window(self._total, group, part)

    def _more(self, group: str, x2: Any) -> None:
        import torch

        if self._stats:
            a = x2.abs()
            s, m = a.sum(0).double(), a.amax(0)
            if self._keep:
                self._abs_parts.setdefault(group, []).append(s.numpy().copy())
            if group in self._abs_sum:
                self._abs_sum[group] += s
                self._abs_max[group] = torch.maximum(self._abs_max[group], m)
            else:
                self._abs_sum[group], self._abs_max[group] = s, m
        if self._rows:
            if self._gen is None:
                self._gen = torch.Generator().manual_seed(self._seed)
            n = int(x2.shape[0])
            pick = torch.randperm(n, generator=self._gen)[: self._rows].sort().values
            self._kept.setdefault(group, []).append(x2[pick].clone())

    def _group(self, name: str) -> str:
        group = self.group_of.get(name)
        if group is None or not self._count.get(group):
            raise LowbitError(f"layer {name!r} saw no calibration tokens")
        return group

    def mean_abs(self, name: str) -> np.ndarray:
        """Mean ``|x|`` per input channel (float64) of a layer's inputs (``stats=True``)."""
        g = self._group(name)
        return self._abs_sum[g].numpy() / self._count[g]

    def max_abs(self, name: str) -> np.ndarray:
        """Max ``|x|`` per input channel (float64) of a layer's inputs (``stats=True``)."""
        return self._abs_max[self._group(name)].double().numpy()

    def rows(self, name: str) -> np.ndarray:
        """The input rows kept (float32 ``[n, in]``; ``rows > 0``)."""
        import torch

        return torch.cat(self._kept[self._group(name)]).numpy()

    def hessian(self, name: str, *, release: bool = False) -> np.ndarray:
        """``2 X^T X / n`` (float64, exactly symmetric) of a layer's inputs.

        With ``release`` the collector's sum for the layer's group is made into ``H`` in place
        and dropped (a later call for that group fails): the same values, bit for bit, without
        the four more ``in x in`` float64 matrices the copy takes (6.6 GB at Llama-3.1-8B's
        ``down_proj``, in = 14,336).

        Raises:
            LowbitError: a layer that saw no tokens, or a collector made with ``hessian=False``.
        """
        group = self._group(name)
        self._flush(group)
        if group not in self._total:
            raise LowbitError(f"layer {name!r}: no Hessian was collected (hessian=False)")
        if release:
            S = self._total.pop(group)
            if not S.flags.writeable:  # sums handed over read-only (Ray's object store)
                S = S.copy()
            return _symmetric_in_place(S, 2.0 / self._count[group])
        S = self._total[group]
        return (2.0 / self._count[group]) * (np.triu(S) + np.triu(S, 1).T)

    def groups(self) -> dict[str, list[str]]:
        """Shared inputs: group -> names of the layers reading it, in hook order."""
        out: dict[str, list[str]] = {}
        for name in self.linears:
            g = self.group_of.get(name)
            if g is not None:
                out.setdefault(g, []).append(name)
        return out

    def tokens(self, name: str) -> int:
        return self._count.get(self.group_of.get(name, ""), 0)

    def parts(self) -> dict[str, Any]:
        """What this collector summed, in parts another process adds up (made inside
        :func:`parts_kept`; once: the windows are handed over): ``group_of``, and per group
        ``windows`` (each window's float32 ``X^T X``, upper block triangle), ``count``
        (tokens), ``abs`` (each pass's float64 ``sum |x|``) and ``max`` (float32 ``max |x|``)
        where ``stats``."""
        assert self._keep, "parts() of a collector made outside parts_kept()"
        for group in list(self._sum):
            self._flush(group)
        groups = {}
        for group, count in self._count.items():
            groups[group] = {
                "windows": self._windows.pop(group, []),  # handed over, not kept twice
                "count": count,
                "abs": self._abs_parts.pop(group, []),
                "max": self._abs_max[group].numpy() if group in self._abs_max else None,
            }
        return {"group_of": dict(self.group_of), "groups": groups}

    @classmethod
    def merged(cls, linears: dict[str, Any], shards: list[dict[str, Any]]) -> HessianCollector:
        """A collector holding the sums of several collectors' :meth:`parts`, one per shard
        of samples, given in sample order (:func:`add_parts`, :meth:`from_sums`)."""
        sums: dict[str, Any] = {}
        for shard in shards:
            add_parts(sums, shard)
        return cls.from_sums(linears, sums)

    @classmethod
    def from_sums(cls, linears: dict[str, Any], sums: dict[str, Any]) -> HessianCollector:
        """A collector holding sums that :func:`add_parts` made: what its methods
        (:meth:`hessian`, :meth:`tokens`, :meth:`mean_abs`, ...) read. Its hooks are never
        registered (no ``with``)."""
        import torch

        col = cls(linears)
        col.group_of.update(sums.get("group_of", {}))
        for group, got in sums.get("groups", {}).items():
            col._count[group] = got["count"]
            if got["total"] is not None:
                col._total[group] = got["total"]
            if got["abs"] is not None:
                col._abs_sum[group] = torch.from_numpy(got["abs"])
            if got["max"] is not None:
                col._abs_max[group] = torch.from_numpy(got["max"])
        return col


def add_parts(sums: dict[str, Any], parts: dict[str, Any]) -> dict[str, Any]:
    """Add one shard's :meth:`HessianCollector.parts` onto ``sums`` (in place; start from
    ``{}``), shards in sample order: the float64 total adds the windows one after another and
    ``sum |x|`` the passes one after another, the additions one collector that saw every
    sample makes, so the sums are bitwise its sums.

    Returns:
        ``sums``: ``group_of``, and per group ``total`` (float64 ``X^T X``, upper block
        triangle), ``count``, ``abs`` (float64 ``sum |x|``) and ``max`` (float32), each None
        where not collected.

    Raises:
        LowbitError: shards that grouped a layer differently.
    """
    group_of = sums.setdefault("group_of", {})
    groups = sums.setdefault("groups", {})
    for name, group in parts["group_of"].items():
        if group_of.setdefault(name, group) != group:
            raise LowbitError(f"calibration workers grouped layer {name!r} differently")
    for group, got in parts["groups"].items():
        acc = groups.setdefault(group, {"total": None, "count": 0, "abs": None, "max": None})
        acc["count"] += got["count"]
        for w in got["windows"]:  # as _flush: the float32 window made float64, then added
            _add_window(acc, "total", w)
        for a in got["abs"]:
            if acc["abs"] is None:
                acc["abs"] = a.copy()
            else:
                acc["abs"] += a
        if got["max"] is not None:
            m = got["max"]
            acc["max"] = m.copy() if acc["max"] is None else np.maximum(acc["max"], m)
    return sums


def _add_window(totals: dict[str, Any], key: str, part: np.ndarray) -> None:
    """``totals[key] += part.astype(float64)`` (or set to it) without the float64 copy of the
    window: numpy widens the float32 values chunk by chunk inside the addition, exactly, so
    the sum is bitwise the same. The copy was one more ``in x in`` float64 matrix at every
    window after the first (1.64 GB at Llama-3.1-8B's down_proj, beside the total and the
    float32 sum)."""
    total = totals.get(key)
    if total is None:
        totals[key] = part.astype(np.float64)
    else:
        np.add(total, part, out=total)


def _symmetric_in_place(S: np.ndarray, scale: float) -> np.ndarray:
    """``scale * (triu(S) + triu(S, 1).T)`` computed in ``S`` itself: the lower triangle
    copied from the upper in row blocks, ``+ 0.0`` (as the sum with the zero triangle: a
    ``-0.0`` becomes ``+0.0``), then scaled. Bitwise the expression's values."""
    n = S.shape[0]
    step = 512
    for i0 in range(0, n, step):
        i1 = min(i0 + step, n)
        S[i0:i1, :i0] = S[:i0, i0:i1].T
        blk = S[i0:i1, i0:i1]
        low = np.tril_indices(i1 - i0, -1)
        blk[low] = blk.T[low]
    np.add(S, 0.0, out=S)
    S *= scale
    return S


class _Done(Exception):
    """Raised by the last layer's hook: the rest of the forward pass is not needed."""


def _float32(hook: Any) -> Any:
    """``hook`` run with autocast off: under a bf16 compute precision
    (``lowbit.models._compute``) the sums stay float32."""

    def run(*args: Any, **kwargs: Any) -> Any:
        with exact():
            return hook(*args, **kwargs)

    return run


def _same_tensor(a: Any, b: Any) -> bool:
    return a is b or (
        a.data_ptr() == b.data_ptr() and a.shape == b.shape and a.stride() == b.stride()
    )
