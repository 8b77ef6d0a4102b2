"""Memory of a whole-model calibration run: blocks read from the checkpoint only at their turn, parameters freed once used, the C heap trimmed."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import re
from typing import Any

from lowbit.models.build import load_deferred


def _release_heap() -> bool:
    """Hand the C heap's free pages back to the system (glibc's ``malloc_trim(0)``; a no-op
    where there is none). Between blocks the allocator keeps what the last block's temporaries
    freed; measured on SmolLM2 (32 samples) the resident memory grew 220 MB over the 30 blocks
    without this and 54 MB with it (the quantized tensors kept). Computes nothing.

    Returns:
        Whether anything could be asked (glibc found).
    """
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


@functools.cache
def _malloc_trim() -> Any:
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):  # not glibc (musl, macOS, Windows)
        return None


def _own(blocks: Any, block: Any) -> list[Any]:
    """The parameters of ``block`` that no other block of the stack shares."""
    elsewhere = {id(p) for other in blocks if other is not block for p in other.parameters()}
    return [p for p in block.parameters() if id(p) not in elsewhere]


#: A parameter of a numbered block (``model.layers.3.``): the blocks GPTQ loads in turn.
_BLOCK_KEY = re.compile(r"(?:^|\.)(?:layers|layer|h|blocks|block)\.(\d+)\.")


_HEAD_KEY = re.compile(r"(?:^|\.)(?:lm_head|embed_out)\.weight$")


def _later_block(key: str) -> bool:
    """Whether a model key belongs to a block after the first (read at its turn) or is the LM
    head (never run: the capture stops at the first block; a head tied to the embedding is
    loaded with it)."""
    if _HEAD_KEY.search(key):
        return True
    m = _BLOCK_KEY.search(key)
    return m is not None and int(m.group(1)) > 0


class _Deferred:
    """The blocks after the first, read from the checkpoint only when their turn comes.

    ``build_model(defer=_later_block)`` leaves them unread (no memory: their pages are never
    written), so GPTQ holds one block's weights at a time besides the embeddings it drops after
    the capture, whatever the model's depth (``benchmarks/bench_gptq_memory.py``). Deferred
    parameters outside the block stack are loaded at once.
    """

    def __init__(self, net: Any, ckpt: Any, prefix: str) -> None:
        self._net, self._ckpt = net, ckpt
        lead = re.compile(re.escape(prefix) + r"\.(\d+)\.")
        self._by_block: dict[int, list[str]] = {}
        outside = []
        for key in getattr(net, "lowbit_deferred", ()):
            m = lead.match(key)
            if m is None and _HEAD_KEY.search(key):
                continue  # never needed
            if m is None:
                outside.append(key)
            else:
                self._by_block.setdefault(int(m.group(1)), []).append(key)
        if outside:
            load_deferred(net, ckpt, outside)

    def restore(self, index: int) -> None:
        """Read block ``index``'s parameters (a block never deferred: nothing to do)."""
        keys = self._by_block.pop(index, [])
        if keys:
            import torch

            with torch.inference_mode(False), torch.no_grad():
                load_deferred(self._net, self._ckpt, keys)


def _drop(params: Any) -> None:
    """Free parameters the run needs no more (the model is the run's own and then discarded):
    the embeddings once the first block's inputs are captured, each block once it is done."""
    import torch

    with torch.inference_mode(False), torch.no_grad():
        for p in params:
            p.data = torch.empty(0, dtype=p.dtype)
