"""Where a job's model comes from: a path, a shipped model name, an open checkpoint, or a
transformers model held in memory.

A transformers model (``torch.nn.Module`` with ``config`` and ``save_pretrained``, what
torchao's ``quantize_`` and llm-compressor's ``oneshot(model=...)`` take) is written once as a
Hugging Face folder (safetensors, its config, and the tokenizer when one is given) into a
temporary folder, read from there, and removed when the job ends, also on error. lowbit builds
its own models from checkpoints, so a module that is not a transformers model is refused.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from lowbit.checkpoints.readers import Checkpoint
from lowbit.checkpoints.streaming import open_model
from lowbit.errors import LowbitError

__all__ = ["is_module", "open_source"]


def is_module(model: object) -> bool:
    """Whether ``model`` is an in-memory torch module (without importing torch)."""
    return any(c.__module__.startswith("torch.nn") and c.__name__ == "Module"
               for c in type(model).__mro__)  # fmt: skip


@contextlib.contextmanager
def open_source(
    model: str | os.PathLike[str] | Checkpoint | Any | None,
    *,
    tokenizer: Any = None,
    near: Path | None = None,
) -> Iterator[Checkpoint]:
    """Open a job's model as a :class:`~lowbit.checkpoints.readers.Checkpoint`.

    Args:
        model: a path (``.safetensors``, a Hugging Face folder, ``.gguf``), a shipped model
            name (``smollm2``, ``minilm``), None (SmolLM2), an open checkpoint, or a
            transformers model in memory.
        tokenizer: with a transformers model: its tokenizer, saved beside it (needed by
            calibrated methods and GGUF output).
        near: put the temporary folder of an in-memory model beside this path (the output),
            on the same disk; default: the system's temporary folder.

    Raises:
        LowbitError: a module that is not a transformers model, or an unreadable path.
    """
    if not is_module(model):
        yield open_model(model)
        return
    if not (hasattr(model, "config") and hasattr(model, "save_pretrained")):
        raise LowbitError(
            f"{type(model).__name__}: lowbit quantizes transformers models (with .config and "
            ".save_pretrained) or checkpoints on disk; save this module's state_dict with its "
            "config as a Hugging Face folder and pass the folder"
        )
    parent = near.parent if near is not None and near.parent.is_dir() else None
    with tempfile.TemporaryDirectory(prefix=".lowbit-module-", dir=parent) as tmp:
        folder = Path(tmp) / type(model).__name__
        model.save_pretrained(folder, safe_serialization=True)
        if tokenizer is not None:
            tokenizer.save_pretrained(folder)
        ckpt = open_model(folder)
        try:
            yield ckpt
        finally:
            ckpt.close()
