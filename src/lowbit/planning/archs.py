"""How many parameters a model has, where they sit, and what shape the attention is.

Three ways in, one result (:class:`~lowbit.planning.modelspec.ModelSpec`: named tensors plus the
architecture numbers the planner needs for the KV cache and activations):

- a Hugging Face ``config.json`` (:func:`spec_from_config`): the tensors are built from the
  architecture, with the names ``transformers`` gives them, for llama, mistral, mixtral, qwen2,
  qwen2_moe, qwen3, qwen3_moe, gemma, gemma2, gemma3_text, phi3, granite, phi, gpt2, gpt_neox,
  bert, roberta, xlm-roberta and distilbert; an unknown ``model_type`` that has the llama
  fields is counted as a llama-style decoder (with a warning), else the error names the
  missing fields;
- a checkpoint (:func:`spec_from_checkpoint`): a safetensors file or folder, or a GGUF file,
  counted from the headers (:mod:`lowbit.planning.headers`; no tensor data is read), with the
  architecture numbers from a ``config.json`` beside it or the GGUF metadata;
- a bare count (:func:`spec_from_params`, ``"7B"``, ``"135M"``): one anonymous tensor.

:func:`load_spec` takes any of these (and the shipped model names ``smollm2``, ``minilm``).

The jobs live in three modules: :mod:`lowbit.planning._arch_config` (``config.json`` to a spec),
:mod:`lowbit.planning._arch_families` (the tensors of each architecture family) and
:mod:`lowbit.planning._arch_headers` (a spec from safetensors/GGUF headers); this module
re-exports their public names and holds :func:`load_spec`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from lowbit.checkpoints.shipped import DEFAULT_MODELS, default_model_key, default_model_path
from lowbit.errors import LowbitError
from lowbit.planning._arch_config import KNOWN_ARCHITECTURES, load_config, spec_from_config
from lowbit.planning._arch_headers import spec_from_checkpoint
from lowbit.planning.headers import read_gguf_header, read_safetensors_header
from lowbit.planning.modelspec import (
    COMPONENTS,
    ModelSpec,
    TensorInfo,
    classify,
    parse_params,
    spec_from_params,
)

__all__ = [
    "COMPONENTS",
    "KNOWN_ARCHITECTURES",
    "ModelSpec",
    "TensorInfo",
    "classify",
    "load_config",
    "load_spec",
    "parse_params",
    "read_gguf_header",
    "read_safetensors_header",
    "spec_from_checkpoint",
    "spec_from_config",
    "spec_from_params",
]


def load_spec(model: Any, name: str | None = None) -> ModelSpec:
    """Turn anything :func:`lowbit.plan` accepts into a :class:`ModelSpec`.

    Accepts a :class:`ModelSpec`; a count (``7e9``, ``"7B"``); a config dict; a shipped model
    name (``"smollm2"``, ``"minilm"``); or a path to a ``config.json``, a safetensors file or
    folder, or a ``.gguf`` file.
    """
    if isinstance(model, ModelSpec):
        return model
    if isinstance(model, Mapping):
        return spec_from_config(model, name)
    if isinstance(model, (int, float)) and not isinstance(model, bool):
        return spec_from_params(model, name)
    if isinstance(model, str) and re.fullmatch(
        r"\s*[0-9][0-9_,.]*(e[0-9]+)?\s*[kmbgt]?\s*", model, re.I
    ):
        return spec_from_params(model, name)
    if isinstance(model, str) and default_model_key(model) and not Path(model).exists():
        key = default_model_key(model)
        name = name or DEFAULT_MODELS[key].title  # type: ignore[index]
        model = default_model_path(model)
    if not isinstance(model, (str, Path)):
        raise LowbitError(f"cannot plan a {type(model).__name__}: give a path, a config or a count")
    p = Path(model)
    if p.is_file() and p.suffix == ".json":
        spec = spec_from_config(p, name)
    elif p.is_dir() and not any(p.glob("*.safetensors")) and not any(p.glob("*.gguf")):
        if not (p / "config.json").exists():
            raise LowbitError(f"{p} holds no config.json, *.safetensors or *.gguf")
        spec = spec_from_config(p / "config.json", name or p.name)
    else:
        spec = spec_from_checkpoint(p)
    return replace(spec, name=name) if name else spec
