"""A :class:`~lowbit.planning.modelspec.ModelSpec` from a Hugging Face ``config.json``.

:func:`spec_from_config` dispatches on ``model_type`` to the family builders of
:mod:`lowbit.planning._arch_families`; an unknown ``model_type`` with the llama fields is
counted as a llama-style decoder (with a warning).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from lowbit import _json
from lowbit.errors import LowbitError
from lowbit.planning._arch_families import (
    _bert,
    _distilbert,
    _gpt2,
    _gpt_neox,
    _llama_like,
    _phi,
)
from lowbit.planning.modelspec import ModelSpec

__all__ = ["KNOWN_ARCHITECTURES", "load_config", "spec_from_config"]

_LLAMA_LIKE = {
    "llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "gemma",
    "gemma2", "gemma3_text", "phi3", "granite", "smollm3",
}  # fmt: skip
_ENCODERS = {"bert", "roberta", "xlm-roberta", "distilbert"}
KNOWN_ARCHITECTURES = tuple(sorted(_LLAMA_LIKE | _ENCODERS | {"gpt2", "gpt_neox", "phi"}))
_LLAMA_FIELDS = (
    "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size",
)  # fmt: skip


def load_config(path: str | Path) -> dict[str, Any]:
    """Read a ``config.json`` (or a folder holding one) as a dict.

    Raises:
        LowbitError: not JSON, or not a JSON object.
    """
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"

    cfg = _json.load(p)
    if not isinstance(cfg, dict):
        raise LowbitError(f"malformed config {p}: expected a JSON object, got {type(cfg).__name__}")
    return cfg


def spec_from_config(config: Mapping[str, Any] | str | Path, name: str | None = None) -> ModelSpec:
    """Count a model's parameters from its Hugging Face config.

    Args:
        config: the parsed ``config.json`` dict, or a path to it (or to its folder).
        name: a display name (default: the config's ``_name_or_path`` or the file name).

    Returns:
        The tensors ``transformers`` would create (base model plus LM head for decoders;
        for encoders the base model with pooler, as ``AutoModel`` loads it).

    Raises:
        LowbitError: malformed config, or an unknown architecture lacking the fields of a
            llama-style decoder (the message lists the missing fields).
    """
    path = None
    if not isinstance(config, Mapping):
        path = Path(config)
        config = load_config(path)
        name = name or (path.parent.name if path.name == "config.json" else path.stem)
    cfg = dict(config)
    arch = str(cfg.get("model_type") or "").lower()
    name = name or str(cfg.get("_name_or_path") or arch or "model")
    notes: list[str] = []
    if arch in _LLAMA_LIKE:
        spec = _llama_like(cfg, arch)
    elif arch == "gpt2":
        spec = _gpt2(cfg)
    elif arch == "gpt_neox":
        spec = _gpt_neox(cfg)
    elif arch == "phi":
        spec = _phi(cfg)
    elif arch in ("bert", "roberta", "xlm-roberta"):
        spec = _bert(cfg, arch)
    elif arch == "distilbert":
        spec = _distilbert(cfg)
    else:
        missing = [k for k in _LLAMA_FIELDS if cfg.get(k) is None]
        if missing:
            raise LowbitError(
                f"unknown architecture {arch or '(no model_type)'!r}; known: "
                f"{', '.join(KNOWN_ARCHITECTURES)}. To count it as a llama-style decoder the "
                f"config needs {', '.join(missing)}; or give a checkpoint to count its tensors"
            )
        note = f"unknown architecture {arch!r} counted as a llama-style decoder"
        warnings.warn(note, stacklevel=2)
        notes.append(note)
        spec = _llama_like(cfg, "llama")
    if cfg.get("quantization_config"):
        notes.append("config has a quantization_config: counts are of the unquantized model")
    return replace(
        spec,
        name=name,
        architecture=arch or spec.architecture,
        path=str(path) if path else None,
        notes=tuple(notes),
    )
