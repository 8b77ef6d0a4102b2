"""Reading MLX folders back: every quantized weight dequantized as ``mx.dequantize`` does.

:class:`MLXFolder` is the :class:`~lowbit.checkpoints.readers.Checkpoint` ``open_checkpoint``
returns for a folder whose ``config.json`` carries mlx-lm's ``quantization`` block. Its tensor
names are the model's (``<path>.weight``; the ``.scales`` and ``.biases`` beside it belong to
the quantization), and ``get`` returns a quantized weight as float32, dequantized in the
scales' dtype exactly as ``mx.dequantize`` on the CPU (affine), or exactly (the FP modes, whose
values are products of few significant bits). Everything is checked when the folder is opened:
words that are not uint32, scales or biases whose shapes do not fit the words at the module's
bits and group size, modes and bits MLX cannot hold, a module the config leaves unquantized
that stores scales: each is one LowbitError naming the tensor. Stacked experts (mlx-lm's
``switch_mlp``) read as per-expert weights under the checkpoint's names
(``lowbit.checkpoints.mlx.experts``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from lowbit.checkpoints.mlx.experts import switch_of
from lowbit.checkpoints.mlx.params import MLXParams, is_mlx_config, read_quantization
from lowbit.checkpoints.readers import (
    HuggingFaceFolder,
    IndexedCheckpoint,
    TensorInfo,
    read_config,
)
from lowbit.errors import LowbitError
from lowbit.quant import mlx as Q

__all__ = ["MLXFolder", "is_mlx_folder", "verify_mlx"]

_FLOATS = ("F32", "F16", "BF16")


class MLXFolder(IndexedCheckpoint):
    """An MLX folder (mlx-lm's layout), read with dense weight names.

    Attributes:
        quantization: the default :class:`MLXParams` of the folder's ``quantization`` block.
        modules: quantized module path -> its :class:`MLXParams`.
    """

    format = "mlx"

    def __init__(self, path: str | Path) -> None:
        super().__init__()
        self.path = Path(path)
        self._st = HuggingFaceFolder(self.path)
        self.metadata = self._st.metadata
        cfg = dict(self._st.config or {})
        where = str(self.path / "config.json")
        default, entries = read_quantization(cfg, where)
        cfg.pop("quantization", None)
        cfg.pop("quantization_config", None)
        self.config = cfg
        self.quantization = default
        stored = self._st.names()
        have = set(stored)
        self.modules: dict[str, MLXParams] = {}
        self._infos: dict[str, TensorInfo] = {}
        for n in stored:
            module, _, part = n.rpartition(".")
            if part == "scales" and f"{module}.weight" in have:
                if entries.get(module, default) is None:
                    raise LowbitError(
                        f"{self.path}: {module} stores scales but config.json's quantization "
                        f"says it is not quantized (false)"
                    )
                self.modules[module] = entries.get(module) or default
        self._experts: dict[str, tuple[str, int]] = {}  # expert name -> (stacked module, e)
        for n in stored:
            module, _, part = n.rpartition(".")
            switch = switch_of(n, cfg, str(self.path))
            if module in self.modules and part in ("scales", "biases"):
                continue
            info = self._check(module) if module in self.modules else self._st.info(n)
            if switch is None:
                self._infos[n] = info
                continue
            if len(info.shape) != 3:
                raise LowbitError(
                    f"{self.path}: {n} has shape {list(info.shape)}; stacked experts are "
                    "[experts, out, in]"
                )
            experts = int(info.shape[0])
            for e in range(experts):
                name = switch[1](e)
                self._experts[name] = (switch[0], e)
                self._infos[name] = TensorInfo(
                    name, tuple(info.shape[1:]), info.dtype, info.nbytes // experts, info.file,
                    info.offset + e * (info.nbytes // experts),
                )  # fmt: skip

    def _check(self, module: str) -> TensorInfo:
        """The dense weight's info, after checking its words, scales and biases fit."""
        p = self.modules[module]
        st = self._st
        w = st.info(f"{module}.weight")
        s = st.info(f"{module}.scales")
        where = f"{self.path}: {module}"
        if w.dtype != "U32":
            raise LowbitError(f"{where}.weight is {w.dtype}, not uint32 words ({p.label})")
        if len(w.shape) < 2:
            raise LowbitError(f"{where}.weight has shape {list(w.shape)}: not a matrix")
        n = w.shape[-1] * 32 // p.bits  # type: ignore[operator]
        if (w.shape[-1] * 32) % p.bits:  # type: ignore[operator]
            raise LowbitError(
                f"{where}.weight: rows of {w.shape[-1]} words do not hold whole {p.bits}-bit codes"
            )
        want = (*w.shape[:-1], n // p.group_size)  # type: ignore[operator]
        if n % p.group_size or tuple(s.shape) != want:  # type: ignore[operator]
            raise LowbitError(
                f"{where}.scales has shape {list(s.shape)}; {list(w.shape)} words of {p.bits}-bit "
                f"codes in groups of {p.group_size} need {list(want)}"
            )
        parts = [w, s]
        if p.has_biases:
            if s.dtype not in _FLOATS:
                raise LowbitError(f"{where}.scales is {s.dtype}; affine scales are F32, F16, BF16")
            if f"{module}.biases" not in set(st.names()):
                raise LowbitError(f"{where}: affine quantization stores biases; none found")
            b = st.info(f"{module}.biases")
            if tuple(b.shape) != tuple(s.shape) or b.dtype != s.dtype:
                raise LowbitError(
                    f"{where}.biases is {b.dtype}{list(b.shape)}; its scales are "
                    f"{s.dtype}{list(s.shape)}"
                )
            parts.append(b)
        elif s.dtype != "U8":
            raise LowbitError(f"{where}.scales is {s.dtype}; {p.mode} scales are uint8 codes")
        kind = f"MLX_{p.mode.upper()}{p.bits if p.mode == 'affine' else ''}"
        return TensorInfo(
            f"{module}.weight",
            (*w.shape[:-1], n),
            kind,
            sum(i.nbytes for i in parts),
            w.file,
            w.offset,
        )

    def get(self, name: str, dtype: Any = None) -> np.ndarray:
        """One tensor: a quantized weight dequantized to float32, anything else as stored; an
        expert of a stack (``switch_mlp``) is its slice of the stack."""
        expert = None
        if name in self._experts:
            module, expert = self._experts[name]
        else:
            module = name[: -len(".weight")] if name.endswith(".weight") else None  # type: ignore[assignment]
        if module not in self.modules:
            self.info(name)
            if expert is not None:
                return self._st.get(f"{module}.weight", dtype)[expert]
            return self._st.get(name, dtype)
        arr = np.ascontiguousarray(self.dequantized(module, expert), dtype=np.float32)
        arr.setflags(write=False)
        return arr if dtype is None else arr.astype(dtype)

    def quantized(self, module: str) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """The stored words, scales and (affine) biases of one quantized module."""
        get = self._st.get
        biases = get(f"{module}.biases") if self.modules[module].has_biases else None
        return get(f"{module}.weight"), get(f"{module}.scales"), biases

    def dequantized(self, module: str, expert: int | None = None) -> np.ndarray:
        """One module's weight as ``mx.dequantize`` gives it (affine: in the scales' dtype;
        FP modes: float32, where their products are exact); of a stack, one expert's slice."""
        p = self.modules[module]
        words, scales, biases = self.quantized(module)
        if expert is not None:
            words, scales = words[expert], scales[expert]
            biases = None if biases is None else biases[expert]
        return Q.dequantize(
            np.asarray(words),
            np.asarray(scales),
            None if biases is None else np.asarray(biases),
            mode=p.mode,
            group_size=p.group_size,
            bits=p.bits,
            dtype=np.float32,
        )

    def close(self) -> None:
        self._st.close()


def is_mlx_folder(path: str | Path) -> bool:
    """Whether ``path`` is a folder whose config.json carries mlx-lm's ``quantization``."""
    p = Path(path)
    return p.is_dir() and is_mlx_config(read_config(p / "config.json"))


def verify_mlx(path: str | Path) -> dict[str, Any]:
    """``lowbit verify`` of an MLX folder: the quantization block parses, every quantized
    module's words, scales and biases fit, and every weight decodes (finite values).

    Raises:
        LowbitError: the first problem found.
    """
    p = Path(path)
    with MLXFolder(p) as ckpt:
        per: dict[str, int] = {}
        for module, params in ckpt.modules.items():
            w = ckpt.dequantized(module)
            if not np.all(np.isfinite(w)):
                raise LowbitError(f"{p}: {module}.weight decodes to NaN or infinite values")
            per[params.label] = per.get(params.label, 0) + 1
        names = ckpt.names()
        files = sorted({ckpt.info(n).file for n in names})
        return {
            "path": str(p),
            "kind": "mlx",
            "tensors": len(names),
            "checks": [
                "config.json quantization (mlx-lm)",
                "safetensors headers",
                "words, scales and biases fit each module's bits and groups",
                "every quantized weight decodes to finite values",
            ],
            "files": [
                {"file": f.name, "bytes": f.stat().st_size, "sha256": "not recorded"} for f in files
            ],
            "summary": {
                "quantized weights": len(ckpt.modules),
                **{f"{k} weights": n for k, n in sorted(per.items())},
                "default": ckpt.quantization.label,
            },
        }
