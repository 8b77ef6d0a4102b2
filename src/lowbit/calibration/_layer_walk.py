"""GPTQ's ``layers`` order through pre-norm residual blocks, found from the block's own
structure (``lowbit.calibration.gptq``).

A block of the llama, Mistral, Qwen2/3, Phi-3 and Gemma 2/3 families (and their mixtures of
experts) is a sequence of sublayers, each read through a norm and added to the residual::

    h' = h + post_a(attn(pre_a(h)))        out = h' + post_m(mlp(pre_m(h')))

(``post_*`` only in Gemma 2/3: ``post_attention_layernorm``, ``post_feedforward_layernorm``;
dropouts, identity in evaluation, are passed over). :meth:`LayerWalk.of` finds the parts from
one forward pass of the block: its direct children in the order they are called, those holding
linear layers being the sublayers, those with parameters and no linear layer the norms; a
sublayer gets the block's keyword arguments (mask, rotary tables) when its ``forward`` takes
``attention_mask`` or ``position_embeddings``. It then checks, on the first sample, that the
staged computation gives the block's output.

Per sublayer, over all samples: collect ``H`` of the layers that read the sublayer's input
(q/k/v, gate/up) and quantize them; where the sublayer's output is its last linear layer of
what that layer reads (o_proj, down_proj, through the post-norm), run the sublayer again with
those quantized, keeping the last layer's inputs (:class:`_Stash`) and collecting its ``H``,
quantize it and add its outputs to the residual: one forward pass per block where the
``blocks`` order costs two. A sublayer whose output is not one linear layer's (a mixture of
experts: a routed sum) is walked in two stages, every gate/up projection in one pass and every
down projection in the next (with the first stage quantized: each expert's down projection
reads only its own gate/up), then run once more for the residual; another sublayer of that
kind is walked group by group (``lowbit.calibration._group_walk.walk_groups`` on the sublayer
alone). Blocks of another structure (DeepSeek's dense first layers before its MoE ones)
get their own walk (:meth:`LayerWalk.fits`).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any

from lowbit.calibration._group_walk import walk_groups
from lowbit.calibration.hessians import HessianCollector
from lowbit.errors import LowbitError
from lowbit.methods.gptq import GPTQ, Sequential

__all__ = ["LayerWalk", "Part", "block_signature"]


@dataclass(frozen=True)
class Part:
    """One sublayer of a block: ``h + post(sub(pre(h)))``.

    Attributes:
        pre: the norm before (a child of the block).
        sub: the sublayer (a child holding linear layers).
        takes: it gets the block's keyword arguments.
        post: the norm on its output, or ``""``.
        last: its last linear layer (path in the block) when the sublayer's output is that
            layer's output (through ``post``); ``""``: walked group by group.
    """

    pre: str
    sub: str
    takes: bool
    post: str = ""
    last: str = ""


def block_signature(block: Any) -> tuple[Any, ...]:
    """The block's class and its children's classes: blocks with one signature share a walk."""
    return (type(block), *(type(c) for _, c in block.named_children()))


def _has_linear(mod: Any) -> bool:
    import torch

    return any(isinstance(m, torch.nn.Linear) for m in mod.modules())


def _takes_kwargs(mod: Any) -> bool:
    try:
        params = inspect.signature(mod.forward).parameters
    except (TypeError, ValueError):  # pragma: no cover - a builtin forward
        return False
    return "attention_mask" in params or "position_embeddings" in params


def _out(result: Any) -> Any:
    return result[0] if isinstance(result, (tuple, list)) else result


def _parts(block: Any, h: Any, a: tuple[Any, ...], k: dict[str, Any]) -> list[Part] | None:
    """The block's sublayers with their norms, from the order its children are called."""
    order: list[str] = []
    handles = []
    for name, child in block.named_children():

        def pre(m: Any, args: Any, name: str = name) -> None:
            if not order or order[-1] != name:
                order.append(name)

        handles.append(child.register_forward_pre_hook(pre))
    try:
        block(h, *a, **k)
    finally:
        for hd in handles:
            hd.remove()
    kinds = {}
    for name in order:
        child = block.get_submodule(name)
        if _has_linear(child):
            kinds[name] = "sub"
        elif any(True for _ in child.parameters()):
            kinds[name] = "norm"
    seq = [n for n in order if n in kinds]
    parts: list[Part] = []
    for i, name in enumerate(seq):
        if kinds[name] != "sub":
            continue
        if i == 0 or kinds[seq[i - 1]] != "norm" or seq.count(name) != 1:
            return None
        post = ""
        nxt = seq[i + 1] if i + 1 < len(seq) else None
        after = seq[i + 2] if i + 2 < len(seq) else None
        if nxt is not None and kinds[nxt] == "norm" and (after is None or kinds[after] == "norm"):
            post = nxt
        parts.append(Part(seq[i - 1], name, _takes_kwargs(block.get_submodule(name)), post))
    return parts or None


@dataclass
class LayerWalk:
    """The ``layers`` order through blocks of one structure (see the module docstring)."""

    parts: tuple[Part, ...]
    signature: tuple[Any, ...] = ()
    stash: _Stash = field(default_factory=lambda: _Stash())

    @classmethod
    def of(cls, block: Any, states: list[Any], method: GPTQ) -> LayerWalk | None:
        """The walk for blocks shaped like ``block`` (checked on ``states[0]``), or None."""
        import torch

        if method.sequential is not Sequential.LAYERS or not states:
            return None
        h, a, k = states[0]
        if a:
            return None
        parts = _parts(block, h, a, k)
        if parts is None:
            return None
        paths = {id(m): n for n, m in block.named_modules()}
        inside = {id(m) for p in parts for m in block.get_submodule(p.sub).modules()}
        if any(isinstance(m, torch.nn.Linear) and id(m) not in inside for m in block.modules()):
            return None  # a linear layer outside the sublayers: not this structure
        want = _out(block(h, *a, **k))
        x = h
        found: list[Part] = []
        for part in parts:
            inputs: list[tuple[Any, Any]] = []
            mod = block.get_submodule(part.sub)
            handles = [
                m.register_forward_pre_hook(lambda m, args, got=inputs: got.append((m, args[0])))
                for m in mod.modules()
                if isinstance(m, torch.nn.Linear)
            ]
            try:
                y = _call(block, part, x, k)
            finally:
                for hd in handles:
                    hd.remove()
            if not inputs:
                return None
            last, z = inputs[-1]
            lz = last(z)
            if part.post:
                lz = block.get_submodule(part.post)(lz)
            single = lz.shape == y.shape and torch.allclose(lz, y, rtol=1e-5, atol=1e-6)
            found.append(Part(part.pre, part.sub, part.takes, part.post,
                              paths[id(last)] if single else ""))  # fmt: skip
            x = x + y
        if x.shape != want.shape or not torch.allclose(x, want, rtol=1e-5, atol=1e-5):
            return None
        return cls(tuple(found), block_signature(block))

    @property
    def lasts(self) -> tuple[str, ...]:
        """Each sublayer's last linear layer (``""``: walked group by group)."""
        return tuple(p.last for p in self.parts)

    def fits(self, block: Any) -> bool:
        """Whether ``block`` has the structure this walk was found on."""
        return block_signature(block) == self.signature

    def run(
        self,
        block: Any,
        states: list[Any],
        samples: list[Any],
        linears: dict[str, Any],
        solve: Callable[[HessianCollector], None],
        outputs: bool = True,
        collecting: Callable[[], AbstractContextManager[Any]] = nullcontext,
    ) -> None:
        """Quantize ``linears`` (module path -> linear of this block) in layer order; with
        ``outputs``, replace ``states`` by the quantized block's outputs. ``collecting`` is
        entered around each pass that collects statistics (a mixture of experts' routing of
        every token to every expert)."""
        for p, part in enumerate(self.parts):
            final_part = p == len(self.parts) - 1
            inner_ids = {id(m) for m in block.get_submodule(part.sub).modules()}
            mine = {n: m for n, m in linears.items() if id(m) in inner_ids}
            if not part.last:
                if mine and _staged(mine):
                    for stage in _stages(mine):
                        with collecting(), HessianCollector(stage) as col:
                            for (h, _, k), (_, mask) in zip(states, samples, strict=True):
                                col.next_sample(mask)
                                col.run(_call, block, part, h, k)
                        solve(col)
                elif mine:

                    def sub(hidden: Any, *_a: Any, part: Part = part, **kw: Any) -> Any:
                        return _call(block, part, hidden, kw)

                    with collecting():
                        walk_groups(sub, states, samples, mine, lambda c, _ls: solve(c))
                if not outputs and final_part:
                    return
                for j, (h, a, k) in enumerate(states):
                    states[j] = (h + _call(block, part, h, k), a, k)
                continue
            last = block.get_submodule(part.last)
            final = {n: m for n, m in mine.items() if m is last}
            inner = {n: m for n, m in mine.items() if m is not last}
            if inner:
                with collecting(), HessianCollector(inner) as col:
                    for (h, _, k), (_, mask) in zip(states, samples, strict=True):
                        col.next_sample(mask)
                        col.run(_call, block, part, h, k)
                solve(col)
            if not outputs and final_part and not final:
                return
            if not final:
                for j, (h, a, k) in enumerate(states):
                    states[j] = (h + _call(block, part, h, k), a, k)
                continue
            zs = self.stash.start(len(states))
            cap = last.register_forward_pre_hook(lambda m, args, keep=zs: keep.add(args[0]))
            try:
                with collecting(), HessianCollector(final) as col:
                    for (h, _, k), (_, mask) in zip(states, samples, strict=True):
                        col.next_sample(mask)
                        col.run(_call, block, part, h, k)
            finally:
                cap.remove()
            if not outputs and final_part:
                zs.drop()  # never read: not held through the solve
            else:
                zs.park()  # a large stash waits out the solve on disk (_Stash)
            solve(col)
            if not outputs and final_part:
                return
            post = block.get_submodule(part.post) if part.post else None
            for j, z in enumerate(zs.kept()):  # the residual plus the quantized last layer
                h, a, k = states[j]
                y = last(z)
                states[j] = (h + (post(y) if post is not None else y), a, k)


#: The projections that read an MLP's (or an expert's) hidden activations: the second stage.
_SECOND = ("down_proj", "w2")


def _staged(mine: dict[str, Any]) -> bool:
    """A mixture of experts' sublayer: its layers quantized in two stages (see _stages)."""
    return any(".experts." in n for n in mine)


def _stages(mine: dict[str, Any]) -> list[dict[str, Any]]:
    """A mixture's layers in the order their inputs depend on each other: every expert's (and
    shared expert's) gate/up projections read the sublayer's input, each down projection only
    its own expert's gate/up outputs; so all of a stage are collected in one pass, the second
    with the first quantized, where a group-by-group walk takes a pass per expert."""
    second = {n: m for n, m in mine.items() if n.rsplit(".", 1)[-1] in _SECOND}
    first = {n: m for n, m in mine.items() if n not in second}
    return [s for s in (first, second) if s]


def _call(block: Any, part: Part, h: Any, kwargs: dict[str, Any]) -> Any:
    x = block.get_submodule(part.pre)(h)
    sub = block.get_submodule(part.sub)
    y = _out(sub(hidden_states=x, **kwargs) if part.takes else sub(x))
    return block.get_submodule(part.post)(y) if part.post else y


class _Stash:
    """The last layer's inputs of every calibration sample, copied into one float buffer that
    every sublayer of every block reuses (allocated once, at the largest size asked).

    SmolLM2 with 128 x 512 tokens: 403 MB for down_proj's 1,536 inputs, the o_proj's 576 in
    the same memory (one buffer, not a tensor per sample, so the allocator keeps no freed
    pages between sublayers). Written to a temporary file instead, they cost about 2.5 s of
    page-cache copies per block on 2 cores, a fifth of a block's time.

    A stash larger than :attr:`PARK_BYTES` is another matter: Llama-3.1-8B's down_proj inputs
    for 64 x 512 tokens are 1.9 GB, held while the layer's 14,336-wide Hessian is factored
    (3.3 GB). :meth:`park` writes such a stash to an unnamed temporary file (gone with the
    process, however it ends) and frees its buffer for the solve; :meth:`kept` reads it back
    one tensor at a time, the same bytes. A few seconds a block where the block takes minutes.
    """

    #: stashes larger than this wait out the solve on disk (SmolLM2's 403 MB stay in memory)
    PARK_BYTES = 1 << 30

    def __init__(self) -> None:
        self._buf: Any = None
        self._views: list[Any] = []
        self._used = 0
        self._count = 0
        self._apart = False
        self._file: Any = None
        self._parked: list[tuple[Any, Any]] = []  # (shape, dtype) of each tensor parked

    def start(self, count: int) -> _Stash:
        """Forget what was kept (the buffer stays); ``count`` tensors of one shape follow."""
        self._unpark()
        self._views, self._used, self._count, self._apart = [], 0, int(count), False
        return self

    def add(self, t: Any) -> None:
        """Copy one tensor in (a tensor that does not fit gets its own copy)."""
        import torch

        n = t.numel()
        if self._used == 0 and (
            self._buf is None or self._buf.dtype != t.dtype or self._buf.numel() < n * self._count
        ):
            self._buf = None  # free the smaller one first
            self._buf = torch.empty(n * max(1, self._count), dtype=t.dtype)
        if self._buf.dtype == t.dtype and self._used + n <= self._buf.numel():
            view = self._buf[self._used : self._used + n].view(t.shape)
            view.copy_(t)
            self._used += n
        else:  # another shape or dtype than the first: rare, kept apart
            view = t.detach().clone()
            self._apart = True
        self._views.append(view)

    def drop(self) -> None:
        """Forget what was kept and free the buffer."""
        self._unpark()
        self._views, self._buf, self._used = [], None, 0

    def park(self) -> None:
        """A stash over :attr:`PARK_BYTES`, all in the buffer: written to a temporary file and
        the buffer freed until :meth:`kept`. Where the file cannot be written (a full disk) the
        stash stays in memory, with a warning: the same results, the higher peak."""
        import tempfile
        import warnings

        import torch

        if self._buf is None or self._apart or not self._views:
            return
        size = self._used * self._buf.element_size()
        if size <= self.PARK_BYTES:
            return
        raw = self._buf[: self._used].view(torch.uint8).numpy()
        f = None
        try:
            f = tempfile.TemporaryFile()
            for a in range(0, raw.size, _CHUNK):
                f.write(raw[a : a + _CHUNK].data)
            f.flush()
        except OSError as exc:
            if f is not None:
                f.close()
            warnings.warn(
                f"the last layer's inputs ({size / 1e9:.1f} GB) stay in memory during the "
                f"solve: a temporary file in {tempfile.gettempdir()} could not hold them ({exc})",
                RuntimeWarning,
                stacklevel=2,
            )
            return
        self._file = f
        self._parked = [(v.shape, v.dtype) for v in self._views]
        self._views, self._buf, self._used = [], None, 0

    def kept(self) -> Iterator[Any]:
        """The tensors added since :meth:`start`, in order (views into the buffer, or, when
        parked, each read back from the file into its own tensor)."""
        if self._file is None:
            yield from list(self._views)
            return
        import torch

        f = self._file
        f.seek(0)
        for shape, dtype in self._parked:
            t = torch.empty(shape, dtype=dtype)
            raw = t.view(-1).view(torch.uint8).numpy()
            for a in range(0, raw.size, _CHUNK):
                want = raw[a : a + _CHUNK]
                try:
                    got = f.readinto(want.data)
                except OSError as exc:
                    raise LowbitError(
                        f"could not read back the parked layer inputs: {exc}"
                    ) from None
                if got != want.size:
                    raise LowbitError("the parked layer inputs came back short (temporary file)")
            yield t
        self._unpark()

    def _unpark(self) -> None:
        if self._file is not None:
            self._file.close()
        self._file, self._parked = None, []


#: bytes per read or write of a parked stash (a single read is capped near 2 GiB on Linux)
_CHUNK = 1 << 26
