"""A model's blocks and its calibration inputs, for the GPTQ and AWQ drivers: the stack of blocks, the checkpoint tensor behind each linear layer, the samples, the first block's captured inputs, and weights written back."""

from __future__ import annotations

from collections.abc import Collection
from types import SimpleNamespace
from typing import Any

import numpy as np

from lowbit.calibration.data import (
    decoder_windows,
    encoder_texts,
)
from lowbit.calibration.text import evaluated_sentences
from lowbit.checkpoints.gguf.names import gguf_to_hf_array, gguf_to_hf_name
from lowbit.checkpoints.streaming import checkpoint_tensors
from lowbit.errors import LowbitError
from lowbit.models.build import _prefix_fix, param_shape
from lowbit.models.moe import expert_of
from lowbit.quant.tensor import quantize


class _Captured(Exception):
    """Raised by the first block's pre-hook: its inputs are what we came for."""


def _calibration(calibration: Any, cls: Any) -> Any:
    if calibration is None:
        return cls()
    if isinstance(calibration, cls):
        return calibration
    if isinstance(calibration, str):
        return cls(source=calibration)
    raise LowbitError(
        f"calibration must be a Calibration or a source string, got {type(calibration).__name__}"
    )


def _find_blocks(net: Any) -> tuple[str, Any]:
    """The model's stack of blocks: the longest ``ModuleList`` of modules of one class that
    hold linear layers (``model.layers`` of a llama, ``encoder.layer`` of a BERT), a block's
    list of experts excepted."""
    import torch

    best: tuple[str, Any] | None = None
    for name, mod in net.named_modules():
        if not isinstance(mod, torch.nn.ModuleList) or len(mod) == 0:
            continue
        if hasattr(mod, "route_all"):  # a block's experts (lowbit.models.moe), not blocks
            continue
        kinds = {type(m) for m in mod}
        if len(kinds) != 1:
            continue
        if not any(isinstance(s, torch.nn.Linear) for s in mod[0].modules()):
            continue
        if best is None or len(mod) > len(best[1]):
            best = (name, mod)
    if best is None:
        raise LowbitError("GPTQ found no stack of transformer blocks in this model")
    return best


def _module_name(net: Any, ckpt: Any, name: str) -> str | None:
    """The model's module path of a checkpoint weight (None: no such module weight)."""

    if ckpt.format == "gguf" and expert_of(name) is not None:  # a stack's expert, split out
        key = _prefix_fix(net, ckpt)(name)  # (lowbit.checkpoints.gguf.expert_split)
    elif ckpt.format == "gguf":
        try:
            key = gguf_to_hf_name(name, ckpt.config)
        except LowbitError:
            return None
    else:
        key = _prefix_fix(net, ckpt)(name)
    return key[: -len(".weight")] if key.endswith(".weight") else None


def _locate(net: Any, ckpt: Any, todo: dict[str, Any], prefix: str) -> dict[int, dict[str, str]]:
    """Per block index, module path -> checkpoint name of the linear layers GPTQ quantizes."""
    import torch

    per_block: dict[int, dict[str, str]] = {}
    lead = prefix + "."
    for name, t in todo.items():
        path = _module_name(net, ckpt, name)
        if path is None or not path.startswith(lead) or len(t.shape) != 2:
            continue
        try:
            mod = net.get_submodule(path)
        except AttributeError:
            continue
        if not isinstance(mod, torch.nn.Linear):
            continue
        if param_shape(net, path + ".weight") != tuple(t.shape):  # a deferred block's too
            continue
        index = int(path[len(lead) :].split(".", 1)[0])
        per_block.setdefault(index, {})[path] = name
    return per_block


def _locate_rounded(
    net: Any, ckpt: Any, names: Collection[str], prefix: str
) -> tuple[dict[str, str], dict[int, dict[str, str]]]:
    """Where the tensors an output rounds without GPTQ live in the model: module path ->
    checkpoint name of those before the blocks (the token embedding), and per block index of
    the linear layers inside them. Tensors the calibration never runs (the output head) and
    those of another shape are left out."""
    import torch

    before: dict[str, str] = {}
    lead = prefix + "."
    todo = {n: SimpleNamespace(shape=tuple(ckpt.info(n).shape)) for n in names}
    head = net.get_output_embeddings() if hasattr(net, "get_output_embeddings") else None
    for name in todo:
        path = _module_name(net, ckpt, name)
        if path is None or path.startswith(lead):
            continue
        try:
            mod = net.get_submodule(path)
        except AttributeError:
            continue
        if not isinstance(mod, torch.nn.Embedding) or mod is head:
            continue
        if param_shape(net, path + ".weight") == todo[name].shape:
            before[path] = name
    return before, _locate(net, ckpt, todo, prefix)


def _samples(
    tokenizer: Any,
    calib: Any,
    causal: bool,
    avoid: int,
    exclude: Collection[str] | None,
    limit: int,
) -> list[tuple[dict[str, Any], Any]]:
    """Model inputs of the calibration data, with the mask of the tokens that count."""
    import torch

    if causal:
        wins = decoder_windows(tokenizer, calib, avoid=avoid)
        return [({"input_ids": torch.tensor([w], dtype=torch.long)}, None) for w in wins]
    if exclude is None and not calib.is_records:
        exclude = evaluated_sentences(calib.text()[1])
    texts = encoder_texts(calib, exclude=exclude or ())
    out = []
    max_length = min(calib.length or 256, limit)
    for i in range(0, len(texts), 32):
        enc = tokenizer(
            texts[i : i + 32],
            padding=True,
            truncation=True,
            max_length=max_length,
            return_tensors="pt",
        )
        out.append((dict(enc), enc["attention_mask"].bool()))
    return out


def _capture(net: Any, first: Any, samples: Any, causal: bool) -> list[tuple[Any, Any, Any]]:
    """The first block's inputs for every sample: (hidden states, other args, kwargs)."""
    got: list[tuple[Any, Any, Any]] = []

    def pre(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if args:
            hidden, rest = args[0], tuple(args[1:])
        else:
            kwargs = dict(kwargs)
            hidden, rest = kwargs.pop("hidden_states"), ()
        got.append((hidden, rest, dict(kwargs)))
        raise _Captured

    handle = first.register_forward_pre_hook(pre, with_kwargs=True)
    try:
        for inputs, _ in samples:
            kw = {"use_cache": False} if causal else {}
            try:
                net(**inputs, **kw)
            except _Captured:
                pass
            else:  # pragma: no cover - the hook always fires
                raise AssertionError("the first block was never called")
    finally:
        handle.remove()
    return got


def _errors(
    W: np.ndarray, deq: np.ndarray, H: np.ndarray, scheme: Any, tokens: int
) -> dict[str, float]:
    """Relative layer-output errors ``tr(D H D^T) / tr(W H W^T)`` of round-to-nearest and of
    GPTQ on the calibration inputs (a report: float32 products with the float32 ``H``)."""

    W32 = W.astype(np.float32)
    if hasattr(scheme, "rtn"):  # a llama.cpp block type (GgmlTarget): llama.cpp's rounding
        rtn = scheme.rtn(W32, H)
    else:
        rtn = quantize(W32, scheme).dequantize(np.float32)
    D = np.stack([W32, W32 - rtn, W32 - deq.astype(np.float32)])  # [3, out, in]
    e = np.einsum("kij,kij->k", D @ H, D, dtype=np.float64)
    base = float(e[0])
    return {
        "tokens": tokens,
        "rtn": float(e[1]) / base if base else 0.0,
        "gptq": float(e[2]) / base if base else 0.0,
    }


def _out(result: Any) -> Any:
    return result[0] if isinstance(result, (tuple, list)) else result


def _model_layout(ckpt: Any, name: str, arr: np.ndarray, net: Any) -> np.ndarray:
    """A checkpoint-layout weight as the model holds it (GGUF q/k rows un-permuted)."""
    if ckpt.format != "gguf" or expert_of(name) is not None:  # experts: never permuted
        return arr

    return gguf_to_hf_array(gguf_to_hf_name(name, ckpt.config), arr, ckpt.config)


def _set_weight(linear: Any, arr: np.ndarray) -> None:
    import torch

    with torch.inference_mode(False), torch.no_grad():
        linear.weight.copy_(torch.from_numpy(np.ascontiguousarray(arr, dtype=np.float32)))


def _tensors(checkpoint: Any) -> Any:

    return checkpoint_tensors(checkpoint)
