"""The scan's options and running it (``lowbit sensitivity``, ``quantize/plan --budget``), and
the JSON outputs of mixed precision (a scan, a plan file): replaced only with ``--overwrite``
and only over a file of their kind, written atomically."""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from lowbit import _json
from lowbit.checkpoints.io.outputs import check_not_input
from lowbit.cli import _common
from lowbit.errors import LowbitError
from lowbit.evaluation.sensitivity import SensitivityResult
from lowbit.jobs.budget import scan as scan_job
from lowbit.plans.plan import PrecisionPlan


def add_scan_options(
    p: argparse.ArgumentParser,
    *,
    required: bool = True,
    measure: str = "exact",
    calib: bool = True,
) -> None:
    """The scan's options (shared with ``lowbit quantize --budget``, which runs a scan)."""
    p.add_argument(
        "--schemes",
        metavar="LIST",
        default=None if not required else "int4:g128,nf4,int8:ch",
        help="comma-separated candidate schemes (default int4:g128,nf4,int8:ch)",
    )
    if calib:  # lowbit quantize has them already (GPTQ's, same meaning)
        _calib_options(p)
    else:  # the trials need far fewer windows than GPTQ; by default they share them
        p.add_argument(
            "--scan-samples",
            type=int,
            metavar="N",
            help="windows (sentences) the sensitivity trials run on (default: --calib-samples)",
        )
        p.add_argument(
            "--scan-len",
            type=int,
            metavar="L",
            help="tokens per trial window (default: --calib-len)",
        )
    _trial_options(p, measure)


def scan_windows(args: argparse.Namespace) -> tuple[int | None, int]:
    """The trials' ``(samples, length)``: ``--scan-samples``/``--scan-len`` where given (lowbit
    quantize), else ``--calib-samples``/``--calib-len``.

    Raises:
        LowbitError: a count or length below 1.
    """
    samples = getattr(args, "scan_samples", None) or args.calib_samples
    length = getattr(args, "scan_len", None) or args.calib_len or 512
    for flag, v in (("--scan-samples", getattr(args, "scan_samples", None)),
                    ("--scan-len", getattr(args, "scan_len", None))):  # fmt: skip
        if v is not None and v < 1:
            raise LowbitError(f"{flag} must be a positive integer, got {v}")
    return samples, length


def _calib_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--calib",
        metavar="default|FILE.txt",
        default="default",
        help="calibration text (default: lowbit eval's text, a range eval does not score)",
    )
    p.add_argument(
        "--calib-samples",
        type=int,
        metavar="N",
        help="windows (causal LMs, default 8) or sentences (encoders, default 128)",
    )
    p.add_argument("--calib-len", type=int, default=512, metavar="L", help="tokens per window")


def _trial_options(p: argparse.ArgumentParser, measure: str | None) -> None:
    said = (f"default {measure}" if measure is not None
            else "default block for a GGUF budget, else exact")  # fmt: skip
    p.add_argument(
        "--measure",
        choices=["exact", "block", "proxy", "fisher"],
        default=measure,
        help="exact: run the model per trial (from the tensor's block to the logits); block: "
        "run the tensor's block alone, its output error weighted by the next-token Fisher at "
        "its output (causal LMs; far fewer block forwards on deep models); "
        "proxy: input-weighted weight error only; "
        "fisher: output-gradient- and input-weighted weight error only (one backward pass, "
        f"causal LMs; ranks like exact far better than proxy) ({said})",
    )
    p.add_argument(
        "--proxy",
        choices=["input", "fisher"],
        default=None,
        help="the proxy reported beside each trial: input (sum_j E[x_j^2] ||W_j - Q(W)_j||^2) "
        "or fisher (sum_ij E[g_i^2] E[x_j^2] (W - Q(W))_ij^2) (default input; fisher with "
        "--measure fisher)",
    )
    p.add_argument(
        "--exact-schemes",
        metavar="LIST",
        help="with --measure exact: only these of --schemes run the model; the others are "
        "scored by their proxy times the tensor's measured damage/proxy ratio",
    )
    p.add_argument(
        "--tensors",
        metavar="GLOBS",
        help="only tensors matching one of these comma-separated globs (e.g. 'blk.2?.*')",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=1,
        metavar="N",
        help="processes running trials, and quantize's gptq/awq calibration split by samples "
        "(with --ray: Ray actors; 1 = one per cluster CPU)",
    )
    p.add_argument(
        "--ray",
        nargs="?",
        const=True,
        default=False,
        metavar="ADDRESS",
        help="run trials (and gptq/awq calibration) on a Ray cluster (no ADDRESS: RAY_ADDRESS "
        "or a local instance)",
    )


def scan(args: argparse.Namespace, ckpt: Any, progress: bool | None) -> Any:
    """Run the scan the options describe on an open checkpoint."""
    samples, length = scan_windows(args)
    return scan_job(
        ckpt, _common.parse_list(args.schemes), text=args.calib, samples=samples, length=length,
        measure=args.measure or "exact", proxy=args.proxy,
        tensors=_common.parse_list(args.tensors),
        exact_schemes=_common.parse_list(getattr(args, "exact_schemes", None)),
        workers=args.workers, ray=args.ray,
        compute=_common.compute_option(getattr(args, "compute", "fp32")), progress=progress,
    )  # fmt: skip


def _is_plan(path: Path) -> bool:
    try:
        PrecisionPlan.from_file(path)
    except (LowbitError, OSError, UnicodeDecodeError):
        return False
    return True


def _is_scan(path: Path) -> bool:
    try:
        SensitivityResult.from_dict(_json.load(path))  # a FIFO planted there: refused
    except (LowbitError, OSError, UnicodeDecodeError, ValueError, AttributeError):
        return False
    return True


_KINDS = {"plan": _is_plan, "scan": _is_scan}


def check_json_output(path: Path, overwrite: bool, kind: str) -> None:
    """A JSON output (a plan file, a scan) replaces an existing file only with ``--overwrite``
    and only when that file is one of its kind (what lowbit writes there), never a link.

    Raises:
        LowbitError: a missing folder, an existing file without ``--overwrite``, or one that
            is not a plan file / sensitivity result.
    """
    if not path.parent.is_dir():
        raise LowbitError(f"cannot write {path}: directory {path.parent} does not exist")
    check_not_input(path, ())
    what = {"plan": "plan file", "scan": "sensitivity result"}[kind]
    if path.is_symlink() or (path.exists() and not path.is_file()):
        raise LowbitError(f"{path} exists and is not a regular file; not replacing it")
    if path.exists():
        if not overwrite:
            raise LowbitError(f"{path} exists; --overwrite replaces it")
        if not _KINDS[kind](path):
            raise LowbitError(f"{path} exists and is not a {what}; not replacing it")


def write_json(path: Path, doc: Any, overwrite: bool, kind: str) -> None:
    """Write a JSON output atomically (a temporary file beside it, then a rename)."""
    check_json_output(path, overwrite, kind)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(json.dumps(_common.to_jsonable(doc), indent=1) + "\n")
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _umask() -> int:
    old = os.umask(0)
    os.umask(old)
    return old
