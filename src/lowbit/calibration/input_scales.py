"""NVFP4 W4A4's static input scales: what ``lowbit quantize --activations nvfp4`` writes as
compressed-tensors' ``input_global_scale``.

Each layer's scale is ``448 * 6 / amax`` (``lowbit.models.act_quant.input_global_scale``, as
compressed-tensors' ``generate_gparam`` computes it) of the largest ``|x|`` its input takes over
forward passes of the calibration windows (llm-compressor's ``static_minmax`` observer). The
model run is the one the folder holds: the written weights (``ct_weights``, NVFP4's shared tensor
scales included), inputs in full precision, as ``lowbit eval --act nvfp4`` calibrates a variant.

Layers vLLM fuses into one GEMM (q/k/v, gate/up) read the same input, so their maxima agree; the
group's scale is still taken from the group's largest maximum (the smallest encode factor: no
member's input clips), the direction the weights' shared tensor scale takes, so the folder holds
one value per fused group whatever the arithmetic did.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from lowbit.calibration.data import Calibration, decoder_windows
from lowbit.checkpoints.compressed_tensors.fp4 import fused_siblings
from lowbit.checkpoints.gguf.names import gguf_to_hf_name
from lowbit.checkpoints.tokenizer import build_tokenizer
from lowbit.errors import LowbitError
from lowbit.models._compute import compute_context
from lowbit.models._threads import _threads
from lowbit.models.act_quant import input_global_scale, observe_input_amax
from lowbit.models.build import build_model
from lowbit.models.hooks import attach_rotations

__all__ = ["InputScales", "nvfp4_input_scales"]


@dataclass(frozen=True)
class InputScales:
    """What :func:`nvfp4_input_scales` measured.

    Attributes:
        scales: the output's weight name (transformers names; ``...q_proj.weight``) -> float32
            ``input_global_scale``, one value per fused group.
        amax: the same names -> the largest ``|x|`` the layer's input took.
        record: what the run's summary says: ``activations``, ``layers``, ``fused_groups``,
            ``calibration`` (settings and ``described``), ``windows``, ``tokens``, ``seconds``.
    """

    scales: dict[str, np.float32]
    amax: dict[str, float]
    record: dict[str, Any]


def nvfp4_input_scales(
    ckpt: Any,
    weights: Mapping[str, Any],
    calibration: Calibration,
    *,
    threads: int | None = None,
    progress: bool | None = None,
    compute: str = "fp32",
    rotations: Mapping[str, int] | None = None,
) -> InputScales:
    """The static NVFP4 input scale of every layer whose weight is in ``weights``.

    Args:
        ckpt: the checkpoint written from (an open one; AWQ's and SmoothQuant's folded one).
        weights: checkpoint name -> QuantizedTensor of every layer that gets NVFP4 activations
            and every other quantized weight (``lowbit.checkpoints.compressed_tensors.pipeline.ct_weights``): the
            model is built with them dequantized, as the folder will hold it.
        calibration: the calibration text and its slice (windows, tokens per window).
        threads: torch threads (default: the usable cores).
        progress: a bar over the windows (``None``: only on a terminal).
        compute: the precision of the forwards (``fp32``, ``bf16``, ``auto``).
        rotations: weight name -> Hadamard block of the weights stored rotated
            (``--method hadamard|hadamard+gptq``): those layers' inputs are rotated online
            (``lowbit.models.hooks.attach_rotations``), so their scales are the rotated
            inputs' maxima, what the served layer quantizes.

    Raises:
        LowbitError: a weight that is not a linear layer's, or one whose layer saw no input.
    """
    t0 = time.perf_counter()
    to_hf = (lambda n: gguf_to_hf_name(n, ckpt.config)) if ckpt.format == "gguf" else str
    tokenizer = build_tokenizer(ckpt)
    windows = decoder_windows(tokenizer, calibration)
    dense = {n: qt.dequantize(np.float32) for n, qt in weights.items()}
    model = build_model(ckpt, weights=dense, progress=False)
    del dense
    attach_rotations(model, dict(rotations or {}), ckpt.format)
    modules = dict(model.named_modules())
    layers = []
    for name in weights:
        hf = to_hf(name)
        module = modules.get(hf.removesuffix(".weight"))
        if not hf.endswith(".weight") or module is None:
            raise LowbitError(f"{name}: NVFP4 activations need a linear layer's weight")
        layers.append((hf.removesuffix(".weight"), module))
    with _threads(threads), compute_context(compute):
        seen = observe_input_amax(model, windows, layers, progress=progress)
    del model
    amax = {f"{m}.weight": float(a) for m, a in seen.items()}
    missing = sorted({f"{m}.weight" for m, _ in layers} - set(amax))
    if missing:
        raise LowbitError(f"{missing[0]}: its layer saw no input in the calibration forwards")
    scales: dict[str, np.float32] = {}
    groups = 0
    for name in amax:
        if name in scales:
            continue
        group = [n for n in fused_siblings(name) if n in amax] or [name]
        top = max(amax[n] for n in group)
        g = np.float32(input_global_scale(np.float32(top)).item())
        scales.update(dict.fromkeys(group, g))
        groups += len(group) > 1
    record = {
        "activations": "nvfp4",
        "layers": len(scales),
        "fused_groups": groups,
        "calibration": {**calibration.to_dict(), "described": calibration.describe("decoder")},
        "windows": len(windows),
        "tokens": sum(len(w) for w in windows),
        "seconds": time.perf_counter() - t0,
    }
    return InputScales(scales=scales, amax=amax, record=record)
