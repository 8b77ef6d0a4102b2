"""A streaming safetensors writer: header first, then one tensor at a time.

``safetensors.numpy.save_file`` needs every array of a file in memory at once and knows neither
bfloat16 nor float8; this writer plans each tensor from its dtype and shape, writes the header,
then asks for each tensor's data in turn, so peak memory is about one tensor.

Layout (safetensors README, "Format"): an unsigned little-endian 64-bit header size ``N``, ``N``
bytes of UTF-8 JSON (``{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__":
{str: str}}``, padded with spaces to a multiple of 8), then the tensors' little-endian C-order
bytes, contiguous, in header order, offsets counted from the end of the header.
"""

from __future__ import annotations

import json
import os
import struct
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from lowbit.errors import LowbitError

_CODES: dict[np.dtype, str] = {
    np.dtype(np.bool_): "BOOL",
    np.dtype(np.uint8): "U8",
    np.dtype(np.int8): "I8",
    np.dtype(np.uint16): "U16",
    np.dtype(np.int16): "I16",
    np.dtype(np.uint32): "U32",
    np.dtype(np.int32): "I32",
    np.dtype(np.uint64): "U64",
    np.dtype(np.int64): "I64",
    np.dtype(np.float16): "F16",
    np.dtype(np.float32): "F32",
    np.dtype(np.float64): "F64",
}
# ml_dtypes' types by dtype name: an array of one exists only once ml_dtypes is imported, so
# this module does not import it (its import is most of a cold start)
_ML_CODES = {"bfloat16": "BF16", "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2"}


def dtype_code(dtype: np.dtype) -> str:
    """The safetensors name of a numpy dtype (``F32``, ``BF16``, ``F8_E4M3``, ...)."""
    dt = np.dtype(dtype).newbyteorder("=")
    code = _CODES.get(dt)
    ml = sys.modules.get("ml_dtypes")
    if code is None and ml is not None and dt.name in _ML_CODES and dt == getattr(ml, dt.name):
        code = _ML_CODES[dt.name]
    if code is None:
        raise LowbitError(f"safetensors cannot store dtype {dtype}")
    return code


@dataclass
class Entry:
    """One tensor to write: its name, dtype and shape now, its data from ``produce()`` later."""

    name: str
    dtype: np.dtype
    shape: tuple[int, ...]
    produce: Callable[[], np.ndarray]

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize


def write_file(
    path: str | os.PathLike[str],
    entries: Sequence[Entry],
    metadata: dict[str, str] | None = None,
    on_tensor: Callable[[Entry], None] | None = None,
    digest: Any = None,
) -> None:
    """Write ``entries`` to one safetensors file, producing each tensor's data in turn.

    ``digest`` (a ``hashlib`` object) is fed every byte written, so a checksum of the file
    costs no second read; it hashes each tensor on a second thread while the tensor is written
    (both release the GIL), so the checksum adds little wall time beside the write.
    """
    header: dict[str, Any] = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    offset = 0
    for e in entries:
        header[e.name] = {
            "dtype": dtype_code(e.dtype),
            "shape": [int(n) for n in e.shape],
            "data_offsets": [offset, offset + e.nbytes],
        }
        offset += e.nbytes
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    with open(path, "wb") as f, ThreadPoolExecutor(1) as hasher:
        head = struct.pack("<Q", len(blob)) + blob
        f.write(head)
        if digest is not None:
            digest.update(head)
        for e in entries:
            data = np.asarray(e.produce())
            want = np.dtype(e.dtype).newbyteorder("<")
            if data.shape != tuple(e.shape) or data.dtype.newbyteorder("<") != want:
                # internal invariant: the plan and the data agree
                raise AssertionError(
                    f"{e.name}: planned {e.dtype}{list(e.shape)}, got {data.dtype}{list(data.shape)}"
                )
            # a uint8 view of the (contiguous) data: written without another copy
            raw = np.ascontiguousarray(data, dtype=want).reshape(-1).view(np.uint8)
            hashed = None if digest is None else hasher.submit(digest.update, raw)
            try:
                f.write(raw)
            finally:
                if hashed is not None:
                    hashed.result()  # in order: the next tensor's bytes follow these
            if on_tensor is not None:
                on_tensor(e)
