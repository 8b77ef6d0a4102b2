"""``lowbit quantize --out-format mlx``'s library side: a model to an MLX folder.

As ``mlx_lm.convert -q`` makes it (``--q-bits``, ``--q-group-size``, ``--q-mode``), or with one
of mlx-lm's mixed recipes (``mixed_2_6``, ``mixed_3_4``, ``mixed_3_6``, ``mixed_4_6``).

>>> quantize_mlx("smollm2", "smol-mlx")                                   # doctest: +SKIP
>>> quantize_mlx("model_dir", "m-3bit", MLXParams(bits=3, group_size=32))  # doctest: +SKIP
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Mapping
from typing import Any

from lowbit.checkpoints.mlx.params import MLXParams
from lowbit.checkpoints.mlx.writer import _Plan, model_dtype, output_layout, write_mlx
from lowbit.checkpoints.readers import Checkpoint
from lowbit.checkpoints.shape_checks import check_checkpoint_shapes
from lowbit.checkpoints.streaming import (
    check_unrotated,
    disk_bytes,
    open_model,
    output_and_files,
)
from lowbit.errors import LowbitError
from lowbit.methods._mlx_gptq import MLXTarget

__all__ = ["RECIPES", "gptq_targets", "mixed_recipe", "quantize_mlx"]

#: mlx-lm's mixed recipes (``mlx_lm.convert --quant-predicate``): (low bits, high bits)
RECIPES = {"mixed_2_6": (2, 6), "mixed_3_4": (3, 4), "mixed_3_6": (3, 6), "mixed_4_6": (4, 6)}
_LAYER = re.compile(r"\.layers\.(\d+)\.")


def mixed_recipe(
    recipe: str, names: list[str], group_size: int = 64
) -> dict[str, MLXParams | None]:
    """Each module's params under an mlx-lm mixed recipe (``mlx_lm.convert``'s
    ``mixed_quant_predicate_builder``, after llama.cpp's Q4_K_M choices): ``v_proj`` and
    ``down_proj`` of the first and last eighth of the layers and of every third layer between
    get the high bits, and so does ``lm_head``; every other module the low bits.

    Args:
        recipe: one of :data:`RECIPES`.
        names: the output's tensor names (transformers names).
        group_size: the groups of every module.

    Raises:
        LowbitError: an unknown recipe, or a model without ``down_proj`` layers (as mlx-lm).
    """
    if recipe not in RECIPES:
        raise LowbitError(f"unknown MLX recipe {recipe!r}; allowed: {', '.join(RECIPES)}")
    low, high = RECIPES[recipe]
    modules = [n[: -len(".weight")] for n in names if n.endswith(".weight")]
    if not any("down_proj" in m for m in modules):
        raise LowbitError(f"{recipe}: the model has no down_proj layers, which the recipe needs")
    layers = {int(m.group(1)) for n in modules if (m := _LAYER.search(n + "."))}
    num = max(layers) + 1 if layers else 0
    out: dict[str, MLXParams | None] = {}
    for m in modules:
        hit = _LAYER.search(m + ".")
        index = int(hit.group(1)) if hit else 0
        more = index < num // 8 or index >= 7 * num // 8 or (index - num // 8) % 3 == 2
        high_here = (("v_proj" in m or "v_a_proj" in m or "v_b_proj" in m) and more) or (
            "down_proj" in m and more
        )
        high_here = high_here or "lm_head" in m
        out[m] = MLXParams(bits=high if high_here else low, group_size=group_size)
    return out


def _modules(
    ckpt: Checkpoint,
    params: MLXParams,
    recipe: str | None,
    modules: Mapping[str, MLXParams | None] | None = None,
) -> dict[str, Any]:
    if modules is not None:
        if recipe is not None:
            raise LowbitError("give an MLX recipe or per-module grids, not both")
        return dict(modules)
    if recipe is None:
        return {}
    if params.mode != "affine":
        raise LowbitError(f"MLX recipe {recipe}: mlx-lm's recipes are affine, not {params.mode}")
    names = [n for n, _ in output_layout(ckpt)]
    return mixed_recipe(recipe, names, params.group_size)  # type: ignore[arg-type]


def gptq_targets(
    ckpt: Checkpoint,
    params: MLXParams | None = None,
    *,
    recipe: str | None = None,
    dtype: str | None = None,
    modules: Mapping[str, MLXParams | None] | None = None,
    search: bool = False,
) -> dict[str, MLXTarget]:
    """The weights GPTQ rounds onto MLX's affine grid: every linear layer of the transformer
    blocks the MLX output quantizes (source tensor name -> its grid; the embedding and an
    output layer stay round to nearest, as GPTQ sees no inputs of theirs in the blocks).
    ``search``: each group's scale and bias searched for the least Hessian-weighted error
    (:class:`~lowbit.methods._mlx_gptq.MLXTarget`) instead of MLX's edge rule.

    Raises:
        LowbitError: a mode other than affine.
    """
    params = params or MLXParams()
    if params.mode != "affine":
        raise LowbitError(f"GPTQ onto MLX grids is affine only, not {params.mode}")
    plan = _Plan(ckpt, params, _modules(ckpt, params, recipe, modules))
    dt = model_dtype(ckpt, dtype)
    name = "bfloat16" if dt.name == "bfloat16" else dt.name
    out = {}
    for hf, src, kind in plan.entries:
        if kind == "weight" and ".layers." in hf:
            p = plan.quantized[hf[: -len(".weight")]]
            for one in plan.stacks.get(hf, (src,)):  # each expert of a stack on its own
                out[one] = MLXTarget(p.bits, p.group_size, name, search)  # type: ignore[arg-type]
    return out


def quantize_mlx(
    model: str | os.PathLike[str] | Checkpoint | None,
    out: str | os.PathLike[str],
    params: MLXParams | None = None,
    *,
    recipe: str | None = None,
    dtype: str | None = None,
    overwrite: bool = False,
    copy_code: bool = False,
    progress: bool | None = None,
    max_shard_size: int | None = None,
    weights: Mapping[str, Any] | None = None,
    method: Mapping[str, Any] | None = None,
    modules: Mapping[str, MLXParams | None] | None = None,
) -> dict[str, Any]:
    """Quantize a model to an MLX folder that ``mlx_lm.load`` reads.

    Args:
        model: a path, a shipped model name, or an open checkpoint (see
            ``lowbit.checkpoints.streaming.open_model``).
        out: the folder to write.
        params: the quantization (default ``MLXParams()``: affine, 4 bits, groups of 64, as
            ``mlx_lm.convert -q``).
        recipe: an mlx-lm mixed recipe (:data:`RECIPES`; affine only).
        dtype: the model dtype (``float16``, ``bfloat16``, ``float32``; default config.json's).
        overwrite: replace an existing folder that lowbit wrote.
        copy_code: also copy the source folder's ``.py`` files.
        progress: progress bars (None: only on a terminal).
        max_shard_size: bytes per safetensors file (default 5 GiB).
        weights: source tensor name -> weights already on their grids (GPTQ's, for the
            tensors of :func:`gptq_targets`); the others are rounded to nearest.
        method: how ``weights`` were made, returned as ``method``.
        modules: module path -> its own params, or None (kept): per-module grids (a budget's
            choice), written as config.json entries; not with ``recipe``.

    Returns:
        ``{"out", "out_format": "mlx", "source", "source_format", "quantization", "quantized"
        (module -> params), "dtype", "files", "bytes", "seconds"}``.

    Raises:
        LowbitError: see :func:`lowbit.checkpoints.mlx.writer.write_mlx`; a recipe with a mode
            other than affine; an output that is or lies inside the source.
    """
    start = time.perf_counter()
    params = params or MLXParams()
    ckpt = open_model(model)
    check_unrotated(ckpt)
    check_checkpoint_shapes(ckpt)
    modules = _modules(ckpt, params, recipe, modules)
    out, files = output_and_files(ckpt, out, copy_code)
    result = write_mlx(
        ckpt, out, params, modules=modules, dtype=dtype, files=files, overwrite=overwrite,
        progress=progress, max_shard_size=max_shard_size, done=weights,
    )  # fmt: skip
    ckpt.close()
    return {
        "out": str(out),
        "out_format": "mlx",
        "source": str(ckpt.path),
        "source_format": ckpt.format,
        "quantization": {**params.to_dict(), **({"recipe": recipe} if recipe else {})},
        **result,
        **({"method": dict(method)} if method is not None else {}),
        "bytes": disk_bytes(out),
        "seconds": time.perf_counter() - start,
    }
