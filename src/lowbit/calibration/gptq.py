"""GPTQ on a whole model: calibration forward passes block by block, one solve per layer.

:func:`gptq_weights` is what ``lowbit eval --methods gptq`` runs. It builds the model in
float32, runs the calibration data (``lowbit.calibration.data``) up to the first block
of its stack of identical blocks (decoder layers, encoder layers), and then for each block
(GPTQ's sequential mode: block ``i`` is calibrated on the outputs of the quantized blocks
before it), in one of two orders (:class:`lowbit.methods.gptq.Sequential`):

``layers`` (default): group by group of layers that read one input (q/k/v, then o_proj,
gate/up, down_proj), collect ``H = 2 X^T X / n`` with forward hooks on the outputs of the
groups already quantized, quantize the group, go on. In pre-norm residual blocks (llama,
Mistral, Qwen2/3, Phi-3, Gemma 2/3 and their mixtures of experts, found from the block's own
structure) the block's outputs come from the same pass
(``lowbit.calibration._layer_walk.LayerWalk``); every other block (BERT's post-norm layers) is
run once per group, each pass stopped at the group's input, and once more for its outputs
(``lowbit.calibration._group_walk``).

``blocks``:

1. collect ``H`` of every linear layer the plan quantizes, from the block's inputs, with
   forward hooks (layers that read the same tensor share one ``H``);
2. quantize those layers with :func:`lowbit.methods.gptq.gptq_quantize` (the weights as the
   checkpoint stores them: GPTQ treats rows independently, so GGUF's permuted q/k rows need no
   undoing) and put the dequantized weights into the model;
3. run the block again, now quantized, to get the next block's inputs.

Tensors the plan quantizes outside the blocks (MiniLM's pooler, an untied LM head) and those
that are not linear layers are rounded to nearest as ``lowbit quantize`` does. Memory: see
``lowbit.calibration.data``'s docstring.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Collection, Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lowbit._progress import progress_bar
from lowbit._version import __version__
from lowbit.calibration._block_args import block_args, with_block_args
from lowbit.calibration._experts import expert_floor, unreached_experts
from lowbit.calibration._group_walk import walk_groups
from lowbit.calibration._layer_walk import LayerWalk as _LayerWalk
from lowbit.calibration._layer_walk import block_signature
from lowbit.calibration._memory import (
    SpilledTensors,
    _Deferred,
    _drop,
    _later_block,
    _own,
    _release_heap,
)
from lowbit.calibration._resume import Resume, source_files, tokens_digest
from lowbit.calibration.blocks import (
    _calibration,
    _capture,
    _errors,
    _find_blocks,
    _locate,
    _locate_rounded,
    _model_layout,
    _out,
    _samples,
    _set_weight,
)
from lowbit.calibration.data import (
    Calibration,
)
from lowbit.calibration.hessians import HessianCollector
from lowbit.checkpoints import steps as qw
from lowbit.checkpoints.streaming import open_model, plan_model
from lowbit.checkpoints.tokenizer import build_tokenizer
from lowbit.errors import LowbitError
from lowbit.methods.gptq import GPTQ, Sequential
from lowbit.models._compute import compute_context
from lowbit.models._threads import _numpy_blas_threads, _threads
from lowbit.models.build import build_model
from lowbit.models.moe import expert_of, route_all_tokens
from lowbit.plans.plan import PrecisionPlan
from lowbit.plans.rules import calibrated_method, method_name

__all__ = ["GPTQRun", "gptq_weights"]


@dataclass
class GPTQRun:
    """What :func:`gptq_weights` made and measured.

    Attributes:
        weights: checkpoint tensor name -> :class:`~lowbit.quant.quantized_tensor.QuantizedTensor`, for
            every tensor the plan quantizes: a mapping that keeps them on disk and reads one
            back when asked (``lowbit.calibration._memory.SpilledTensors``), so the run's
            memory does not grow with the model's depth.
        methods: name -> ``gptq`` or ``rtn`` (how each tensor was quantized).
        layers: per GPTQ layer: ``tokens`` seen, and the layer-output error
            ``tr(ΔW H ΔW^T) / tr(W H W^T)`` of round-to-nearest (``rtn``) and of GPTQ
            (``gptq``) on the calibration inputs it saw.
        seconds: per phase: ``load`` (model, tokenizer, data), ``capture`` (up to the first
            block), ``collect`` (hooked forward passes), ``solve`` (GPTQ), ``report`` (the
            errors in ``layers``), ``propagate`` (quantized forward passes), ``rtn`` (the other
            tensors), ``total``: wall-clock seconds.
        calibration: what the calibration data was (samples, tokens, source).
        cpu_seconds: the same phases in CPU seconds of this process (all its threads): what
            a time means on a shared machine.
        sequential: the order the layers were calibrated in, ``layers`` or ``blocks``
            (:class:`~lowbit.methods.gptq.Sequential`): what the method asked (``blocks`` also
            where no block was calibrated).
    """

    weights: MutableMapping[str, Any]
    methods: dict[str, str]
    layers: dict[str, dict[str, float]] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    calibration: dict[str, Any] = field(default_factory=dict)
    cpu_seconds: dict[str, float] = field(default_factory=dict)
    sequential: str = "layers"


class _Clock:
    """Wall and CPU seconds per phase (``start`` then ``stop(phase)``)."""

    PHASES = ("load", "capture", "collect", "solve", "report", "propagate", "rtn")

    def __init__(self) -> None:
        self.wall = dict.fromkeys(self.PHASES, 0.0)
        self.cpu = dict.fromkeys(self.PHASES, 0.0)
        self._t = (0.0, 0.0)

    def start(self) -> None:
        self._t = (time.perf_counter(), time.process_time())

    def stop(self, phase: str) -> None:
        self.wall[phase] += time.perf_counter() - self._t[0]
        self.cpu[phase] += time.process_time() - self._t[1]
        self.start()

    def totals(self) -> dict[str, float]:
        return {**self.wall, "total": sum(self.wall.values())}

    def cpu_totals(self) -> dict[str, float]:
        return {**self.cpu, "total": sum(self.cpu.values())}


def gptq_weights(
    model: Any,
    scheme: Any,
    calibration: Any = None,
    method: Any = None,
    *,
    avoid_tokens: int = 0,
    exclude: Collection[str] | None = None,
    threads: int | None = None,
    progress: bool | None = None,
    default_method: str = "gptq",
    compute: str = "fp32",
    targets: Mapping[str, Any] | None = None,
    rounded: Mapping[str, Callable[[], np.ndarray]] | None = None,
    resume: Resume | None = None,
    _worker: Any = None,
) -> GPTQRun:
    """Quantize a model's weights with GPTQ on calibration data.

    Args:
        model: a checkpoint path, shipped model name (``smollm2``, ``minilm``) or open
            checkpoint that ``lowbit.models.build.build_model`` can build.
        scheme: a scheme string (``int4:g128``), :class:`~lowbit.quant.scheme.Scheme` or
            :class:`~lowbit.plans.plan.PrecisionPlan` (which tensors, in which scheme).
        calibration: a :class:`~lowbit.calibration.data.Calibration`, a source string
            (``default``, a ``.txt`` or ``.jsonl`` path) or None (default).
        method: a :class:`~lowbit.methods.gptq.GPTQ` (default ``GPTQ()``).
        avoid_tokens: causal LMs: tokens at the start of the calibration text an evaluation
            scores (calibration starts after them).
        exclude: encoders: sentences an evaluation measures (never drawn for calibration);
            default: those ``lowbit eval`` measures by default (256 drawn with seed 0 from the
            calibration text).
        threads: torch threads (default: the usable cores, see
            ``lowbit.evaluation.perplexity.default_threads``).
        progress: tqdm bars (``None``: only on a terminal).
        default_method: how the tensors whose plan rule names no ``method`` are quantized:
            ``gptq`` (default) or ``rtn`` (then only the rules saying ``method: gptq`` use
            GPTQ); a rule's ``method`` always wins.
        compute: precision of the model's forward passes (capture, propagation): ``fp32``
            (default), ``bf16`` or ``auto`` (``lowbit.models._compute``); Hessians are
            summed and solved in float32/float64 either way.
        targets: instead of ``scheme``'s plan: checkpoint tensor name ->
            :class:`~lowbit.methods._ggml_gptq.GgmlTarget` (llama.cpp's block type of each
            tensor, as a mix chose it); the linear layers among them are GPTQ'd onto their
            block type (:class:`~lowbit.methods._ggml_gptq.GgmlQuantized` weights), the
            others left out of ``weights`` (the caller rounds them as llama.cpp does).
        rounded: tensors the output rounds without GPTQ: checkpoint name -> a function
            returning their rounded values (dequantized, in the checkpoint's layout). The
            token embedding's are set before the first block runs and a block's linear layers'
            before it is calibrated, so every layer GPTQ rounds sees the inputs the written
            file will give it rather than the float model's (tensors the calibration never
            runs, such as the output head, and the targets themselves are ignored). Each is
            read when its block's turn comes. Not with ``resume`` (a record could not check
            what the functions return).
        resume: a :class:`~lowbit.calibration._resume.Resume` (``lowbit quantize`` makes one
            beside its output): a record after every block, and a run that finds a matching
            record continues after its last finished block, with the same result as a run
            never interrupted. The returned ``weights`` then live in the record's folder
            (the caller removes it once they are written). Ignored by calibration workers
            and for a checkpoint with no path.
        _worker: a calibration worker's session (``lowbit.calibration._workers``): the run
            collects on the worker's shard of samples and solves on the Hessians summed over
            every worker.

    Returns:
        A :class:`GPTQRun`.

    Raises:
        LowbitError: a model lowbit cannot build, a plan that cannot apply, calibration data
            that is missing or too short, a layout GPTQ cannot walk.
    """
    import torch

    clock = _Clock()
    clock.start()
    method = GPTQ() if method is None else method
    if not isinstance(method, GPTQ):
        raise LowbitError(f"method must be a lowbit.methods.gptq.GPTQ, got {type(method).__name__}")
    calib = _calibration(calibration, Calibration)
    if rounded and resume is not None:
        raise LowbitError("a GPTQ run with rounded tensors cannot resume: give one or the other")
    ckpt = open_model(model)
    if targets is not None:
        todo: dict[str, Any] = {
            n: _Target(n, tuple(ckpt.info(n).shape), t) for n, t in targets.items()
        }
    else:
        plan = scheme if isinstance(scheme, PrecisionPlan) else PrecisionPlan.uniform(scheme)
        todo = {t.name: t for t in plan_model(ckpt, plan).quantized}
    default_method = method_name(default_method) or "gptq"
    calibrated_method([t.method for t in todo.values()], default_method, run="gptq")
    wanted = {n for n, t in todo.items() if (t.method or default_method) == "gptq"}
    tokenizer = build_tokenizer(ckpt)
    net = build_model(ckpt, progress=progress, defer=_later_block)
    causal = net.get_output_embeddings() is not None
    prefix, blocks = _find_blocks(net)
    deferred = _Deferred(net, ckpt, prefix)
    per_block = _locate(net, ckpt, {n: t for n, t in todo.items() if n in wanted}, prefix)
    as_written = {n: f for n, f in (rounded or {}).items() if n not in wanted}
    before, rounded_blocks = _locate_rounded(net, ckpt, as_written, prefix)
    limit = int(getattr(net.config, "max_position_embeddings", 0) or 1 << 30)
    samples = _samples(tokenizer, calib, causal, avoid_tokens, exclude, limit)
    everything = samples
    if _worker is not None:
        samples = _worker.shard(samples)
    clock.stop("load")

    if _worker is not None or getattr(ckpt, "path", None) is None:
        resume = None
    methods: dict[str, str] = {}
    layers: dict[str, dict[str, float]] = {}
    start = 0  # the first block to calibrate (after a resume record's last one)
    last = max(per_block, default=-1)  # no block after the last one GPTQ quantizes is run
    states: list[Any] = []
    own_args: list[Any] | None = None
    # numpy's BLAS on one thread: its idle threads spin on the cores torch's are about to use
    with (
        _threads(threads),
        _numpy_blas_threads(1),
        compute_context(compute),
        torch.inference_mode(),
    ):
        clock.start()
        saved: list[Any] = []
        if resume is not None:
            tokens = tokens_digest(everything)
            options = {"default_method": default_method, "avoid_tokens": avoid_tokens,
                       "exclude": exclude, "compute": compute}  # fmt: skip
            start = resume.open(_fingerprint(ckpt, todo, method, calib, tokens, options))
        # on disk (memory flat in depth): a resume record's folder, or a temporary one
        weights: MutableMapping[str, Any] = SpilledTensors(
            None if resume is None else resume.tensors_folder
        )
        if start:
            saved = resume.restore(weights, methods, layers)  # type: ignore[union-attr]
        for path, name in before.items():  # the embedding as the file holds it
            _set_weight(net.get_submodule(path), _model_layout(ckpt, name, as_written[name](), net))
        if last >= start:
            states = _capture(net, blocks[0], samples, causal)
            if saved:  # the resumed block's inputs: the hidden states the record kept
                states = [(h, a, k) for h, (_, a, k) in zip(saved, states, strict=True)]
            own_args = block_args(net, blocks[: last + 1], samples, causal)
        inside = {id(p) for p in blocks.parameters()}
        _drop(p for p in net.parameters() if id(p) not in inside)  # embeddings, head: done
        clock.stop("capture")
        todo_blocks = max(0, last + 1 - start)
        bar = progress_bar(todo_blocks, progress, f"gptq from block {start}" if start else "gptq",
                           "block")  # fmt: skip
        block_clock = [time.perf_counter()]

        def finished(i: int, states: list[Any]) -> None:
            """Block ``i`` is done: its resume record, the bar (with seconds per block)."""
            if resume is not None:
                hidden = [h for h, _, _ in states] if i < last else None
                resume.save(i, hidden, weights, methods, layers)
            now = time.perf_counter()
            if hasattr(bar, "set_postfix_str"):
                bar.set_postfix_str(f"block {i}: {now - block_clock[0]:.1f} s", refresh=False)
            block_clock[0] = now
            bar.update(1)

        layered = last >= 0 and method.sequential is Sequential.LAYERS
        walks: dict[Any, Any] = {}  # block signature -> its layer walk (None: group by group)
        all_experts = calib.experts == "all"
        sequential = "layers" if layered else "blocks"

        def solve(
            col: HessianCollector, mine: dict[str, str], linears: dict[str, Any], model: Any = net
        ) -> None:
            if _worker is not None:  # the sums of every worker's shard, in sample order
                col = _worker.reduce(col)
            clock.stop("collect")
            for group in col.groups().values():
                H = col.hessian(group[0], release=True)  # the sums become H: no copy
                experts = [m for m in group if expert_of(mine[m])]
                if experts:
                    group = expert_floor(group, experts, col, H, mine, calib, layers)
                    if not group:
                        continue
                H32 = H.astype(np.float32)
                for part in _expert_parts(group, mine, ckpt):
                    ws = {mine[m]: np.asarray(ckpt.get(mine[m]), dtype=np.float64) for m in part}
                    schemes = {mine[m]: todo[mine[m]].scheme for m in part}
                    qts = method.quantize_shared(ws, H, schemes)
                    clock.stop("solve")
                    for m in part:
                        name = mine[m]
                        deq = qts[name].dequantize(np.float64)
                        layers[name] = {
                            **_errors(ws[name], deq, H32, schemes[name], col.tokens(m)),
                            **layers.get(name, {}),
                        }
                        _set_weight(linears[m], _model_layout(ckpt, name, deq, model))
                        weights[name] = qts[name]
                        methods[name] = "gptq"
                    del ws, qts
                    clock.stop("report")

        with bar:
            for i, block in enumerate(blocks[: last + 1]):
                if i < start:  # done by the run the resume record is of
                    _drop(_own(blocks, block))
                    continue
                deferred.restore(i)  # this block's weights, read now
                for path, name in rounded_blocks.get(i, {}).items():  # the file's, not GPTQ's
                    arr = _model_layout(ckpt, name, as_written[name](), net)
                    _set_weight(net.get_submodule(path), arr)
                _release_heap()
                if own_args is not None:  # this block's mask and rotary tables (layer types)
                    states = with_block_args(states, own_args[i])
                mine = per_block.get(i, {})
                linears = {m: net.get_submodule(m) for m in mine}
                clock.start()
                sig = block_signature(block)
                if layered and sig not in walks:  # the structure of this kind of block
                    walks[sig] = _LayerWalk.of(block, states, method)
                walk = walks.get(sig)
                # where the walk cannot decompose the block, the layers order runs group by group
                groupwise = walk is None and layered
                if walk is not None:  # one pass: collect, solve, propagate, layer group by group
                    walk.run(
                        block, states, samples, linears,
                        lambda c, m=mine, ls=linears: solve(c, m, ls), outputs=i < last,
                        collecting=lambda b=block: route_all_tokens(b, all_experts),
                    )  # fmt: skip
                    _drop(_own(blocks, block))  # never run again
                    finished(i, states)
                    clock.stop("propagate")
                    continue
                if mine and groupwise:  # layers order, group by group of the block's passes
                    with route_all_tokens(block, all_experts):
                        walk_groups(
                            block, states, samples, linears, lambda c, ls, m=mine: solve(c, m, ls)
                        )
                elif mine:
                    with route_all_tokens(block, all_experts), HessianCollector(linears) as col:
                        for (hidden, args, kwargs), (_, mask) in zip(states, samples, strict=True):
                            col.next_sample(mask)
                            col.run(block, hidden, *args, **kwargs)
                    solve(col, mine, linears)
                if i < last:
                    for j, (h, a, k) in enumerate(states):  # in place: one sample's copy extra
                        states[j] = (_out(block(h, *a, **k)), a, k)
                        del h
                _drop(_own(blocks, block))  # never run again
                finished(i, states)
                clock.stop("propagate")
    del net, states
    clock.start()
    unreached_experts(wanted, weights, layers)
    for name, tp in todo.items():
        if name not in weights and targets is None:
            weights[name] = qw.read_quantized(ckpt, tp)
            methods[name] = "rtn"
    clock.stop("rtn")
    calib_facts = {
        **calib.to_dict(),
        "kind": "causal-lm" if causal else "encoder",
        "described": calib.describe("causal-lm" if causal else "encoder"),
        "samples_used": len(everything) if causal else sum(int(m.shape[0]) for _, m in everything),
        "tokens": sum(int(s["input_ids"].numel()) for s, _ in everything)
        if causal
        else sum(int(m.sum()) for _, m in everything),
    }
    return GPTQRun(
        weights, methods, layers, clock.totals(), calib_facts, clock.cpu_totals(), sequential
    )


# ---------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------


#: float64 bytes of weights one shared solve takes at most when a group is split by expert
_EXPERT_PART_BYTES = 256 << 20


def _expert_parts(group: list[str], mine: dict[str, str], ckpt: Any) -> list[list[str]]:
    """A layer group's members in the solves that quantize them with its Hessian: the whole
    group, except that experts (one Hessian for all of them when every token goes through
    every expert, ``--moe-calibrate all``) go whole expert by whole expert, in parts of at
    most :data:`_EXPERT_PART_BYTES` of float64 weights. Rows are independent in GPTQ, so
    the codes are the same; before, the 64 gate/up pairs of a 64-expert block were one
    stacked solve of 2.1 GB of float64 weights, held four times over (a one-block folder of
    the generated 7B-class model peaked at 14.9 GB of anonymous memory; 5.1 GB in parts)."""
    which = {m: expert_of(mine[m]) for m in group}
    by_expert: dict[int, list[str]] = {}
    for m, ex in which.items():
        if ex is not None:
            by_expert.setdefault(ex[0], []).append(m)
    if len(by_expert) <= 1:
        return [group]
    parts: list[list[str]] = [[m for m in group if which[m] is None]]  # not an expert: a shared one
    size = 0
    for members in by_expert.values():
        nbytes = sum(8 * int(np.prod(ckpt.info(mine[m]).shape)) for m in members)
        if parts[-1] and size + nbytes > _EXPERT_PART_BYTES:
            parts.append([])
            size = 0
        parts[-1] += members
        size += nbytes
    return [p for p in parts if p]


def _fingerprint(
    ckpt: Any, todo: Mapping[str, Any], method: GPTQ, calib: Any, tokens: str, env: Any
) -> dict[str, Any]:
    """Everything a GPTQ run's result depends on, for its resume record (``_resume``)."""
    import torch

    def scheme(s: Any) -> Any:
        if hasattr(s, "to_dict"):
            return s.to_dict()
        if hasattr(s, "key"):  # a llama.cpp or MLX grid: its importance vector's bytes too
            h = hashlib.sha256()
            for part in s.key():
                h.update(part if isinstance(part, bytes) else repr(part).encode())
                h.update(b"\0")
            return h.hexdigest()
        return repr(s)

    plan = {n: [scheme(t.scheme), t.method] for n, t in sorted(todo.items())}
    plan_json = json.dumps(plan, sort_keys=True, default=repr).encode()
    exclude = env.get("exclude")
    return {
        "lowbit": __version__,
        "numpy": np.__version__,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "source": source_files(ckpt.path),
        "plan": hashlib.sha256(plan_json).hexdigest(),
        "method": method.to_dict(),
        "default_method": env.get("default_method"),
        "calibration": calib.to_dict(),
        "tokens": tokens,
        "avoid_tokens": env.get("avoid_tokens"),
        "exclude": None if exclude is None else sorted(exclude),
        "compute": env.get("compute"),
    }


@dataclass(frozen=True)
class _Target:
    """A tensor GPTQ rounds onto a llama.cpp block type (``targets``), as a plan's tensor."""

    name: str
    shape: tuple[int, ...]
    scheme: Any
    method: str | None = None
