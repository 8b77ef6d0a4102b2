"""Quantize a whole checkpoint, streaming: one tensor at a time from the reader, through
``lowbit.quantize``, into a writer.

>>> from lowbit.plans.plan import PrecisionPlan                      # doctest: +SKIP
>>> plan = PrecisionPlan.uniform("int4", group_size=128)
>>> quantize_model("smollm2", plan, "smollm2-int4")                       # lowbit checkpoint
>>> quantize_model("model_dir", PrecisionPlan.uniform("int8"), "ct", out_format="compressed-tensors")
>>> quantize_model("m.gguf", PrecisionPlan.uniform("q4_0"), "m.Q4_0.gguf", out_format="gguf")

Memory stays at about one tensor (its float32 values, their quantized codes and the memory map
of its bytes, released before the next tensor is read), whatever the checkpoint's size: headers
are planned from shapes alone (``lowbit.quant.layout.quantized_arrays``), then each
tensor is read, quantized and written when its bytes are due. Everything is written under a
temporary name and renamed when complete.

Outputs:

- ``lowbit``: lowbit's own checkpoint (``lowbit.checkpoints.lowbit_format.checkpoint``), any scheme;
- ``compressed-tensors``: the folder vLLM serves (``lowbit.checkpoints.compressed_tensors.writer``), for the
  schemes it defines: int1..8 per tensor / output channel / group (groups must divide the rows),
  fp8 E4M3 per tensor / channel; a GGUF source is renamed to Hugging Face names with its q/k
  rows un-permuted and its tokenizer saved beside;
- ``gguf``: llama.cpp's file (``lowbit.checkpoints.gguf.writer``) from a GGUF source (its metadata
  is copied): int4/int8 symmetric groups of 32 with float16 scales are stored exactly as Q4_0 /
  Q8_0 blocks; other int4/int8 schemes (and ``--to q4_0`` / ``q8_0``) use llama.cpp's own
  reference rounding (``lowbit.ggml.legacy``); kept tensors are copied byte for byte.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from lowbit._progress import progress_bar
from lowbit.checkpoints import open_checkpoint
from lowbit.checkpoints import steps as qw
from lowbit.checkpoints._model_files import model_files
from lowbit.checkpoints.compressed_tensors.checks import check_ct
from lowbit.checkpoints.compressed_tensors.pipeline import write_ct
from lowbit.checkpoints.gguf.checks import check_gguf
from lowbit.checkpoints.gguf.convert import check_hf_source, write_gguf_from_hf
from lowbit.checkpoints.gguf.names import gguf_to_hf_name
from lowbit.checkpoints.gguf.pipeline import write_gguf
from lowbit.checkpoints.io.outputs import check_not_input
from lowbit.checkpoints.lowbit_format.checkpoint import is_lowbit_checkpoint
from lowbit.checkpoints.lowbit_format.pipeline import write_lowbit
from lowbit.checkpoints.output_bytes import output_nbytes
from lowbit.checkpoints.readers import Checkpoint
from lowbit.checkpoints.shape_checks import check_checkpoint_shapes
from lowbit.checkpoints.shipped import DEFAULT_MODELS, default_model_key, default_model_path
from lowbit.errors import LowbitError
from lowbit.plans.plan import AppliedPlan, PrecisionPlan, TensorPlan

__all__ = [
    "OUT_FORMATS",
    "check_unrotated",
    "checkpoint_tensors",
    "convert_hf_to_gguf",
    "open_model",
    "output_and_files",
    "output_nbytes",
    "plan_model",
    "quantize_model",
    "quantized_weights",
    "resolve_model",
    "rotated_tensors",
]

OUT_FORMATS = ("lowbit", "compressed-tensors", "gguf")


# ---------------------------------------------------------------------------------------
# Opening and planning
# ---------------------------------------------------------------------------------------


def resolve_model(model: str | os.PathLike[str] | None) -> Path:
    """The path of a model argument: a file or folder, or a shipped model name.

    ``None`` is the default SmolLM2; ``smollm2`` / ``minilm`` (and their aliases) are the
    shipped models (``lowbit.checkpoints.shipped``) unless a file of that name exists.

    Raises:
        LowbitError: neither an existing path nor a shipped model name.
        ImportError: a shipped model whose package is not installed (says how to install it).
    """
    if model is None:
        return default_model_path("smollm2")
    p = Path(model)
    if p.exists():
        return p
    key = default_model_key(str(model))
    if key is not None:
        return default_model_path(key)
    raise LowbitError(
        f"{model}: no such file or folder (and not a shipped model: "
        f"{', '.join(sorted(DEFAULT_MODELS))})"
    )


def open_model(model: str | os.PathLike[str] | Checkpoint | None) -> Checkpoint:
    """Open a model argument (see :func:`resolve_model`) as a ``Checkpoint`` for reading.

    Raises:
        LowbitError: an unreadable checkpoint, or a lowbit checkpoint (quantize its source).
    """
    if isinstance(model, Checkpoint):
        return model
    path = resolve_model(model)
    if is_lowbit_checkpoint(path):
        raise LowbitError(
            f"{path} is already a lowbit checkpoint; quantize its source model instead"
        )
    return open_checkpoint(path)


def rotated_tensors(method: Mapping[str, Any] | None) -> dict[str, int]:
    """The weights a method's record says are stored block-Hadamard rotated (its
    ``rotation.tensors``: weight name -> block; empty: none)."""
    return dict(((method or {}).get("rotation") or {}).get("tensors") or {})


def check_unrotated(checkpoint: Checkpoint) -> None:
    """Refuse to write a new checkpoint from one whose weights are stored in a rotated basis
    (a compressed-tensors ``transform_config`` with online input transforms): the output would
    hold rotated weights without the rotation its layers' inputs need.

    Raises:
        LowbitError: such a source.
    """
    transforms = getattr(checkpoint, "transforms", None)
    if transforms:
        raise LowbitError(
            f"{checkpoint.path}: its weights are stored rotated (transform_config group "
            f"{transforms[0].group!r}) and an output made from them would lose the rotation: "
            "quantize the float model it was made from"
        )


def plan_model(
    checkpoint: Checkpoint,
    plan: PrecisionPlan,
    *,
    out_format: str = "lowbit",
    gguf_rounding: str = "auto",
) -> AppliedPlan:
    """Apply a plan to a checkpoint's tensors and check the output format can hold the result.

    Args:
        checkpoint: an open checkpoint (``open_model``).
        plan: the precision plan.
        out_format: ``lowbit``, ``compressed-tensors`` or ``gguf``.
        gguf_rounding: for GGUF output, ``auto`` (lowbit's codes where the scheme is exactly
            Q4_0/Q8_0, llama.cpp's rounding otherwise) or ``llama.cpp`` (always).

    Returns:
        The :class:`~lowbit.plans.plan.AppliedPlan`.

    Raises:
        LowbitError: an unquantizable tensor (named), or a scheme the output format lacks.

    Warns:
        UserWarning: rules matching no tensor; GGUF output approximating a scheme with
            llama.cpp's block layout.
    """
    if out_format not in OUT_FORMATS:
        raise LowbitError(
            f"unknown output format {out_format!r}; choose one of {', '.join(OUT_FORMATS)}"
        )
    if gguf_rounding not in ("auto", "llama.cpp"):
        raise LowbitError(f"gguf_rounding must be 'auto' or 'llama.cpp', got {gguf_rounding!r}")
    check_checkpoint_shapes(checkpoint)  # before a tensor is read or an output sized
    applied = plan.apply(checkpoint_tensors(checkpoint), source=str(checkpoint.path.name))
    if out_format == "compressed-tensors":
        check_ct(applied, checkpoint)
    elif out_format == "gguf":
        # a Hugging Face source is converted as llama.cpp's convert_hf_to_gguf.py does
        hf = check_hf_source if checkpoint.format != "gguf" else None
        check_gguf(applied, checkpoint, gguf_rounding, source_check=hf)
    return applied


def quantized_weights(
    checkpoint: Checkpoint, applied: AppliedPlan, *, progress: bool | None = None
) -> Iterator[tuple[TensorPlan, Any]]:
    """Yield ``(tensor plan, QuantizedTensor)`` for each tensor the plan quantizes, one at a time.

    For evaluating a scheme in memory without writing anything.
    """
    todo = applied.quantized
    with progress_bar(len(todo), progress, "quantizing", "tensor") as bar:
        for t in todo:
            yield t, qw.read_quantized(checkpoint, t)
            bar.update(1)


def output_and_files(
    ckpt: Checkpoint, out: str | os.PathLike[str], copy_code: bool
) -> tuple[Path, Any]:
    """The output path and the source's files that go with it
    (:func:`~lowbit.checkpoints._model_files.model_files`), checked to be none of the inputs
    (the source, its tensor files, the files copied).

    Raises:
        LowbitError: an empty path, or one that is or lies inside an input.
    """
    if not str(out):
        raise LowbitError("the output path is empty")
    path = Path(out)
    files = model_files(ckpt, copy_code=copy_code)
    inputs = {Path(ckpt.path)} | {f for f, _ in files.copied}
    inputs |= {Path(ckpt.info(n).file) for n in ckpt.names() if ckpt.info(n).file is not None}
    check_not_input(path, sorted(inputs))
    return path, files


def quantize_model(
    model: str | os.PathLike[str] | Checkpoint | None,
    plan: PrecisionPlan,
    out: str | os.PathLike[str],
    *,
    out_format: str = "lowbit",
    gguf_rounding: str = "auto",
    overwrite: bool = False,
    copy_code: bool = False,
    max_shard_size: int | None = None,
    progress: bool | None = None,
    weights: Mapping[str, Any] | None = None,
    method: Mapping[str, Any] | None = None,
    input_scales: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Quantize a checkpoint with a precision plan and write the result.

    Args:
        model: a path (``.safetensors``, a Hugging Face folder, ``.gguf``), a shipped model
            name (``smollm2``, ``minilm``), or an open checkpoint.
        plan: the :class:`~lowbit.plans.plan.PrecisionPlan`.
        out: the folder (``lowbit``, ``compressed-tensors``) or ``.gguf`` file to write.
        out_format: ``lowbit`` (default), ``compressed-tensors`` or ``gguf``.
        gguf_rounding: see :func:`plan_model`.
        overwrite: replace an existing output that lowbit wrote (a lowbit or
            compressed-tensors folder, a GGUF file); anything else is refused.
        copy_code: also copy the source folder's ``.py`` files (custom modelling code). Other
            files are copied only when they belong to a model (config, tokenizer, chat
            template, README, licence: ``lowbit.checkpoints._model_files``).
        max_shard_size: bytes per safetensors shard (default 2 GiB for lowbit, 5 GiB for
            compressed-tensors).
        progress: tqdm bars (``None``: only on a terminal; ``False``: never).
        weights: tensors already quantized as the plan says (name -> QuantizedTensor, e.g.
            ``lowbit.calibration.gptq.gptq_weights(...).weights``), written as they are
            (GGUF: in Q4_0/Q8_0 layouts); the plan's other tensors are rounded to nearest.
        method: how ``weights`` were made (e.g. ``GPTQ().to_dict()`` plus the calibration),
            recorded in the manifest and, per tensor, as ``method``. A ``rotation`` in it
            (``{"tensors": {name: block}}``: weights stored block-Hadamard rotated) is
            declared for the consumer: the manifest's, or compressed-tensors'
            ``transform_config``; a GGUF is refused.
        input_scales: compressed-tensors output of a plan with NVFP4 activations (W4A4): the
            static ``input_global_scale`` of each such weight, by its output name
            (``lowbit.calibration.input_scales.nvfp4_input_scales``).

    Returns:
        A summary: ``out``, ``out_format``, ``source``, ``totals`` (the plan's), ``bytes``
        (written, on disk), ``seconds`` (this call's), ``seconds_parts`` (``quantize``:
        reading and rounding the source tensors, casting; ``write``: the rest, packing,
        hashing and writing files, GGUF's llama.cpp rounding included), ``copied_files``
        (names copied from the source folder) and ``left_out`` (``[{"file", "why"}]`` of the
        others).

    Raises:
        LowbitError: an unreadable source, an unquantizable tensor, a scheme the output format
            lacks, a plan rule naming a calibrated method (``gptq``, ``awq``) without
            ``weights``, an output that is, contains or lies inside the source, an existing output
            without ``overwrite`` (or not written by lowbit), another run writing the same
            output, a write error (disk full, read-only). Nothing is left half-written: the
            output is swapped in complete (``lowbit.checkpoints.io.outputs``).

    Warns:
        UserWarning: temporary folders of an interrupted earlier run completed or removed.
    """
    start = time.perf_counter()
    # weights stored rotated (MR-GPTQ, --method hadamard): the consumer must rotate their inputs
    rotated = rotated_tensors(method)
    if rotated and out_format == "gguf":
        raise LowbitError(
            "the weights are stored block-Hadamard rotated and a GGUF cannot declare the "
            "rotation their inputs need: write lowbit or compressed-tensors"
        )
    experts = [n for n in rotated if ".experts." in n]
    if experts and out_format == "compressed-tensors":
        raise LowbitError(
            f"{experts[0]}: a mixture's expert weights stored rotated; vLLM applies a "
            "transform_config to linear layers, not to its fused experts: write lowbit, or use "
            "--method hadamard-fold"
        )
    ckpt = open_model(model)
    check_unrotated(ckpt)
    applied = plan_model(ckpt, plan, out_format=out_format, gguf_rounding=gguf_rounding)
    w4a4 = [t for t in applied.quantized if t.activations == "nvfp4"]
    if w4a4 and out_format != "compressed-tensors":
        raise LowbitError(
            f"tensor {w4a4[0].name!r}: NVFP4 activations (W4A4) are written to compressed-tensors "
            f"only (their static input scales are its input_global_scale), not {out_format}: "
            "write --out-format compressed-tensors, or drop --activations nvfp4"
        )
    ruled = [t for t in applied.quantized if t.method not in (None, "rtn")]
    if weights is None and ruled:  # rounding them to nearest would ignore what the rule says
        raise LowbitError(
            f"tensor {ruled[0].name!r}: its plan rule says method: {ruled[0].method}, and "
            "nothing here calibrates (no weights= given): run lowbit quantize --plan, which "
            "runs the rules' methods, or give the rule no method"
        )
    out, files = output_and_files(ckpt, out, copy_code)
    copied: list[str] = []
    left: list[dict[str, str]] = []
    clock = qw.Clock()
    if out_format == "lowbit":
        copied, left = write_lowbit(
            ckpt, applied, out, overwrite, max_shard_size, progress, files,
            done=weights, method=None if method is None else dict(method), clock=clock,
        )  # fmt: skip
    elif out_format == "compressed-tensors":
        copied, left = write_ct(
            ckpt, applied, out, overwrite, max_shard_size, progress, files, done=weights,
            clock=clock, input_scales=input_scales, rotations=rotated,
        )  # fmt: skip
    elif ckpt.format != "gguf":
        write_gguf_from_hf(ckpt, applied, out, overwrite, progress, gguf_rounding, done=weights)
    else:
        write_gguf(ckpt, applied, out, overwrite, progress, gguf_rounding, done=weights,
                      clock=clock)  # fmt: skip
    ckpt.close()
    seconds = time.perf_counter() - start
    return {
        "out": str(out),
        "out_format": out_format,
        "source": str(ckpt.path),
        "source_format": ckpt.format,
        "totals": applied.totals(),
        "bytes": disk_bytes(out),
        "seconds": seconds,
        "seconds_parts": {"quantize": clock.seconds, "write": seconds - clock.seconds},
        "copied_files": copied,
        "left_out": left,
    }


def disk_bytes(path: str | os.PathLike[str]) -> int:
    """Bytes of a file, or of every file under a folder."""
    p = Path(path)
    if p.is_file():
        return p.stat().st_size
    return sum(f.stat().st_size for f in p.rglob("*") if f.is_file())


def checkpoint_tensors(checkpoint: Checkpoint) -> list[tuple[Any, ...]]:
    """``(name, shape, dtype, nbytes, alias)`` of every tensor of an open checkpoint, in file
    order; ``alias`` is a GGUF tensor's transformers name (so rules may use either), else None."""
    to_hf = None
    if getattr(checkpoint, "format", None) == "gguf":
        cfg = checkpoint.config

        def to_hf(name: str) -> str:
            return gguf_to_hf_name(name, cfg)

    out = []
    for name in checkpoint.names():
        info = checkpoint.info(name)
        alias = None
        if to_hf is not None:
            try:
                alias = to_hf(name)
            except LowbitError:
                alias = None
        out.append((name, tuple(info.shape), str(info.dtype), int(info.nbytes), alias))
    return out


def convert_hf_to_gguf(
    model: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    outtype: str = "bf16",
    overwrite: bool = False,
    progress: bool | None = None,
) -> dict[str, Any]:
    """llama.cpp's ``convert_hf_to_gguf.py --outtype OUTTYPE``: a Hugging Face folder to GGUF.

    Args:
        model: the Hugging Face folder (config.json, safetensors, tokenizer.json).
        out: the ``.gguf`` file to write.
        outtype: ``bf16``, ``f16`` or ``f32`` for the 2-D weights (the embedding and other
            kept tensors stay as stored; norms are F32), or any lowbit scheme GGUF holds
            (``q8_0``, ``q4_0``).

    Returns:
        :func:`quantize_model`'s summary.
    """
    return quantize_model(
        model, PrecisionPlan.uniform(outtype), out, out_format="gguf", overwrite=overwrite,
        progress=progress,
    )  # fmt: skip
