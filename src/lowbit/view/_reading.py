"""``lowbit report``'s reader: a quantized checkpoint (lowbit, compressed-tensors, GGUF) one
tensor at a time, as (stored as, scheme, rule, shape, stored bits, values)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from lowbit.checkpoints import open_checkpoint
from lowbit.checkpoints.compressed_tensors.verify import ct_config
from lowbit.methods.hadamard import hadamard
from lowbit.quant.quantized_tensor import QuantizedTensor
from lowbit.view import _ct_read

__all__ = ["QuantizedReader"]


class QuantizedReader:
    """A quantized checkpoint read one tensor at a time, whatever its format."""

    def __init__(self, path: Path) -> None:

        self.path = path
        self.ckpt = open_checkpoint(path)
        self._transforms: list[Any] = []
        self._folder: Any = None
        if self.ckpt.format == "compressed-tensors":
            # the stored parts (packed codes, scales), not the dequantized view of the weights
            self._folder = self.ckpt
            self._transforms = list(getattr(self.ckpt, "transforms", []))
            self.ckpt = self.ckpt._st  # type: ignore[attr-defined]
        self.format = self.ckpt.format
        self.manifest: dict[str, Any] | None = getattr(self.ckpt, "manifest", None)
        self.ct: dict[str, Any] | None = None
        self._index: tuple[set[str], dict[str, list[str]]] | None = None
        if self.format == "huggingface":
            self.ct = ct_config(path)
            if self.ct is not None:
                self.format = "compressed-tensors"

    def source(self) -> str | None:
        if self.manifest is not None:
            return str(self.manifest["source"]["path"])
        return None

    def plan(self) -> dict[str, Any] | None:
        if self.manifest is not None:
            return self.manifest.get("plan")
        if self.ct is not None:
            return {"compressed-tensors": self.ct.get("config_groups", {})}
        return None

    def names(self) -> list[str]:
        """The model's tensor names (compressed-tensors' ``weight_packed``/``weight_scale``
        parts count as one ``weight``)."""
        if self.ct is None:
            return self.ckpt.names()
        out: dict[str, None] = {}
        hidden = {f".{t.tensor_suffix}.weight" for t in self._transforms}
        for n in self.ckpt.names():
            module, _, part = n.rpartition(".")
            if any(n.endswith(h) for h in hidden):
                continue  # a transform's matrix, not a model tensor
            if part.startswith("weight_"):
                out.setdefault(f"{module}.weight", None)
            else:
                out.setdefault(n, None)
        return list(out)

    def input_rotation(self, name: str, shape: tuple[int, ...]) -> np.ndarray | None:
        """The block matrix ``M`` by which the weight ``name`` is stored rotated (``W M``;
        its layer's input is rotated alike at run time), or None: a lowbit checkpoint's
        recorded block Hadamard rotation (MR-GPTQ), a compressed-tensors folder's online input
        transform (resolved by layer name, ``re:`` pattern, or a class-name target such as
        ``Linear``, taken to name every 2-D weight the config quantizes)."""
        if len(shape) != 2:
            return None
        if self.manifest is not None:
            block = self.ckpt.rotations().get(name)  # type: ignore[attr-defined]
            return None if block is None else hadamard(block)
        layer = name.removesuffix(".weight")
        hits = [t for t in self._transforms if t.matches(layer, ("Linear",))]
        if not hits or not self._ct_quantized(name):
            return None
        return self._folder.transform_matrix(hits[0], layer, int(shape[1]))

    def tensor(self, name: str) -> tuple[str, str, str | None, tuple[int, ...], int, Any]:
        """``(stored, scheme, rule, shape, stored bits, values)``; values is a
        ``QuantizedTensor`` for a lowbit quantized tensor, else a float array (or None for
        compressed-tensors parts lowbit cannot dequantize)."""
        if self.manifest is not None:
            e = self.ckpt.entry(name)  # type: ignore[attr-defined]
            shape = tuple(int(d) for d in e["shape"])
            if e["kind"] == "quantized":
                qt = self.ckpt.quantized(name)  # type: ignore[attr-defined]
                return "quantized", qt.scheme.label, _rule(e), shape, qt.nbytes * 8, qt
            info = self.ckpt.info(name)
            label = str(e.get("label") if e["kind"] == "cast" else e.get("dtype", info.dtype))
            return e["kind"], label, _rule(e), shape, info.nbytes * 8, None
        if self._ct_quantized(name):
            return self._ct_tensor(name)
        info = self.ckpt.info(name)
        stored = "kept" if info.dtype in ("F32", "F16", "BF16", "F64") else "quantized"
        return stored, info.dtype, None, info.shape, info.nbytes * 8, None

    def _parts(self) -> tuple[set[str], dict[str, list[str]]]:
        """The stored names, and each module's ``weight_*`` parts (built once: a look-up per
        tensor, not a scan of every name, which made the report quadratic in tensors)."""
        if self._index is None:
            names = set(self.ckpt.names())
            parts: dict[str, list[str]] = {}
            for n in self.ckpt.names():
                module, _, part = n.rpartition(".")
                if part.startswith("weight_"):
                    parts.setdefault(module, []).append(n)
            self._index = (names, parts)
        return self._index

    def _ct_quantized(self, name: str) -> bool:
        """A compressed-tensors weight stored as codes and scales (not as plain values)."""
        module = name.removesuffix(".weight")
        return self.ct is not None and f"{module}.weight_scale" in self._parts()[0]

    def _ct_tensor(self, name: str) -> tuple[str, str, str | None, tuple[int, ...], int, Any]:
        module = name.removesuffix(".weight")
        names, by_module = self._parts()
        parts = [n for n in by_module.get(module, []) if n != name]
        if f"{module}.weight" in names:
            parts.append(f"{module}.weight")
        bits = sum(self.ckpt.info(n).nbytes * 8 for n in parts)
        shape: tuple[int, ...] = ()
        if f"{module}.weight_shape" in parts:
            shape = tuple(int(v) for v in np.asarray(self.ckpt.get(f"{module}.weight_shape")))

        g = _ct_read.ct_scheme(self.ckpt, self.ct, module)  # type: ignore[arg-type]
        if not shape and f"{module}.weight" in parts:
            shape = self.ckpt.info(f"{module}.weight").shape
        if not shape and f"{module}.weight_packed" in parts:  # NVFP4/MXFP4: two per byte
            rows, half = self.ckpt.info(f"{module}.weight_packed").shape
            shape = (rows, 2 * half)
        if g is None:
            scheme = "+".join(sorted(self.ckpt.info(n).dtype for n in parts))
        else:
            scheme = _ct_read.label(g)
        return "quantized", scheme, None, shape, bits, None

    def values(self, name: str, held: Any) -> np.ndarray | None:

        if isinstance(held, QuantizedTensor):
            return None  # lowbit.error dequantizes it itself, exactly
        if self._ct_quantized(name):
            module = name.removesuffix(".weight")
            g = _ct_read.ct_scheme(self.ckpt, self.ct, module)  # type: ignore[arg-type]
            return None if g is None else _ct_read.ct_weight(self.ckpt, module, g)
        return np.asarray(self.ckpt.get(name, np.float32))


def _rule(entry: dict[str, Any]) -> str | None:
    """``rule N`` for the plan rule (index N of the plan's rules) that decided a tensor."""
    rule = entry.get("rule")
    return None if rule is None else f"rule {rule}"
