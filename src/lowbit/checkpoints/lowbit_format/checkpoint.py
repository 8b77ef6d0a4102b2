"""lowbit's own quantized checkpoint: packed codes and scales in safetensors, the plan in JSON.

A lowbit checkpoint is a folder::

    DIR/
      lowbit.json                  the manifest (below)
      model.safetensors            or model-00001-of-0000N.safetensors: the tensors
      config.json, tokenizer.json  copied from a Hugging Face source (and its other small files)
      source_metadata.gguf         for a GGUF source: its metadata (tokenizer, hyperparameters)

Every quantized tensor ``NAME`` is stored as the arrays of
``lowbit.quant.quantized_tensor.QuantizedTensor.to_arrays(prefix="NAME:")``: ``NAME:codes`` (uint8, packed
little-endian at the element width, ``lowbit.codecs.packing``), ``NAME:scale`` (float32, float16,
bfloat16 as uint16 bit patterns, or E8M0 as uint8 codes, shaped as ``lowbit.quant.layout`` says),
``NAME:zero_point`` (asymmetric integers: packed at the element width, two's complement), or for
NF4 double quantization ``NAME:scale_codes``, ``NAME:scale_absmax``, ``NAME:scale_offset``. A
kept tensor is stored under its own name exactly as the source stored it (a GGUF block type such
as Q8_0 as its raw bytes, uint8 ``[rows, bytes per row]``); a cast tensor in its new dtype.

``lowbit.json`` holds ``{"format": "lowbit-checkpoint", "version": 1, "lowbit_version",
"source": {"path", "format"}, "plan": PrecisionPlan.to_dict(), "config": the model's Hugging
Face config (derived from GGUF metadata for a GGUF source), "files": [shards], "tensors": {NAME:
entry}}`` where an entry is ``{"kind": "quantized" | "kept" | "cast", "file", "shape",
"source_dtype", ...}``; quantized entries add ``"tensor"`` (``to_arrays``' metadata: its own
``version``, shape, scale shape and the full ``Scheme``) and ``"activations"``; kept entries add
``"dtype"`` and ``"encoding"`` (``"array"`` or ``"gguf:TYPE"``). ``"checksums"`` records the
size and sha256 of every file written into the folder and ``"manifest_sha256"`` the digest of
the manifest itself (:mod:`lowbit.checkpoints.lowbit_format.manifest`, which also holds the schema every
load checks).

Reading back (:class:`LowbitCheckpoint`, ``lowbit.load(DIR)``) first checks the manifest and the
files against it (``verify=False`` skips the sha256s), then gives exactly
``QuantizedTensor.dequantize()``'s float32 values; ``lowbit.load_model(DIR)`` builds the
transformers model with those weights and simulates per-token activation quantization on the
layers whose plan asked for it (``lowbit.models.activations``).
"""

from __future__ import annotations

import hashlib
import math
import os
import shutil
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from lowbit._progress import progress_bar
from lowbit._version import __version__
from lowbit.checkpoints.gguf.writer import write_gguf
from lowbit.checkpoints.io import gguf_file as _gguf
from lowbit.checkpoints.io import safetensors_write as _safetensors
from lowbit.checkpoints.io.atomic import atomic_dir
from lowbit.checkpoints.lowbit_format import manifest as _manifest
from lowbit.checkpoints.lowbit_format.manifest import GGUF_METADATA, MANIFEST
from lowbit.checkpoints.readers import Checkpoint, SafetensorsFile, TensorInfo
from lowbit.errors import LowbitError
from lowbit.plans.plan import PrecisionPlan
from lowbit.quant.layout import quantized_arrays
from lowbit.quant.quantized_tensor import QuantizedTensor

__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "MANIFEST",
    "LowbitCheckpoint",
    "Unit",
    "is_lowbit_checkpoint",
    "write_lowbit_checkpoint",
]

FORMAT_NAME = "lowbit-checkpoint"
FORMAT_VERSION = 1
DEFAULT_SHARD_SIZE = 2 * 2**30

_PLAIN_GGUF = ("F32", "F16", "BF16", "F64", "I8", "I16", "I32", "I64")


# ---------------------------------------------------------------------------------------
# Writing
# ---------------------------------------------------------------------------------------


@dataclass
class Unit:
    """One tensor to write: its manifest entry and arrays now, their data from ``produce()``.

    Attributes:
        name: the tensor's name.
        entry: its manifest entry (``kind``, ``shape``, ...; ``file`` is filled in).
        arrays: ``(key, dtype, shape)`` of every array it stores, in order.
        produce: returns ``{key: array}`` for all of them (called once, when due).
    """

    name: str
    entry: dict[str, Any]
    arrays: list[tuple[str, np.dtype, tuple[int, ...]]]
    produce: Callable[[], dict[str, np.ndarray]]
    _data: dict[str, np.ndarray] | None = field(default=None, repr=False)

    @property
    def nbytes(self) -> int:
        return sum(math.prod(s) * np.dtype(d).itemsize for _, d, s in self.arrays)

    def take(self, key: str) -> np.ndarray:
        """The data of one array; the tensor is produced on the first call and dropped after
        its last array is taken (one tensor in memory at a time)."""
        if self._data is None:
            self._data = self.produce()
            missing = [k for k, _, _ in self.arrays if k not in self._data]
            if missing:  # internal invariant: produce() makes what was planned
                raise AssertionError(f"{self.name}: produce() gave no {missing}")
        arr = self._data.pop(key)
        if not self._data:
            self._data = None
        return arr


def write_lowbit_checkpoint(
    out_dir: str | os.PathLike[str],
    units: Sequence[Unit],
    manifest: dict[str, Any],
    *,
    copy_files: Sequence[tuple[Path, str]] = (),
    gguf_metadata_source: str | os.PathLike[str] | None = None,
    max_shard_size: int = DEFAULT_SHARD_SIZE,
    overwrite: bool = False,
    progress: bool | None = None,
) -> Path:
    """Write a lowbit checkpoint folder, streaming one tensor at a time.

    Args:
        out_dir: the folder to create, written as ``DIR.tmp-XXXX`` beside it and renamed when
            complete: an error or Ctrl-C midway leaves nothing.
        units: the tensors in order; each one's data is produced when its bytes are due.
        manifest: the manifest without ``files``/``tensors`` (source, plan, config).
        copy_files: ``(file, relative name)`` pairs copied into the folder (tokenizer files).
        gguf_metadata_source: a GGUF file whose metadata is kept as ``source_metadata.gguf``.
        max_shard_size: bytes per safetensors shard (a tensor's arrays never straddle two).
        overwrite: replace an existing folder.
        progress: tqdm bar over tensors (``None``: only on a terminal).

    Returns:
        The folder written.

    Raises:
        LowbitError: an existing folder without ``overwrite``, duplicate names.
    """
    if max_shard_size <= 0:
        raise LowbitError(f"max_shard_size must be positive, got {max_shard_size}")
    seen: set[str] = set()
    for u in units:
        for key, _, _ in u.arrays:
            if key in seen:
                raise LowbitError(f"array name {key!r} appears twice in the checkpoint")
            seen.add(key)
    shards: list[list[Unit]] = [[]]
    size = 0
    for u in units:
        if shards[-1] and size + u.nbytes > max_shard_size:
            shards.append([])
            size = 0
        shards[-1].append(u)
        size += u.nbytes
    names = (
        ["model.safetensors"]
        if len(shards) == 1
        else [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    )
    meta = {"format": "lowbit", "lowbit_format_version": str(FORMAT_VERSION)}
    digests: dict[str, Any] = {}
    with atomic_dir(out_dir, overwrite=overwrite) as tmp:
        bar = progress_bar(len(units), progress, f"quantizing into {Path(out_dir).name}", "tensor")
        with bar:
            for fname, shard in zip(names, shards, strict=True):
                entries = [
                    _safetensors.Entry(key, dtype, shape, _taker(u, key))
                    for u in shard
                    for key, dtype, shape in u.arrays
                ]
                last = {u.arrays[-1][0] for u in shard if u.arrays}

                def done(e: Any, last: set[str] = last) -> None:
                    if e.name in last:
                        bar.update(1)

                digests[fname] = hashlib.sha256()
                _safetensors.write_file(
                    tmp / fname, entries, meta, on_tensor=done, digest=digests[fname]
                )
        tensors: dict[str, Any] = {}
        for fname, shard in zip(names, shards, strict=True):
            for u in shard:
                tensors[u.name] = {**u.entry, "file": fname}  # entries are complete now
        doc = {
            "format": FORMAT_NAME,
            "version": FORMAT_VERSION,
            "lowbit_version": __version__,
            **manifest,
            "files": names,
            "tensors": tensors,
        }
        if gguf_metadata_source is not None:
            write_gguf(tmp / GGUF_METADATA, {}, source=gguf_metadata_source, progress=False)
        for src, rel in copy_files:
            dest = tmp / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, dest)
        _write_manifest(tmp, doc, {k: h.hexdigest() for k, h in digests.items()})
    return Path(out_dir)


def _write_manifest(folder: Path, doc: dict[str, Any], digests: dict[str, str]) -> None:
    """Write ``lowbit.json`` last: the size and sha256 of every file in the folder (the shards'
    digests were taken while they were written), then the manifest's own digest."""
    doc[_manifest.CHECKSUMS_KEY] = _manifest.record_files(folder, digests)
    (folder / MANIFEST).write_text(_manifest.seal(doc, default=_jsonable))


def _taker(u: Unit, key: str) -> Callable[[], np.ndarray]:
    return lambda: u.take(key)


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, (bytes, bytearray)):
        return obj.decode("utf-8", "replace")
    raise TypeError(f"not JSON-serialisable: {type(obj).__name__}")


def quantized_unit(
    name: str,
    shape: tuple[int, ...],
    scheme: Any,
    quantize: Callable[[], Any],
    entry: dict[str, Any],
) -> Unit:
    """A :class:`Unit` for a tensor quantized when due (``quantize()`` gives the QuantizedTensor)."""
    specs = quantized_arrays(shape, scheme)
    prefix = f"{name}:"

    def produce() -> dict[str, np.ndarray]:
        qt = quantize()
        arrays, meta = qt.to_arrays(prefix)
        entry["tensor"] = meta
        out = {}
        for s in specs:
            a = np.asarray(arrays.pop(prefix + s.suffix))
            if a.dtype != s.dtype or a.size != math.prod(s.shape):  # internal invariant
                raise AssertionError(
                    f"{name}: planned {s.suffix} {s.dtype}{list(s.shape)}, got {a.dtype}{a.shape}"
                )
            out[prefix + s.suffix] = a.reshape(s.shape)
        if arrays:  # internal invariant: the layout above knows every array
            raise AssertionError(f"{name}: unplanned arrays {sorted(arrays)}")
        return out

    entry.setdefault("tensor", None)
    arrays = [(prefix + s.suffix, s.dtype, s.shape) for s in specs]
    entry["arrays"] = [key for key, _, _ in arrays]
    return Unit(name, entry, arrays, produce)


# ---------------------------------------------------------------------------------------
# Reading
# ---------------------------------------------------------------------------------------


def is_lowbit_checkpoint(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a folder holding a lowbit checkpoint manifest (False for a path
    no file can have: too long, a symlink loop, a NUL; the opener then says why)."""
    p = Path(path)
    try:
        return p.is_dir() and (p / MANIFEST).is_file()
    except OSError:  # ENAMETOOLONG, ELOOP: is_dir() passes only some errors as False
        return False


class LowbitCheckpoint(Checkpoint):
    """A lowbit checkpoint opened for reading: ``get`` gives dequantized float32 arrays.

    Attributes:
        path: the folder.
        format: ``"lowbit"``.
        source_format: the source's format (``gguf``, ``huggingface``, ``safetensors``): its
            tensor names and layout are kept.
        manifest: the parsed ``lowbit.json``.
        config: the model's Hugging Face config (or None).
        metadata: the GGUF source's metadata (empty for other sources).
    """

    format = "lowbit"

    def __init__(self, path: str | os.PathLike[str], *, verify: bool = True) -> None:
        """Open a checkpoint folder, checking its manifest and files first.

        Args:
            path: the folder.
            verify: check the manifest's own digest and every file's sha256 against it
                (reads every byte once); False skips both. The schema, containment and file
                sizes are checked either way (see :mod:`lowbit.checkpoints.lowbit_format.manifest`).

        Raises:
            LowbitError: no manifest, or one that does not pass those checks, naming the file
                and the field.
        """
        super().__init__()
        self.path = Path(path)
        doc, expected = _manifest.load(
            self.path, format_name=FORMAT_NAME, version=FORMAT_VERSION, verify=verify
        )
        where = str(self.path / MANIFEST)
        self.manifest = doc
        self.source_format = str(doc["source"]["format"])
        self.config = doc["config"]
        self._entries: dict[str, dict[str, Any]] = doc["tensors"]
        self._shards: dict[str, Any] = {}
        for i, fname in enumerate(doc["files"]):
            f = _manifest.member(self.path, fname, where, f"files[{i}]")
            if not f.is_file():
                raise LowbitError(f"{self.path}: shard {fname} is missing")
            self._shards[fname] = SafetensorsFile(f)
        _manifest.check_arrays(expected, doc, self._shards, where)
        self.metadata: dict[str, Any] = {}
        if (self.path / GGUF_METADATA).exists():
            meta_file = _manifest.member(self.path, GGUF_METADATA, where, GGUF_METADATA)
            self.metadata = _gguf.parse(meta_file).metadata

    # -- the Checkpoint interface ---------------------------------------------------------

    def names(self) -> list[str]:
        return list(self._entries)

    def entry(self, name: str) -> dict[str, Any]:
        """The manifest entry of one tensor."""
        try:
            return self._entries[name]
        except KeyError:
            raise self._missing(name) from None

    def info(self, name: str) -> TensorInfo:
        e = self.entry(name)
        shard = self._shards[e["file"]]
        keys = self._keys(name, e)
        infos = [shard.info(k) for k in keys]
        dtype = e.get("label") or e.get("dtype") or e.get("source_dtype", "?")
        return TensorInfo(
            name,
            tuple(e["shape"]),
            str(dtype),
            sum(i.nbytes for i in infos),
            shard.path,
            min(i.offset for i in infos),
        )

    def _keys(self, name: str, e: dict[str, Any]) -> list[str]:
        if e["kind"] != "quantized":
            return [name]
        keys = e.get("arrays")
        if not isinstance(keys, list) or not keys:
            raise LowbitError(f"{self.path}: manifest entry of {name!r} lists no arrays")
        return [str(k) for k in keys]

    def get(self, name: str, dtype: Any = None) -> np.ndarray:
        """One tensor's values: quantized ones dequantized to float32 (exactly
        ``QuantizedTensor.dequantize()``), kept ones as stored (GGUF block types dequantized
        to float32), cast ones in their stored dtype."""
        e = self.entry(name)
        if e["kind"] == "quantized":
            arr = self.quantized(name).dequantize(np.float32)
        else:
            arr = self._plain(name, e)
        if dtype is not None and arr.dtype != np.dtype(dtype):
            arr = arr.astype(dtype)
        return arr

    def quantized(self, name: str) -> Any:
        """The stored ``QuantizedTensor`` of a quantized tensor (codes bit for bit).

        Raises:
            LowbitError: the tensor was kept or cast, not quantized.
        """
        e = self.entry(name)
        if e["kind"] != "quantized":
            raise LowbitError(f"{self.path}: tensor {name!r} is {e['kind']}, not quantized")
        shard = self._shards[e["file"]]
        arrays = {k: shard.get(k) for k in self._keys(name, e)}
        return QuantizedTensor.from_arrays(arrays, e["tensor"], prefix=f"{name}:")

    def _plain(self, name: str, e: dict[str, Any]) -> np.ndarray:
        arr = self._shards[e["file"]].get(name)
        encoding = e.get("encoding", "array")
        if encoding.startswith("gguf:"):
            from gguf import quants
            from gguf.constants import GGMLQuantizationType

            qtype = GGMLQuantizationType[encoding[5:]]
            return quants.dequantize(np.asarray(arr), qtype).reshape(tuple(e["shape"]))
        return arr

    def close(self) -> None:
        for s in self._shards.values():
            s.close()
        super().close()

    # -- plan and model --------------------------------------------------------------------

    @property
    def plan(self) -> Any:
        """The :class:`~lowbit.plans.plan.PrecisionPlan` the checkpoint was made with."""
        return PrecisionPlan.from_dict(self.manifest.get("plan") or {}, where=str(self.path))

    def activations(self) -> dict[str, str]:
        """``{tensor name: activation format}`` for layers whose plan asks for W8A8."""
        return {
            n: e["activations"]
            for n, e in self._entries.items()
            if e.get("kind") == "quantized" and e.get("activations")
        }

    def rotations(self) -> dict[str, int]:
        """``{tensor name: Hadamard block}`` of the tensors stored in a block-Hadamard-rotated
        basis (``W R``; ``lowbit quantize --method hadamard|hadamard+gptq``): a consumer rotates
        those layers' inputs, ``x ↦ x R`` (``lowbit.methods.hadamard.rotate_rows``).

        Raises:
            LowbitError: a recorded rotation of an unknown tensor or with a block that is not
                a power of two dividing the tensor's input width.
        """
        rot = (self.manifest.get("method") or {}).get("rotation") or {}
        out = {}
        for name, block in ((rot.get("tensors") if isinstance(rot, dict) else None) or {}).items():
            shape = self._entries.get(name, {}).get("shape")
            ok = isinstance(block, int) and block > 0 and not block & (block - 1)
            if not ok or not shape or len(shape) != 2 or shape[1] % block:
                raise LowbitError(
                    f"{self.path}: the manifest records a rotation of {name!r} in blocks of "
                    f"{block!r}, which that tensor cannot have"
                )
            out[str(name)] = int(block)
        return out

    def as_source(self) -> Checkpoint:
        """A view with the source's format name, for ``lowbit.models.build.build_model`` (GGUF names
        are renamed and q/k rows un-permuted as for the source) and ``build_tokenizer``."""
        return _SourceView(self)

    def __repr__(self) -> str:
        return f"<LowbitCheckpoint of {self.source_format} {str(self.path)!r}: {len(self)} tensors>"


class _SourceView(Checkpoint):
    """A lowbit checkpoint seen as its source checkpoint (names, format, config, tokenizer)."""

    def __init__(self, inner: LowbitCheckpoint) -> None:
        super().__init__()
        self.inner = inner
        self.format = inner.source_format
        self.config = inner.config
        self.metadata = inner.metadata
        gguf_meta = inner.path / GGUF_METADATA
        self.path = gguf_meta if self.format == "gguf" and gguf_meta.is_file() else inner.path

    def names(self) -> list[str]:
        return self.inner.names()

    def info(self, name: str) -> TensorInfo:
        return self.inner.info(name)

    def get(self, name: str, dtype: Any = None) -> np.ndarray:
        return self.inner.get(name, dtype)


def iter_dequantized(ckpt: LowbitCheckpoint) -> Iterator[tuple[str, np.ndarray]]:
    """``(name, float32 array)`` for every tensor (kept integer tensors as stored)."""
    for name in ckpt.names():
        yield name, ckpt.get(name)
