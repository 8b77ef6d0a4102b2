"""Config fields the model builder hands to transformers and torch, checked first (issue 41).

transformers looks names up (``getattr(transformers, architecture)``, ``getattr(torch,
dtype)``), sizes the embedding's padding row from ``pad_token_id`` and falls back to its class
defaults for absent counts; a hostile config made each a ``TypeError``, ``IndexError``,
``AttributeError`` or ``AssertionError`` deep inside them, or a model of the default's size.
These checks make each one ``LowbitError`` line (``lowbit.models.build`` calls them).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lowbit._json import short_repr
from lowbit.errors import LowbitError

__all__ = ["check_builder_keys", "check_dtype_names", "check_gguf_required", "one_line"]

_GGUF_REQUIRED = {
    "num_hidden_layers": "block_count",
    "hidden_size": "embedding_length",
    "num_attention_heads": "attention.head_count",
}


def check_builder_keys(cfg: Mapping[str, Any], where: str) -> None:
    """The keys transformers reads as names, of the types it needs (a list for a class name
    was a TypeError, a number for the dtype an IndexError, deep inside transformers), and a
    padding id inside the vocabulary (torch asserts the embedding's padding row is a row).

    Raises:
        LowbitError: naming the field.
    """
    archs = cfg.get("architectures")
    if archs is not None and (
        not isinstance(archs, list) or not all(isinstance(a, str) for a in archs)
    ):
        raise LowbitError(
            f"{where}: architectures is {short_repr(archs)}; lowbit expects a list of class names"
        )
    pad, vocab = cfg.get("pad_token_id"), cfg.get("vocab_size")
    if pad is not None and type(vocab) is int and (type(pad) is not int or not 0 <= pad < vocab):
        raise LowbitError(
            f"{where}: pad_token_id is {short_repr(pad)}; it must be a token id below "
            f"vocab_size {vocab}"
        )
    for key in ("torch_dtype", "dtype", "model_type"):
        value = cfg.get(key)
        if value is not None and not isinstance(value, str):
            raise LowbitError(f"{where}: {key} is {short_repr(value)}; lowbit expects a name")


def check_dtype_names(cfg: Mapping[str, Any], where: str) -> None:
    """A dtype name torch knows (transformers looks it up with ``getattr(torch, name)``).

    Raises:
        LowbitError: naming the field.
    """
    import torch

    for key in ("torch_dtype", "dtype"):
        value = cfg.get(key)
        if value not in (None, "auto") and not isinstance(
            getattr(torch, str(value), None), torch.dtype
        ):
            raise LowbitError(f"{where}: {key} is {short_repr(value)}, not a torch dtype name")


def check_gguf_required(cfg: Mapping[str, Any], arch: str, where: str) -> None:
    """The counts a GGUF must give (transformers' class defaults would stand in for them).

    Raises:
        LowbitError: naming the first GGUF key that is absent.
    """
    for key, gkey in _GGUF_REQUIRED.items():
        if cfg.get(key) is None:
            raise LowbitError(
                f"{where}: no {arch}.{gkey}; lowbit cannot build the model without it"
            )


def one_line(exc: BaseException, limit: int = 300) -> str:
    """A third-party exception's message on one line, at most ``limit`` characters."""
    said = " ".join(str(exc).split())
    return said if len(said) <= limit else said[: limit - 3] + "..."
