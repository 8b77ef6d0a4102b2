"""Forward hooks on a built model's linear layers, named by checkpoint tensor: per-token
activation quantization (W8A8 emulation) and block-Hadamard input rotations (weights stored
rotated)."""

from __future__ import annotations

from typing import Any

from lowbit.checkpoints.gguf.names import gguf_to_hf_name
from lowbit.errors import LowbitError
from lowbit.methods.hadamard import rotate_rows
from lowbit.models.activations import fake_quantize_per_token


def attach_activation_quantization(
    model: Any, per_tensor: dict[str, str], source_format: str
) -> dict[str, str]:
    """Hook per-token activation quantization onto the linear layers of the given weights.

    Args:
        model: the transformers model.
        per_tensor: ``{checkpoint tensor name: activation format}``.
        source_format: ``gguf`` when the names are llama.cpp's.

    Returns:
        ``{module name: format}`` of the hooked layers.
    """
    if not per_tensor:
        return {}

    modules = dict(model.named_modules())
    out: dict[str, str] = {}
    for name, fmt in per_tensor.items():
        found = _linear_of(model, modules, name, source_format, "activation quantization")

        def hook(_m: Any, args: tuple[Any, ...], fmt: str = fmt) -> tuple[Any, ...]:
            return (fake_quantize_per_token(args[0], fmt), *args[1:])

        modules[found].register_forward_pre_hook(hook)
        out[found] = fmt
    return out


def _linear_of(
    model: Any, modules: dict[str, Any], name: str, source_format: str, what: str
) -> str:
    """The module name of the ``nn.Linear`` a checkpoint weight ``name`` is.

    Raises:
        LowbitError: the model has no such linear layer.
    """
    import torch

    base = getattr(model, "base_model_prefix", "") or ""
    key = name
    if source_format == "gguf":
        key = gguf_to_hf_name(name, getattr(model.config, "to_dict", dict)())
    key = key.removesuffix(".weight")
    found = next(
        (k for k in (key, f"{base}.{key}", key.removeprefix(f"{base}.")) if k in modules), None
    )
    if found is None or not isinstance(modules[found], torch.nn.Linear):
        raise LowbitError(f"{what} for {name!r}: the model has no linear layer {key!r}")
    return found


def attach_rotations(model: Any, blocks: dict[str, int], source_format: str) -> dict[str, int]:
    """Hook ``x ↦ x R`` (block Hadamard, ``lowbit.methods.hadamard``) onto the inputs of the
    linear layers whose weights a lowbit checkpoint stores rotated (``W R``).

    Args:
        model: the transformers model.
        blocks: ``{checkpoint tensor name: Hadamard block}``.
        source_format: ``gguf`` when the names are llama.cpp's.

    Returns:
        ``{module name: block}`` of the hooked layers.

    Raises:
        LowbitError: a rotated weight that is not a linear layer of the model.
    """
    modules = dict(model.named_modules())
    out: dict[str, int] = {}
    for name, block in blocks.items():
        found = _linear_of(model, modules, name, source_format, "a block Hadamard rotation")
        modules[found].register_forward_pre_hook(
            lambda _m, a, b=block: (rotate_rows(a[0], b), *a[1:])
        )
        out[found] = block
    return out
