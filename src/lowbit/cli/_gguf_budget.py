"""``lowbit quantize GGUF --budget BPW|--size BYTES --out-format gguf``: llama.cpp types per tensor.

Each tensor llama-quantize would quantize gets the GGUF type of least measured damage that keeps
the file within the budget (:mod:`lowbit.checkpoints.gguf.budget`: candidates, fallbacks, exact
file bytes; :mod:`lowbit.evaluation.gguf_sensitivity`: the trials). Candidates come from
``--candidates`` (or ``--schemes``) as GGUF type names, default
:data:`~lowbit.checkpoints.gguf.budget.DEFAULT_CANDIDATES`; ``--imatrix`` is used by the trials
and the writer alike. ``--measure block`` (the default) runs each trial's block alone
(:mod:`lowbit.evaluation.block_sensitivity`); ``--measure exact`` the model from the trial's
block to the logits.
With ``--method gptq`` the trials still round as llama.cpp does (they
choose the types), and then GPTQ rounds every linear layer onto its chosen type, as it does
onto a fixed mix's (:func:`lowbit.jobs.gguf.gptq_onto`). A lowbit scheme among them (``int4:g128``) is refused: a GGUF budget
chooses among GGUF types.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

from lowbit.checkpoints.streaming import open_model
from lowbit.cli import _common
from lowbit.cli._calibrated import calibration_of
from lowbit.cli._gguf_mix import gptq_config
from lowbit.cli._scan import scan_windows
from lowbit.errors import LowbitError
from lowbit.jobs.gguf import gguf_budget
from lowbit.plans.mixed import parse_size

_GGUF_NAME = re.compile(r"^(I?Q\d\w*|TQ\d\w*|MXFP4|NVFP4|F16|BF16|F32)$", re.IGNORECASE)
# options of lowbit's own budget (or of the fixed mixes) that a GGUF budget does not take
_NOT_HERE = (
    "to", "plan", "plan_preset", "sensitivity", "min_format", "tensor_type",
    "output_tensor_type", "token_embedding_type", "pure", "leave_output_tensor", "eval", "plot",
    "group", "scale_method", "scale_format", "activations", "exact_schemes", "tensors", "ray",
    "proxy", "smooth", "w8a8",
)  # fmt: skip


def _given(args: argparse.Namespace) -> list[str]:
    return _common.parse_list(getattr(args, "candidates", None)) + _common.parse_list(
        getattr(args, "schemes", None)
    )


def wanted(args: argparse.Namespace) -> bool:
    """Whether this run is a GGUF budget (``--budget``/``--size`` with ``--out-format gguf``
    and GGUF types or no candidates named).

    Raises:
        LowbitError: GGUF types and lowbit schemes in one candidate list.
    """
    if args.out_format != "gguf" or not (args.budget or args.size):
        return False
    if getattr(args, "sensitivity", None):
        return False  # a lowbit scan's result: lowbit's own budget path
    given = _given(args)
    gguf = [c for c in given if _GGUF_NAME.match(c.strip())]
    if gguf and len(gguf) != len(given):
        other = next(c for c in given if c not in gguf)
        raise LowbitError(
            f"candidates mix GGUF types ({gguf[0]}) and lowbit schemes ({other}); a GGUF budget "
            "chooses among GGUF types (Q4_K,Q6_K,Q8_0,...)"
        )
    return bool(gguf) or not given


def _check(args: argparse.Namespace) -> tuple[float | None, int | None]:
    if args.budget and args.size:
        raise LowbitError("give --budget or --size, not both")
    for flag in _NOT_HERE:
        if getattr(args, flag, None) not in (None, False, "", []):
            raise LowbitError(
                f"--{flag.replace('_', '-')} does not apply to a GGUF budget (--budget/--size "
                "with --out-format gguf choose each tensor's llama.cpp type)"
            )
    if getattr(args, "method", "rtn") not in ("rtn", "gptq") or getattr(args, "asym", False):
        raise LowbitError(
            "a GGUF budget rounds as llama.cpp does, or with --method gptq onto the chosen "
            "types (no other --method, no --asym)"
        )
    if (getattr(args, "measure", None) or "block") not in ("exact", "block"):
        raise LowbitError(
            "a GGUF budget measures each trial by the model (--measure exact) or by its block "
            "(--measure block); no proxy"
        )
    if getattr(args, "workers", 1) != 1:
        raise LowbitError("a GGUF budget runs its trials in this process; drop --workers")
    c, s = (_common.parse_list(getattr(args, k, None)) for k in ("candidates", "schemes"))
    if c and s and [x.upper() for x in c] != [x.upper() for x in s]:
        raise LowbitError("give the GGUF candidate types once (--candidates or --schemes)")
    if args.size:
        return None, parse_size(args.size)
    try:
        return float(args.budget), None
    except ValueError:
        raise LowbitError(
            f"--budget {args.budget!r}: with --out-format gguf, a number of bits per quantized "
            "weight (e.g. 4.8); or give --size BYTES"
        ) from None


def _default_out(source: Path, args: argparse.Namespace) -> Path:
    stem = source.name.removesuffix(".gguf")
    stem = re.sub(r"\.(F32|F16|BF16|Q\d\w*)$", "", stem, flags=re.IGNORECASE)
    tag = f"budget-{args.budget}" if args.budget else f"size-{args.size}"
    return Path(f"{stem}.{tag}.gguf")


def run(args: argparse.Namespace) -> int:
    """Measure, solve and write (or with ``--dry-run``, show) the GGUF budget file."""
    bpw, size = _check(args)
    progress = False if args.no_progress or args.json else None
    ckpt = open_model(args.model)
    if args.out is not None and not args.out.strip():
        raise LowbitError("--out is empty; give the .gguf file to write")
    out = Path(args.out) if args.out else _default_out(Path(ckpt.path), args)
    samples, length = scan_windows(args)
    gptq = getattr(args, "method", "rtn") == "gptq"
    res = gguf_budget(
        ckpt, out, size=size, bits_per_weight=bpw, candidates=_given(args) or None,
        imatrix=getattr(args, "imatrix", None) or None,
        method=gptq_config(args) if gptq else "rtn",
        calibration=calibration_of(args) if gptq else None, scan_text=args.calib,
        scan_samples_count=samples, scan_length=length, overwrite=args.overwrite,
        threads=args.threads, compute=_common.compute_option(getattr(args, "compute", "fp32")),
        progress=progress, dry_run=args.dry_run, measure=getattr(args, "measure", None) or "block",
        resume=True if getattr(args, "resume", False) else None,
    )  # fmt: skip
    if args.json:
        _common.print_json(res.details)
        return 0
    _print(res.details, res.plan, args.dry_run)
    return 0


def _print(doc: dict[str, Any], plan: Any, dry_run: bool) -> None:
    rows = [[r.tensor, r.type, ",".join(r.candidates) or "kept", r.nbytes,
             "-" if r.damage is None else f"{r.damage:.3e}"] for r in plan.rows]  # fmt: skip
    _common.print_table(rows, ["tensor", "type", "from", "bytes", "damage"], align="lllrr")
    counts: dict[str, int] = {}
    for r in plan.quantized:
        counts[r.type] = counts.get(r.type, 0) + 1
    a = plan.allocation
    print(
        f"\n{len(plan.quantized)} tensors chosen from {', '.join(doc['candidates'])}: "
        + ", ".join(f"{n} {t}" for t, n in sorted(counts.items()))
    )
    print(
        f"file {plan.file_bytes:,} bytes ({doc['file_bits_per_weight']:.4f} bits per weight of "
        f"the file; {plan.bits_per_weight:.4f} over the chosen tensors), general.file_type "
        f"{plan.file_type}"
    )
    print(
        f"predicted damage (sum of per-tensor {doc['metric']}): {plan.predicted_damage:.4e}; "
        f"at most {a.gap:.3e} above the best choice within the budget; calibration "
        f"{doc['calibration']}; {doc['seconds']['total']:.1f} s"
    )
    m = doc.get("method")
    if m is not None:
        print(
            f"gptq onto the chosen types: {m['gptq_tensors']} tensors, layer-output error "
            f"{m['mean_error']['gptq']:.4g} (llama.cpp's rounding {m['mean_error']['rtn']:.4g}), "
            f"importance: {m['importance']}"
        )
    if dry_run:
        print("Dry run: nothing written.")
    else:
        print(f"wrote {doc['path']}")
