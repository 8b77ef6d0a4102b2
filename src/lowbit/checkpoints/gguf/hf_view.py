"""A Hugging Face folder seen as the GGUF that ``convert_hf_to_gguf`` would write from it.

:class:`ConvertedView` answers what the GGUF jobs (llama-quantize's mixes, size budgets, GPTQ onto
GGUF block types) ask of a GGUF checkpoint: names, shapes and types, each tensor's values and the
file's metadata, all made from the folder on request, tensor by tensor, by the converter's own
functions (:mod:`lowbit.checkpoints.gguf.convert`), so what a job writes from the view is byte for
byte what it writes from the converted file, without that file: no extra disk, no extra write
and read of the whole model.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import numpy as np

from lowbit._arrays import bfloat16
from lowbit.checkpoints.gguf import convert
from lowbit.checkpoints.gguf import writer as gguf_writer
from lowbit.checkpoints.gguf.config import derive_config
from lowbit.checkpoints.gguf.writer import GGUFTensor
from lowbit.checkpoints.io import gguf_file
from lowbit.checkpoints.readers import Checkpoint, TensorInfo, as_dtype, readonly
from lowbit.plans.plan import PrecisionPlan

__all__ = ["ConvertedView"]

_DTYPES = {"F32": np.dtype("<f4"), "F16": np.dtype("<f2")}


def _keep_plan() -> PrecisionPlan:
    return PrecisionPlan.from_dict({"rules": [{"match": "*", "format": "keep"}]})


def _tensors(hf: Any) -> list[tuple[Any, ...]]:
    """``(name, shape, dtype, nbytes, None)`` of each tensor, as ``quantize_model`` plans a
    Hugging Face source (``lowbit.checkpoints.streaming.checkpoint_tensors``)."""
    out = []
    for name in hf.names():
        info = hf.info(name)
        out.append((name, tuple(info.shape), str(info.dtype), int(info.nbytes), None))
    return out


class ConvertedView(Checkpoint):
    """A Hugging Face checkpoint as its converted GGUF (every tensor at its stored precision).

    ``names()``, ``info()``, ``get()``, ``metadata`` and ``config`` are those of
    :class:`~lowbit.checkpoints.gguf.reader.GGUFFile` opened on the file ``lowbit quantize
    FOLDER --to keep --out-format gguf`` writes; ``path`` is the folder. Writers copy the
    metadata with :meth:`gguf_fields` (what
    :func:`lowbit.checkpoints.io.gguf_file.raw_metadata` reads from that file).
    Tensors have no span of their own (``offset`` -1): ``get`` reads and converts them.

    Raises:
        LowbitError: a folder the converter refuses (family, tokenizer, tensor names).
    """

    format = "gguf"

    def __init__(self, hf: Any) -> None:
        super().__init__()
        self.hf = hf
        self.path = Path(hf.path)
        fam = convert.hf_family(hf)
        applied = _keep_plan().apply(_tensors(hf), source=str(self.path.name))
        self._sources = convert._sources(hf, applied, fam)
        shapes = {name: convert._shape(s) for name, s in self._sources.items()}
        self._types = {name: convert._gguf_type(s) for name, s in self._sources.items()}
        planned = {
            name: gguf_writer._plan(
                name, GGUFTensor(np.broadcast_to(np.float32(0), shapes[name]), self._types[name])
            )
            for name in self._sources
        }
        self._infos = {
            name: TensorInfo(name, p.shape, self._types[name], p.nbytes, self.path, -1)
            for name, p in planned.items()
        }
        meta = convert.hf_metadata(hf, fam, shapes)
        arch, typed = gguf_writer.header_fields(planned, metadata=meta, arch=fam.arch)
        self._fields = gguf_writer.encoded_fields(arch, typed)
        self.metadata = _parsed(self._fields, self.path)
        self.config = derive_config(self.metadata, set(self._infos))

    def names(self) -> list[str]:
        return list(self._infos)

    def info(self, name: str) -> TensorInfo:
        try:
            return self._infos[name]
        except KeyError:
            raise self._missing(name) from None

    def get(self, name: str, dtype: Any = None) -> np.ndarray:
        """The tensor as the converted file stores it (F32, F16 or BF16 values), numpy order."""
        info = self.info(name)
        value = convert._value(self.hf, self._sources[name], "auto", None)
        data = np.ascontiguousarray(gguf_writer._plan(name, value).produce())
        want = _DTYPES.get(info.dtype) or np.dtype(bfloat16())
        arr = data.reshape(-1).view(np.uint8).view(want).reshape(info.shape)
        return readonly(as_dtype(arr, dtype))

    def prefetch(self, name: str) -> None:
        """The source tensors a converted tensor is made of, hinted to the operating system
        (:meth:`Checkpoint.prefetch`)."""
        source = self._sources.get(name)
        for member in source.members if source is not None else ():
            self.hf.prefetch(member.name)

    def gguf_fields(self) -> dict[str, tuple[int, bytes]]:
        """Every metadata key of the converted file as (value type, encoded value), in order."""
        return dict(self._fields)

    def close(self) -> None:
        self.hf.close()
        super().close()


def _parsed(fields: dict[str, tuple[int, bytes]], path: Path) -> dict[str, Any]:
    """The metadata as :class:`~lowbit.checkpoints.gguf.reader.GGUFFile` reads it."""
    parts = [b"GGUF", struct.pack("<IQQ", 3, 0, len(fields))]
    for key, (vtype, payload) in fields.items():
        k = key.encode("utf-8")
        parts += [struct.pack("<Q", len(k)), k, struct.pack("<I", vtype), payload]
    return gguf_file.parse_bytes(b"".join(parts), path).metadata
