"""GGUF jobs: llama-quantize's mixes (:func:`gguf_mix`) and GGUF files within a size budget
(:func:`gguf_budget`), from a GGUF or a Hugging Face source, rounded as llama.cpp rounds or
GPTQ'd onto the same block types.

The types come from :mod:`lowbit.ggml.mixes` (mixes) or from measured damage
(:mod:`lowbit.evaluation.gguf_sensitivity`, solved by :mod:`lowbit.checkpoints.gguf.budget`);
the bytes from :mod:`lowbit.ggml.blocks`; the file from
:func:`lowbit.checkpoints.gguf.mix.write_gguf_mix` /
:func:`lowbit.checkpoints.gguf.budget.write_gguf_types`. ``lowbit quantize --to q4_k_m
--out-format gguf`` and ``--budget/--size --out-format gguf`` are these functions.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from lowbit._progress import progress_bar
from lowbit.calibration._resume import Resume, resume_folder
from lowbit.calibration.data import Calibration
from lowbit.calibration.gptq import gptq_weights
from lowbit.checkpoints.gguf.budget import (
    DEFAULT_CANDIDATES,
    budget_options,
    budget_vectors,
    parse_types,
    solve_gguf,
    write_gguf_types,
)
from lowbit.checkpoints.gguf.convert import check_hf_source
from lowbit.checkpoints.gguf.expert_split import ExpertSplit, Stacks, expert_stacks, split_targets
from lowbit.checkpoints.gguf.hf_view import ConvertedView
from lowbit.checkpoints.gguf.imatrix import read_imatrix
from lowbit.checkpoints.gguf.mix import gguf_mix_types, gguf_targets, gptq_targets, write_gguf_mix
from lowbit.checkpoints.io.outputs import check_output
from lowbit.checkpoints.streaming import check_unrotated, open_model
from lowbit.checkpoints.tokenizer import build_tokenizer
from lowbit.errors import LowbitError
from lowbit.evaluation.gguf_sensitivity import gguf_block_sensitivity, gguf_sensitivity
from lowbit.evaluation.scan_samples import scan_samples
from lowbit.ggml import blocks, mixes
from lowbit.jobs.results import GGUFResult
from lowbit.methods.gptq import GPTQ

__all__ = ["gguf_budget", "gguf_mix", "gguf_source", "gptq_onto", "mix_overrides"]

Path_ = str | os.PathLike[str]
Vectors = Mapping[str, np.ndarray]


def mix_overrides(
    tensor_types: Mapping[str, str] | Sequence[tuple[str, str]] | Sequence[str] | None = None,
    output_tensor_type: str | None = None,
    token_embedding_type: str | None = None,
    pure: bool = False,
    leave_output_tensor: bool = False,
) -> dict[str, Any]:
    """llama-quantize's per-tensor overrides as :func:`gguf_mix_types` takes them.

    ``tensor_types``: ``{pattern: type}``, ``[(pattern, type)]`` or ``["pattern=type"]``
    (regexes; the first match wins), as ``--tensor-type``.

    Raises:
        LowbitError: an item that is not ``PATTERN=TYPE``.
    """
    pairs: list[tuple[str, str]] = []
    items = tensor_types.items() if isinstance(tensor_types, Mapping) else (tensor_types or [])
    for item in items:
        if isinstance(item, str):
            pattern, sep, typ = item.partition("=")
            if not sep or not pattern or not typ:
                raise LowbitError(f"--tensor-type {item!r}: write PATTERN=TYPE (e.g. attn_v=q8_0)")
        else:
            pattern, typ = item
        pairs.append((str(pattern).lower(), str(typ)))
    return {
        "tensor_types": pairs,
        "output_tensor_type": output_tensor_type,
        "token_embedding_type": token_embedding_type,
        "pure": bool(pure),
        "leave_output_tensor": bool(leave_output_tensor),
    }


@contextlib.contextmanager
def gguf_source(ckpt: Any, out: Path, progress: bool | None) -> Iterator[Any]:
    """``ckpt`` itself when it is a GGUF; a Hugging Face source seen as the GGUF lowbit's
    ``convert_hf_to_gguf`` writes from it (llama.cpp's tensors and keys, each tensor at the
    precision it is stored in), converted tensor by tensor as the job reads it: no temporary
    copy of the source, and the same output bytes as converting first
    (:class:`~lowbit.checkpoints.gguf.hf_view.ConvertedView`).

    ``out`` and ``progress`` are unused (kept for callers of the former two-step route).

    Raises:
        LowbitError: a family or tokenizer lowbit cannot convert.
    """
    del out, progress
    if ckpt.format == "gguf":
        yield ckpt
        return
    check_hf_source(ckpt)
    view = ConvertedView(ckpt)
    try:
        yield view
    finally:
        view.close()


def gptq_onto(
    ckpt: Any,
    targets: dict[str, Any],
    importance: bool,
    *,
    gptq: GPTQ | None = None,
    calibration: Calibration | None = None,
    threads: int | None = None,
    compute: str = "fp32",
    progress: bool | None = None,
    rounded: Mapping[str, Callable[[], np.ndarray]] | None = None,
    resume: Resume | None = None,
) -> tuple[Mapping[str, Any], dict[str, Any]]:
    """GPTQ of ``targets`` (tensor -> :class:`~lowbit.methods._ggml_gptq.GgmlTarget`): the
    GGUF blocks of the tensors it rounded, and its record. ``rounded``: the other tensors'
    values as the file will hold them (:func:`~lowbit.checkpoints.gguf.mix.mix_rounded`), set
    into the model the calibration runs. ``resume``: a record kept after every block
    (:mod:`lowbit.calibration._resume`; the blocks then live in its folder until written)."""
    cfg = gptq or GPTQ()
    stacks = expert_stacks(ckpt, [n for n in targets if len(ckpt.info(n).shape) == 3])
    source = ExpertSplit(ckpt, stacks) if stacks else ckpt  # each expert on its own
    run = gptq_weights(
        source, None, calibration or Calibration(), cfg, threads=threads, progress=progress,
        compute=compute, targets=split_targets(targets, stacks), rounded=rounded,
        resume=resume,
    )  # fmt: skip
    # GPTQ's tensors, read one at a time when written (run.weights keeps them on disk)
    done: Mapping[str, Any] = _Subset(run.weights, [n for n in run.weights
                                                    if run.methods.get(n) == "gptq"])  # fmt: skip
    errs = [run.layers[n] for n in done if n in run.layers]
    mean = {k: float(np.mean([e[k] for e in errs])) if errs else 0.0 for k in ("rtn", "gptq")}
    gptq_tensors = len(done)
    if stacks:  # the experts' bytes as the stacks the GGUF stores
        done = Stacks(done, ckpt, stacks, targets)
    record = {
        **cfg.to_dict(),
        "gptq_tensors": gptq_tensors,
        "importance": "importance matrix" if importance else "diag(H)",
        "mean_error": mean,
        "layers": run.layers,
        "calibration": run.calibration,
        "seconds": run.seconds,
    }
    return done, record


class _Subset(Mapping[str, Any]):
    """The named entries of a mapping, each read from it when asked for."""

    def __init__(self, base: Mapping[str, Any], names: Sequence[str]) -> None:
        self._base, self._names = base, list(names)
        self._set = set(self._names)

    def __getitem__(self, name: str) -> Any:
        if name not in self._set:
            raise KeyError(name)
        return self._base[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


@contextlib.contextmanager
def _resume_record(out: Path, cfg: GPTQ | None, resume: bool | None) -> Iterator[Resume | None]:
    """The resume record a GPTQ run keeps beside ``out`` while it runs (None: no GPTQ, or
    ``resume=False``): kept if the run fails or is stopped, removed once the output is whole."""
    if resume and cfg is None:
        raise LowbitError("--resume continues a GPTQ run (--method gptq); this run has no GPTQ")
    if cfg is None or resume is False:
        yield None
        return
    with Resume(resume_folder(out), require=resume is True) as kept:
        yield kept


def _imatrix(imatrix: Path_ | Vectors | None) -> tuple[Vectors | None, str | None]:
    """The importance vectors (GGUF weight name -> vector) and the file they came from."""
    if imatrix is None or isinstance(imatrix, Mapping):
        return imatrix, None
    return read_imatrix(imatrix), os.fspath(imatrix)


def _method(method: str | GPTQ) -> GPTQ | None:
    if isinstance(method, GPTQ):
        return method
    if method == "gptq":
        return GPTQ()
    if method == "rtn":
        return None
    raise LowbitError(
        f"method {method!r}: llama.cpp's GGUF types are rounded as llama.cpp does (rtn), or "
        "with gptq onto the same grids"
    )


def _nbytes(shape: tuple[int, ...], t: str) -> int:
    if t in ("F32", "F16", "BF16"):
        return int(np.prod(shape, dtype=np.int64)) * (4 if t == "F32" else 2)
    return blocks.nbytes(tuple(shape), t) if t in blocks.TYPES else 0


def gguf_mix(
    model: Any,
    mix: str,
    out: Path_ | None = None,
    *,
    imatrix: Path_ | Vectors | None = None,
    method: str | GPTQ = "rtn",
    calibration: Calibration | None = None,
    tensor_types: Mapping[str, str] | Sequence[Any] | None = None,
    output_tensor_type: str | None = None,
    token_embedding_type: str | None = None,
    pure: bool = False,
    leave_output_tensor: bool = False,
    overwrite: bool = False,
    threads: int | None = None,
    compute: str = "fp32",
    progress: bool | None = None,
    dry_run: bool = False,
    resume: bool | None = None,
) -> GGUFResult:
    """Write ``model`` as llama-quantize writes its mix ``mix`` (``"Q4_K_M"``, ``"q5_k_s"``,
    ``"iq4_xs"``, ...): every tensor's type by llama-quantize's rules, llama.cpp's bytes.

    The same file as ``lowbit quantize MODEL --to MIX --out-format gguf`` with the same options.

    Args:
        model: a GGUF file, a Hugging Face folder (read as the GGUF llama.cpp's
            ``convert_hf_to_gguf.py`` writes from it, tensor by tensor, with no temporary
            copy), a shipped model name or an open checkpoint.
        mix: the llama-quantize mix name.
        out: the ``.gguf`` file to write (needed unless ``dry_run``).
        imatrix: an importance matrix (a GGUF or ``.dat`` file, or the vectors
            :func:`~lowbit.checkpoints.gguf.imatrix.read_imatrix` returns), used as
            llama-quantize uses it.
        method: ``"rtn"`` (llama.cpp's rounding), ``"gptq"`` or a
            :class:`~lowbit.methods.gptq.GPTQ`: every linear layer the mix requantizes is
            GPTQ'd onto its block type, each block's scales from llama.cpp's search.
        calibration: GPTQ's data (default: :class:`~lowbit.calibration.data.Calibration`).
        tensor_types, output_tensor_type, token_embedding_type, pure, leave_output_tensor:
            llama-quantize's overrides (``--tensor-type PATTERN=TYPE`` ...).
        overwrite: replace an output lowbit wrote.
        threads, compute: GPTQ's torch threads and forward precision.
        progress: bars (None: on a terminal or in Jupyter; False: never).
        dry_run: choose the types and write nothing.
        resume: GPTQ keeps a resume record beside ``out`` after every block
            (``.OUT.lowbit-resume``, :mod:`lowbit.calibration._resume`): None (default)
            continues from a matching record and starts over (with a warning) from one that
            does not match; True requires one (``--resume``); False keeps none. A run killed
            at any moment and started again writes the same bytes.

    Returns:
        A :class:`~lowbit.jobs.results.GGUFResult`; ``types`` holds every tensor's type.

    Raises:
        LowbitError: an unknown mix, a source lowbit cannot convert, a bad output path, an
            importance matrix a type needs and lacks.
    """
    start = time.perf_counter()
    m = mixes.mix(mix.strip())
    cfg = _method(method)
    ckpt = open_model(model)
    check_unrotated(ckpt)
    imat, imat_path = _imatrix(imatrix)
    options = mix_overrides(
        tensor_types, output_tensor_type, token_embedding_type, pure, leave_output_tensor
    )
    if out is None and not dry_run:
        raise LowbitError("say where to write the GGUF: out='model.Q4_K_M.gguf'")
    out_path = Path(out) if out is not None else Path(f"{Path(ckpt.path).name}.{m.name}.gguf")
    if not dry_run:  # before any work: a bad out fails at once
        check_output(out_path, overwrite=overwrite, kind="file", inputs=[ckpt.path])
    with gguf_source(ckpt, out_path, progress) as source:
        types = gguf_mix_types(source, m.name, has_imatrix=imat is not None, **options)
        if dry_run:
            return _dry_mix(source, m, types, start)
        done = record = None
        seconds: dict[str, float] = {}
        if cfg is not None and out_path.exists() and not overwrite:  # before the calibration
            raise LowbitError(f"{out_path} exists; pass overwrite=True to replace it")
        with _resume_record(out_path, cfg, resume) as kept:
            if cfg is not None:
                t0 = time.perf_counter()
                targets = gptq_targets(source, m.name, imatrix=imat, **options)
                done, record = gptq_onto(
                    source, targets, imat is not None, gptq=cfg, calibration=calibration,
                    threads=threads, compute=compute, progress=progress, resume=kept,
                )  # fmt: skip
                seconds["calibration"] = time.perf_counter() - t0
            result = write_gguf_mix(
                source, out_path, m.name, imatrix=imat, overwrite=overwrite, progress=progress,
                weights=done, **options,
            )  # fmt: skip
    seconds["write"] = result["seconds"]
    if record is not None:
        result["method"] = record
    if imat_path is not None:
        result["imatrix"] = imat_path
    seconds["total"] = time.perf_counter() - start
    return GGUFResult(
        details=result,
        out=out_path,
        out_format="gguf",
        source=str(ckpt.path),
        bytes=int(result["bytes"]),
        tensors=int(result["tensors"]),
        seconds=seconds,
        method=record,
        types=types,
        imatrix=imat_path,
    )


def _dry_mix(ckpt: Any, m: Any, types: dict[str, str], start: float) -> GGUFResult:
    rows, total = [], 0
    for name in ckpt.names():
        info = ckpt.info(name)
        t = types[name]
        nbytes = info.nbytes if t == info.dtype.upper() else _nbytes(tuple(info.shape), t)
        total += nbytes
        rows.append(
            {"name": name, "shape": "x".join(map(str, info.shape)), "stored": info.dtype,
             "type": t, "bytes": nbytes}
        )  # fmt: skip
    doc = {
        "source": str(ckpt.path),
        "mix": m.name,
        "file_type": m.file_type,
        "tensors": rows,
        "tensor_bytes": total,
    }
    return GGUFResult(
        details=doc,
        out=None,
        out_format="gguf",
        source=str(ckpt.path),
        bytes=total,
        tensors=len(rows),
        seconds={"total": time.perf_counter() - start},
        types=types,
        dry_run=True,
    )


def gguf_budget(
    model: Any,
    out: Path_ | None = None,
    *,
    size: int | None = None,
    bits_per_weight: float | None = None,
    candidates: Sequence[str] | None = None,
    imatrix: Path_ | Vectors | None = None,
    method: str | GPTQ = "rtn",
    calibration: Calibration | None = None,
    scan_text: str = "default",
    scan_samples_count: int | None = None,
    scan_length: int = 512,
    overwrite: bool = False,
    threads: int | None = None,
    compute: str = "fp32",
    progress: bool | None = None,
    dry_run: bool = False,
    measure: str = "block",
    resume: bool | None = None,
) -> GGUFResult:
    """Write ``model`` as a GGUF whose every quantized tensor has the llama.cpp type of least
    measured damage that keeps the file within ``size`` bytes (or ``bits_per_weight``).

    The same file as ``lowbit quantize MODEL --size BYTES --out-format gguf`` with the same
    options: each candidate type of each tensor is tried on the scan text (llama.cpp's
    rounding, the rest of the model in float), the damages solved for the budget, then
    (``method="gptq"``) every linear layer GPTQ'd onto its chosen type.

    Args:
        model: a GGUF file, a Hugging Face folder, a shipped model name or an open checkpoint.
        out: the ``.gguf`` file (needed unless ``dry_run``).
        size: the file's bytes at most; or ``bits_per_weight``: stored bits per quantized weight.
        candidates: GGUF type names (default
            :data:`~lowbit.checkpoints.gguf.budget.DEFAULT_CANDIDATES`).
        imatrix: used by the trials and the writer alike.
        method: ``"rtn"``, ``"gptq"`` or a :class:`~lowbit.methods.gptq.GPTQ`.
        calibration: GPTQ's data.
        scan_text, scan_samples_count, scan_length: the trials' text, windows and tokens per
            window (``--calib``, ``--scan-samples``, ``--scan-len``).
        overwrite, threads, compute, progress, dry_run: as :func:`gguf_mix`.
        measure: ``block`` (default): each trial runs the tensor's block alone, its output
            error weighted by the next-token Fisher at that block's output
            (:mod:`lowbit.evaluation.block_sensitivity`; one block forward per trial, memory
            of one block); ``exact``: each trial runs the model from the tensor's block to the
            logits (mean KL). On SmolLM2 at Q4_K_M's bytes the two files' mean KL differ by
            2 % (docs/scale.md).
        resume: as :func:`gguf_mix`'s, for the GPTQ after the trials (a resumed run measures
            the trials again: they are deterministic, so it continues the same GPTQ).

    Returns:
        A :class:`~lowbit.jobs.results.GGUFResult` (``details`` holds the plan, every measured
        damage and the solver's gap).

    Raises:
        LowbitError: both or neither of ``size`` and ``bits_per_weight``, an unknown type, a
            budget below the smallest file.
    """
    start = time.perf_counter()
    if (size is None) == (bits_per_weight is None):
        raise LowbitError("give size (bytes) or bits_per_weight, one of them")
    if measure not in ("exact", "block"):
        raise LowbitError(f"measure must be 'exact' or 'block', got {measure!r}")
    cfg = _method(method)
    types = parse_types(list(candidates or DEFAULT_CANDIDATES))
    ckpt = open_model(model)
    check_unrotated(ckpt)
    if out is None and not dry_run:
        raise LowbitError("say where to write the GGUF: out='model.budget.gguf'")
    out_path = Path(out) if out is not None else Path(f"{Path(ckpt.path).name}.budget.gguf")
    if not dry_run:
        check_output(out_path, overwrite=overwrite, kind="file", inputs=[ckpt.path])
    imat, imat_path = _imatrix(imatrix)
    with gguf_source(ckpt, out_path, progress) as source:
        options = budget_options(source, types)
        vectors = budget_vectors(source, options, imat) if imat is not None else {}
        calib = scan_samples(
            "causal", build_tokenizer(source), scan_text, samples=scan_samples_count,
            length=scan_length,
        )  # fmt: skip
        total = sum(len(v) for v in options.values())
        label = "GGUF block trials" if measure == "block" else "GGUF trials"
        measured = gguf_block_sensitivity if measure == "block" else gguf_sensitivity
        with progress_bar(total, progress, label, "trial") as bar:
            tick: Callable[[int, int], None] = lambda done, _total: bar.update(done - bar.n)  # noqa: E731
            sens = measured(source, options, calib, vectors=vectors, progress=tick, compute=compute)
        t0 = time.perf_counter()
        plan = solve_gguf(source, options, sens.damages, size=size, bits_per_weight=bits_per_weight)
        seconds = {**sens.seconds, "solve": time.perf_counter() - t0}
        doc: dict[str, Any] = {
            "source": str(source.path),
            "candidates": list(types),
            "imatrix": imat_path,
            "calibration": sens.calibration,
            "metric": sens.metric,
            "measure": measure,
            "trials": total,
            **plan.to_dict(),
            "damages": sens.damages,  # every option measured, {tensor: {type: damage}}
        }
        nbytes = plan.file_bytes
        if not dry_run:
            done = None
            with _resume_record(out_path, cfg, resume) as kept:
                if cfg is not None:  # onto the types the trials chose
                    targets = gguf_targets(source, plan.types, vectors)
                    done, doc["method"] = gptq_onto(
                        source, targets, imat is not None, gptq=cfg, calibration=calibration,
                        threads=threads, compute=compute, progress=progress, resume=kept,
                    )  # fmt: skip
                    sec = doc["method"]["seconds"]
                    seconds["gptq"] = sec.get("total", sum(sec.values()))
                written = write_gguf_types(
                    source, out_path, plan, vectors=vectors, overwrite=overwrite,
                    progress=progress, weights=done,
                )  # fmt: skip
            seconds["write"] = written["seconds"]
            doc = {"path": written["path"], "bytes": written["bytes"], **doc}
            nbytes = int(written["bytes"])
    seconds["total"] = time.perf_counter() - start
    doc["seconds"] = seconds
    return GGUFResult(
        details=doc,
        out=None if dry_run else out_path,
        out_format="gguf",
        source=str(ckpt.path),
        bytes=nbytes,
        tensors=len(plan.rows),
        seconds=seconds,
        method=doc.get("method"),
        types=dict(plan.types),
        imatrix=imat_path,
        plan=plan,
        dry_run=dry_run,
    )
