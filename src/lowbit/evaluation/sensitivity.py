"""How much each tensor costs the model when it alone is quantized: the input to mixed precision.

For every tensor a uniform plan would quantize and every candidate scheme, :func:`sensitivity`
measures the damage of quantizing that tensor alone, everything else kept as in the source:

- ``exact``: for causal LMs the mean KL divergence KL(original || trial) of the next-token
  distributions over the calibration tokens; for encoders ``1 - mean cosine`` of the
  mean-pooled sentence embeddings against the original's.
- ``proxy``: the expected squared error of the layer's output if its inputs were uncorrelated,
  ``sum_j E[x_j^2] * sum_i (W_ij - Q(W)_ij)^2``: the weight error weighted by the diagonal of
  ``X^T X / n`` (collected once, with hooks on the linear layers). Cheap: one forward pass.

The exact scan reuses work: the hidden states entering block ``b`` are the same for every
trial inside blocks ``>= b``, so one forward pass of the original caches them (the input of
every block, for every calibration window), and a trial runs only blocks ``b..end`` and the
head. Blocks before ``b`` are replaced by pass-throughs for the trial, and a pre-hook on block
``b`` feeds it the cached input, so the model's own forward (masks, rotary embeddings, norms,
pooling) runs unchanged. Memory: the model, plus ``blocks x tokens x hidden x 4`` bytes of
cached inputs, plus the original's log-probabilities (``tokens x vocab x 4`` bytes) or
embeddings.

The damage of each option and its exact storage cost (codes, scales, zero points: the
:class:`~lowbit.quant.tensor.QuantizedTensor` that ``lowbit quantize`` would write) feed the
bits-budget solver (:mod:`lowbit.quant.budget`).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import math
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lowbit.checkpoints._pipeline import read_quantized
from lowbit.checkpoints.names import gguf_to_hf_name, unpermute_qk
from lowbit.checkpoints.quantize_model import plan_model
from lowbit.checkpoints.readers import Checkpoint
from lowbit.errors import LowbitError
from lowbit.evaluation._sensitivity_workers import distributed_scan
from lowbit.evaluation.models import build_model
from lowbit.quant.plan import PrecisionPlan

__all__ = [
    "Calibration",
    "SensitivityEntry",
    "SensitivityResult",
    "sensitivity",
    "spearman",
]


@dataclass(frozen=True)
class Calibration:
    """What the trials run on: token windows (causal LMs) or sentences (encoders).

    Attributes:
        label: where it came from, for reports (text, slice).
        windows: token id windows, each the same length (causal LMs).
        sentences: texts (encoders).
    """

    label: str
    windows: tuple[tuple[int, ...], ...] = ()
    sentences: tuple[str, ...] = ()


@dataclass(frozen=True)
class SensitivityEntry:
    """One (tensor, scheme) trial."""

    tensor: str
    scheme: str
    numel: int
    bits: int  # stored bits of codes, scales and zero points
    proxy: float
    damage: float | None  # exact measure; None when only the proxy was asked for

    @property
    def bits_per_weight(self) -> float:
        return self.bits / self.numel

    def to_dict(self) -> dict[str, Any]:
        return {
            "tensor": self.tensor,
            "scheme": self.scheme,
            "numel": self.numel,
            "bits": self.bits,
            "bits_per_weight": self.bits_per_weight,
            "proxy": self.proxy,
            "damage": self.damage,
        }


@dataclass(frozen=True)
class SensitivityResult:
    """Every trial, what was measured, and on what."""

    model: str
    kind: str  # "causal" or "encoder"
    measure: str  # "exact" or "proxy"
    metric: str  # what ``damage`` is
    calibration: str
    schemes: tuple[str, ...]
    entries: tuple[SensitivityEntry, ...]
    seconds: dict[str, float] = field(default_factory=dict)

    def tensors(self) -> list[str]:
        """Tensor names in model order."""
        seen: dict[str, None] = {}
        for e in self.entries:
            seen.setdefault(e.tensor, None)
        return list(seen)

    def table(self, key: str | None = None) -> dict[str, dict[str, SensitivityEntry]]:
        """``{tensor: {scheme: entry}}``."""
        out: dict[str, dict[str, SensitivityEntry]] = {}
        for e in self.entries:
            out.setdefault(e.tensor, {})[e.scheme] = e
        return out

    def score(self, e: SensitivityEntry) -> float:
        """The number the budget solver minimises: the exact damage, else the proxy."""
        return e.damage if e.damage is not None else e.proxy

    def rank_correlation(self) -> float | None:
        """Spearman correlation between proxy and exact damage over all trials (None: proxy only)."""
        pairs = [(e.proxy, e.damage) for e in self.entries if e.damage is not None]
        if len(pairs) < 3:
            return None
        a, b = zip(*pairs, strict=True)
        return spearman(a, b)

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": 1,
            "model": self.model,
            "kind": self.kind,
            "measure": self.measure,
            "metric": self.metric,
            "calibration": self.calibration,
            "schemes": list(self.schemes),
            "rank_correlation": self.rank_correlation(),
            "seconds": dict(self.seconds),
            "entries": [e.to_dict() for e in self.entries],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SensitivityResult:
        """Read back :meth:`to_dict` (a ``lowbit sensitivity --json`` file)."""
        try:
            entries = tuple(
                SensitivityEntry(
                    tensor=str(e["tensor"]),
                    scheme=str(e["scheme"]),
                    numel=int(e["numel"]),
                    bits=int(e["bits"]),
                    proxy=float(e["proxy"]),
                    damage=None if e["damage"] is None else float(e["damage"]),
                )
                for e in d["entries"]
            )
            return cls(
                model=str(d["model"]),
                kind=str(d["kind"]),
                measure=str(d["measure"]),
                metric=str(d["metric"]),
                calibration=str(d["calibration"]),
                schemes=tuple(str(s) for s in d["schemes"]),
                entries=entries,
                seconds={str(k): float(v) for k, v in d.get("seconds", {}).items()},
            )
        except (KeyError, TypeError, ValueError) as e:
            raise LowbitError(f"not a lowbit sensitivity result: {type(e).__name__}: {e}") from None


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Spearman's rank correlation (average ranks for ties)."""

    def ranks(x: Sequence[float]) -> np.ndarray:
        x = np.asarray(x, dtype=np.float64)
        order = np.argsort(x, kind="stable")
        r = np.empty(len(x))
        r[order] = np.arange(len(x), dtype=np.float64)
        for v in np.unique(x):  # ties share their mean rank
            tie = x == v
            if tie.sum() > 1:
                r[tie] = r[tie].mean()
        return r

    ra, rb = ranks(a), ranks(b)
    ra, rb = ra - ra.mean(), rb - rb.mean()
    denom = math.sqrt(float((ra * ra).sum() * (rb * rb).sum()))
    return float((ra * rb).sum() / denom) if denom else 0.0


# ---------------------------------------------------------------------------------------
# The model's parts
# ---------------------------------------------------------------------------------------


def _blocks(model: Any) -> Any:
    """The model's list of transformer blocks (the largest ``ModuleList`` of modules)."""
    import torch

    best = None
    for _, mod in model.named_modules():
        if isinstance(mod, torch.nn.ModuleList) and len(mod) > 0:
            size = sum(p.numel() for p in mod.parameters())
            if best is None or size > best[0]:
                best = (size, mod)
    if best is None:
        raise LowbitError(f"{type(model).__name__}: no list of transformer blocks found")
    return best[1]


class _Weights:
    """Checkpoint tensor name -> the model parameter it fills (and the row reordering)."""

    def __init__(self, model: Any, checkpoint: Checkpoint) -> None:
        self.params = dict(model.named_parameters())
        self.modules = dict(model.named_modules())
        self.gguf = checkpoint.format == "gguf"
        self.cfg = checkpoint.config or {}
        keys = set(self.params)
        base = getattr(model, "base_model_prefix", "") or ""
        self.prefix = ""
        self.strip = ""
        if not self.gguf and base:
            names = checkpoint.names()
            if not any(n in keys for n in names):
                if any(f"{base}.{n}" in keys for n in names):
                    self.prefix = f"{base}."
                else:
                    self.strip = f"{base}."

    def key(self, name: str) -> str:
        hf = gguf_to_hf_name(name) if self.gguf else name
        if self.strip and hf.startswith(self.strip):
            hf = hf[len(self.strip) :]
        return self.prefix + hf

    def param(self, name: str) -> Any:
        p = self.params.get(self.key(name))
        if p is None:
            raise LowbitError(f"tensor {name!r} fills no parameter of the model")
        return p

    def module(self, name: str) -> str:
        return self.key(name).rsplit(".", 1)[0]

    def model_layout(self, name: str, arr: np.ndarray) -> np.ndarray:
        """A checkpoint-layout array in the model's layout (GGUF q/k rows un-permuted)."""
        if not self.gguf:
            return arr
        key = self.key(name)
        if key.endswith("q_proj.weight"):
            return unpermute_qk(arr, self.cfg["num_attention_heads"])
        if key.endswith("k_proj.weight"):
            heads = self.cfg.get("num_key_value_heads", self.cfg["num_attention_heads"])
            return unpermute_qk(arr, heads)
        return arr


def _block_of(weights: _Weights, blocks: Any, name: str) -> int:
    """Index of the block holding a tensor's parameter (-1: outside every block)."""
    p = weights.param(name)
    for i, block in enumerate(blocks):
        if any(q is p for q in block.parameters()):
            return i
    return -1


# ---------------------------------------------------------------------------------------
# Running the model: the original once, trials from a block onward
# ---------------------------------------------------------------------------------------


class _Runner:
    """Runs the model on the calibration data; caches block inputs; measures trials."""

    def __init__(self, model: Any, tokenizer: Any, kind: str, calib: Calibration, batch: int):
        import torch

        self.torch = torch
        self.model = model
        self.kind = kind
        self.blocks = _blocks(model)
        self.batches = self._batches(tokenizer, calib, batch)
        self.cache: list[list[Any]] = []  # per batch, per block: the block's hidden input
        self.ref: list[Any] = []  # per batch: log-probs (causal) or embeddings (encoder)
        self.block_returns_tuple = False

    def _batches(self, tokenizer: Any, calib: Calibration, batch: int) -> list[dict[str, Any]]:
        torch = self.torch
        out = []
        if self.kind == "causal":
            if not calib.windows:
                raise LowbitError("a causal LM needs calibration token windows")
            ids = torch.tensor(calib.windows, dtype=torch.long)
            for i in range(0, len(ids), batch):
                out.append({"input_ids": ids[i : i + batch]})
        else:
            if tokenizer is None or not calib.sentences:
                raise LowbitError("an encoder needs calibration sentences and a tokenizer")
            texts = list(calib.sentences)
            for i in range(0, len(texts), batch):
                enc = tokenizer(
                    texts[i : i + batch],
                    padding=True,
                    truncation=True,
                    max_length=256,
                    return_tensors="pt",
                )
                out.append(dict(enc))
        return out

    def _summary(self, out: Any, inputs: dict[str, Any]) -> Any:
        """Log-probs of the next token (causal) or L2-normalised mean-pooled embeddings."""
        torch = self.torch
        if self.kind == "causal":
            return torch.log_softmax(out.logits[:, :-1].float(), dim=-1)
        hidden = out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]
        mask = inputs["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * mask).sum(1) / mask.sum(1).clamp_min(1e-9)
        return torch.nn.functional.normalize(pooled, dim=-1)

    def _damage(self, got: Any, ref: Any) -> tuple[float, int]:
        """Summed damage and the count it is a mean over."""
        if self.kind == "causal":
            kl = (ref.exp() * (ref - got)).sum(-1)  # KL(original || trial) per position
            return float(kl.sum()), kl.numel()
        cos = (got.double() * ref.double()).sum(-1)
        return float((1.0 - cos).sum()), cos.numel()

    def reference(self) -> None:
        """One pass of the original: the cached block inputs and the reference outputs."""
        torch = self.torch
        captured: list[Any] = []

        def grab(_mod: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            h = args[0] if args else kwargs["hidden_states"]
            captured.append(h.detach())

        def returns(_mod: Any, _args: Any, output: Any) -> None:
            self.block_returns_tuple = isinstance(output, tuple)

        hooks = [b.register_forward_pre_hook(grab, with_kwargs=True) for b in self.blocks]
        hooks.append(self.blocks[0].register_forward_hook(returns))
        try:
            with torch.inference_mode():
                for inputs in self.batches:
                    captured.clear()
                    out = self.model(**inputs)
                    self.cache.append(list(captured))
                    self.ref.append(self._summary(out, inputs))
        finally:
            for h in hooks:
                h.remove()
        if any(len(c) != len(self.blocks) for c in self.cache):
            raise LowbitError("the model did not run each block once per pass")

    def trial(self, start: int) -> float:
        """Mean damage of the model as it is now against the reference, from block ``start``.

        ``start`` < 0 runs the whole model (a tensor outside every block, or a check).
        """
        torch = self.torch
        total, count = 0.0, 0
        with torch.inference_mode(), self._from_block(start) as feed:
            for b, inputs in enumerate(self.batches):
                feed[0] = self.cache[b][start] if start >= 0 else None
                got = self._summary(self.model(**inputs), inputs)
                s, n = self._damage(got, self.ref[b])
                total += s
                count += n
        return total / count

    @contextmanager
    def _from_block(self, start: int) -> Iterator[list[Any]]:
        """Blocks before ``start`` pass their input through; block ``start`` gets the cache."""
        feed: list[Any] = [None]
        if start <= 0:
            if start == 0:
                hook = self.blocks[0].register_forward_pre_hook(
                    self._feeder(feed), with_kwargs=True
                )
                try:
                    yield feed
                finally:
                    hook.remove()
            else:
                yield feed
            return
        saved = [blk.forward for blk in self.blocks[:start]]
        tuple_out = self.block_returns_tuple

        def passthrough(*args: Any, **kwargs: Any) -> Any:
            h = args[0] if args else kwargs["hidden_states"]
            return (h,) if tuple_out else h

        for blk in self.blocks[:start]:
            blk.forward = passthrough
        hook = self.blocks[start].register_forward_pre_hook(self._feeder(feed), with_kwargs=True)
        try:
            yield feed
        finally:
            hook.remove()
            for blk, fwd in zip(self.blocks[:start], saved, strict=True):
                blk.forward = fwd

    @staticmethod
    def _feeder(feed: list[Any]) -> Callable[..., Any]:
        def hook(_mod: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            if feed[0] is None:
                return None
            if args:
                return (feed[0], *args[1:]), kwargs
            return args, {**kwargs, "hidden_states": feed[0]}

        return hook

    def input_moments(self, modules: Sequence[str]) -> dict[str, np.ndarray]:
        """E[x_j^2] of every named linear layer's input over the calibration data."""
        torch = self.torch
        sums: dict[str, Any] = {}
        counts: dict[str, int] = {}
        named = dict(self.model.named_modules())
        hooks = []
        for m in modules:

            def grab(_mod: Any, args: tuple[Any, ...], name: str = m) -> None:
                x = args[0].detach().float().reshape(-1, args[0].shape[-1])
                sums[name] = sums.get(name, 0) + (x * x).sum(0).double()
                counts[name] = counts.get(name, 0) + x.shape[0]

            hooks.append(named[m].register_forward_pre_hook(grab))
        try:
            with torch.inference_mode():
                for inputs in self.batches:
                    self.model(**inputs)
        finally:
            for h in hooks:
                h.remove()
        return {m: (sums[m] / counts[m]).numpy() for m in modules if m in sums}


# ---------------------------------------------------------------------------------------
# The scan
# ---------------------------------------------------------------------------------------

_METRICS = {
    "causal": "mean KL(original || trial) of next-token distributions, nats",
    "encoder": "1 - mean cosine of sentence embeddings",
    "proxy": "proxy: sum_j E[x_j^2] * ||W_j - Q(W)_j||^2",
}


def _plans(
    checkpoint: Checkpoint, schemes: Sequence[str], select: Sequence[str] = ()
) -> tuple[list[Any], list[str]]:
    """The uniform plan of each scheme applied to the checkpoint, and the tensors they quantize
    (those matching a glob of ``select``, when given).

    Needs no model: the driver of a distributed scan calls it to number the trials.
    """
    if not schemes:
        raise LowbitError("give at least one candidate scheme")
    plans = [plan_model(checkpoint, PrecisionPlan.uniform(s)) for s in schemes]
    if select:
        plans = [
            dataclasses.replace(
                a,
                tensors=tuple(
                    t for t in a.tensors
                    if t.action != "quantize" or any(fnmatch.fnmatchcase(t.name, g) for g in select)
                ),
            )
            for a in plans
        ]  # fmt: skip
    names = [t.name for t in plans[0].quantized]
    if not names:
        what = f" matching {', '.join(select)}" if select else ""
        raise LowbitError(f"{checkpoint.path}: no tensor to quantize{what}")
    for s, applied in zip(schemes[1:], plans[1:], strict=True):
        if [t.name for t in applied.quantized] != names:
            raise LowbitError(f"scheme {s!r} quantizes other tensors than {schemes[0]!r}")
    return plans, names


class _Scan:
    """What one process needs to run trials: the model, its cached block inputs, the moments.

    Every process of a distributed scan builds its own (from a path it can read) and runs the
    trials it is given; a trial's numbers depend only on the model, the calibration data and
    the trial, so any split of the trials gives the numbers of one process running them all.
    """

    def __init__(
        self,
        checkpoint: Checkpoint,
        schemes: Sequence[str],
        calibration: Calibration,
        tokenizer: Any,
        measure: str,
        batch: int,
        select: Sequence[str] = (),
    ) -> None:
        if measure not in ("exact", "proxy"):
            raise LowbitError(f"measure must be 'exact' or 'proxy', got {measure!r}")
        self.seconds: dict[str, float] = {}
        self.checkpoint = checkpoint
        self.measure = measure
        t0 = time.perf_counter()
        self.plans, self.names = _plans(checkpoint, schemes, select)
        model = build_model(checkpoint, progress=False)
        self.kind = (
            "causal"
            if hasattr(model, "lm_head") or "CausalLM" in type(model).__name__
            else "encoder"
        )
        self.runner = _Runner(model, tokenizer, self.kind, calibration, batch)
        self.weights = _Weights(model, checkpoint)
        self.seconds["build"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        self.moments = self.runner.input_moments([self.weights.module(n) for n in self.names])
        self.seconds["proxy_pass"] = time.perf_counter() - t0
        if measure == "exact":
            t0 = time.perf_counter()
            self.runner.reference()
            self.seconds["reference"] = time.perf_counter() - t0
        self.start_of = {n: _block_of(self.weights, self.runner.blocks, n) for n in self.names}

    @property
    def count(self) -> int:
        """Number of trials: tensors x schemes (numbered scheme-major, in model order)."""
        return len(self.names) * len(self.plans)

    def run(self, trial: int, cached: bool = True) -> SensitivityEntry:
        """One trial: quantize tensor ``trial % tensors`` with scheme ``trial // tensors``."""
        import torch

        t = self.plans[trial // len(self.names)].quantized[trial % len(self.names)]
        weights = self.weights
        qt = read_quantized(self.checkpoint, t)
        w_hat = qt.dequantize(np.float32)
        w = np.asarray(self.checkpoint.get(t.name), dtype=np.float32)
        err2 = ((w.astype(np.float64) - w_hat) ** 2).sum(0)  # per input column
        mom = self.moments.get(weights.module(t.name))
        proxy = float(err2 @ mom) if mom is not None and mom.shape == err2.shape else math.nan
        damage = None
        if self.measure == "exact":
            p = weights.param(t.name)
            saved = p.detach().clone()
            with torch.no_grad():
                p.copy_(torch.from_numpy(weights.model_layout(t.name, w_hat).copy()))
            try:
                damage = self.runner.trial(self.start_of[t.name] if cached else -1)
            finally:
                with torch.no_grad():
                    p.copy_(saved)
        return SensitivityEntry(
            tensor=t.name,
            scheme=t.scheme.label,
            numel=qt.numel,
            bits=qt.nbytes * 8,
            proxy=proxy,
            damage=damage,
        )


def sensitivity(
    checkpoint: Checkpoint,
    schemes: Sequence[str],
    calibration: Calibration,
    *,
    tokenizer: Any = None,
    measure: str = "exact",
    cached: bool = True,
    batch: int = 4,
    progress: Callable[[int, int], None] | None = None,
    workers: int = 1,
    ray: bool | str = False,
    tensors: Sequence[str] = (),
) -> SensitivityResult:
    """Measure every quantizable tensor under every candidate scheme, one tensor at a time.

    Args:
        checkpoint: an open checkpoint (``lowbit.open_checkpoint``).
        schemes: candidate scheme strings (``int4:g128``, ``nf4``, ``int8:ch`` ...).
        calibration: token windows (causal LMs) or sentences (encoders); keep them disjoint
            from the data the result will be evaluated on.
        tokenizer: the model's tokenizer (encoders).
        measure: ``exact`` (the measured damage, and the proxy beside it) or ``proxy`` only.
        cached: reuse the cached block inputs (``False`` runs the whole model per trial: for
            checking the cache, same numbers).
        batch: windows or sentences per forward pass.
        progress: called as ``progress(done, total)`` after each trial (each chunk of trials
            when they run on workers).
        workers: processes that run trials (1: this process). Each opens the checkpoint from
            its path, builds the model and its cache, and runs a share of the trials
            (:mod:`lowbit.evaluation._sensitivity_workers`); the result is the same.
        ray: run the trials on a Ray cluster: ``True`` connects as ``ray.init()`` does (a
            running cluster named by ``RAY_ADDRESS``, else a local instance), a string is the
            cluster's address. ``workers`` is then the number of Ray actors (1: one per CPU of
            the cluster). The checkpoint's path must be readable on every node.
        tensors: globs; only the tensors matching one are tried (default: all).

    Returns:
        A :class:`SensitivityResult`.

    Raises:
        LowbitError: an unknown scheme or measure, a model lowbit cannot build, no tensors,
            ``workers < 1``.
        ImportError: ``ray`` given without Ray installed (``pip install 'lowbit[ray]'``).
    """
    if measure not in ("exact", "proxy"):
        raise LowbitError(f"measure must be 'exact' or 'proxy', got {measure!r}")
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise LowbitError(f"workers must be a positive integer, got {workers!r}")
    if ray is not False or workers > 1:
        labels = [a.quantized[0].scheme.label for a in _plans(checkpoint, schemes, tensors)[0]]
        kind, entries, seconds = distributed_scan(
            checkpoint.path,
            tuple(schemes),
            calibration,
            tokenizer=tokenizer,
            measure=measure,
            cached=cached,
            batch=batch,
            progress=progress,
            workers=workers,
            ray=ray,
            select=tuple(tensors),
            scan_type=_Scan,
            plans=_plans,
        )
    else:
        scan = _Scan(checkpoint, schemes, calibration, tokenizer, measure, batch, tensors)
        labels = [a.quantized[0].scheme.label for a in scan.plans]
        entries = []
        t0 = time.perf_counter()
        for i in range(scan.count):
            entries.append(scan.run(i, cached))
            if progress is not None:
                progress(i + 1, scan.count)
        seconds = {**scan.seconds, "trials": time.perf_counter() - t0}
        kind = scan.kind
    return SensitivityResult(
        model=str(checkpoint.path),
        kind=kind,
        measure=measure,
        metric=_METRICS[kind] if measure == "exact" else _METRICS["proxy"],
        calibration=calibration.label,
        schemes=tuple(labels),
        entries=tuple(entries),
        seconds=seconds,
    )
