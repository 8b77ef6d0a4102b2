"""Each block's own extra inputs where blocks differ by layer type (sliding-window and global
attention layers of Gemma 2/3, Qwen2 with ``use_sliding_window``, ...).

GPTQ and AWQ capture the first block's inputs (hidden states, the other arguments, keyword
arguments such as the attention mask and rotary embeddings) once and run each later block on
its predecessor's outputs with those arguments. Where ``config.layer_types`` names more than
one type, transformers gives each type its own mask and rotary embeddings (Gemma 3's local
layers rotate with base 10,000, its global ones with 1,000,000), so the first block's are wrong
for the others. :func:`block_args` runs the model once more per sample with every block
replaced by the identity (the embeddings, masks and rotary tables are computed; no block and no
LM head is) and keeps each block's arguments; :func:`with_block_args` puts them into the
states before a block runs.
"""

from __future__ import annotations

from typing import Any

__all__ = ["block_args", "with_block_args"]


class _Done(Exception):
    """Raised by the last block: the LM head need not run."""


def block_args(net: Any, blocks: Any, samples: Any, causal: bool) -> list[Any] | None:
    """Per block, per sample ``(args, kwargs)``; None when the model's blocks are all of one
    layer type (the first block's arguments serve every block).

    Args:
        net: the model (float weights).
        blocks: its stack of blocks.
        samples: per sample ``(model inputs, mask)``.
        causal: a causal LM (``use_cache=False`` is passed).
    """
    types = list(getattr(getattr(net, "config", None), "layer_types", None) or ())
    if len(set(types)) < 2 or len(types) < len(blocks):
        return None
    got: list[list[Any]] = [[] for _ in blocks]

    def fake(i: int) -> Any:
        def forward(*args: Any, **kwargs: Any) -> Any:
            if args:
                hidden, rest = args[0], tuple(args[1:])
            else:
                kwargs = dict(kwargs)
                hidden, rest = kwargs.pop("hidden_states"), ()
            got[i].append((rest, dict(kwargs)))
            if i == len(blocks) - 1:
                raise _Done
            return hidden

        return forward

    for i, b in enumerate(blocks):
        b.forward = fake(i)
    try:
        for inputs, _ in samples:
            try:
                net(**inputs, **({"use_cache": False} if causal else {}))
            except _Done:
                pass
    finally:
        for b in blocks:
            b.__dict__.pop("forward", None)  # the class's forward again
    return got


def with_block_args(states: list[Any], args: list[Any] | None) -> list[Any]:
    """``states`` (per sample: hidden, args, kwargs) with a block's own arguments (no change
    for None)."""
    if args is None:
        return states
    return [(h, a, k) for (h, _, _), (a, k) in zip(states, args, strict=True)]
