"""Block-local sensitivity: each trial runs one block, not the model (``--measure block``).

The whole-model measure (:mod:`lowbit.evaluation.sensitivity`, ``exact``, and
:mod:`lowbit.evaluation.gguf_sensitivity`) runs the model from the tensor's block to the logits
for every trial: about ``tensors x candidates x blocks / 2`` block forwards, a day and a half
for a GGUF budget of an 8B model on two cores. This measure runs ``tensors x candidates``
block forwards (each trial one block) plus about four passes of the model, and holds one
block's weights and activations at a time (two blocks: the first stays loaded), whatever the
depth:

1. **Forward** (the walk GPTQ uses: :func:`lowbit.calibration.blocks._capture`, each block's
   own arguments, later blocks read only at their turn and freed after it): the calibration
   windows go through the original model block by block; each block's input hidden states are
   spilled to a temporary folder (``.npy``), the last block's output kept.
2. **The gradient at the top**: next tokens are *drawn from the model's own distribution*
   (:func:`lowbit.evaluation._sensitivity_runner.sample_next`, seeded) and the gradient of
   their summed cross-entropy with respect to the last block's output is taken through the
   final norm and the head. Its square, averaged over draws, estimates the diagonal of the
   Fisher information of each position's next-token distribution, which is the Hessian of
   KL(original || trial) at the original (``Runner.output_moments`` explains the sampling).
3. **Backward, block by block, with the trials** (last block first): block ``b`` is read, run
   on its spilled input with gradients, and the gradient ``g`` reaching its output (from block
   ``b + 1``) gives ``G_b = g^2`` per position and coordinate: the Fisher diagonal at block
   ``b``'s output, *through every later block*. Each tensor of the block in each candidate is
   then quantized alone, the block run again on the same inputs, and its output error
   ``delta`` gives the damage

       D = 1/2 * sum_{t,d} G_b[t, d] * delta[t, d]^2 / positions,

   the second-order estimate of the mean KL(original || trial) in nats with the Fisher taken
   diagonal (what it leaves out: the cross terms between coordinates and positions, and
   higher orders). Then ``g`` goes back through the block to its input, the block is freed.
   The token embedding's error enters the first block's input and is weighted by the
   gradient there.
4. **The head** (``lm_head``/``output.weight``, or a token embedding tied to it): the exact mean
   KL of the trial's next-token distributions against the original's, from the original last
   hidden states (the model's own final norm and head: every block is replaced by a function
   returning those states). A tied embedding's damage is its input part plus its head part.

Memory: two blocks' weights, the embeddings and head, one block's activations and gradients
(with the block's recomputed forward), the spilled block inputs on disk (``blocks x positions
x hidden x 4`` bytes). Causal LMs only.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lowbit.calibration._block_args import block_args, with_block_args
from lowbit.calibration._memory import _HEAD_KEY, _Deferred, _drop, _later_block, _own
from lowbit.calibration.blocks import _capture, _find_blocks, _out
from lowbit.checkpoints.readers import Checkpoint
from lowbit.errors import LowbitError
from lowbit.evaluation._sensitivity_runner import TensorWeights, sample_next
from lowbit.evaluation.scan_samples import ScanSamples
from lowbit.models._compute import compute_context, resolve_compute
from lowbit.models.build import build_model

__all__ = ["BLOCK_METRIC", "BlockDamages", "block_damages"]

BLOCK_METRIC = (
    "block-local: 1/2 sum G * (block output error)^2 per position, G the squared gradient of "
    "the sampled next-token loss at the block's output (estimated mean KL, nats)"
)

Roundtrip = Callable[[str, np.ndarray, str], np.ndarray]
"""``(tensor name, its float32 values as the checkpoint stores them, candidate)`` -> the values
that candidate stores, decoded (same layout)."""

_DRAWS = 4  # sampled next tokens per position for the gradient (their squares averaged)


@dataclass
class BlockDamages:
    """``damages``: ``{tensor: {candidate: estimated mean KL, nats}}``; ``seconds`` per phase;
    ``blocks``: trials per block, in walk order."""

    damages: dict[str, dict[str, float]]
    seconds: dict[str, float] = field(default_factory=dict)
    blocks: list[int] = field(default_factory=list)


def _defer(key: str) -> bool:
    """Blocks after the first are read at their turn; the head is needed (its trials)."""
    return _later_block(key) and not _HEAD_KEY.search(key)


class _Walk:
    """One model built with its later blocks deferred, its windows, block 0's inputs."""

    def __init__(self, checkpoint: Checkpoint, calibration: ScanSamples, batch: int) -> None:
        import torch

        self.torch = torch
        self.net = build_model(checkpoint, progress=False, defer=_defer)
        if self.net.get_output_embeddings() is None:
            raise LowbitError("block-local sensitivity needs a causal LM (its loss is next-token)")
        self.prefix, self.blocks = _find_blocks(self.net)
        self.deferred = _Deferred(self.net, checkpoint, self.prefix)
        ids = torch.tensor(calibration.windows, dtype=torch.long)
        self.samples = [
            ({"input_ids": ids[i : i + batch]}, None) for i in range(0, len(ids), batch)
        ]
        with torch.no_grad():
            self.states = _capture(self.net, self.blocks[0], self.samples, True)
            self.args = block_args(self.net, self.blocks, self.samples, True)
        self.tuple_out = False

    def run(self, i: int, states: list[Any]) -> list[Any]:
        """Block ``i``'s outputs (hidden states) on ``states``."""
        outs = []
        for h, a, k in states:
            r = self.blocks[i](h, *a, **k)
            self.tuple_out = isinstance(r, tuple)
            outs.append(_out(r).detach())
        return outs

    def block_states(self, i: int, hidden: list[Any]) -> list[Any]:
        """Block ``i``'s inputs: ``hidden`` with its arguments."""
        states = [(h, a, k) for h, (_, a, k) in zip(hidden, self.states, strict=True)]
        return with_block_args(states, self.args[i]) if self.args is not None else states

    def forward(self, spill: Any) -> list[Any]:
        """Every block in turn on the original weights (each read, then freed), its input
        hidden states saved in folder ``spill``; the last block's outputs."""
        hidden = [h for h, _, _ in self.states]
        for i in range(len(self.blocks)):
            self.deferred.restore(i)
            for n, h in enumerate(hidden):
                np.save(f"{spill}/{i}.{n}.npy", h.float().numpy(), allow_pickle=False)
            hidden = self.run(i, self.block_states(i, hidden))
            _drop(_own(self.blocks, self.blocks[i]))
        return hidden

    @contextmanager
    def from_last(self, hidden: list[Any]) -> Iterator[list[int]]:
        """Every block returns ``hidden[n]`` (the current sample ``n``, set in the yielded
        list): the model's own forward then runs only its embeddings, final norm and head."""
        at = [0]
        tuple_out = self.tuple_out

        def forward(*args: Any, **kwargs: Any) -> Any:
            h = hidden[at[0]]
            return (h,) if tuple_out else h

        for b in self.blocks:
            b.forward = forward
        try:
            yield at
        finally:
            for b in self.blocks:
                b.__dict__.pop("forward", None)

    def logits(self, hidden: list[Any], n: int, at: list[int]) -> Any:
        at[0] = n
        return self.net(**self.samples[n][0], use_cache=False).logits[:, :-1].float()


def _top_gradient(walk: _Walk, hidden: list[Any], seed: int) -> list[Any]:
    """Per sample, the gradient of the sampled next tokens' cross-entropy at the last block's
    output, one per draw (``_DRAWS`` x batch x positions x hidden)."""
    torch = walk.torch
    gen = torch.Generator().manual_seed(seed)
    out = []
    leaves = [h.detach().clone().requires_grad_(True) for h in hidden]
    flags = [(p, p.requires_grad) for p in walk.net.parameters()]
    try:
        for p, _ in flags:
            p.requires_grad_(False)
        with torch.enable_grad(), walk.from_last(leaves) as at:
            for n in range(len(leaves)):
                logits = walk.logits(leaves, n, at)
                grads = []
                for _ in range(_DRAWS):
                    labels = sample_next(logits, gen)
                    loss = torch.nn.functional.cross_entropy(
                        logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), reduction="sum"
                    )
                    (g,) = torch.autograd.grad(loss, leaves[n], retain_graph=True)
                    grads.append(g.float())
                out.append(torch.stack(grads))
    finally:
        for p, flag in flags:
            p.requires_grad_(flag)
    return out


def _squared(g: list[Any]) -> list[Any]:
    """``G = mean over draws of g^2`` per sample, float64."""
    return [(x.double() ** 2).mean(0) for x in g]


def _weighted(G: list[Any], outs: list[Any], ref: list[Any], positions: int) -> float:
    """``1/2 sum G * (outs - ref)^2 / positions`` over the samples, in float64 sums."""
    total = 0.0
    for w, o, r in zip(G, outs, ref, strict=True):
        d = o.double() - r.double()
        total += float((w * d * d).sum())
    return 0.5 * total / positions


def _head_kl(walk: _Walk, hidden: list[Any], ref: list[Any]) -> float:
    """Mean KL(original || now) of the next-token distributions from the original last hidden
    states (``ref``: the original log-probabilities per sample)."""
    torch = walk.torch
    total, count = 0.0, 0
    with walk.from_last(hidden) as at:
        for n in range(len(hidden)):
            lp1 = torch.log_softmax(walk.logits(hidden, n, at).double(), -1)
            lp0 = ref[n]
            total += float((lp0.exp() * (lp0 - lp1)).sum())
            count += lp1.shape[0] * lp1.shape[1]
    return total / count


def _backward(walk: _Walk, i: int, states: list[Any], g: list[Any]) -> tuple[list[Any], list[Any]]:
    """Block ``i`` run on ``states`` with gradients: its outputs, and the gradients ``g`` at
    its output (one per draw) taken back to its input."""
    torch = walk.torch
    outs, back = [], []
    with torch.enable_grad():
        for (h, a, k), gn in zip(states, g, strict=True):
            leaf = h.detach().requires_grad_(True)
            out = _out(walk.blocks[i](leaf, *a, **k))
            outs.append(out.detach())
            grads = [
                torch.autograd.grad(out, leaf, grad_outputs=gd.to(out.dtype), retain_graph=True)[0]
                for gd in gn
            ]
            back.append(torch.stack(grads).float())
    return outs, back


def block_damages(
    checkpoint: Checkpoint,
    trials: Mapping[str, Sequence[str]],
    roundtrip: Roundtrip,
    calibration: ScanSamples,
    *,
    batch: int = 4,
    progress: Callable[[int, int], None] | None = None,
    compute: str = "fp32",
    seed: int = 0,
) -> BlockDamages:
    """The block-local damage of every tensor of ``trials`` in each of its candidates.

    Args:
        checkpoint: an open checkpoint of a causal LM lowbit builds.
        trials: ``{tensor: candidates}`` (checkpoint names; the candidates are what
            ``roundtrip`` takes).
        roundtrip: the tensor's values in a candidate, decoded (:data:`Roundtrip`).
        calibration: token windows (keep them apart from the evaluation's text).
        batch: windows per forward pass.
        progress: ``progress(done, total)`` after each trial.
        compute: precision of the block forwards (``fp32``, ``bf16``, ``auto``).
        seed: of the sampled next tokens of the gradient.

    Returns:
        A :class:`BlockDamages`.

    Raises:
        LowbitError: not a causal LM, no windows, a tensor that fills no parameter or that
            lies outside every block and is neither the token embedding nor the head.
    """
    if not calibration.windows:
        raise LowbitError("block-local sensitivity needs token windows of a causal LM")
    compute = resolve_compute(compute)
    with tempfile.TemporaryDirectory(prefix="lowbit-blocks-") as spill, compute_context(compute):
        return _damages(checkpoint, trials, roundtrip, calibration, batch, progress, seed, spill)


def _damages(
    checkpoint: Checkpoint,
    trials: Mapping[str, Sequence[str]],
    roundtrip: Roundtrip,
    calibration: ScanSamples,
    batch: int,
    progress: Callable[[int, int], None] | None,
    seed: int,
    spill: str,
) -> BlockDamages:
    import torch

    seconds: dict[str, float] = {}
    t0 = time.perf_counter()
    with torch.no_grad():
        first = _Walk(checkpoint, calibration, batch)
        last = first.forward(spill)
    seconds["forward"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    g = _top_gradient(first, last, seed)
    seconds["gradient"] = time.perf_counter() - t0
    tuple_out = first.tuple_out
    del first

    t0 = time.perf_counter()
    walk = _Walk(checkpoint, calibration, batch)  # its blocks read again, last first
    walk.tuple_out = tuple_out
    positions = sum(int(s["input_ids"].shape[0]) * (int(s["input_ids"].shape[1]) - 1)
                    for s, _ in walk.samples)  # fmt: skip
    weights = TensorWeights(walk.net, checkpoint)
    params = {n: weights.param(n) for n in trials}
    index = {id(p): i for i, b in enumerate(walk.blocks) for p in b.parameters()}
    embed = walk.net.get_input_embeddings().weight
    head = walk.net.get_output_embeddings().weight
    per_block: dict[int, list[str]] = {}
    outside: list[str] = []
    for n, p in params.items():
        if id(p) in index:
            per_block.setdefault(index[id(p)], []).append(n)
        elif p is embed or p is head:
            outside.append(n)
        else:
            raise LowbitError(
                f"tensor {n!r} lies outside every block and is neither the token embedding "
                "nor the output head: block-local sensitivity cannot measure it (use the "
                "whole-model measure)"
            )
    total = sum(len(c) for c in trials.values())
    done = [0]
    damages: dict[str, dict[str, float]] = {n: {} for n in trials}

    def each(name: str, measure: Callable[[], float]) -> None:
        p = params[name]
        w = np.asarray(checkpoint.get(name), dtype=np.float32)
        # a float32 parameter holding the checkpoint's values is restored from them, not from
        # a clone (2.1 GB more for an 8B output head or embedding); anything else is cloned
        same = p.dtype == torch.float32 and np.array_equal(
            p.detach().numpy(), weights.model_layout(name, w)
        )
        saved = None if same else p.detach().clone()
        try:
            for c in trials[name]:
                try:
                    w_hat = roundtrip(name, w, c)
                except LowbitError as exc:
                    raise LowbitError(f"tensor {name!r} as {c}: {exc}") from None
                weights.fill(p, name, w_hat)
                del w_hat  # the next candidate's rounding does not hold this one beside it
                with torch.no_grad():
                    damages[name][c] = damages[name].get(c, 0.0) + max(0.0, measure())
                done[0] += 1
                if progress is not None:
                    progress(done[0], total)
        finally:
            if saved is None:
                weights.fill(p, name, w)
            else:
                with torch.no_grad():
                    p.copy_(saved)

    heads = [n for n in outside if params[n] is head]
    if heads:  # the head's exact KL, from the original last hidden states
        with torch.no_grad(), walk.from_last(last) as at:
            ref = [torch.log_softmax(walk.logits(last, n, at).double(), -1)
                   for n in range(len(last))]  # fmt: skip
        for n in heads:
            with torch.no_grad():
                each(n, lambda: _head_kl(walk, last, ref))
        del ref
    counts: list[int] = [0] * len(walk.blocks)
    for i in reversed(range(len(walk.blocks))):
        walk.deferred.restore(i)
        hidden = [torch.from_numpy(np.load(f"{spill}/{i}.{n}.npy", allow_pickle=False))
                  for n in range(len(walk.samples))]  # fmt: skip
        states = walk.block_states(i, hidden)
        outs, back = _backward(walk, i, states, g)
        G = _squared(g)
        for n in per_block.get(i, []):
            with torch.no_grad():
                each(
                    n, lambda i=i, s=states, o=outs, w=G: _weighted(w, walk.run(i, s), o, positions)
                )
            counts[i] += len(trials[n])
        g = back
        if i:
            _drop(_own(walk.blocks, walk.blocks[i]))
    embeds = [n for n in outside if params[n] is embed]
    if embeds:  # the embedding's error at the first block's input, weighted by the gradient there
        G = _squared(g)
        h0 = [h for h, _, _ in walk.states]
        tied = {n for n in heads}
        part = {n: damages[n].copy() for n in embeds if n in tied}
        for n in embeds:
            damages[n] = {}

            def into_first() -> float:
                got = _capture(walk.net, walk.blocks[0], walk.samples, True)
                return _weighted(G, [h for h, _, _ in got], h0, positions)

            with torch.no_grad():
                each(n, into_first)
            for c, v in part.get(n, {}).items():  # a tied embedding: plus its head part
                damages[n][c] += v
    seconds["trials"] = time.perf_counter() - t0
    return BlockDamages(damages, seconds, counts)
