"""Checkpoint headers without the data, as the planner's tensors: safetensors and GGUF.

The headers are parsed and checked by the same parsers the checkpoint readers use
(:mod:`lowbit.checkpoints.io.safetensors`, :mod:`lowbit.checkpoints.io.gguf_file`): every length is
validated against the file size, so a truncated or corrupt file is a clear
:class:`~lowbit.errors.LowbitError`, and a 100 GB checkpoint is counted in milliseconds. GGUF's
GGML block sizes come from the ``gguf`` package (``GGML_QUANT_SIZES``); its ``GGUFReader`` is not
used (it builds numpy views of every metadata item, about 4 s for a 49k-token vocabulary).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lowbit.checkpoints.io import gguf_file as _gguf
from lowbit.checkpoints.io import safetensors as _safetensors
from lowbit.checkpoints.io.safetensors import SAFETENSORS_DTYPE_BITS
from lowbit.planning.modelspec import TensorInfo
from lowbit.plans.components import classify

__all__ = ["SAFETENSORS_DTYPE_BITS", "read_gguf_header", "read_safetensors_header"]

_LIST_LIMIT = 64  # longer metadata arrays (a vocabulary) are given as their length


def _info(t: Any, dtype: str, data_offset: int) -> TensorInfo:
    """A parser's tensor entry as the planner's, its offset made relative to the data section."""
    shape, offset = t.shape, t.offset - data_offset
    return TensorInfo(t.name, shape, classify(t.name, len(shape)), dtype, t.nbytes, offset=offset)


def read_safetensors_header(path: str | Path) -> tuple[list[TensorInfo], dict[str, str]]:
    """Parse a safetensors file's header (8-byte little-endian length + JSON); read no data.

    Returns:
        The tensors (names, shapes, dtypes, stored bytes, components; ``offset`` relative to
        the data section) in offset order, and the ``__metadata__`` dict.

    Raises:
        LowbitError: a missing file or a malformed header (bad length, not JSON, an unknown
            dtype, offsets that do not match the shapes, overlap or leave the file).
    """
    header = _safetensors.parse(Path(path))
    return [_info(t, t.dtype, header.data_offset) for t in header.tensors.values()], header.metadata


def read_gguf_header(path: str | Path) -> tuple[list[TensorInfo], dict[str, Any]]:
    """Parse a GGUF file's header (metadata and tensor infos); read no tensor data.

    Shapes are returned in row-major order (GGUF lists the fastest dimension first). Stored
    bytes come from GGML's block sizes (``gguf.GGML_QUANT_SIZES``); metadata arrays longer
    than 64 items (the vocabulary) are returned as their length. ``TensorInfo.offset`` is
    relative to the data section, which starts at ``meta["__data_offset__"]`` (aligned to
    ``meta["__alignment__"]``, ``general.alignment`` or 32).

    Raises:
        LowbitError: not a GGUF file, or a header that does not fit the file (see
            :func:`lowbit.checkpoints.io.gguf_file.parse`).
        ImportError: the ``gguf`` package (for the GGML type table) is missing.
    """
    header = _gguf.parse(Path(path))
    tensors = [_info(t, t.type_name, header.data_offset) for t in header.tensors.values()]
    meta = {
        k: len(v) if isinstance(v, list) and len(v) > _LIST_LIMIT else v
        for k, v in header.metadata.items()
    }
    meta["__data_offset__"] = header.data_offset
    meta["__alignment__"] = header.alignment
    return tensors, meta
