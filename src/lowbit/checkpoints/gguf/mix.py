"""Write a GGUF as llama-quantize does for one of its mixes (Q4_K_M, Q5_K_S, ...), from a GGUF source.

The types come from :func:`lowbit.ggml.mixes.choose_types` (the architecture and
hyperparameters read from the source's metadata), the blocks from :mod:`lowbit.ggml.blocks`
(llama.cpp's bytes), the file from :func:`lowbit.checkpoints.gguf.writer.write_gguf` with the
source's metadata copied and ``general.file_type`` set to the mix's. As in llama-quantize:

- a tensor whose chosen type is the one it is stored in is copied byte for byte; every other
  tensor is decoded to float32 and quantized (a quantized source is requantized, which
  llama-quantize only does with ``--allow-requantize``);
- an importance matrix (:func:`lowbit.checkpoints.gguf.imatrix.read_imatrix`) gives the tensor of the
  same name its vector; a vector of the wrong length is an error, except for
  ``token_embd.weight``, which is then quantized without one; tensors it does not name are
  quantized without one; Q2_K_S needs one for its Q2_K tensors.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from lowbit.checkpoints.gguf.expert_split import expert_stacks
from lowbit.checkpoints.gguf.writer import GGUFTensor, metadata_source, write_gguf
from lowbit.checkpoints.steps import raw_bytes
from lowbit.errors import LowbitError
from lowbit.ggml import blocks, grids, mixes
from lowbit.methods._ggml_gptq import GgmlTarget
from lowbit.methods._iq_gptq import IQ_TYPES

__all__ = [
    "gguf_mix_types",
    "gguf_rounded",
    "gguf_targets",
    "gptq_targets",
    "mix_rounded",
    "write_gguf_mix",
]

_FLOATS = {"F32", "F16", "BF16"}


def _first_int(value: Any) -> int | None:
    if isinstance(value, (list, tuple)):
        value = value[0] if value else None
    return int(value) if isinstance(value, (int, np.integer)) else None


def _hparams(ckpt: Any) -> dict[str, Any]:
    """Architecture, layer count, GQA ratio and expert count from a GGUF's metadata."""
    meta = ckpt.metadata
    arch = str(meta.get("general.architecture", ""))
    if not arch:
        raise LowbitError(f"{ckpt.path}: the GGUF has no general.architecture")
    n_layer = _first_int(meta.get(f"{arch}.block_count"))
    heads = _first_int(meta.get(f"{arch}.attention.head_count"))
    kv = _first_int(meta.get(f"{arch}.attention.head_count_kv"))
    gqa = None
    if heads is not None:
        kv = heads if kv is None else kv
        gqa = heads // kv if kv else 0
    return {
        "arch": arch,
        "n_layer": n_layer,
        "n_gqa": gqa,
        "n_expert": _first_int(meta.get(f"{arch}.expert_count")),
    }


def _specs(ckpt: Any) -> list[mixes.TensorSpec]:
    return [mixes.TensorSpec(n, tuple(ckpt.info(n).shape), ckpt.info(n).dtype) for n in ckpt]


def gguf_mix_types(ckpt: Any, mix_name: str, **options: Any) -> dict[str, str]:
    """The type of each tensor of a GGUF checkpoint for llama-quantize's ``mix_name``.

    Args:
        ckpt: an open GGUF checkpoint (``lowbit.checkpoints.open_checkpoint``).
        mix_name: e.g. "q4_k_m".
        options: :func:`lowbit.ggml.mixes.choose_types`'s keyword options (overrides,
            ``has_imatrix``, ``pure``, ``leave_output_tensor``).

    Raises:
        LowbitError: a source that is not GGUF, an unknown mix, bad overrides.
    """
    if getattr(ckpt, "format", None) != "gguf":
        raise LowbitError(
            f"{ckpt.path}: llama.cpp's mixes read a GGUF source (its architecture, "
            "hyperparameters and tokenizer); convert the model to GGUF first"
        )
    hp = _hparams(ckpt)
    arch = hp.pop("arch")
    hp = {k: v for k, v in hp.items() if v is not None}
    return mixes.choose_types(arch, _specs(ckpt), mix_name, **hp, **options)


def gptq_targets(
    ckpt: Any,
    mix_name: str,
    *,
    imatrix: Mapping[str, np.ndarray] | None = None,
    **options: Any,
) -> dict[str, GgmlTarget]:
    """What GPTQ rounds onto for llama-quantize's mix ``mix_name``: every 2-D tensor the mix
    requantizes to a type with per-block scales (:data:`lowbit.ggml.grids.GPTQ_TYPES`) or an
    i-quant below 4 bits (:data:`lowbit.methods._iq_gptq.IQ_TYPES`), with
    the importance matrix's vector where it has one (else GPTQ uses its Hessian's diagonal).

    Raises:
        LowbitError: as :func:`write_gguf_mix` for the types and the importance matrix.
    """
    m = mixes.mix(mix_name)
    types = gguf_mix_types(ckpt, m.name, has_imatrix=imatrix is not None, **options)
    return gguf_targets(ckpt, types, _vectors(ckpt, types, imatrix, m.name))


def gguf_targets(
    ckpt: Any, types: Mapping[str, str], vectors: Mapping[str, np.ndarray] | None = None
) -> dict[str, GgmlTarget]:
    """What GPTQ rounds onto when ``types`` (tensor -> GGUF type: a mix's, a solved budget's)
    are written: every 2-D tensor and every expert stack (``blk.L.ffn_up_exps.weight``, each
    expert GPTQ'd on its own: :mod:`lowbit.checkpoints.gguf.expert_split`) requantized to a
    type with per-block scales (:data:`lowbit.ggml.grids.GPTQ_TYPES`,
    :data:`lowbit.methods._iq_gptq.IQ_TYPES`), with its importance vector where ``vectors``
    has one (else GPTQ uses its Hessian's diagonal).
    """
    out = {}
    stacks = expert_stacks(ckpt, [n for n in types if len(ckpt.info(n).shape) == 3])
    for name, t in types.items():
        info = ckpt.info(name)
        gptq = t in grids.GPTQ_TYPES or t in IQ_TYPES
        if (len(info.shape) == 2 or name in stacks) and gptq and t != info.dtype.upper():
            out[name] = GgmlTarget(t, (vectors or {}).get(name))
    return out


def mix_rounded(
    ckpt: Any,
    mix_name: str,
    *,
    imatrix: Mapping[str, np.ndarray] | None = None,
    skip: Iterable[str] = (),
    **options: Any,
) -> dict[str, Callable[[], np.ndarray]]:
    """What llama-quantize's mix ``mix_name`` writes for each tensor it quantizes, but those
    in ``skip`` (GPTQ's targets): for GPTQ's walk
    (:func:`lowbit.calibration.gptq.gptq_weights`'s ``rounded``), so the tensors it rounds see
    the inputs the file will give them.

    Raises:
        LowbitError: as :func:`write_gguf_mix` for the types and the importance matrix.
    """
    m = mixes.mix(mix_name)
    types = gguf_mix_types(ckpt, m.name, has_imatrix=imatrix is not None, **options)
    return gguf_rounded(ckpt, types, _vectors(ckpt, types, imatrix, m.name), skip)


def gguf_rounded(
    ckpt: Any,
    types: Mapping[str, str],
    vectors: Mapping[str, np.ndarray] | None = None,
    skip: Iterable[str] = (),
) -> dict[str, Callable[[], np.ndarray]]:
    """Tensor -> a function returning the float32 values a file of ``types`` holds for it
    (llama.cpp's rounding with its importance vector, decoded), for every 2-D tensor rounded
    to a block type, but those in ``skip``; each is computed when called."""
    left = set(skip)
    out: dict[str, Callable[[], np.ndarray]] = {}
    for name, t in types.items():
        info = ckpt.info(name)
        if name in left or len(info.shape) != 2 or t == info.dtype.upper() or t in _FLOATS:
            continue
        vec = (vectors or {}).get(name)

        def values(name: str = name, t: str = t, vec: Any = vec) -> np.ndarray:
            return blocks.dequantize(blocks.quantize(ckpt.get(name), t, imatrix=vec), t)

        out[name] = values
    return out


class _Tensors(Mapping[str, GGUFTensor]):
    """The output tensors, made on access (one at a time), in the source's order."""

    def __init__(
        self,
        ckpt: Any,
        types: dict[str, str],
        vectors: dict[str, np.ndarray],
        done: Mapping[str, Any] | None = None,
    ):
        self.ckpt, self.types, self.vectors = ckpt, types, vectors
        self.done = done or {}

    def __getitem__(self, name: str) -> GGUFTensor:
        info = self.ckpt.info(name)
        new = self.types[name]
        if name in self.done:  # GPTQ's blocks, already bytes
            return GGUFTensor(self.done[name].data, new, raw=True)
        if new == info.dtype.upper():
            return GGUFTensor(raw_bytes(self.ckpt, name), info.dtype, raw=True)
        data = np.asarray(self.ckpt.get(name))  # the block quantizer casts row chunks
        return GGUFTensor(data, new, imatrix=self.vectors.get(name))

    def __iter__(self) -> Iterator[str]:
        return iter(self.ckpt.names())

    def __len__(self) -> int:
        return len(self.ckpt.names())


def importance_vectors(
    ckpt: Any, names: Iterable[str], imatrix: Mapping[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """Each named tensor's importance vector, checked as llama-quantize checks it: a vector of
    the wrong length is an error except for ``token_embd.weight`` (then quantized without
    one); tensors the matrix does not name get none.

    Raises:
        LowbitError: an importance matrix naming none of the tensors, or a wrong length.
    """
    named = [n for n in names if n in imatrix]
    if not named:
        first = next(iter(imatrix), "")
        raise LowbitError(
            f"the importance matrix names none of this model's quantized tensors (its first "
            f"entry is {first!r}); was it computed for another model?"
        )
    out: dict[str, np.ndarray] = {}
    for n in named:
        shape = ckpt.info(n).shape
        want = shape[-1] * (shape[-3] if len(shape) >= 3 else 1)
        vec = np.asarray(imatrix[n], dtype=np.float32).reshape(-1)
        if vec.size == want:
            out[n] = vec
        elif n != "token_embd.weight":
            raise LowbitError(
                f"importance matrix entry {n!r} has {vec.size} values; the tensor of shape "
                f"{tuple(shape)} needs {want}"
            )
    return out


def _vectors(
    ckpt: Any, types: dict[str, str], imatrix: Mapping[str, np.ndarray] | None, mix_name: str
) -> dict[str, np.ndarray]:
    """Each quantized tensor's importance vector, checked as llama-quantize checks it."""
    out: dict[str, np.ndarray] = {}
    quantized = [n for n in ckpt.names() if types[n] != ckpt.info(n).dtype.upper()]
    if imatrix is not None:
        out = importance_vectors(ckpt, quantized, imatrix)
    name = mixes.mix(mix_name).name
    lacking = [n for n in quantized if mixes.requires_imatrix(n, types[n], name) and n not in out]
    if lacking:
        what = "its Q2_K tensors" if name == "Q2_K_S" else f"{types[lacking[0]]} tensors"
        raise LowbitError(
            f"{name} needs an importance matrix for {what} ({lacking[0]} has none; "
            "llama-quantize refuses too): pass --imatrix FILE"
        )
    return out


def write_gguf_mix(
    ckpt: Any,
    out: str | os.PathLike[str],
    mix_name: str,
    *,
    imatrix: Mapping[str, np.ndarray] | None = None,
    overwrite: bool = False,
    progress: bool | None = None,
    weights: Mapping[str, Any] | None = None,
    **options: Any,
) -> dict[str, Any]:
    """Quantize a GGUF checkpoint with llama-quantize's mix ``mix_name`` and write ``out``.

    Args:
        ckpt: an open GGUF checkpoint.
        out: the ``.gguf`` file to write (atomically; see ``write_gguf``).
        mix_name: llama-quantize's type name (q2_k ... q6_k, iq4_xs, q4_1, ...).
        imatrix: ``{weight name: vector}`` (:func:`lowbit.checkpoints.gguf.imatrix.read_imatrix`).
        overwrite: replace an existing file lowbit wrote.
        progress: progress bar (None: on a terminal).
        weights: tensors already quantized to their chosen type (GPTQ's
            :class:`~lowbit.methods._ggml_gptq.GgmlQuantized`, see :func:`gptq_targets`),
            written as they are; the others are rounded here.
        options: :func:`lowbit.ggml.mixes.choose_types`'s overrides.

    Returns:
        A summary: path, bytes, seconds, mix, file_type, per-type tensor counts, imatrix use.

    Raises:
        LowbitError: a non-GGUF source, an unknown mix, a type lowbit cannot write, a bad
            importance matrix, or any of the writer's errors.
    """
    start = time.perf_counter()
    m = mixes.mix(mix_name)
    types = gguf_mix_types(ckpt, m.name, has_imatrix=imatrix is not None, **options)
    for name, t in types.items():
        stored = ckpt.info(name).dtype.upper()
        if t != stored and t not in blocks.TYPES and t not in _FLOATS:
            raise LowbitError(
                f"{m.name} puts {name} in {t}, which lowbit does not write yet (it writes "
                f"{', '.join(blocks.TYPES)})"
            )
    vectors = _vectors(ckpt, types, imatrix, m.name)
    for name, qt in (weights or {}).items():
        if types.get(name) != qt.qtype:
            raise LowbitError(
                f"{name}: quantized to {qt.qtype}, but {m.name} puts it in {types.get(name)}"
            )
    path = write_gguf(
        out,
        _Tensors(ckpt, types, vectors, weights),
        source=metadata_source(ckpt),
        metadata={"general.file_type": m.file_type},
        overwrite=overwrite,
        progress=progress,
    )
    counts: dict[str, int] = {}
    for t in types.values():
        counts[t] = counts.get(t, 0) + 1
    return {
        "path": str(path),
        "bytes": Path(path).stat().st_size,
        "seconds": time.perf_counter() - start,
        "mix": m.name,
        "file_type": m.file_type,
        "types": dict(sorted(counts.items())),
        "tensors": len(types),
        "imatrix_tensors": len(vectors),
    }
