"""Online input transforms of a compressed-tensors folder, hooked onto the built model.

A folder whose ``transform_config`` rotates layer inputs at run time
(``lowbit.checkpoints.compressed_tensors.transforms``: MR-GPTQ and QuIP's "v" rotation, as lowbit and
llm-compressor write them) holds weights in the rotated basis; the model computes what the
folder means only with ``x ↦ x M`` (block by block) before each such layer. This module
resolves each transform's targets against the model's layers, as compressed-tensors'
``match_named_modules`` does (exact names, ``re:`` patterns, layer class names), and hooks the
rotation onto each linear layer's input, ahead of any activation quantization hooked later.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

from lowbit.errors import LowbitError
from lowbit.methods.hadamard import rotate_blocks

__all__ = ["attach_input_transforms"]


def attach_input_transforms(model: Any, checkpoint: Any) -> dict[str, int]:
    """Hook every online input transform ``checkpoint`` declares onto ``model``'s layers.

    Args:
        model: the transformers model built from ``checkpoint``.
        checkpoint: a checkpoint; only a compressed-tensors folder with ``transforms`` has any.

    Returns:
        ``{layer name: block size}`` of the hooked layers (empty without transforms).

    Raises:
        LowbitError: a transform that targets a layer that is not ``nn.Linear``, two online
            input transforms on one layer, a transform that matches no layer, or a matrix
            the folder cannot give (``transform_matrix``).
    """
    transforms = list(getattr(checkpoint, "transforms", None) or [])
    if not transforms:
        return {}
    import torch

    where = getattr(checkpoint, "path", "the folder")
    out: dict[str, int] = {}
    used = set()
    # one torch copy per distinct matrix: a full-width rotation of a wide model is large, and
    # every layer of a group shares it
    shared: dict[tuple[Any, ...], Any] = {}
    for name, module in model.named_modules():
        classes = tuple(c.__name__ for c in type(module).__mro__)
        hits = [t for t in transforms if name and t.matches(name, classes)]
        if not hits:
            continue
        if not isinstance(module, torch.nn.Linear):
            raise LowbitError(
                f"{where}: transform group {hits[0].group!r} targets {name} "
                f"({type(module).__name__}); lowbit applies input transforms to linear layers"
            )
        if len(hits) > 1:
            raise LowbitError(
                f"{where}: {name} has two online input transforms "
                f"({', '.join(t.group for t in hits)}); vLLM applies one"
            )
        t = hits[0]
        used.add(t)
        m = np.ascontiguousarray(checkpoint.transform_matrix(t, name, int(module.in_features)))
        block = int(m.shape[0])
        key = (t, block, hashlib.blake2b(m.tobytes(), digest_size=16).digest())
        if key not in shared:
            shared[key] = torch.tensor(m, dtype=torch.float32)
        mt = shared[key]

        def hook(_m: Any, args: tuple[Any, ...], mt: Any = mt) -> tuple[Any, ...]:
            return (rotate_blocks(args[0], mt), *args[1:])

        module.register_forward_pre_hook(hook)
        out[name] = block
    unused = [t.group for t in transforms if t not in used]
    if unused:
        raise LowbitError(
            f"{where}: transform group {unused[0]!r} matches no layer of the model; its weights "
            "would be read without their rotation"
        )
    return out
