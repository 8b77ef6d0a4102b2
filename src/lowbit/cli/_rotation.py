"""``lowbit quantize --method hadamard|hadamard+gptq``: weights stored in the
block-Hadamard-rotated basis (``W R``, ``lowbit.methods.hadamard``) and the rotation recorded
in the lowbit manifest (``method.rotation.tensors``: tensor name -> block), which
``lowbit.load_model`` (and so ``lowbit eval``) applies to those layers' inputs online; and
``--method hadamard-fold|hadamard-fold+gptq``: the rotation folded offline into attention's
value -> output projections (``lowbit.methods.hadamard_fold``), which every format can write
(nothing is left for the consumer to rotate), the fold recorded as ``method.fold``."""

from __future__ import annotations

from typing import Any

import numpy as np

from lowbit.errors import LowbitError
from lowbit.evaluation.rotated import fold_checkpoint
from lowbit.methods.hadamard import rotate_rows, rotation_block
from lowbit.methods.mr_gptq import RotatedTensor
from lowbit.quant.tensor import quantize

__all__ = ["FOLDING", "ROTATING", "check_rotation", "fold_source", "rotated_rtn", "rotation_record"]

#: The ``--method`` values that store rotated weights.
ROTATING = ("hadamard", "hadamard+gptq")
#: The ``--method`` values that fold the rotation into the float weights first.
FOLDING = ("hadamard-fold", "hadamard-fold+gptq")


def check_rotation(args: Any) -> None:
    """A rotating ``--method`` writes lowbit's format only (the others cannot declare it).

    Raises:
        LowbitError: another output format.
    """
    if args.method in ROTATING and args.out_format != "lowbit":
        raise LowbitError(
            f"--method {args.method} stores rotated weights whose layers' inputs must be "
            f"rotated online; {args.out_format} cannot record that: write --out-format lowbit"
        )


def rotated_rtn(ckpt: Any, applied: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """Round to nearest of ``W R`` for every quantized 2-D weight whose width the scheme's
    group divides (the others as ``lowbit quantize`` rounds them): the weights and the record.

    Raises:
        LowbitError: a scheme without power-of-two groups along the input axis.
    """
    done: dict[str, Any] = {}
    blocks: dict[str, int] = {}
    for t in applied.quantized:
        shape = tuple(ckpt.shape(t.name))
        if len(shape) != 2:
            continue
        block = rotation_block(t.scheme)
        if shape[1] % block:
            continue
        w = np.asarray(ckpt.get(t.name), dtype=np.float32)
        done[t.name] = quantize(rotate_rows(w, block), t.scheme)
        blocks[t.name] = block
    return done, rotation_record({"method": "hadamard"}, blocks)


def rotation_record(record: dict[str, Any], blocks: dict[str, int]) -> dict[str, Any]:
    """``record`` with ``rotation``: the kind and the block of every rotated tensor."""
    return {
        **record,
        "rotation": {"kind": "block-hadamard", "tensors": dict(sorted(blocks.items()))},
    }


def unwrap(done: dict[str, Any], record: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """MR-GPTQ's weights as the rotated QuantizedTensors a writer stores, and the record with
    the rotation of each."""
    blocks = {n: qt.block for n, qt in done.items() if isinstance(qt, RotatedTensor)}
    plain = {n: (qt.rotated if n in blocks else qt) for n, qt in done.items()}
    return plain, rotation_record(record, blocks)


def fold_source(ckpt: Any, plan: Any) -> tuple[Any, dict[str, Any]]:
    """The checkpoint to quantize with the block Hadamard rotation of the plan's default
    scheme (its scale group) folded into every value -> output pair, and the fold's record
    (``kind``, ``where``, ``block``, ``pairs``).

    Raises:
        LowbitError: a plan without a default scheme with power-of-two groups along the input
            axis, a family without the fold, a block that does not divide the head size.
    """
    if plan.default is None:
        raise LowbitError(
            "--method hadamard-fold sizes its rotation to the plan's default scheme; this plan "
            "has none: give --to"
        )
    return fold_checkpoint(ckpt, rotation_block(plan.default))
