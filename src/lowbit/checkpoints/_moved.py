"""Module paths that moved when ``checkpoints/`` was split by format, kept importable.

``import lowbit.checkpoints.gguf_writer`` (documented before the split) still works: it warns
once with a :class:`DeprecationWarning` naming the new path and binds the old name to the very
same module object, so ``monkeypatch``-style code and ``isinstance`` checks see one module.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from types import ModuleType

#: old dotted path -> new dotted path (public modules only; private ones just moved).
MOVED = {
    "lowbit.checkpoints.gguf_arch": "lowbit.checkpoints.gguf.arch",
    "lowbit.checkpoints.gguf_budget": "lowbit.checkpoints.gguf.budget",
    "lowbit.checkpoints.gguf_convert": "lowbit.checkpoints.gguf.convert",
    "lowbit.checkpoints.gguf_hf_config": "lowbit.checkpoints.gguf.hf_config",
    "lowbit.checkpoints.gguf_hparams": "lowbit.checkpoints.gguf.hparams",
    "lowbit.checkpoints.gguf_mix": "lowbit.checkpoints.gguf.mix",
    "lowbit.checkpoints.gguf_tokenizer": "lowbit.checkpoints.gguf.tokenizer",
    "lowbit.checkpoints.gguf_writer": "lowbit.checkpoints.gguf.writer",
    "lowbit.checkpoints.imatrix": "lowbit.checkpoints.gguf.imatrix",
    "lowbit.checkpoints.names": "lowbit.checkpoints.gguf.names",
    # the module shadowed the function of its name: ``from lowbit.checkpoints import
    # quantize_model`` gave the module once the module had been imported
    "lowbit.checkpoints.quantize_model": "lowbit.checkpoints.streaming",
}


class MovedFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds an old path of :data:`MOVED` and hands back the module at its new path."""

    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        new = MOVED[spec.name]
        warnings.warn(
            f"{spec.name} moved to {new}; the old path will be removed in a later release",
            DeprecationWarning,
            stacklevel=2,
        )
        module = importlib.import_module(new)
        self._spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        # the import system set the alias's spec on the shared module: give it its own back
        module.__spec__ = self._spec


class _Package(ModuleType):
    """``lowbit.checkpoints`` itself: importing the old module path
    ``lowbit.checkpoints.quantize_model`` would bind the package's attribute of that name to the
    module (the import system does so for every submodule), hiding the function."""

    def __setattr__(self, name: str, value: object) -> None:
        if isinstance(value, ModuleType) and f"{self.__name__}.{name}" in MOVED:
            return  # an old path's alias: the package's own name stays what it was
        super().__setattr__(name, value)


def install() -> None:
    """Put the finder on ``sys.meta_path`` once, and keep the package's names its own."""
    if not any(isinstance(f, MovedFinder) for f in sys.meta_path):
        sys.meta_path.append(MovedFinder())
    sys.modules["lowbit.checkpoints"].__class__ = _Package
