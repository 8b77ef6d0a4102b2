"""Training recipes: which tensors are rounded to which format, and how they are scaled.

A :class:`Recipe` is a frozen description; :func:`apply_recipe` turns a float32 model into
the emulated one (through :func:`lowbit.torch.emulate`). What each family means:

* 16-bit mixed precision (``fp16``, ``bf16``): every matmul (the linears and attention's
  two matmuls) reads operands rounded to the format and writes its result rounded to it;
  the gradients flowing into and out of each matmul are rounded too. Master weights,
  optimizer state, LayerNorm, softmax, GELU, the loss and the residual stream stay FP32
  (what ``torch.autocast`` does on a GPU). ``fp16-scaled`` adds dynamic loss scaling.
* pure BF16 (``bf16-pure``): as ``bf16``, and the weights themselves are stored in BF16:
  each update ``w - lr*u`` is rounded back to BF16 (to nearest, or stochastically in
  ``bf16-pure-sr``); optimizer moments stay FP32.
* FP8 (``fp8-*``): every linear's input and weight rounded to the forward format and its
  output gradient to the backward format, each tensor with its own power-of-two scale
  (delayed from an amax history, current, or MX blocks of 32); products accumulate in FP32
  and results stay FP32. Attention's matmuls stay FP32, as Transformer Engine keeps them
  in 16 bits.
* QAT (``qat-*``): the block linears' weights are fake-quantized (absmax scale per channel
  or group, values equal to ``lowbit.quantize``), gradients pass straight through;
  optionally the activations too (per-token absmax). The embeddings and the output head
  stay FP32, as post-training quantization of the same model leaves them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from torch import nn

from lowbit.errors import LowbitError
from lowbit.torch import Quantizer, emulate
from lowbit.training.scaling import DelayedScaling, current_scaling, mx_scaling


@dataclass(frozen=True, kw_only=True)
class Recipe:
    """One way to train: formats per tensor role, scaling, weight storage, QAT.

    Args:
        name: the recipe's name (``lowbit train-lab --recipes``).
        summary: one line for tables.
        matmul: 16-bit compute format for every matmul (operands, result, gradients).
        fp8_forward, fp8_backward: FP8 formats of the linears' inputs/weights and output
            gradients.
        fp8_scaling: ``"delayed"``, ``"current"`` or ``"mx"``.
        history_len, amax_compute, margin: delayed scaling parameters.
        loss_scaling: use a dynamic :class:`~lowbit.training.scaling.LossScaler`.
        growth_interval: the loss scaler's good steps between growths.
        weights: storage format of the weights themselves (``"bfloat16"`` for pure BF16).
        update_rounding: how updates are rounded to ``weights`` (nearest_even or stochastic).
        qat: fake-quantization format of the block linears' weights.
        qat_axis, qat_group: per-channel axis or group size of the QAT weight scales.
        qat_act: fake-quantization format of the block linears' inputs (per token).
    """

    name: str
    summary: str
    matmul: str | None = None
    fp8_forward: str | None = None
    fp8_backward: str | None = None
    fp8_scaling: str = "delayed"
    history_len: int = 16
    amax_compute: str = "max"
    margin: int = 0
    loss_scaling: bool = False
    growth_interval: int = 100
    weights: str | None = None
    update_rounding: str = "nearest_even"
    qat: str | None = None
    qat_axis: int | None = None
    qat_group: int | None = None
    qat_act: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def qat_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of ``lowbit.quantize`` giving the same weight quantization."""
        if self.qat_group is not None:
            return {"group_size": self.qat_group}
        if self.qat_axis is not None:
            return {"axis": self.qat_axis}
        return {}


_R = Recipe
RECIPES: dict[str, Recipe] = {
    r.name: r
    for r in [
        _R(name="fp32", summary="FP32 everywhere (the reference)"),
        _R(name="fp16", summary="FP16 matmuls, FP32 master weights, no loss scaling",
           matmul="float16"),
        _R(name="fp16-scaled", summary="FP16 matmuls, FP32 master weights, dynamic loss scaling",
           matmul="float16", loss_scaling=True),
        _R(name="bf16", summary="BF16 matmuls, FP32 master weights", matmul="bfloat16"),
        _R(name="bf16-pure", summary="BF16 matmuls and BF16 weights (updates rounded to nearest)",
           matmul="bfloat16", weights="bfloat16"),
        _R(name="bf16-pure-sr", summary="BF16 matmuls and BF16 weights, stochastic rounding of updates",
           matmul="bfloat16", weights="bfloat16", update_rounding="stochastic"),
        _R(name="fp8-hybrid", summary="FP8 linears: E4M3 forward, E5M2 backward, delayed scaling",
           fp8_forward="float8_e4m3fn", fp8_backward="float8_e5m2"),
        _R(name="fp8-hybrid-current", summary="FP8 linears: E4M3 forward, E5M2 backward, current scaling",
           fp8_forward="float8_e4m3fn", fp8_backward="float8_e5m2", fp8_scaling="current"),
        _R(name="fp8-e4m3", summary="FP8 linears: E4M3 forward and backward, delayed scaling",
           fp8_forward="float8_e4m3fn", fp8_backward="float8_e4m3fn"),
        _R(name="fp8-e5m2", summary="FP8 linears: E5M2 forward and backward, delayed scaling",
           fp8_forward="float8_e5m2", fp8_backward="float8_e5m2"),
        _R(name="fp8-mx", summary="MXFP8 linears: E4M3 forward, E5M2 backward, blocks of 32",
           fp8_forward="float8_e4m3fn", fp8_backward="float8_e5m2", fp8_scaling="mx"),
        _R(name="qat-int8", summary="QAT: INT8 weights, per-channel absmax", qat="int8", qat_axis=0),
        _R(name="qat-int4", summary="QAT: INT4 weights, absmax per group of 32", qat="int4",
           qat_group=32),
        _R(name="qat-int4-channel", summary="QAT: INT4 weights, per-channel absmax", qat="int4",
           qat_axis=0),
        _R(name="qat-nf4", summary="QAT: NF4 weights, absmax per group of 64", qat="nf4",
           qat_group=64),
        _R(name="qat-fp4", summary="QAT: FP4 (E2M1) weights, absmax per group of 32",
           qat="float4_e2m1fn", qat_group=32),
        _R(name="qat-w4a8", summary="QAT: INT4 weights (group 32) and INT8 activations (per token)",
           qat="int4", qat_group=32, qat_act="int8"),
    ]
}  # fmt: skip

#: What ``lowbit train-lab`` runs by default.
DEFAULT_RECIPES = ("fp32", "fp16", "fp16-scaled", "bf16", "fp8-hybrid", "qat-int4")


def get_recipe(name: str) -> Recipe:
    """Look up a recipe by name (``ptq-*`` names are not recipes: they come with ``fp32``)."""
    try:
        return RECIPES[name.strip().lower()]
    except KeyError:
        raise LowbitError(
            f"unknown recipe {name!r}; known: {', '.join(RECIPES)} (PTQ rows come with fp32 "
            "and a qat-* recipe)"
        ) from None


def _fp8_factory(recipe: Recipe, fmt: str, count: bool | str) -> Callable[[], Quantizer]:
    if recipe.fp8_scaling == "delayed":
        return lambda: DelayedScaling(
            fmt,
            history_len=recipe.history_len,
            amax_compute=recipe.amax_compute,
            margin=recipe.margin,
            count=count,
        )
    if recipe.fp8_scaling == "current":
        return lambda: current_scaling(fmt, margin=recipe.margin, count=count)
    if recipe.fp8_scaling == "mx":
        return lambda: mx_scaling(fmt, count=count)
    raise LowbitError(
        f"unknown fp8_scaling {recipe.fp8_scaling!r}; allowed: 'delayed', 'current', 'mx'"
    )


def apply_recipe(model: nn.Module, recipe: Recipe) -> nn.Module:
    """Make ``model`` (a float32 TinyDecoder or any model with ``nn.Linear``) emulate ``recipe``.

    Returns the same model, its linears swapped for emulated ones where the recipe
    rounds anything.
    """
    if recipe.matmul is not None:
        f = recipe.matmul
        emulate(model, input=f, weight=f, output=f, grad_output=f, grad_input=f, grad_weight=f)
    elif recipe.fp8_forward is not None:
        # underflow is counted for the gradients only (counting costs two passes)
        fwd = _fp8_factory(recipe, recipe.fp8_forward, "overflow")
        bwd = _fp8_factory(recipe, recipe.fp8_backward or recipe.fp8_forward, True)
        emulate(model, input=fwd, weight=fwd, grad_output=bwd, matmuls=False)
    elif recipe.qat is not None:
        qat_emulate(model, recipe.qat, recipe.qat_kwargs, recipe.qat_act)
    return model


def qat_emulate(
    model: nn.Module,
    weight: str | None,
    weight_kwargs: dict[str, Any] | None = None,
    act: str | None = None,
) -> nn.Module:
    """Fake-quantize the block linears' weights (absmax, per channel/group) and/or inputs.

    Only modules under ``model.blocks`` are touched (embeddings and head stay FP32).
    Activations get one absmax scale per token (row).
    """
    kw = weight_kwargs or {}

    def wq() -> Quantizer:
        return Quantizer(weight, scaling="absmax", axis=kw.get("axis"),
                         group_size=kw.get("group_size"), count="overflow")  # fmt: skip

    def aq() -> Quantizer:
        return Quantizer(act, scaling="absmax", group_size=-1, count="overflow")

    exclude = [n for n, _ in model.named_children() if n != "blocks"]
    emulate(model, weight=wq if weight else None, input=aq if act else None, matmuls=False,
            exclude=exclude)  # fmt: skip
    return model
