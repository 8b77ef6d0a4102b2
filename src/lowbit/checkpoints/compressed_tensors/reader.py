"""Reading compressed-tensors folders back: every quantized weight dequantized by lowbit's code.

:class:`CompressedTensorsFolder` is the :class:`~lowbit.checkpoints.readers.Checkpoint` that
``open_checkpoint`` returns for a folder whose ``config.json`` has a compressed-tensors
``quantization_config`` (``quantization_status`` compressed): its tensor names are the model's
own (``...q_proj.weight``, not ``weight_packed``/``weight_scale``/``weight_zero_point``/
``weight_shape``), and ``get`` returns the dequantized float32 weight, ``(q - zero_point) *
scale`` in float32 as compressed-tensors computes it, for the storage formats lowbit writes and
``lowbit verify`` checks: ``pack-quantized`` (int1..int8 in int32 words, zero points packed down
the rows), ``int-quantized`` (int8), ``float-quantized`` and ``naive-quantized`` (fp8 E4M3 or
int8), with tensor, channel or group scales. Everything else in the folder reads as stored.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from lowbit.checkpoints.compressed_tensors.fp4 import FP4_FORMATS, read_fp4
from lowbit.checkpoints.compressed_tensors.layout import (
    ct_candidates,
    ct_check_weight,
    ct_groups,
)
from lowbit.checkpoints.compressed_tensors.tensor import CTTensor
from lowbit.checkpoints.compressed_tensors.transforms import (
    InputTransform,
    input_transforms,
    transform_matrix,
)
from lowbit.checkpoints.readers import HuggingFaceFolder, IndexedCheckpoint, TensorInfo
from lowbit.errors import LowbitError

__all__ = ["CompressedTensorsFolder", "unpack_int32"]

_PARTS = ("weight_packed", "weight_scale", "weight_zero_point", "weight_shape",
          "weight_global_scale", "input_global_scale")  # fmt: skip
# Every tensor name part compressed-tensors' own schemes store beside a module's weight
# (compressed_tensors/quantization/lifecycle/initialize.py: {base}_scale, _zero_point,
# _g_idx, _global_scale for base weight/input/output; weight_packed and weight_shape from
# the pack-quantized compressor). A quantized module's other tensors (bias, anything) are
# the model's own and read as stored.
_QUANT_PARTS = frozenset(
    {"weight_packed", "weight_shape"}
    | {
        f"{base}_{part}"
        for base in ("weight", "input", "output")
        for part in ("scale", "zero_point", "g_idx", "global_scale")
    }
)


def unpack_int32(words: np.ndarray, num_bits: int, n: int) -> np.ndarray:
    """Inverse of :func:`lowbit.checkpoints.compressed_tensors.tensor.pack_int32` along the last axis.

    Args:
        words: int32 array ``[rows, ceil(n * num_bits / 32)]``.
        num_bits: bits per code (1..8).
        n: codes per row.

    Returns:
        int8 signed codes ``[rows, n]`` (the stored unsigned value minus ``2^(num_bits-1)``).
    """
    w = np.ascontiguousarray(words, dtype="<i4")
    rows = w.shape[0]
    bits = np.unpackbits(w.view(np.uint8).reshape(rows, -1), axis=1, bitorder="little")
    bits = bits[:, : n * num_bits].reshape(rows, n, num_bits).astype(np.int16)
    u = (bits << np.arange(num_bits, dtype=np.int16)).sum(axis=2)
    return (u - (1 << (num_bits - 1))).astype(np.int8)


def _input_mode(a: dict[str, Any]) -> str | None:
    """The ``lowbit eval --act`` mode of a config group's ``input_activations`` (None: none
    fits)."""
    if not a.get("symmetric", True):
        return None
    bits, kind, strategy = a.get("num_bits"), a.get("type"), a.get("strategy")
    dynamic, group = a.get("dynamic"), a.get("group_size")
    if bits == 8 and strategy == "token" and dynamic is True:
        return {"int": "int8", "float": "fp8_token"}.get(kind)
    if (bits, kind, strategy, group, dynamic) == (8, "float", "group", 128, True):
        return "fp8_block"
    if (bits, kind, strategy, group, dynamic) == (4, "float", "tensor_group", 16, "local"):
        return "nvfp4"
    return None


def _owner(name: str) -> str:
    """The last module-name part of a tensor name (``q_proj`` of ``...q_proj.weight``)."""
    parts = name.split(".")
    return parts[-2] if len(parts) > 1 else ""


class CompressedTensorsFolder(IndexedCheckpoint):
    """A compressed-tensors folder (as lowbit writes them), read with dense weight names.

    Attributes:
        quantization_config: the folder's ``quantization_config`` (``config`` is
            ``config.json`` without it, so a model built from it is a plain float model).
        transforms: the online input transforms its ``transform_config`` declares
            (``lowbit.checkpoints.compressed_tensors.transforms``), which ``lowbit.models.build.build_model``
            applies; their stored matrices are not among :meth:`names`.
    """

    format = "compressed-tensors"

    def __init__(self, path: Path) -> None:

        super().__init__()
        self.path = Path(path)
        self._st = HuggingFaceFolder(self.path)
        self.metadata = self._st.metadata
        cfg = dict(self._st.config or {})
        self.quantization_config = cfg.pop("quantization_config")
        self.config = cfg
        where = str(self.path / "config.json")
        if self.quantization_config.get("quantization_status", "compressed") != "compressed":
            raise LowbitError(
                f"{where}: quantization_status "
                f"{self.quantization_config.get('quantization_status')!r}: lowbit reads "
                f"compressed checkpoints"
            )
        groups = ct_groups(self.quantization_config, where)
        self.transforms = input_transforms(self.quantization_config, where)
        self._stored_matrices: dict[str, list[str]] = {}
        # a transform's stored matrices (``<layer>.v_input.weight``) are not the model's
        hidden = {t.tensor_suffix for t in self.transforms}
        names = [n for n in self._st.names() if _owner(n) not in hidden]
        all_modules = {n.rsplit(".", 1)[0] for n in names}
        quantized = sorted({n.rsplit(".", 1)[0] for n in names if n.rsplit(".", 1)[-1] in _PARTS})
        self._groups: dict[str, dict[str, Any]] = {}
        self._group_names: dict[str, str] = {}
        for m in quantized:
            fits = [(n, g) for n, g in ct_candidates(m, groups, all_modules)
                    if ct_check_weight(self._st, m, g) is None]  # fmt: skip
            if not fits:
                raise LowbitError(
                    f"{self.path}: {m} is stored quantized but matches no config group "
                    f"(lowbit verify {self.path} says why)"
                )
            self._group_names[m], self._groups[m] = fits[0]
        self._infos: dict[str, TensorInfo] = {}
        for n in names:
            module, _, part = n.rpartition(".")
            if module in self._groups and (part == "weight" or part in _QUANT_PARTS):
                if part in ("weight_scale", "weight_packed", "weight"):
                    self._add_weight(module)
                continue  # zero points, shapes, activation scales belong to the quantization
            self._infos[n] = self._st.info(n)

    def _add_weight(self, module: str) -> None:
        name = f"{module}.weight"
        if name in self._infos:
            return
        g = self._groups[module]
        parts = [f"{module}.{p}" for p in (*_PARTS, "weight")]
        have = set(self._st.names())
        infos = [self._st.info(p) for p in parts if p in have]
        if g["format"] in FP4_FORMATS:
            data = self._st.info(f"{module}.weight_packed")
            shape = (data.shape[0], data.shape[1] * 2)
        elif g["format"] == "pack-quantized":
            shape = tuple(int(v) for v in np.asarray(self._st.get(f"{module}.weight_shape")))
            data = self._st.info(f"{module}.weight_packed")
        else:
            data = self._st.info(f"{module}.weight")
            shape = data.shape
        kind = f"CT_INT{g['bits']}" if g["type"] == "int" else f"CT_FP{g['bits']}"
        self._infos[name] = TensorInfo(
            name, shape, kind, sum(i.nbytes for i in infos), data.file, data.offset
        )

    def input_activations(self) -> dict[str, tuple[str, Any]]:
        """How each quantized module's input is quantized when served, from its config
        group's ``input_activations``: module -> ``(mode, scale)``, mode ``int8`` /
        ``fp8_token`` (dynamic per token, scale None), ``fp8_block`` (dynamic, groups of 128)
        or ``nvfp4`` (W4A4: scale the stored float32 ``input_global_scale``); weight-only
        modules are absent.

        Raises:
            LowbitError: input quantization lowbit cannot emulate (static INT8/FP8 scales,
                asymmetric, other groups), naming the module and its group.
        """
        out: dict[str, tuple[str, Any]] = {}
        raw = self.quantization_config.get("config_groups") or {}
        for module, gname in self._group_names.items():
            a = (raw.get(gname) or {}).get("input_activations")
            if not a:
                continue
            mode = _input_mode(a)
            if mode is None:
                raise LowbitError(
                    f"{self.path}: {module} (config group {gname}) declares input_activations "
                    f"{a} that lowbit cannot emulate: it emulates dynamic per-token int8/fp8, "
                    "fp8 groups of 128 and NVFP4 (static input_global_scale)"
                )
            scale = None
            if mode == "nvfp4":
                name = f"{module}.input_global_scale"
                if name not in self._st.names():
                    raise LowbitError(
                        f"{self.path}: {module} declares NVFP4 input activations but stores no "
                        "input_global_scale"
                    )
                scale = np.float32(np.ravel(np.asarray(self._st.get(name), np.float32))[0])
            out[module] = (mode, scale)
        return out

    def transform_matrix(self, t: InputTransform, layer: str, width: int) -> np.ndarray:
        """The matrix with which ``layer``'s input blocks are multiplied at run time under
        the online transform ``t`` (one of :attr:`transforms`): see
        :func:`lowbit.checkpoints.compressed_tensors.transforms.transform_matrix`."""
        suffix = f".{t.tensor_suffix}.weight"
        stored = self._stored_matrices.get(suffix)
        if stored is None:  # one scan per transform, not one per layer
            stored = [n for n in self._st.names() if n.endswith(suffix)]
            self._stored_matrices[suffix] = stored

        def get(name: str) -> np.ndarray | None:
            own = name + suffix
            if own in stored:
                return np.asarray(self._st.get(own))
            # compressed-tensors shares one matrix per group and size; save_pretrained keeps
            # the first layer's copy of the tied tensors
            size = t.head_dim or width
            shared = [n for n in stored if tuple(self._st.info(n).shape) == (size, size)]
            return np.asarray(self._st.get(shared[0])) if shared else None

        return transform_matrix(t, layer, width, get)

    def get(self, name: str, dtype: Any = None) -> np.ndarray:
        """One tensor: a quantized weight dequantized to float32, anything else as stored."""
        module = name[: -len(".weight")] if name.endswith(".weight") else None
        if module not in self._groups:
            self.info(name)  # a missing name: the error lists close ones
            return self._st.get(name, dtype)
        arr = self._dequantize(module)  # type: ignore[arg-type]
        arr.setflags(write=False)
        return arr if dtype is None else arr.astype(dtype)

    def quantized_tensor(self, module: str) -> CTTensor:
        """The stored codes, scales and zero points of one quantized module's weight."""
        g = self._groups[module]
        bits, strategy = g["bits"], g["strategy"]
        get = self._st.get
        if g["format"] in FP4_FORMATS:
            return CTTensor(**read_fp4(get, module, g))
        if g["format"] == "pack-quantized":
            out, cols = (int(v) for v in np.asarray(get(f"{module}.weight_shape")))
            codes: Any = unpack_int32(get(f"{module}.weight_packed"), bits, cols)
        else:
            w = np.asarray(get(f"{module}.weight"))
            out, cols = w.shape
            codes = w.view(np.uint8) if g["type"] == "float" else w.astype(np.int8)
        scale = np.asarray(get(f"{module}.weight_scale"), dtype=np.float32)
        zp = None
        if not g["symmetric"]:
            z = np.asarray(get(f"{module}.weight_zero_point"))
            if g["format"] == "pack-quantized" and strategy != "tensor":
                z = unpack_int32(np.ascontiguousarray(z.T), bits, out).T  # packed down the rows
            zp = z.astype(np.int8).reshape(scale.shape)
        return CTTensor(
            codes=codes,
            scale=scale,
            kind=g["type"],
            num_bits=bits,
            zero_point=zp,
            group_size=g["group_size"] if strategy == "group" else None,
            strategy=strategy,
            block_structure=g.get("block"),
        )

    def _dequantize(self, module: str) -> np.ndarray:
        return np.ascontiguousarray(self.quantized_tensor(module).dequantize(), np.float32)

    def close(self) -> None:
        self._st.close()
        super().close()
