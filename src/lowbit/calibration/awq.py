"""AWQ and SmoothQuant on a whole model: exact scale folds block by block, then quantization.

:func:`awq_weights` is what ``lowbit quantize --method awq``, ``--smooth`` and ``lowbit eval
--methods awq`` / ``--smooth`` run. It reuses GPTQ's machinery (``lowbit.calibration.gptq``:
the model in float32, the calibration data of ``lowbit.calibration.data`` run up to the
first block, forward hooks one block at a time, sequential mode) and for each block:

1. collects, for every linear layer the block holds, the statistics of its inputs (AWQ: the
   Hessian ``2 X^T X / n`` and mean ``|x|`` per channel; SmoothQuant: max ``|x|`` per channel and
   up to ``SmoothQuant.rows`` input rows);
2. walks the block's exact folds (``lowbit.methods.folds.FOLDS`` of the model's family, in
   order): searches the scales of the group of linears (``lowbit.methods.awq.awq_search`` or
   ``lowbit.methods.smoothquant.smoothquant_search``) and folds them (the operation before
   divided, the linears' input columns multiplied);
3. AWQ: searches each layer's clipping (q/k excepted); quantizes every planned linear of the
   block with its scheme (``lowbit.quantize``), puts the dequantized weights and the folded
   norms/biases into the model, and runs the block again for the next block's inputs.

Folds happen in the checkpoint's own layout (a column scaling commutes with GGUF's q/k row
permutation; the rows scaled, of ``v`` and ``up``, are never permuted). Tensors the plan
quantizes outside the blocks are rounded to nearest. Memory: as GPTQ's, plus SmoothQuant's rows
(``rows x in x 4`` bytes per layer group of a block).
"""

from __future__ import annotations

import math
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lowbit._progress import progress_bar
from lowbit.calibration._awq_block import do_block
from lowbit.calibration._block_args import block_args, with_block_args
from lowbit.calibration.blocks import _calibration, _capture, _find_blocks, _locate, _out, _samples
from lowbit.calibration.data import Calibration
from lowbit.calibration.gptq import _Target
from lowbit.calibration.hessians import HessianCollector
from lowbit.checkpoints import steps as qw
from lowbit.checkpoints.gguf.names import gguf_to_hf_name
from lowbit.checkpoints.readers import Checkpoint, ReplacedCheckpoint
from lowbit.checkpoints.streaming import open_model, plan_model
from lowbit.checkpoints.tokenizer import build_tokenizer
from lowbit.errors import LowbitError
from lowbit.methods.awq import AWQ
from lowbit.methods.folds import FOLDS, expand_experts, fold_family
from lowbit.methods.smoothquant import SmoothQuant
from lowbit.models._compute import compute_context
from lowbit.models._threads import _threads
from lowbit.models.build import _prefix_fix, build_model
from lowbit.models.moe import expert_of, route_all_tokens
from lowbit.plans.plan import PrecisionPlan
from lowbit.plans.rules import calibrated_method, method_name

__all__ = ["AWQRun", "awq_weights"]


@dataclass
class AWQRun:
    """What :func:`awq_weights` made and measured.

    Attributes:
        weights: checkpoint name -> :class:`~lowbit.quant.quantized_tensor.QuantizedTensor` of every
            tensor the plan quantizes (a folded layer's weights as folded).
        replaced: checkpoint name -> float32 array of every other tensor a fold changed (norm
            weights and biases, a bias of ``v``/``up``, linears the plan keeps), checkpoint
            layout: write or build with them, or the model is not the one quantized.
        methods: name -> ``awq``/``smoothquant`` (block linears) or ``rtn`` (the others).
        layers: per block linear: ``tokens``, and its relative output error on the
            calibration data, in the original input space, of round to nearest (``rtn``) and
            of the method (``awq`` / ``smoothquant``; SmoothQuant's with the activations
            quantized per token, on the rows kept).
        folds: per fold and block: ``block``, ``prev``, ``linears``, and ``alpha``, ``before``,
            ``after`` (the search's group errors) or ``skipped`` (why).
        scales: per folded block linear, ``(rows, cols)``: its stored weight is
            ``diag(1/rows) W diag(cols)`` of the original ``W`` (so ``rows * Ŵ / cols`` is the
            quantized weight in the original model's terms).
        seconds: per phase: ``load``, ``capture``, ``collect``, ``search``, ``quantize``,
            ``report``, ``propagate``, ``rtn``, ``total``.
        calibration: what the calibration data was.
    """

    weights: dict[str, Any]
    replaced: dict[str, np.ndarray]
    methods: dict[str, str]
    layers: dict[str, dict[str, float]] = field(default_factory=dict)
    folds: list[dict[str, Any]] = field(default_factory=list)
    scales: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    calibration: dict[str, Any] = field(default_factory=dict)

    def model_weights(self) -> dict[str, np.ndarray]:
        """What ``build_model(checkpoint, weights=...)`` takes: dequantized and folded tensors."""
        out = {n: qt.dequantize(np.float32) for n, qt in self.weights.items()}
        out.update(self.replaced)
        return out

    def folded_checkpoint(self, source: Any) -> Checkpoint:
        """The source with the folds applied and nothing quantized: :attr:`replaced`, and every
        folded linear's weight as ``diag(1/rows) W diag(cols)`` of its original ``W``
        (:attr:`scales`, the checkpoint's layout). It computes what the source computes (the
        folds are exact), so a second method can quantize it: SmoothQuant, then GPTQ."""
        ckpt = open_model(source)
        folded = dict(self.replaced)
        for name, (rows, cols) in self.scales.items():
            w = np.asarray(ckpt.get(name), dtype=np.float64)
            folded[name] = (w / np.asarray(rows)[:, None] * np.asarray(cols)[None, :]).astype(
                np.float32
            )
        return ReplacedCheckpoint(ckpt, folded)

    def checkpoint(self, source: Any) -> Checkpoint:
        """The source checkpoint with the folded tensors of :attr:`replaced` in place of its own
        (float32, ``F32``): what ``lowbit.checkpoints.streaming.quantize_model`` writes
        from, with ``weights=`` the quantized tensors."""
        return ReplacedCheckpoint(open_model(source), self.replaced)


def awq_weights(
    model: Any,
    scheme: Any,
    calibration: Any = None,
    method: Any = None,
    *,
    avoid_tokens: int = 0,
    exclude: Collection[str] | None = None,
    threads: int | None = None,
    progress: bool | None = None,
    default_method: str = "awq",
    compute: str = "fp32",
    targets: Mapping[str, Any] | None = None,
    _worker: Any = None,
) -> AWQRun:
    """Quantize a model's weights with AWQ, or round them after SmoothQuant's folds.

    Args:
        model: a checkpoint path, shipped model name or open checkpoint.
        scheme: a scheme string, :class:`~lowbit.quant.scheme.Scheme` or
            :class:`~lowbit.plans.plan.PrecisionPlan`.
        calibration: a :class:`~lowbit.calibration.data.Calibration`, a source string or
            None (default).
        method: :class:`~lowbit.methods.awq.AWQ` (default) or
            :class:`~lowbit.methods.smoothquant.SmoothQuant`.
        avoid_tokens, exclude, threads, progress, compute: as
            :func:`lowbit.calibration.gptq.gptq_weights` (the search runs on float32 and
            float64 statistics whatever ``compute`` is).
        default_method: how the tensors whose plan rule names no ``method`` are quantized:
            ``awq`` (default: by ``method``, AWQ or SmoothQuant) or ``rtn`` (then only the
            rules saying ``method: awq`` use AWQ). A rule's ``method`` always wins: a
            ``method: rtn`` tensor is rounded to nearest as stored, and a fold that would
            change it is skipped (``folds`` says so).
        targets: instead of ``scheme``'s plan (AWQ only): checkpoint tensor name ->
            :class:`~lowbit.methods._mlx_gptq.MLXTarget`; the block linears among them are
            scaled, clipped and rounded onto their MLX grid
            (:class:`~lowbit.methods._mlx_gptq.MLXQuantized` weights), the others left out of
            ``weights`` (the caller rounds them, from :meth:`AWQRun.checkpoint`).
        _worker: a calibration worker's session (``lowbit.calibration._workers``; AWQ
            only): statistics of the worker's shard of samples, searched and quantized on
            those summed over every worker.

    Returns:
        An :class:`AWQRun`.

    Raises:
        LowbitError: a model lowbit cannot build, a plan that cannot apply, calibration data
            that is missing or too short, a method that is neither AWQ nor SmoothQuant, a
            plan whose rules name ``gptq`` (one calibrated method per run), SmoothQuant with
            rules naming ``gptq`` or ``awq``.
    """
    import torch

    t0 = time.perf_counter()
    phases = ("load", "capture", "collect", "search", "quantize", "report", "propagate", "rtn")
    sec = dict.fromkeys(phases, 0.0)
    method = AWQ() if method is None else method
    if not isinstance(method, (AWQ, SmoothQuant)):
        raise LowbitError(f"method must be AWQ or SmoothQuant, got {type(method).__name__}")
    calib = _calibration(calibration, Calibration)
    ckpt = open_model(model)
    if targets is not None:
        if isinstance(method, SmoothQuant):
            raise LowbitError("SmoothQuant onto MLX grids is not supported; use AWQ or GPTQ")
        todo: dict[str, Any] = {
            n: _Target(n, tuple(ckpt.info(n).shape), t) for n, t in targets.items()
        }
    else:
        plan = scheme if isinstance(scheme, PrecisionPlan) else PrecisionPlan.uniform(scheme)
        todo = {t.name: t for t in plan_model(ckpt, plan).quantized}
    wanted = _wanted(todo, default_method, isinstance(method, SmoothQuant))
    tokenizer = build_tokenizer(ckpt)
    net = build_model(ckpt, progress=progress)
    causal = net.get_output_embeddings() is not None
    prefix, blocks = _find_blocks(net)
    per_block = _locate(net, ckpt, {n: t for n, t in todo.items() if n in wanted}, prefix)
    names = _param_names(net, ckpt)
    folds = FOLDS.get(fold_family((ckpt.config or {}).get("model_type")) or "", ())
    cfg = net.config
    experts = max((getattr(m, "num_experts", 0) for m in net.modules() if hasattr(m, "route_all")),
                  default=0)  # fmt: skip
    folds = expand_experts(folds, experts)
    head_dim = int(getattr(cfg, "head_dim", 0) or cfg.hidden_size // cfg.num_attention_heads)
    limit = int(getattr(cfg, "max_position_embeddings", 0) or 1 << 30)
    samples = _samples(tokenizer, calib, causal, avoid_tokens, exclude, limit)
    everything = samples
    if _worker is not None:
        samples = _worker.shard(samples)
    sec["load"] = time.perf_counter() - t0
    sq = isinstance(method, SmoothQuant)
    per_pass = math.ceil(method.rows / len(samples)) if sq else 0

    run = AWQRun({}, {}, {})
    with _threads(threads), compute_context(compute), torch.inference_mode():
        t = time.perf_counter()
        states = _capture(net, blocks[0], samples, causal)
        own_args = block_args(net, blocks, samples, causal)
        sec["capture"] = time.perf_counter() - t
        with progress_bar(len(blocks), progress, method.name, "block") as bar:
            for i, block in enumerate(blocks):
                lead = f"{prefix}.{i}."
                mine = per_block.get(i, {})
                if own_args is not None:  # this block's mask and rotary tables (layer types)
                    states = with_block_args(states, own_args[i])
                hooked = {p: net.get_submodule(p) for p in mine}
                for f in folds:
                    for lin in f.linears:
                        mod = _linear(net, lead + lin)
                        if mod is not None:
                            hooked[lead + lin] = mod
                if hooked:
                    t = time.perf_counter()
                    with (
                        route_all_tokens(block, calib.experts == "all"),
                        HessianCollector(hooked, hessian=not sq, stats=True, rows=per_pass) as col,
                    ):
                        for (h, a, k), (_, mask) in zip(states, samples, strict=True):
                            col.next_sample(mask)
                            block(h, *a, **k)
                    if _worker is not None:  # every worker's sums, in sample order
                        col = _worker.reduce(col)
                    sec["collect"] += time.perf_counter() - t
                    mine = _expert_floor(mine, col, calib, run.layers)
                    do_block(net, ckpt, i, lead, mine, todo, names, folds, head_dim, col,
                              method, run, sec)  # fmt: skip
                t = time.perf_counter()
                if i + 1 < len(blocks):
                    states = [(_out(block(h, *a, **k)), a, k) for h, a, k in states]
                sec["propagate"] += time.perf_counter() - t
                bar.update(1)
    del net, states
    t = time.perf_counter()
    for name, tp in todo.items():
        if name not in run.weights and targets is None:
            run.weights[name] = qw.read_quantized(ckpt, tp)
            run.methods[name] = "rtn"
    sec["rtn"] = time.perf_counter() - t
    sec["total"] = time.perf_counter() - t0
    run.seconds = sec
    kind = "causal-lm" if causal else "encoder"
    run.calibration = {
        **calib.to_dict(),
        "kind": kind,
        "described": calib.describe(kind),
        "samples_used": len(everything) if causal else sum(int(m.shape[0]) for _, m in everything),
        "tokens": sum(int(s["input_ids"].numel()) for s, _ in everything)
        if causal
        else sum(int(m.sum()) for _, m in everything),
    }
    return run


def _expert_floor(
    mine: dict[str, str], col: Any, calib: Any, layers: dict[str, Any]
) -> dict[str, str]:
    """``mine`` without the expert layers that saw fewer tokens than the calibration's floor
    (never routed to, or under ``expert_min_tokens``): rounded to nearest, the report says so."""
    keep = {}
    for path, name in mine.items():
        tokens = col.tokens(path)
        if expert_of(name) and (tokens == 0 or tokens < calib.expert_min_tokens):
            layers[name] = {
                "tokens": tokens,
                "fallback": f"rtn: {tokens} tokens < floor {calib.expert_min_tokens}"
                if tokens
                else "rtn: no calibration token",
            }
            continue
        keep[path] = name
    return keep


def _wanted(todo: dict[str, Any], default: str, smooth: bool) -> set[str]:
    """The planned tensors AWQ (or SmoothQuant) quantizes; the others are rounded to nearest.

    Raises:
        LowbitError: rules naming ``gptq`` (or ``default`` gptq); SmoothQuant with rules
            naming a calibrated method.
    """
    named = [t.method for t in todo.values()]
    ruled = sorted({m for m in named if m not in (None, "rtn")})
    if smooth and ruled:
        raise LowbitError(
            "SmoothQuant rounds to nearest after its folds: the plan's rules name method: "
            f"{ruled[0]}; give them method: rtn or none"
        )
    calibrated_method(named, default, run="awq")
    default = method_name(default) or "awq"
    return {n for n, t in todo.items() if (t.method or default) == "awq"}


def _linear(net: Any, path: str) -> Any:
    import torch

    try:
        mod = net.get_submodule(path)
    except AttributeError:
        return None
    return mod if isinstance(mod, torch.nn.Linear) else None


def _param_names(net: Any, ckpt: Any) -> dict[str, str]:
    """Checkpoint name -> the model's parameter path, for every checkpoint tensor."""
    fix = _prefix_fix(net, ckpt)
    out = {}
    for name in ckpt.names():
        if ckpt.format == "gguf":
            try:
                out[name] = gguf_to_hf_name(name, ckpt.config)
            except LowbitError:
                continue
        else:
            out[name] = fix(name)
    return out
