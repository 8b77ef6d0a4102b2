"""The other jobs of the command line, one call each: :func:`evaluate` (``lowbit eval``),
:func:`imatrix` (``lowbit imatrix``), :func:`report` (``lowbit report``), :func:`verify`
(``lowbit verify``) and :func:`convert_hf_to_gguf` (``lowbit quantize HF --plan keep
--out-format gguf``, llama.cpp's converter). Each writes what its command writes and returns a
:class:`~lowbit.jobs.results.Result`.

A sensitivity scan is :func:`lowbit.evaluation.sensitivity.sensitivity` (``lowbit.sensitivity``)
and a plan for a bits budget :func:`lowbit.plans.mixed.plan_for_budget`; docs/python.md shows
the two together.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lowbit import _json
from lowbit.calibration.data import Calibration
from lowbit.calibration.imatrix import compute_imatrix
from lowbit.checkpoints.gguf.imatrix import write_imatrix
from lowbit.checkpoints.io.outputs import check_output, output_file
from lowbit.checkpoints.streaming import convert_hf_to_gguf as _convert
from lowbit.checkpoints.streaming import resolve_model
from lowbit.checkpoints.verify import verify_checkpoint
from lowbit.errors import LowbitError
from lowbit.evaluation.variants import evaluate_variants
from lowbit.jobs.results import Result
from lowbit.jobs.stopwatch import Stopwatch
from lowbit.view.html import render
from lowbit.view.png import write_pngs
from lowbit.view.report import build_report

__all__ = ["EvalResult", "FileResult", "convert_hf_to_gguf", "evaluate", "imatrix", "report",
           "verify"]  # fmt: skip

PathLike = str | os.PathLike[str]


class FileResult(Result):
    """A job that wrote one file: ``details["path"]`` (or ``out``), what it holds, seconds."""

    def _summary(self) -> str:
        d = self.details
        secs = d.get("seconds")
        total = secs.get("total") if isinstance(secs, dict) else secs
        took = "" if total is None else f", {total:.1f} s"
        return f"{d.get('path') or d.get('out')}{took}"


class EvalResult(Result):
    """``lowbit eval``'s measurements: one row per variant (``details["rows"]``)."""

    def _summary(self) -> str:
        rows = self.details.get("rows", [])
        return f"{self.details.get('model')}: {len(rows)} rows, {self.details.get('kind', '')}"

    def _rows(self) -> list[dict[str, Any]]:
        return [{k: v for k, v in row.items() if not isinstance(v, dict | list)}
                for row in self.details.get("rows", [])]  # fmt: skip


def evaluate(
    model: Any = None,
    quantized: Sequence[PathLike] = (),
    schemes: Sequence[str] | None = None,
    **options: Any,
) -> EvalResult:
    """Measure a model and its quantized variants, as ``lowbit eval`` does: perplexity, KL and
    top-1 agreement (causal LMs) or embedding fidelity (encoders) of every variant against the
    original, on the same text.

    Args:
        model: the original (a path or shipped name; default SmolLM2).
        quantized: checkpoints of it on disk (lowbit, compressed-tensors, GGUF ...).
        schemes: scheme strings quantized in memory (``["int4:g128", "nf4"]``); None: the
            defaults when ``quantized`` is empty too; ``[]`` for none.
        options: the rest of :func:`lowbit.evaluation.variants.evaluate_variants`'s keywords
            (``tokens``, ``window``, ``methods``, ``calibration``, ``act``, ``kv``, ...).

    Returns:
        An :class:`EvalResult` whose ``details`` is what ``lowbit eval --json`` prints.
    """
    for q in quantized:
        if not Path(q).exists():
            raise LowbitError(f"{q}: no such file or folder")
    return EvalResult(details=evaluate_variants(model, quantized, schemes, **options))


def imatrix(
    model: Any,
    out: PathLike,
    *,
    calibration: Calibration | None = None,
    process_output: bool = False,
    threads: int | None = None,
    overwrite: bool = False,
    progress: bool | None = None,
) -> FileResult:
    """Collect llama.cpp's importance matrix of a GGUF causal LM and write it as llama-imatrix
    does (GGUF format), what ``lowbit imatrix`` writes.

    Args:
        model: a GGUF file or shipped model name.
        out: the ``.gguf`` file to write (never an input).
        calibration: the windows (default: 128 x 512 tokens of the default text).
        process_output: also collect ``output.weight``.
        threads, overwrite, progress: torch threads; replace an output lowbit wrote; bars.

    Raises:
        LowbitError: an empty ``out``, one that is an input (the model, its calibration text,
            whatever ``overwrite`` says) or exists without ``overwrite``, a source that is not
            a GGUF causal LM, calibration text too short.
    """
    if not str(out).strip():
        raise LowbitError("--out is empty; give the .gguf file to write")
    if threads is not None and threads < 1:
        raise LowbitError(f"--threads must be >= 1, got {threads}")
    path = Path(out)
    calib = calibration or Calibration()
    named = [model, getattr(calib, "source", None)]
    inputs = [p for p in named if isinstance(p, str | os.PathLike) and Path(p).exists()]
    check_output(path, overwrite=overwrite, inputs=inputs)  # before minutes of work
    start = time.perf_counter()
    im = compute_imatrix(
        model, calib, process_output=process_output, threads=threads, progress=progress
    )
    write_imatrix(
        path, im.sums, im.counts, datasets=[im.dataset], chunk_count=im.chunks,
        chunk_size=im.chunk_size, overwrite=overwrite, inputs=[*inputs, im.source],
    )  # fmt: skip
    return FileResult(
        details={
            "path": str(path),
            "entries": len(im.sums),
            "chunks": im.chunks,
            "chunk_size": im.chunk_size,
            "dataset": im.dataset,
            "seconds": time.perf_counter() - start,
        }
    )


def report(
    model: PathLike,
    out: PathLike = "report.html",
    *,
    against: PathLike | None = None,
    evaluation: Any = None,
    sensitivity: Any = None,
    worst: int = 3,
    png: PathLike | None = None,
    overwrite: bool = False,
) -> FileResult:
    """Write the one-page HTML report of a quantized checkpoint (and, with ``png``, its
    figures as PNGs), what ``lowbit report`` writes.

    Args:
        model: the quantized checkpoint (a folder or file lowbit, compressed-tensors, GGUF or
            MLX; ``model`` as every job names what it reads).
        out: the HTML file.
        against: the source to compare with (a path or shipped name; default: the one the
            checkpoint records).
        evaluation, sensitivity: ``lowbit eval --json`` / ``lowbit sensitivity --out`` results
            to show (a dict, or the path of the JSON file).
        worst: how many of the worst tensors get their candidates measured.
        png: a folder for the figures.
        overwrite: replace an output lowbit wrote.

    Raises:
        LowbitError: an output that is an input or something lowbit did not write, a bad
            JSON file, an unreadable checkpoint.
    """
    clock = Stopwatch()
    if worst < 0:
        raise LowbitError(f"--worst must be >= 0, got {worst}")
    if against is not None:  # a shipped model's name (smollm2, minilm) as quantize takes
        against = str(resolve_model(against))
    inputs = [model] + ([against] if against else [])
    check_output(out, overwrite=overwrite, inputs=inputs)
    evaluation = _read(evaluation, "--eval")
    sens = _read(sensitivity, "--sensitivity")
    if sens is not None and not isinstance(sens, dict):
        raise LowbitError(f"--sensitivity {sensitivity}: not a lowbit sensitivity result")
    with clock.part("tensors"):  # reading and measuring each tensor, then the candidates
        rep = build_report(
            model, against=against, evaluation=evaluation, sensitivity=sens, worst=worst
        )
    clock.split("tensors", {"candidates": rep.seconds.get("details", 0.0)})
    with clock.part("page"):
        page = render(rep)
        with output_file(out, overwrite=overwrite, inputs=inputs) as tmp:
            tmp.write_text(page, encoding="utf-8")
    pngs: list[str] = []
    if png:
        with clock.part("png"):
            pngs = [str(p) for p in write_pngs(rep, png, overwrite=overwrite)]
    return FileResult(
        details={
            "out": str(out),
            "png": pngs,
            "seconds": clock.to_dict(),
            "tensors": len(rep.rows),
        }
    )


def _read(value: Any, option: str) -> Any:
    """A JSON result given as an object or as the path of its file (bounded, checked)."""
    if value is None or isinstance(value, dict | list):
        return value
    try:
        return _json.load(value)
    except LowbitError as exc:
        raise LowbitError(f"{option} {exc}") from None


def verify(path: PathLike, *, hashes: bool = True) -> Result:
    """Check a checkpoint on disk without building a model, as ``lowbit verify`` does.

    Returns:
        A :class:`~lowbit.jobs.results.Result` whose ``details`` is ``lowbit verify --json``'s
        report (``kind``, ``tensors``, ``checks``, ``files``, ``summary``).

    Raises:
        LowbitError: the first problem found, naming the file and what is wrong.
    """
    return Result(details=verify_checkpoint(path, hashes=hashes))


def convert_hf_to_gguf(
    model: PathLike,
    out: PathLike,
    *,
    outtype: str = "bf16",
    overwrite: bool = False,
    progress: bool | None = None,
) -> FileResult:
    """A Hugging Face folder as llama.cpp's ``convert_hf_to_gguf.py --outtype OUTTYPE`` writes
    it (metadata, tensor names and layouts, tokenizer); see
    :func:`lowbit.checkpoints.streaming.convert_hf_to_gguf`."""
    return FileResult(
        details=_convert(model, out, outtype=outtype, overwrite=overwrite, progress=progress)
    )
