"""Optional dependencies: import one, or say in one line which extra installs it.

``import lowbit`` needs numpy and ml_dtypes only. Everything else is an extra of
pyproject.toml (``models``: torch, transformers, tokenizers, safetensors, gguf, tqdm, pyyaml,
compressed-tensors; ``torch``; ``plot``: matplotlib; ``fast``: numba; ``all``: every one).
:func:`require` imports a module where a feature needs it and raises
:class:`MissingExtraError` naming the extra otherwise; :func:`extra_for` maps a missing
module name to its extra, so the CLI turns any ``ModuleNotFoundError`` of an optional module
into the same one line. Progress bars are optional too
(:mod:`lowbit._progress` shows nothing when tqdm is missing).
"""

from __future__ import annotations

import importlib
from types import ModuleType

from lowbit.errors import LowbitError

__all__ = ["EXTRAS", "MissingExtraError", "extra_for", "install_hint", "require"]

#: Top-level module -> the smallest extra of pyproject.toml that installs it.
EXTRAS = {
    "torch": "torch",
    "transformers": "models",
    "tokenizers": "models",
    "safetensors": "models",
    "gguf": "models",
    "tqdm": "models",
    "yaml": "models",
    "compressed_tensors": "models",
    "accelerate": "models",
    "huggingface_hub": "models",
    "matplotlib": "plot",
    "numba": "fast",
}


class MissingExtraError(LowbitError, ImportError):
    """An optional dependency is not installed; the message names the extra that installs it."""


def install_hint(module: str) -> str | None:
    """``pip install 'lowbit[EXTRA]'`` for an optional module, or None for any other."""
    extra = extra_for(module)
    return None if extra is None else f"pip install 'lowbit[{extra}]'"


def extra_for(module: str | None) -> str | None:
    """The extra that installs ``module`` (a dotted name counts by its top level), or None."""
    if not module:
        return None
    return EXTRAS.get(module.split(".", 1)[0])


def require(module: str, *, extra: str | None = None, what: str | None = None) -> ModuleType:
    """Import ``module``, or raise one line naming the extra that installs it.

    Args:
        module: the module to import (``"transformers"``, ``"tqdm.auto"``).
        extra: the extra that installs it (default: :data:`EXTRAS` of its top level).
        what: the feature that needs it, for the message (default: "this").

    Returns:
        The imported module.

    Raises:
        MissingExtraError: the module (or a module it imports) is not installed, e.g.
            "evaluating models needs transformers: pip install 'lowbit[models]'".
    """
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        missing = exc.name or module
        name = extra or extra_for(missing) or extra_for(module) or "all"
        raise MissingExtraError(
            f"{what or 'this'} needs {missing.split('.', 1)[0]}: pip install 'lowbit[{name}]'"
        ) from None
