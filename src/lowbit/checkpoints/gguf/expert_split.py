"""GPTQ onto a GGUF's expert stacks, one expert at a time.

A GGUF holds a mixture-of-experts layer's experts as one stack per projection,
``blk.L.ffn_up_exps.weight`` ``[experts, rows, cols]``, quantized row by row, so the stack's bytes
are its experts' bytes one after the other. GPTQ calibrates each expert on the tokens routed to
it, as a 2-D linear layer of the model lowbit builds (``model.layers.L.mlp.experts.E.up_proj``).
:class:`ExpertSplit` shows the checkpoint with each stack's experts as 2-D tensors under the
transformers checkpoint's names (:func:`lowbit.checkpoints.gguf.names.gguf_expert_names`), which
GPTQ's walk finds as it finds Hugging Face experts; :func:`split_targets` makes one target per
expert (its slice of the stack's importance vector); :class:`Stacks` gives the writer each
stack's bytes again, made on access from the experts' results, an expert GPTQ did not reach
(no routed tokens) rounded as llama.cpp rounds it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from lowbit.checkpoints.gguf.names import gguf_expert_names
from lowbit.checkpoints.readers import Checkpoint, TensorInfo
from lowbit.ggml import blocks
from lowbit.methods._ggml_gptq import GgmlQuantized, GgmlTarget

__all__ = ["ExpertSplit", "Stacks", "split_targets"]


def expert_stacks(ckpt: Any, names: Any) -> dict[str, list[str]]:
    """Each 3-D expert stack among ``names`` -> its experts' transformers names, in order."""
    out = {}
    for name in names:
        shape = ckpt.info(name).shape
        if len(shape) != 3:
            continue
        experts = gguf_expert_names(name, int(shape[0]), ckpt.config)
        if experts is not None and len(experts) == shape[0]:
            out[name] = experts
    return out


#: expert stacks an :class:`ExpertSplit` keeps in float32 (gate and up)
_HELD = 2


class ExpertSplit(Checkpoint):
    """A GGUF checkpoint whose expert stacks can also be read expert by expert, under the
    transformers checkpoint's per-expert names (every other name and attribute is the base's).
    The last two stacks read are kept (GPTQ reads a block's gate and up experts in turn):
    memory of two stacks in float32 (0.5 GB each for a 64-expert block of width 2,048)."""

    def __init__(self, base: Any, stacks: Mapping[str, list[str]]) -> None:
        super().__init__()
        self.base = base
        self.path, self.format = base.path, base.format
        self.metadata, self.config = base.metadata, base.config
        self._where = {n: (s, e) for s, experts in stacks.items() for e, n in enumerate(experts)}
        self._held: dict[str, np.ndarray] = {}  # the last stacks read, at most _HELD

    def __getattr__(self, attr: str) -> Any:  # the base's readers (tokenizer fields ...)
        if attr == "base":
            raise AttributeError(attr)
        return getattr(self.base, attr)

    def names(self) -> list[str]:
        return self.base.names()

    def info(self, name: str) -> TensorInfo:
        if name not in self._where:
            return self.base.info(name)
        stack, _ = self._where[name]
        info = self.base.info(stack)
        rows, cols = info.shape[1:]
        return TensorInfo(name, (rows, cols), info.dtype, info.nbytes // info.shape[0],
                          info.file, -1)  # fmt: skip

    def get(self, name: str, dtype: Any = None) -> np.ndarray:
        if name not in self._where:
            return self.base.get(name, dtype)
        stack, e = self._where[name]
        if stack not in self._held:
            # gate and up alternate expert by expert (one Hessian): two stacks held, or each
            # read would convert a whole stack again (128 times a block at 64 experts)
            while len(self._held) >= _HELD:
                del self._held[next(iter(self._held))]
            self._held[stack] = np.asarray(self.base.get(stack, np.float32))
        arr = self._held[stack][e]
        return arr if dtype is None else arr.astype(dtype)

    def close(self) -> None:
        """Drop the held stacks and the base's memory maps (GPTQ closes the checkpoint between
        blocks so that pages it read stop counting as resident; it reopens them on use)."""
        self._held = {}
        self.base.close()
        super().close()


def split_targets(
    targets: Mapping[str, GgmlTarget], stacks: Mapping[str, list[str]]
) -> dict[str, GgmlTarget]:
    """``targets`` with each expert stack's target replaced by one per expert (its slice of the
    stack's importance vector, which holds one vector per expert one after another)."""
    out: dict[str, GgmlTarget] = {}
    for name, t in targets.items():
        experts = stacks.get(name)
        if experts is None:
            out[name] = t
            continue
        vec = None if t.importance is None else np.asarray(t.importance).reshape(len(experts), -1)
        for e, n in enumerate(experts):
            out[n] = GgmlTarget(t.qtype, None if vec is None else vec[e], t.hessian_importance)
    return out


class Stacks(Mapping[str, Any]):
    """GPTQ's results with every expert stack whose experts it quantized as one tensor again:
    the stack's bytes ``[experts, rows, row bytes]``, made on access (one stack in memory) from
    the experts' :class:`~lowbit.methods._ggml_gptq.GgmlQuantized`; an expert without a
    result (no routed tokens) is rounded as llama.cpp rounds it, with its importance vector."""

    def __init__(
        self,
        done: Mapping[str, Any],
        ckpt: Any,
        stacks: Mapping[str, list[str]],
        targets: Mapping[str, GgmlTarget],
    ) -> None:
        self._done, self._ckpt, self._targets = done, ckpt, targets
        self._stacks = {s: ex for s, ex in stacks.items() if any(n in done for n in ex)}
        self._experts = {n for ex in self._stacks.values() for n in ex}

    def __getitem__(self, name: str) -> Any:
        if name in self._stacks:
            return self._stack(name)
        if name in self._experts:
            raise KeyError(name)
        return self._done[name]

    def _stack(self, name: str) -> GgmlQuantized:
        experts = self._stacks[name]
        t = self._targets[name]
        vec = None if t.importance is None else np.asarray(t.importance).reshape(len(experts), -1)
        parts = []
        for e, n in enumerate(experts):
            if n in self._done:
                q = self._done[n]
                parts.append(np.asarray(q.data).reshape(q.shape[0], -1))
            else:  # not reached by GPTQ: llama.cpp's rounding of this expert
                w = np.asarray(self._ckpt.get(name, np.float32)[e])
                parts.append(blocks.quantize(w, t.qtype, imatrix=None if vec is None else vec[e]))
        data = np.stack(parts)
        rows, cols = self._ckpt.info(name).shape[1:]
        return GgmlQuantized(t.qtype, data, (len(experts) * rows, cols))

    def __iter__(self) -> Iterator[str]:
        yield from (n for n in self._done if n not in self._experts)
        yield from self._stacks

    def __len__(self) -> int:
        return sum(1 for _ in self)
