"""Running a model for a sensitivity scan: the original once, each trial from its block on.

- **The cache.** The hidden states entering block ``b`` are the same for every trial inside
  blocks ``>= b``, so one pass of the original caches the input of every block for every
  calibration batch, and a trial runs only blocks ``b..end``: blocks before ``b`` become
  pass-throughs and a pre-hook on block ``b`` feeds it the cached input, so the model's own
  forward (masks, rotary embeddings, norms, pooling) runs unchanged.
- **The head, without materialising log-probabilities.** For a causal LM whose logits are its
  output linear layer applied to the final hidden state ``h`` (``z = W h + c``), the KL of a
  trial with final hidden state ``h'`` at one position is

      KL(p || q) = sum_v p_v log p_v - sum_v p_v z'_v + logsumexp(z')
                 = const - mu . h' + logsumexp(W h' + c),
      mu = W^T p,   const = sum_v p_v log p_v - p . c,

  so the reference keeps ``mu`` (hidden-size floats per position) and ``const`` instead of
  ``tokens x vocab`` log-probabilities, and a trial computes its logits a chunk of positions
  at a time only for the log-sum-exp (in float64 sums). The reference pass checks that the
  model's logits are that linear map; when they are not (soft-capping, scaling), trials fall
  back to the model's own logits against stored log-probabilities.
- **Input moments** (the proxy's ``E[x_j^2]``) come from one pass of the original that stops
  as soon as every hooked layer has seen its input (before the output head of a causal LM).
- **Output-gradient moments** (the Fisher proxy's ``E[g_i^2]``, :meth:`Runner.output_moments`)
  come from one forward and backward pass of the original per batch: the loss is the
  cross-entropy of next tokens *sampled from the model's own distribution*, and a hook on each
  scanned linear's output keeps the square of the gradient reaching it.

Memory: the model, plus ``blocks x tokens x hidden x 4`` bytes of cached inputs, plus
``tokens x (hidden + 1) x 4`` bytes of reference (the shortcut) or ``tokens x vocab x 4``
(the fallback) or the sentence embeddings (encoders).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np

from lowbit.checkpoints.gguf.names import gguf_to_hf_array, gguf_to_hf_name
from lowbit.checkpoints.readers import Checkpoint
from lowbit.errors import LowbitError
from lowbit.models._compute import exact
from lowbit.models.build import _prefix_fix

__all__ = ["Runner", "TensorWeights", "block_of", "sample_next"]

# Positions per chunk of trial logits (chunk x vocab x 4 bytes: 100 MB for a 49,152 vocab).
_CHUNK = 512


def sample_next(logits: Any, generator: Any) -> Any:
    """One next token per position drawn from the model's own distribution ``softmax(logits)``
    (float64 probabilities; ``logits`` is ``batch x positions x vocab``), with ``generator``
    (a seeded ``torch.Generator``): ``batch x positions`` token ids."""
    import torch

    probs = torch.softmax(logits.detach().double(), dim=-1).reshape(-1, logits.shape[-1])
    return torch.multinomial(probs, 1, generator=generator).reshape(logits.shape[:-1])


class _Stop(Exception):
    """Raised by a hook to end a forward pass once what it needs has been seen."""


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


class TensorWeights:
    """Checkpoint tensor name -> the model parameter it fills (and the row reordering)."""

    def __init__(self, model: Any, checkpoint: Checkpoint) -> None:
        self.params = dict(model.named_parameters())
        self.modules = dict(model.named_modules())
        self.gguf = checkpoint.format == "gguf"
        self.cfg = checkpoint.config or {}
        # the model's names: the base-model prefix and the family's renames (Mixtral's experts)
        self._fix = None if self.gguf else _prefix_fix(model, checkpoint)

    def key(self, name: str) -> str:
        return gguf_to_hf_name(name, self.cfg) if self._fix is None else self._fix(name)

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
        return gguf_to_hf_array(gguf_to_hf_name(name, self.cfg), arr, self.cfg)

    def fill(self, p: Any, name: str, arr: np.ndarray) -> None:
        """Write a checkpoint-layout array into the parameter ``p`` in the model's layout,
        copying the array first only where torch cannot read it in place (not contiguous or
        read-only): an 8B output head is 2.1 GB of float32 a copy."""
        import torch

        a = np.require(self.model_layout(name, arr), requirements=["C", "W"])
        with torch.no_grad():
            p.copy_(torch.from_numpy(a))


def block_of(weights: TensorWeights, blocks: Any, name: str) -> int:
    """Index of the block holding a tensor's parameter (-1: outside every block)."""
    p = weights.param(name)
    for i, block in enumerate(blocks):
        if any(q is p for q in block.parameters()):
            return i
    return -1


class Runner:
    """Runs the model on the calibration data; caches block inputs; measures trials.

    ``head_shortcut=False`` keeps the reference log-probabilities and the model's own logits
    (for checking the shortcut: same numbers up to rounding).
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        kind: str,
        calib: Any,
        batch: int,
        head_shortcut: bool = True,
    ) -> None:
        import torch

        self.torch = torch
        self.model = model
        self.kind = kind
        self.blocks = _blocks(model)
        self.batches = self._batches(tokenizer, calib, batch)
        self.cache: list[list[Any]] = []  # per batch, per block: the block's hidden input
        # per batch: (const, mu) with the head shortcut, log-probs without, or embeddings
        self.ref: list[Any] = []
        self.block_returns_tuple = False
        head = model.get_output_embeddings() if kind == "causal" else None
        self.head = head if head_shortcut and isinstance(head, torch.nn.Linear) else None

    def _batches(self, tokenizer: Any, calib: Any, batch: int) -> list[dict[str, Any]]:
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

    def _logits(self, h: Any) -> Any:
        """The head's logits of ``h``, in float32 whatever the compute precision (the
        shortcut's log-sum-exp needs them; with fp32 compute this is the model's own map)."""
        assert self.head is not None
        with exact():
            return self.torch.nn.functional.linear(h.float(), self.head.weight, self.head.bias)

    def _head_reference(self, logits: Any) -> tuple[Any, Any]:
        """``(const, mu)`` per position (flattened) from the reference logits, in float64 so
        that the probabilities sum to 1 (a float32 softmax's excess multiplies the trial's
        log-sum-exp: 1e-5 of 20 nats is a 2e-4 nats bias)."""
        torch = self.torch
        assert self.head is not None
        w = self.head.weight.double()
        logits = logits.reshape(-1, logits.shape[-1])
        consts, mus = [], []
        for i in range(0, logits.shape[0], _CHUNK):
            lp = torch.log_softmax(logits[i : i + _CHUNK].double(), dim=-1)
            p = lp.exp()
            const = (p * lp).sum(-1)
            if self.head.bias is not None:
                const = const - p @ self.head.bias.double()
            consts.append(const)
            mus.append(p @ w)
        return torch.cat(consts), torch.cat(mus)

    def _head_kl(self, h: Any, ref: tuple[Any, Any]) -> tuple[float, int]:
        """Summed KL over positions from the trial's head input, a chunk at a time."""
        torch = self.torch
        const, mu = ref
        h = h.reshape(-1, h.shape[-1])
        total = float((const.sum() - (mu * h.double()).sum()).item())
        for i in range(0, h.shape[0], _CHUNK):
            z = self._logits(h[i : i + _CHUNK])
            m = z.max(-1, keepdim=True).values
            s = torch.exp(z - m).sum(-1, dtype=torch.float64)
            total += float((m.squeeze(-1).double() + torch.log(s)).sum().item())
        return total, h.shape[0]

    def _run_to_head(self, inputs: dict[str, Any]) -> Any:
        """The model from its inputs to the input of its output head (the head not run)."""
        got: list[Any] = []

        def stop(_mod: Any, args: tuple[Any, ...]) -> None:
            got.append(args[0])
            raise _Stop

        hook = self.head.register_forward_pre_hook(stop)  # type: ignore[union-attr]
        try:
            self.model(**inputs)
        except _Stop:
            pass
        finally:
            hook.remove()
        if not got:
            raise LowbitError("the model's output layer did not run")
        return got[0][:, :-1]

    def reference(self) -> None:
        """One pass of the original: the cached block inputs and the reference outputs."""
        torch = self.torch
        captured: list[Any] = []
        head_in: list[Any] = []

        def grab(_mod: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            h = args[0] if args else kwargs["hidden_states"]
            captured.append(h.detach())

        def returns(_mod: Any, _args: Any, output: Any) -> None:
            self.block_returns_tuple = isinstance(output, tuple)

        hooks = [b.register_forward_pre_hook(grab, with_kwargs=True) for b in self.blocks]
        hooks.append(self.blocks[0].register_forward_hook(returns))
        if self.head is not None:
            hooks.append(self.head.register_forward_pre_hook(lambda _m, a: head_in.append(a[0])))
        try:
            low = torch.is_autocast_enabled("cpu")  # a bf16 compute precision
            with torch.inference_mode():
                for inputs in self.batches:
                    captured.clear()
                    head_in.clear()
                    out = self.model(**inputs)
                    self.cache.append(list(captured))
                    summary = self._summary(out, inputs)
                    if self.head is not None and not self.ref:  # the map is the same for all
                        mine = torch.log_softmax(self._logits(head_in[0][:, :-1]), dim=-1)
                        # bf16 logits (--compute bf16) carry about 3 significant digits
                        tol = 0.25 if low else 1e-4
                        if len(head_in) != 1 or not torch.allclose(mine, summary, atol=tol):
                            self.head = None  # the logits are not the head's linear map
                    if self.head is not None:
                        # with bf16 compute the reference takes the head in float32, as trials do
                        logits = self._logits(head_in[0][:, :-1]) if low else out.logits[:, :-1]
                        const, mu = self._head_reference(logits)
                        # the rounding residual of the original itself (about 1e-7 nats per
                        # position), taken off so that the original scores 0 exactly
                        zero, _ = self._head_kl(head_in[0][:, :-1], (const, mu))
                        self.ref.append((const - zero / const.numel(), mu))
                    else:
                        self.ref.append(summary)
                    del out, summary
        finally:
            for hk in hooks:
                hk.remove()
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
                if self.head is not None:
                    s, n = self._head_kl(self._run_to_head(inputs), self.ref[b])
                else:
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
        """E[x_j^2] of every named linear layer's input over the calibration data.

        Each pass stops once every named layer has seen its input (a causal LM's logits are
        never computed unless its output layer is one of them, and then that layer not run).
        """
        torch = self.torch
        sums: dict[str, Any] = {}
        counts: dict[str, int] = {}
        seen: set[str] = set()
        named = dict(self.model.named_modules())
        wanted = {m for m in modules if m in named}
        hooks = []
        for m in wanted:

            def grab(_mod: Any, args: tuple[Any, ...], name: str = m) -> None:
                x = args[0].detach().float().reshape(-1, args[0].shape[-1])
                sums[name] = sums.get(name, 0) + (x * x).sum(0).double()
                counts[name] = counts.get(name, 0) + x.shape[0]
                seen.add(name)
                if seen == wanted:
                    raise _Stop

            hooks.append(named[m].register_forward_pre_hook(grab))
        try:
            with torch.inference_mode():
                for inputs in self.batches:
                    seen.clear()
                    try:
                        self.model(**inputs)
                    except _Stop:
                        pass
        finally:
            for h in hooks:
                h.remove()
        return {m: (sums[m] / counts[m]).numpy() for m in modules if m in sums}

    def output_moments(self, modules: Sequence[str], seed: int = 0) -> dict[str, np.ndarray]:
        """E[g_i^2] of every named linear layer's output gradient over the calibration tokens.

        ``g`` is the gradient, with respect to the layer's output at one position, of the summed
        cross-entropy ``-sum_t log q(y_t | x_<=t)`` of next tokens ``y_t`` drawn from the model's
        own next-token distribution (:func:`sample_next`, a ``torch.Generator`` seeded with
        ``seed``, batches in order). Why sampled tokens: at the original weights the expected
        outer product of this gradient over ``y ~ p`` is the Fisher information, which is the
        Hessian of ``KL(p || q)`` (the exact measure) at ``q = p``; the gradient of KL to a
        detached copy of the model's own output is zero there, and the argmax token would give
        a biased, smaller estimate. With independent draws the cross terms between positions
        (one backward pass for the sum of all positions' losses) vanish in expectation.

        Only causal LMs (an encoder's exact measure has no such likelihood). Parameters get
        no gradients: the backward pass computes activations' gradients only.

        Raises:
            LowbitError: an encoder, or a named layer that did not run.
        """
        torch = self.torch
        if self.kind != "causal":
            raise LowbitError("the fisher proxy needs a causal LM (its loss is next-token)")
        sums: dict[str, Any] = {}
        counts: dict[str, int] = {}
        named = dict(self.model.named_modules())
        wanted = [m for m in modules if m in named]
        hooks = []
        for m in wanted:

            def keep(_mod: Any, _args: Any, out: Any, name: str = m) -> None:
                if not out.requires_grad:
                    return

                def grad(g: Any) -> None:
                    g = g.detach().double().reshape(-1, g.shape[-1])
                    sums[name] = sums.get(name, 0) + (g * g).sum(0)
                    counts[name] = counts.get(name, 0) + g.shape[0]

                out.register_hook(grad)

            hooks.append(named[m].register_forward_hook(keep))

        def leaf(_mod: Any, _args: Any, out: Any) -> Any:
            return out.detach().requires_grad_(True)

        hooks.append(self.model.get_input_embeddings().register_forward_hook(leaf))
        flags = [(p, p.requires_grad) for p in self.model.parameters()]
        gen = torch.Generator().manual_seed(seed)
        try:
            for p, _ in flags:
                p.requires_grad_(False)
            with torch.enable_grad():
                for inputs in self.batches:
                    logits = self.model(**inputs).logits[:, :-1].float()
                    labels = sample_next(logits, gen)
                    loss = torch.nn.functional.cross_entropy(
                        logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), reduction="sum"
                    )
                    loss.backward()
                    del logits, loss
        finally:
            for h in hooks:
                h.remove()
            for p, flag in flags:
                p.requires_grad_(flag)
        missing = [m for m in wanted if m not in sums]
        if missing:
            raise LowbitError(f"no output gradient reached {', '.join(missing[:3])}")
        return {m: (sums[m] / counts[m]).numpy() for m in wanted}
