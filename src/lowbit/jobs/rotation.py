"""The rotating methods of ``quantize_model`` (``lowbit quantize --method hadamard|hadamard+gptq``): weights stored in the
block-Hadamard-rotated basis (``W R``, ``lowbit.methods.hadamard``) and the rotation recorded
for the consumer, who applies it to those layers' inputs online: in the lowbit manifest
(``method.rotation.tensors``: tensor name -> block) for ``lowbit.load_model`` (and so
``lowbit eval``), or as compressed-tensors' ``transform_config`` for vLLM
(``lowbit.checkpoints.compressed_tensors.transforms``); and
``--method hadamard-fold|hadamard-fold+gptq``: the rotation folded offline into attention's
value -> output projections (``lowbit.methods.hadamard_fold``), which every format can write
(nothing is left for the consumer to rotate), the fold recorded as ``method.fold``."""

from __future__ import annotations

from typing import Any

import numpy as np

from lowbit.checkpoints.readers import ReplacedCheckpoint, TensorInfo
from lowbit.errors import LowbitError
from lowbit.evaluation.rotated import fold_checkpoint
from lowbit.methods.hadamard import rotate_rows, rotation_block
from lowbit.methods.mr_gptq import RotatedTensor
from lowbit.models.moe import expert_of
from lowbit.quant.tensor import quantize

__all__ = [
    "FOLDING",
    "ROTATING",
    "RotatedCheckpoint",
    "check_rotation",
    "fold_source",
    "rotated_rtn",
    "rotation_record",
]

#: The ``--method`` values that store rotated weights.
ROTATING = ("hadamard", "hadamard+gptq")
#: The ``--method`` values that fold the rotation into the float weights first.
FOLDING = ("hadamard-fold", "hadamard-fold+gptq")


def check_rotation(method: str, out_format: str) -> None:
    """A rotating ``method`` writes lowbit's format or compressed-tensors (a GGUF cannot
    declare the rotation its layers' inputs need).

    Raises:
        LowbitError: a GGUF output.
    """
    if method in ROTATING and out_format not in ("lowbit", "compressed-tensors"):
        raise LowbitError(
            f"--method {method} stores rotated weights whose layers' inputs must be "
            f"rotated online; {out_format} cannot record that: write --out-format lowbit "
            "or compressed-tensors (or use --method hadamard-fold, which every format holds)"
        )


def check_experts(method: str, out_format: str, applied: Any) -> None:
    """Refuse, before any calibration, rotated expert weights in compressed-tensors output
    (vLLM applies ``transform_config`` to linear layers, not to its fused experts).

    Raises:
        LowbitError: a rotating ``--method`` with compressed-tensors output of a mixture.
    """
    if method not in ROTATING or out_format != "compressed-tensors":
        return
    experts = [t.name for t in applied.quantized if expert_of(t.name)]
    if experts:
        raise LowbitError(
            f"{experts[0]}: --method {method} would store a mixture's expert weights "
            "rotated, and vLLM applies transform_config to linear layers, not to its fused "
            "experts: write --out-format lowbit, or use --method hadamard-fold"
        )


def rotation_blocks(ckpt: Any, applied: Any) -> dict[str, int]:
    """The Hadamard block of every quantized 2-D weight whose width its scheme's group
    divides (the others stay unrotated).

    Raises:
        LowbitError: a scheme without power-of-two groups along the input axis.
    """
    blocks: dict[str, int] = {}
    for t in applied.quantized:
        shape = tuple(ckpt.shape(t.name))
        if len(shape) != 2:
            continue
        block = rotation_block(t.scheme)
        if shape[1] % block == 0:
            blocks[t.name] = block
    return blocks


def rotated_rtn(ckpt: Any, applied: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """Round to nearest of ``W R`` for every weight :func:`rotation_blocks` rotates (the
    others as ``lowbit quantize`` rounds them): the weights and the record.

    Raises:
        LowbitError: a scheme without power-of-two groups along the input axis.
    """
    blocks = rotation_blocks(ckpt, applied)
    plans = {t.name: t for t in applied.quantized}
    done = {
        name: quantize(rotate_rows(np.asarray(ckpt.get(name), dtype=np.float32), b),
                       plans[name].scheme)
        for name, b in blocks.items()
    }  # fmt: skip
    return done, rotation_record({"method": "hadamard"}, blocks)


class RotatedCheckpoint(ReplacedCheckpoint):
    """``base`` with the weights of ``blocks`` read in the rotated basis, ``W R`` as float32
    (``lowbit.methods.hadamard.rotate_rows``), computed on each read: the source a
    compressed-tensors output of ``--method hadamard`` rounds to nearest, so NVFP4's shared
    q/k/v and gate/up tensor scales are taken from the rotated weights, as written.

    Attributes:
        blocks: weight name -> Hadamard block.
    """

    def __init__(self, base: Any, blocks: dict[str, int]) -> None:
        super().__init__(base, {})
        self.blocks = dict(blocks)

    def info(self, name: str) -> TensorInfo:
        info = self.base.info(name)
        if name in self.blocks:
            n = int(np.prod(info.shape)) * 4
            return TensorInfo(name, info.shape, "F32", n, info.file, info.offset)
        return info

    def get(self, name: str, dtype: Any = None) -> np.ndarray:
        if name not in self.blocks:
            return self.base.get(name, dtype)
        arr = rotate_rows(np.asarray(self.base.get(name), dtype=np.float32), self.blocks[name])
        return arr if dtype is None else arr.astype(dtype)


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
