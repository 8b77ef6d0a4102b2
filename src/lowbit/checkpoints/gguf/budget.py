"""GGUF files within a size or bits budget: each tensor's llama.cpp type chosen from measured damage.

The counterpart of llama-quantize's fixed mixes (:mod:`lowbit.checkpoints.gguf.mix`) for
``lowbit quantize MODEL --budget BPW|--size BYTES --out-format gguf``:

- **which tensors**: those llama-quantize quantizes (:mod:`lowbit.ggml.mixes`' rules: 2-D and
  up, names ending in ``weight``, no norms, no MoE router, ...); every other tensor is copied
  as stored and its bytes count against a ``--size`` budget;
- **candidates**: GGUF block types (:data:`DEFAULT_CANDIDATES` unless given). A candidate
  whose block does not divide a tensor's rows becomes llama-quantize's fallback for it
  (Q2_K/Q3_K to Q4_0, Q4_K to Q5_0, Q5_K to Q5_1, Q6_K to Q8_0, IQ4_XS to IQ4_NL, F16 when
  even that does not fit), and costs and is measured as that fallback: on rows of 576
  (SmolLM2's hidden size) "Q4_K" *is* Q5_0. The token embedding and ``output.weight`` are
  candidates like any tensor, except that a type that cannot hold their rows is dropped for
  them (llama-quantize skips the fallback for them when the type is asked for by name);
- **bytes**: exact file bytes. A tensor of type ``T`` takes ``blocks x block bytes`` (rows of
  whole blocks), padded to the file's 32-byte alignment; the rest of the file (header,
  metadata, tokenizer, tensor infos, the header's padding) does not depend on the tensors'
  types (type ids are fixed-width), so it is counted once from the same metadata and tensor
  names and ranks, without writing a file (:func:`file_overhead`). The file written is then
  exactly ``overhead + sum(aligned tensor bytes)`` (checked after writing);
- **budgets**: ``size``: the whole file's bytes; ``bits_per_weight``: the quantized tensors'
  bytes x 8 over their weights (lowbit's ``--budget``: the candidates' tensors only);
- **solver**: the multiple-choice knapsack of :func:`lowbit.plans.budget.solve` on the summed
  measured damages (with its optimality gap);
- **general.file_type**: a label only (llama.cpp reads the tensors' own types): the mix whose
  default type holds the most bytes of the chosen types (Q3_K/Q4_K/Q5_K: their ``_M`` mix,
  as llama-quantize's aliases; Q8_0 -> 7, Q6_K -> 18, IQ4_NL -> 25, F16 -> 1).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from lowbit.checkpoints.gguf.mix import _Tensors, importance_vectors
from lowbit.checkpoints.gguf.writer import (
    encoded_fields,
    header_fields,
    metadata_source,
    write_gguf,
)
from lowbit.errors import LowbitError
from lowbit.ggml import blocks, mixes
from lowbit.plans.budget import Allocation, solve_budget

__all__ = [
    "ALIGNMENT",
    "DEFAULT_CANDIDATES",
    "GgufChoice",
    "GgufPlan",
    "budget_options",
    "budget_vectors",
    "file_overhead",
    "file_type_for",
    "parse_types",
    "solve_gguf",
    "type_bytes",
    "write_gguf_types",
]

DEFAULT_CANDIDATES = ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q8_0", "IQ4_XS")
"""``--budget``/``--size`` with GGUF output and no ``--candidates``: the K-quants llama.cpp's
mixes are made of, Q8_0 and IQ4_XS (their fallbacks on rows that are not whole 256-blocks:
Q4_0, Q5_0, Q5_1, Q8_0, IQ4_NL)."""

ALIGNMENT = 32
"""GGUF data alignment the writer uses (each tensor's data padded to it)."""

_FLOATS = {"F32": 4, "F16": 2, "BF16": 2}
_ALIASES = {"Q3_K": "Q3_K_M", "Q4_K": "Q4_K_M", "Q5_K": "Q5_K_M", "MXFP4": "MXFP4_MOE"}


def parse_types(names: Iterable[str]) -> tuple[str, ...]:
    """GGUF type names as candidates (any case, duplicates dropped, order kept).

    Raises:
        LowbitError: a name that is no type lowbit writes (the message lists them), or none.
    """
    out: list[str] = []
    for raw in names:
        key = str(raw).strip().upper()
        if key not in blocks.TYPES and key != "F16":
            raise LowbitError(
                f"unknown GGUF type {raw!r} as a candidate; lowbit writes "
                f"{', '.join([*blocks.TYPES, 'F16'])}"
            )
        if key not in out:
            out.append(key)
    if not out:
        raise LowbitError("give at least one GGUF type as a candidate")
    return tuple(out)


def type_bytes(shape: Sequence[int], t: str) -> int:
    """Bytes of a tensor of numpy ``shape`` (rows last) stored as GGUF type ``t``."""
    if t in _FLOATS:
        return math.prod(int(s) for s in shape) * _FLOATS[t]
    return blocks.nbytes(tuple(int(s) for s in shape), t)


def _aligned(n: int) -> int:
    return -(-n // ALIGNMENT) * ALIGNMENT


def _spec(ckpt: Any, name: str) -> mixes.TensorSpec:
    info = ckpt.info(name)
    return mixes.TensorSpec(name, tuple(int(s) for s in info.shape), info.dtype)


def budget_options(ckpt: Any, candidates: Sequence[str]) -> dict[str, dict[str, tuple[str, ...]]]:
    """Per tensor llama-quantize would quantize: ``{type it becomes: candidates that give it}``.

    Tensors it does not quantize are absent (they are copied as stored).

    Raises:
        LowbitError: a tensor no candidate can hold (e.g. an embedding whose rows fit no block).
    """
    out: dict[str, dict[str, tuple[str, ...]]] = {}
    for name in ckpt.names():
        spec = _spec(ckpt, name)
        if not mixes._allows_quantization(spec, True):
            continue
        ncols = spec.shape[-1]
        edge = mixes._category(name) in ("output", "token_embd")
        opts: dict[str, list[str]] = {}
        for c in candidates:
            if c in _FLOATS:
                eff = c
            elif edge:
                if ncols % blocks.TYPES[c].block:
                    continue  # llama.cpp: a type asked for these two is not replaced
                eff = c
            else:
                try:
                    eff = mixes._fallback(spec, c)
                except LowbitError:
                    continue  # no fallback defined for this type (Q4_1, MXFP4 ...)
            opts.setdefault(eff, []).append(c)
        if not opts:
            raise LowbitError(
                f"{name}: rows of {ncols} values fit none of the candidates "
                f"{', '.join(candidates)}; add one whose block divides {ncols} (Q8_0: 32)"
            )
        out[name] = {t: tuple(cs) for t, cs in opts.items()}
    if not out:
        raise LowbitError(f"{ckpt.path}: no tensor llama.cpp would quantize")
    return out


def budget_vectors(
    ckpt: Any, names: Iterable[str], imatrix: Mapping[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """Each candidate tensor's importance vector, checked as llama-quantize checks it (see
    :mod:`lowbit.checkpoints.gguf.mix`): a vector of the wrong length is an error except for
    ``token_embd.weight`` (then quantized without one); tensors it does not name get none.

    Raises:
        LowbitError: an importance matrix naming none of the tensors, or a wrong length.
    """
    return importance_vectors(ckpt, names, imatrix)


def file_type_for(types: Mapping[str, str], shapes: Mapping[str, Sequence[int]]) -> int:
    """``general.file_type`` for a budget file: the mix whose default type holds the most bytes
    of the chosen (quantized) types; a label only, llama.cpp reads each tensor's type."""
    held: dict[str, int] = {}
    for n, t in types.items():
        held[t] = held.get(t, 0) + type_bytes(shapes[n], t)
    main = max(sorted(held), key=lambda t: held[t])
    if main in _ALIASES:
        return mixes.MIXES[_ALIASES[main]].file_type
    for m in mixes.MIXES.values():
        if m.default == main:
            return m.file_type
    raise AssertionError(f"no llama.cpp file type has {main} as its default")  # pragma: no cover


def _metadata(file_type: int) -> dict[str, Any]:
    import gguf

    return {"general.file_type": file_type, "general.quantization_version": gguf.GGML_QUANT_VERSION}


def file_overhead(ckpt: Any, file_type: int = 15) -> int:
    """Bytes of the output GGUF that are not tensor data: header, metadata (the source's,
    copied), tensor infos and the header's padding to the alignment.

    Counted from what the writer writes (:func:`lowbit.checkpoints.gguf.writer.header_fields`,
    encoded as stored), with no file: a tensor info's size depends on its name and rank only,
    and ``general.file_type`` is a fixed-width integer.
    """
    arch, typed = header_fields({}, metadata=_metadata(file_type), source=metadata_source(ckpt))
    n = 24  # magic, version, tensor count, key count
    for key, (_, payload) in encoded_fields(arch, typed).items():
        n += 8 + len(key.encode("utf-8")) + 4 + len(payload)
    for name in ckpt.names():  # name, rank, dimensions, type, offset
        n += 8 + len(name.encode("utf-8")) + 4 + 8 * len(ckpt.info(name).shape) + 4 + 8
    return _aligned(n)


@dataclass(frozen=True)
class GgufChoice:
    """One tensor of a budget GGUF: its type, bytes (unpadded), measured damage (None: kept)."""

    tensor: str
    type: str
    nbytes: int
    numel: int
    damage: float | None
    candidates: tuple[str, ...] = ()
    """The candidates that gave this type (a fallback names the K-quant asked for)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "tensor": self.tensor,
            "type": self.type,
            "bytes": self.nbytes,
            "bits_per_weight": 8 * self.nbytes / self.numel if self.numel else None,
            "damage": self.damage,
            "from_candidates": list(self.candidates),
        }


@dataclass(frozen=True)
class GgufPlan:
    """A solved budget GGUF: every tensor's type and the file it makes."""

    rows: tuple[GgufChoice, ...]
    allocation: Allocation
    budget: dict[str, Any]
    overhead: int
    file_type: int

    @property
    def types(self) -> dict[str, str]:
        return {r.tensor: r.type for r in self.rows}

    @property
    def file_bytes(self) -> int:
        """The size of the file :func:`write_gguf_types` writes for this plan."""
        return self.overhead + sum(_aligned(r.nbytes) for r in self.rows)

    @property
    def quantized(self) -> tuple[GgufChoice, ...]:
        return tuple(r for r in self.rows if r.damage is not None)

    @property
    def bits_per_weight(self) -> float:
        """Bits per weight of the chosen tensors (their bytes only)."""
        q = self.quantized
        return 8 * sum(r.nbytes for r in q) / max(1, sum(r.numel for r in q))

    @property
    def predicted_damage(self) -> float:
        return float(sum(r.damage for r in self.quantized))  # type: ignore[misc]

    def to_dict(self) -> dict[str, Any]:
        a = self.allocation
        params = sum(r.numel for r in self.rows)
        return {
            "budget": dict(self.budget),
            "file_bytes": self.file_bytes,
            "overhead_bytes": self.overhead,
            "tensor_bytes": sum(r.nbytes for r in self.rows),
            "bits_per_weight": self.bits_per_weight,
            "file_bits_per_weight": 8 * self.file_bytes / params if params else None,
            "file_type": self.file_type,
            "predicted_damage": self.predicted_damage,
            "solver": {"damage": a.damage, "bound": a.bound, "gap": a.gap, "unit_bits": a.unit},
            "tensors": [r.to_dict() for r in self.rows],
        }


def solve_gguf(
    ckpt: Any,
    options: Mapping[str, Mapping[str, tuple[str, ...]]],
    damages: Mapping[str, Mapping[str, float]],
    *,
    size: int | None = None,
    bits_per_weight: float | None = None,
    overhead: int | None = None,
    resolution: int = 1 << 16,
) -> GgufPlan:
    """The least summed damage choice of one type per tensor within the budget.

    Args:
        ckpt: the open GGUF source.
        options: :func:`budget_options`.
        damages: ``{tensor: {type: measured damage}}`` for every option.
        size: the whole file's bytes at most; or
        bits_per_weight: the quantized tensors' stored bits per weight at most.
        overhead: :func:`file_overhead` (measured here when None and ``size`` is given).
        resolution: the solver's budget units (exact when the budget over the costs' common
            divisor is within it; :func:`lowbit.plans.budget.solve`).

    Raises:
        LowbitError: not exactly one budget, or a budget below the cheapest choice (the
            message gives the least bytes or bits per weight possible).
    """
    names = list(ckpt.names())
    shapes = {n: tuple(int(s) for s in ckpt.info(n).shape) for n in names}
    free = [n for n in names if n in options]
    probe_ft = 15
    if size is not None and overhead is None and bits_per_weight is None:
        overhead = file_overhead(ckpt, probe_ft)
    overhead = overhead or 0
    kept = {n: ckpt.info(n).nbytes for n in names if n not in options}
    # a size budget counts each tensor padded to the file's alignment; bits per weight do not
    pad = _aligned if size is not None else int
    solved = solve_budget(
        {n: {t: 8 * pad(type_bytes(shapes[n], t)) for t in options[n]} for n in free},
        damages,
        weights=sum(math.prod(shapes[n]) for n in free),
        fixed=8 * (overhead + sum(_aligned(b) for b in kept.values())),
        size=size,
        bits_per_weight=bits_per_weight,
        needs="bytes (the file with every tensor at its smallest candidate)",
        resolution=resolution,
    )
    alloc, budget, chosen = solved.allocation, solved.budget, solved.chosen
    rows = []
    for n in names:
        numel = math.prod(shapes[n])
        if n in chosen:
            t = chosen[n]
            rows.append(GgufChoice(n, t, type_bytes(shapes[n], t), numel, float(damages[n][t]),
                                   options[n][t]))  # fmt: skip
        else:
            rows.append(GgufChoice(n, ckpt.info(n).dtype.upper(), kept[n], numel, None))
    ft = file_type_for(chosen, shapes) if chosen else 0
    return GgufPlan(tuple(rows), alloc, budget, overhead, ft)


def write_gguf_types(
    ckpt: Any,
    out: str | os.PathLike[str],
    plan: GgufPlan,
    *,
    vectors: Mapping[str, np.ndarray] | None = None,
    overwrite: bool = False,
    progress: bool | None = None,
    weights: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Write the plan's GGUF as the mixes are written (source metadata copied, kept tensors
    byte for byte, the others quantized with llama.cpp's bytes and their importance vectors;
    ``weights``: blocks already made for some of them, GPTQ's, written as given).

    Returns:
        ``{"path", "bytes", "seconds"}``.

    Raises:
        LowbitError: the writer's errors (an existing ``out`` without ``overwrite``, ...).
    """
    start = time.perf_counter()
    path = write_gguf(
        out,
        _Tensors(ckpt, plan.types, dict(vectors or {}), weights),
        source=metadata_source(ckpt),
        metadata=_metadata(plan.file_type),
        overwrite=overwrite,
        progress=progress,
    )
    size = Path(path).stat().st_size
    if plan.budget["kind"] == "size" and size != plan.file_bytes:  # the accounting's invariant
        raise AssertionError(f"{path}: wrote {size} bytes, the plan counted {plan.file_bytes}")
    return {"path": str(path), "bytes": size, "seconds": time.perf_counter() - start}
