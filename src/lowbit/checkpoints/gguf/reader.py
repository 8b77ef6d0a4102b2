"""GGUF files read one tensor at a time, as a :class:`~lowbit.checkpoints.readers.Checkpoint`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from lowbit.checkpoints.gguf import config as _gguf_config
from lowbit.checkpoints.io import gguf_file as _gguf
from lowbit.checkpoints.readers import IndexedCheckpoint, TensorInfo, as_dtype, readonly


class GGUFFile(IndexedCheckpoint):
    """A llama.cpp ``.gguf`` file: metadata key/values and (block-quantized) tensors.

    Names are GGUF's own ("blk.0.attn_q.weight"); shapes are in numpy order; ``get`` dequantizes
    block formats (Q4_0 ... Q8_0, K-quants, IQ types) to float32 with ``gguf.quants``. The
    q/k rows keep llama.cpp's permutation: ``lowbit.models.build`` undoes it when building a model.
    """

    format = "gguf"

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path
        self.header = _gguf.parse(path)
        self.metadata = self.header.metadata
        self.config = _gguf_config.derive_config(self.metadata, set(self.header.tensors))
        self._infos = {
            t.name: TensorInfo(t.name, t.shape, t.type_name, t.nbytes, path, t.offset)
            for t in self.header.tensors.values()
        }

    def get(self, name: str, dtype: Any = None) -> np.ndarray:
        self.info(name)
        arr = _gguf.dequantize(self._map(self.path), self.header.tensors[name], self.path)
        return readonly(as_dtype(arr, dtype))
