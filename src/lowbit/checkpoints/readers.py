"""Read checkpoints one tensor at a time: safetensors files, Hugging Face folders, GGUF files.

``open_checkpoint(path)`` gives one interface over all three:

>>> ckpt = open_checkpoint("model_dir")                      # doctest: +SKIP
>>> ckpt.names()[:2], ckpt.shape("lm_head.weight"), ckpt.dtype("lm_head.weight")
>>> w = ckpt.get("lm_head.weight")                           # a memory-mapped numpy array

Tensors are memory-mapped, so a checkpoint larger than RAM can be walked tensor by tensor. Pickle
files (``pytorch_model.bin``) are never loaded.

Headers are parsed and checked against the file by lowbit's own parsers
(:mod:`lowbit.checkpoints.io.safetensors`, :mod:`lowbit.checkpoints.io.gguf_file`), not by the
``safetensors`` package, whose numpy loader rejects bfloat16 and float8 tensors, the ones lowbit
deals in. The tests check this reader against ``safetensors``' own.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from lowbit import _json
from lowbit._arrays import ml_dtype
from lowbit._progress import progress_iter
from lowbit.checkpoints.io import safetensors as _safetensors
from lowbit.errors import LowbitError

# safetensors dtype -> numpy dtype factory (the sub-byte F6/F4 types have none)
_ST_DTYPES: dict[str, Any] = {
    "F64": lambda: np.dtype("<f8"),
    "F32": lambda: np.dtype("<f4"),
    "F16": lambda: np.dtype("<f2"),
    "BF16": lambda: ml_dtype("bfloat16"),
    "F8_E4M3": lambda: ml_dtype("float8_e4m3fn"),
    "F8_E5M2": lambda: ml_dtype("float8_e5m2"),
    "F8_E8M0": lambda: ml_dtype("float8_e8m0fnu"),
    "I64": lambda: np.dtype("<i8"),
    "I32": lambda: np.dtype("<i4"),
    "I16": lambda: np.dtype("<i2"),
    "I8": lambda: np.dtype("i1"),
    "U64": lambda: np.dtype("<u8"),
    "U32": lambda: np.dtype("<u4"),
    "U16": lambda: np.dtype("<u2"),
    "U8": lambda: np.dtype("u1"),
    "BOOL": lambda: np.dtype("?"),
}


@dataclass(frozen=True)
class TensorInfo:
    """Where one tensor lives and how it is stored.

    Attributes:
        name: the tensor's name in the checkpoint.
        shape: numpy order (outermost dimension first; GGUF's dims are reversed to match).
        dtype: the storage type as the file names it ("F32", "BF16", "Q4_1", ...).
        nbytes: bytes on disk.
        file: the file holding it.
        offset: absolute byte offset of its data in that file.
    """

    name: str
    shape: tuple[int, ...]
    dtype: str
    nbytes: int
    file: Path
    offset: int

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


class Checkpoint(ABC):
    """A checkpoint opened for reading, one tensor at a time.

    Attributes:
        path: what was opened (file or folder).
        format: "safetensors", "huggingface" (a folder of safetensors shards) or "gguf".
        metadata: the file's own metadata (safetensors ``__metadata__``, GGUF key/values).
        config: the Hugging Face config dict (``config.json``, or derived from GGUF metadata),
            or ``None`` when there is none.
    """

    path: Path
    format: str
    metadata: dict[str, Any]
    config: dict[str, Any] | None

    def __init__(self) -> None:
        self._maps: dict[Path, np.ndarray] = {}

    @abstractmethod
    def info(self, name: str) -> TensorInfo:
        """Storage facts for one tensor.

        Raises:
            LowbitError: no tensor of that name (the message lists close names).
        """

    @abstractmethod
    def names(self) -> list[str]:
        """Tensor names in file order."""

    @abstractmethod
    def get(self, name: str, dtype: Any = None) -> np.ndarray:
        """Read one tensor as a numpy array.

        Args:
            name: the tensor's name.
            dtype: convert to this dtype (e.g. ``np.float32``); ``None`` keeps the stored type
                (bfloat16/float8 as ml_dtypes types; GGUF block formats dequantized to float32).

        Returns:
            A read-only array, memory-mapped where the stored type allows it.
        """

    def prefetch(self, name: str) -> None:
        """Ask the operating system to start reading one tensor's stored bytes now, and return
        at once: a hint (``posix_fadvise`` WILLNEED) that reads nothing into Python, changes
        no result, and does nothing for an unknown name, a tensor without a span of its own
        or where the platform has no such hint. The writers give it the next tensor while
        they round the current one, so the disk and the rounding overlap."""
        try:
            info = self.info(name)
        except LowbitError:
            return
        _will_need(info.file, info.offset, info.nbytes)

    def shape(self, name: str) -> tuple[int, ...]:
        """Shape of one tensor, numpy order."""
        return self.info(name).shape

    def dtype(self, name: str) -> str:
        """Storage type of one tensor as the file names it ("F32", "BF16", "Q4_1", ...)."""
        return self.info(name).dtype

    def items(
        self, names: list[str] | None = None, *, dtype: Any = None, progress: bool | None = None
    ) -> Iterator[tuple[str, np.ndarray]]:
        """Yield ``(name, array)`` pairs one tensor at a time.

        Args:
            names: the tensors to read (default: all, in file order).
            dtype: as for :meth:`get`.
            progress: show a tqdm progress bar on stderr; ``None`` shows it only when stderr is a
                terminal, ``False`` never.
        """
        todo = self.names() if names is None else list(names)
        for name in progress_iter(todo, progress, f"reading {self.path.name}", "tensor"):
            yield name, self.get(name, dtype)

    @property
    def numel(self) -> int:
        """Total number of values in all tensors."""
        return sum(self.info(n).numel for n in self.names())

    @property
    def nbytes(self) -> int:
        """Total bytes of tensor data on disk."""
        return sum(self.info(n).nbytes for n in self.names())

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self.names())

    def __contains__(self, name: object) -> bool:
        return name in self.names()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.format} {str(self.path)!r}: {len(self)} tensors>"

    def close(self) -> None:
        """Drop the memory maps (arrays already returned stay valid until garbage collected)."""
        self._maps.clear()

    def __enter__(self) -> Checkpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _map(self, file: Path) -> np.ndarray:
        m = self._maps.get(file)
        if m is None:
            # a plain ndarray over the map: every slice or result of an np.memmap is another
            # np.memmap, whose __array_finalize__ costs more than small numpy operations
            m = np.asarray(np.memmap(file, dtype=np.uint8, mode="r"))
            self._maps[file] = m
        return m

    def _missing(self, name: str) -> LowbitError:
        import difflib

        close = difflib.get_close_matches(str(name), self.names(), n=3, cutoff=0.6)
        hint = f"; close names: {', '.join(close)}" if close else ""
        return LowbitError(f"{self.path}: no tensor named {name!r}{hint}")


def _will_need(file: Path, offset: int, nbytes: int) -> None:
    """``posix_fadvise(WILLNEED)`` on a span of ``file`` (nothing where there is none)."""
    advise = getattr(os, "posix_fadvise", None)
    if advise is None or offset < 0 or nbytes <= 0:
        return
    try:
        fd = os.open(file, os.O_RDONLY)
    except OSError:
        return
    try:
        advise(fd, offset, nbytes, os.POSIX_FADV_WILLNEED)
    except OSError:
        pass
    finally:
        os.close(fd)


def as_dtype(arr: np.ndarray, dtype: Any) -> np.ndarray:
    if dtype is None or arr.dtype == np.dtype(dtype):
        return arr
    return arr.astype(dtype)


def readonly(arr: np.ndarray) -> np.ndarray:
    arr = np.asarray(arr)  # a plain ndarray view, not np.memmap (whose reductions stay memmaps)
    if arr.flags.writeable:
        arr = arr.view()
        arr.flags.writeable = False
    return arr


# --------------------------------------------------------------------------- safetensors


def _parse_safetensors(path: Path) -> tuple[dict[str, TensorInfo], dict[str, str]]:
    """The checked header (see :func:`lowbit.checkpoints.io.safetensors.parse`) as TensorInfos.

    Raises:
        LowbitError: a header :func:`~lowbit.checkpoints.io.safetensors.parse` refuses, or a
            dtype with no numpy type (F6_E2M3, F6_E3M2, F4).
    """
    header = _safetensors.parse(path)
    for t in header.tensors.values():
        if t.dtype not in _ST_DTYPES:
            raise LowbitError(
                f"{path}: tensor {t.name!r} has dtype {t.dtype!r}, which lowbit cannot read; "
                f"readable: {', '.join(_ST_DTYPES)}"
            )
    infos = {
        n: TensorInfo(n, t.shape, t.dtype, t.nbytes, path, t.offset)
        for n, t in header.tensors.items()
    }
    return infos, header.metadata


class IndexedCheckpoint(Checkpoint):
    """A checkpoint whose header gave every tensor's TensorInfo up front (``_infos``)."""

    _infos: dict[str, TensorInfo]

    def info(self, name: str) -> TensorInfo:
        try:
            return self._infos[name]
        except KeyError:
            raise self._missing(name) from None

    def names(self) -> list[str]:
        return list(self._infos)


class _SafetensorsBase(IndexedCheckpoint):
    def get(self, name: str, dtype: Any = None) -> np.ndarray:
        info = self.info(name)
        np_dtype = _ST_DTYPES[info.dtype]()
        raw = self._map(info.file)[info.offset : info.offset + info.nbytes]
        arr = raw.view(np_dtype).reshape(info.shape)
        return readonly(as_dtype(arr, dtype))


class SafetensorsFile(_SafetensorsBase):
    """A single ``.safetensors`` file (its folder's ``config.json`` is picked up if present)."""

    format = "safetensors"

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path
        self._infos, self.metadata = _parse_safetensors(path)
        self.config = read_config(path.parent / "config.json")


class HuggingFaceFolder(_SafetensorsBase):
    """A Hugging Face model folder: ``config.json`` plus one or many safetensors shards.

    Shards are found from ``*.safetensors.index.json`` (its ``weight_map``) when present, else
    ``model.safetensors``, else every ``*.safetensors`` file in the folder.
    """

    format = "huggingface"

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path
        self.config = read_config(path / "config.json")
        self.metadata = {}
        indexes = sorted(path.glob("*.safetensors.index.json"))
        if len(indexes) > 1:
            raise LowbitError(
                f"{path}: several shard indexes ({', '.join(p.name for p in indexes)}); open one "
                f"shard file directly or remove the extra index"
            )
        self._infos = {}
        if indexes:
            self._open_index(indexes[0])
        else:
            single = path / "model.safetensors"
            shards = [single] if single.exists() else sorted(path.glob("*.safetensors"))
            if not shards:
                raise LowbitError(_no_weights_message(path))
            for shard in shards:
                self._add_shard(shard)

    def _open_index(self, index: Path) -> None:
        doc = _json.load(index)
        weight_map = doc.get("weight_map") if isinstance(doc, dict) else None
        if not isinstance(weight_map, dict) or not weight_map:
            raise LowbitError(f"{index}: weight_map is empty or not an object")
        if isinstance(doc.get("metadata"), dict):
            self.metadata.update({str(k): v for k, v in doc["metadata"].items()})
        by_shard: dict[str, list[str]] = {}
        for name, shard in weight_map.items():
            by_shard.setdefault(str(shard), []).append(name)
        for shard_name, names in by_shard.items():
            shard = (self.path / shard_name).resolve()
            if self.path.resolve() not in shard.parents:
                raise LowbitError(
                    f"{index}: shard {_json.short_repr(shard_name)} lies outside the folder"
                )
            if not shard.exists():
                raise LowbitError(
                    f"{self.path}: shard {shard_name} is missing (the index lists "
                    f"{len(names)} tensors in it, e.g. {names[0]!r})"
                )
            infos = self._add_shard(shard)
            absent = [n for n in names if n not in infos]
            if absent:
                raise LowbitError(
                    f"{shard}: the index places tensor {absent[0]!r} here but the shard does not "
                    f"hold it ({len(absent)} such tensors)"
                )

    def _add_shard(self, shard: Path) -> dict[str, TensorInfo]:
        infos, meta = _parse_safetensors(shard)
        for name, info in infos.items():
            if name in self._infos:
                raise LowbitError(
                    f"{self.path}: tensor {name!r} is in both {self._infos[name].file.name} and "
                    f"{shard.name}"
                )
            self._infos[name] = info
        for k, v in meta.items():
            self.metadata.setdefault(k, v)
        return infos


def _no_weights_message(path: Path) -> str:
    pickles = [p.name for p in path.glob("*.bin")] + [p.name for p in path.glob("*.pt")]
    if pickles:
        return (
            f"{path}: only pickle weights ({', '.join(sorted(pickles)[:3])}); lowbit never loads "
            f"pickles. Convert them to safetensors first"
        )
    return f"{path}: no .safetensors or .gguf weights in this folder"


def read_config(path: Path) -> dict[str, Any] | None:
    if not path.exists():
        return None
    cfg = _json.load(path)
    if not isinstance(cfg, dict):
        raise LowbitError(f"{path}: config is not a JSON object")
    return cfg


# --------------------------------------------------------------------------------- GGUF


# --------------------------------------------------------------------------------- entry


class ReplacedCheckpoint(Checkpoint):
    """A checkpoint with some tensors replaced by float32 arrays held in memory (e.g. AWQ's
    folded norms, ``lowbit.calibration.awq.AWQRun.checkpoint``); every other tensor is
    read from ``base``. A replaced tensor's :meth:`info` says ``F32`` and the float32 bytes;
    its ``file`` and ``offset`` still point at the original, so writers that copy stored
    bytes must look at :attr:`replaced` first (``lowbit.checkpoints.steps`` does).

    Attributes:
        base: the checkpoint read for everything not replaced.
        replaced: name -> the float32 array that replaces it.
    """

    def __init__(self, base: Checkpoint, replaced: dict[str, np.ndarray]) -> None:
        super().__init__()
        self.base = base
        self.replaced = {n: np.asarray(a, dtype=np.float32) for n, a in replaced.items()}
        self.path, self.format = base.path, base.format
        self.metadata, self.config = base.metadata, base.config

    def names(self) -> list[str]:
        return self.base.names()

    def info(self, name: str) -> TensorInfo:
        info = self.base.info(name)
        if name in self.replaced:
            return TensorInfo(
                name, info.shape, "F32", int(self.replaced[name].nbytes), info.file, info.offset
            )
        return info

    def get(self, name: str, dtype: Any = None) -> np.ndarray:
        if name not in self.replaced:
            return self.base.get(name, dtype)
        arr = self.replaced[name]
        return arr if dtype is None else arr.astype(dtype)

    def close(self) -> None:
        self.base.close()
        super().close()
