"""Build runnable torch / transformers models from checkpoints.

``build_model(checkpoint, weights=None)`` turns what a reader gives (see
``lowbit.checkpoints.open_checkpoint``) into a transformers model in eval mode:

- a GGUF file of a family in ``lowbit.checkpoints.gguf.arch.GGUF_ARCHS`` (llama, qwen2, qwen3,
  qwen2moe, qwen3moe, gemma2, gemma3, phi3; a llama file with experts is Mixtral; the default
  SmolLM2-135M-Instruct is llama): tensors dequantized, renamed to Hugging Face names, llama.cpp's
  q/k row permutation and Gemma's stored norm offset undone, expert stacks split per expert,
  the family's transformers class configured from the GGUF metadata;
- a Hugging Face folder (or a safetensors file beside a ``config.json``): the architecture the
  config names (``BertModel`` for all-MiniLM-L6-v2), weights matched by name, strictly.

``weights`` replaces any of the checkpoint's tensors (keyed by the checkpoint's own names) before
the model is built: this is how quantized-then-dequantized weights are evaluated.

Everything runs offline: configs and tokenizers come from the files, never from the Hub.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Collection, Iterator, Mapping
from typing import Any

import numpy as np

from lowbit._optional import require
from lowbit._progress import progress_iter
from lowbit.checkpoints.config_checks import check_config
from lowbit.checkpoints.gguf.arch import GGUF_ARCHS
from lowbit.checkpoints.gguf.names import (
    gguf_expert_names,
    gguf_to_hf_array,
    gguf_to_hf_experts,
    gguf_to_hf_name,
)
from lowbit.checkpoints.lowbit_format.checkpoint import LowbitCheckpoint, is_lowbit_checkpoint
from lowbit.checkpoints.opener import open_checkpoint
from lowbit.checkpoints.readers import Checkpoint
from lowbit.checkpoints.shape_checks import check_checkpoint_shapes
from lowbit.checkpoints.shipped import shipped_or_path
from lowbit.errors import LowbitError
from lowbit.models._config_guard import (
    check_builder_keys,
    check_dtype_names,
    check_gguf_required,
    one_line,
)
from lowbit.models.ggml_act import gguf_linear_types
from lowbit.models.hooks import attach_activation_quantization, attach_rotations
from lowbit.models.input_transforms import attach_input_transforms
from lowbit.models.moe import (
    check_layouts,
    checkpoint_rename,
    fused_base,
    split_fused,
    unfuse_experts,
)

__all__ = [
    "attach_activation_quantization",
    "attach_rotations",
    "build_model",
    "hf_tensors",
    "load_deferred",
    "load_model",
    "param_shape",
]


def hf_tensors(
    checkpoint: Checkpoint,
    weights: Mapping[str, np.ndarray] | None = None,
    *,
    progress: bool | None = None,
    names: list[str] | None = None,
) -> Iterator[tuple[str, np.ndarray]]:
    """Yield ``(hugging_face_name, float32 array)`` for every tensor, one at a time.

    GGUF tensors are renamed and their q/k rows un-permuted, expert stacks split into the
    checkpoint's per-expert tensors; safetensors names pass through.

    Args:
        checkpoint: an open checkpoint.
        weights: replacements keyed by the checkpoint's own names (each the checkpoint's shape).
        progress: tqdm bar (``None``: only on a terminal).
        names: only these checkpoint names (default: all).

    Raises:
        LowbitError: a replacement for a name the checkpoint lacks, or of the wrong shape.
    """
    weights = dict(weights or {})
    _check_replacements(checkpoint, weights)
    is_gguf = checkpoint.format == "gguf"
    cfg = checkpoint.config or {}
    names = checkpoint.names() if names is None else names
    names = [n for n in names if not (is_gguf and n in _ROPE_TENSORS)]
    for name in progress_iter(names, progress, f"loading {checkpoint.path.name}", "tensor"):
        arr = weights[name] if name in weights else checkpoint.get(name)
        arr = np.asarray(arr, dtype=np.float32)
        if not is_gguf:
            yield name, arr
            continue
        experts = gguf_to_hf_experts(name, arr, cfg)
        if experts is not None:
            yield from experts
            continue
        hf = gguf_to_hf_name(name, cfg)
        yield hf, gguf_to_hf_array(hf, arr, cfg)


def _check_replacements(checkpoint: Checkpoint, weights: Mapping[str, Any]) -> None:
    for name, arr in weights.items():
        if name not in checkpoint:
            raise checkpoint._missing(name)
        if tuple(np.shape(arr)) != checkpoint.shape(name):
            raise LowbitError(
                f"replacement for {name!r} has shape {tuple(np.shape(arr))}, the checkpoint's "
                f"is {checkpoint.shape(name)}"
            )


# ------------------------------------------------------------------------------ build


def _checked_config(checkpoint: Checkpoint) -> tuple[dict[str, Any], str]:
    """The config a model is built from and its model type, every field checked (and against
    the tensors) before torch or transformers is imported."""
    cfg = dict(checkpoint.config or {})
    arch = None
    if checkpoint.format == "gguf":
        arch = getattr(checkpoint, "metadata", {}).get(
            "general.architecture", cfg.get("model_type")
        )
        if arch not in GGUF_ARCHS:
            raise LowbitError(
                f"{checkpoint.path}: GGUF architecture {arch!r}: lowbit builds models for "
                f"{', '.join(GGUF_ARCHS)} only (reading its tensors works)"
            )
    if not cfg:
        raise LowbitError(
            f"{checkpoint.path}: no config.json beside the weights, so the model cannot be built "
            f"(reading tensors works)"
        )
    if (
        checkpoint.format == "gguf"
        and "vocab_size" not in cfg
        and "token_embd.weight" in checkpoint
    ):
        # no vocabulary nor vocab_size key: transformers' default (151,936 for Qwen) would size
        # the embedding before the load refuses it; the embedding's rows are the vocabulary
        cfg["vocab_size"] = int(checkpoint.info("token_embd.weight").shape[0])
    if checkpoint.format == "gguf" and LONGROPE[0] in checkpoint:
        cfg = _longrope_config(checkpoint, cfg)
    # every count and real value in range and consistent with the tensors before the model
    # is allocated from them (block_count 10**9, zero heads, top-k past the experts, NaN rope)
    check_config(
        cfg,
        str(checkpoint.path),
        gguf_arch=str(arch) if checkpoint.format == "gguf" else None,
        tensors=((n, tuple(checkpoint.info(n).shape)) for n in checkpoint.names()),
    )
    check_builder_keys(cfg, str(checkpoint.path))
    check_checkpoint_shapes(checkpoint)  # before the model is allocated from the config
    if checkpoint.format == "gguf":
        check_gguf_required(cfg, str(arch), str(checkpoint.path))
    model_type = cfg.pop("model_type", None)
    if model_type is None:
        raise LowbitError(f"{checkpoint.path}: config has no model_type")
    for key in ("transformers_version", "_name_or_path"):
        cfg.pop(key, None)
    return cfg, str(model_type)


def _hf_config(checkpoint: Checkpoint, cfg: dict[str, Any], model_type: str) -> Any:
    """transformers' config object of a checked config (:func:`_checked_config`)."""
    import transformers

    check_dtype_names(cfg, str(checkpoint.path))
    known = getattr(transformers, "CONFIG_MAPPING", None)
    if known is not None and model_type not in known:
        import difflib

        close = difflib.get_close_matches(str(model_type), list(known.keys()), n=3)
        hint = f" (closest: {', '.join(close)})" if close else ""
        raise LowbitError(
            f"{checkpoint.path}: model_type {model_type!r} is no architecture transformers "
            f"{transformers.__version__} knows, so the model cannot be built{hint}"
        )
    try:
        config = transformers.AutoConfig.for_model(model_type, **cfg)
        pad, vocab = getattr(config, "pad_token_id", None), getattr(config, "vocab_size", None)
        if "pad_token_id" not in cfg and type(pad) is int and type(vocab) is int and pad >= vocab:
            # the class's default padding row (Phi-3's 32000) is past a smaller vocabulary;
            # the row only matters to training, so there is none
            config.pad_token_id = None
        return config
    except Exception as exc:  # ValueError, or huggingface_hub's strict-dataclass errors
        if not isinstance(exc, ValueError) and "Strict" not in type(exc).__name__:
            raise
        raise LowbitError(
            f"{checkpoint.path}: transformers cannot build this config: {one_line(exc)}"
        ) from None


def _model_class(config: Any) -> Any:
    import transformers

    for arch in getattr(config, "architectures", None) or ():
        cls = getattr(transformers, arch, None)
        if cls is not None:
            return cls
    return None


def _instantiate(config: Any, dtype: Any) -> Any:
    """A model with uninitialised parameters (every one is then overwritten from the checkpoint)."""
    import torch
    import transformers

    try:  # skipping random init saves seconds; the helper moved between transformers versions
        from transformers.initialization import no_init_weights
    except ImportError:  # pragma: no cover - transformers < 5
        from transformers.modeling_utils import no_init_weights  # type: ignore[no-redef]
    cls = _model_class(config)
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with no_init_weights():
            try:
                model = (
                    cls(config) if cls is not None else transformers.AutoModel.from_config(config)
                )
            except (TypeError, ValueError, KeyError, ZeroDivisionError, AssertionError,
                    AttributeError, IndexError) as exc:  # fmt: skip
                # a value lowbit's checks let through that the model class cannot use (a null
                # count, an unknown activation, a sparse step of 0): transformers' own error
                raise LowbitError(
                    f"transformers cannot build {type(config).__name__.removesuffix('Config')} "
                    f"from this config ({type(exc).__name__}: {one_line(exc, 200)})"
                ) from None
            unfuse_experts(model)  # fused 3-D experts -> one linear layer per expert
    finally:
        torch.set_default_dtype(old)
    model.tie_weights()  # post_init ties inside init_weights, which no_init_weights skips
    return model


def build_model(
    checkpoint: Checkpoint,
    weights: Mapping[str, np.ndarray] | None = None,
    *,
    dtype: Any = None,
    strict: bool = True,
    progress: bool | None = None,
    defer: Callable[[str], bool] | None = None,
) -> Any:
    """Build a transformers model from a checkpoint, optionally with replaced weights.

    Args:
        checkpoint: from ``open_checkpoint``: a GGUF llama-family file, or safetensors with a
            ``config.json`` naming an architecture transformers knows.
        weights: arrays that replace checkpoint tensors, keyed by the checkpoint's own names (GGUF
            names for a GGUF file; the permutation is undone after replacement).
        dtype: torch dtype of the parameters (default ``torch.float32``).
        strict: every model parameter must come from the checkpoint (tied ones excepted) and
            every checkpoint tensor must find a parameter (known buffers such as
            ``position_ids`` excepted).
        progress: tqdm bar while loading (``None``: only on a terminal).
        defer: model parameter keys for which it is true are not read: they hold no memory
            (the model's ``lowbit_deferred`` lists them) until :func:`load_deferred` fills
            them. GPTQ defers every block but the first, so a model's blocks are in memory
            one at a time.

    Returns:
        The model (a ``transformers.PreTrainedModel``) in eval mode on the CPU. Its
        ``lowbit_gguf_types`` maps linear layers to the GGUF types of the weights they hold
        (a GGUF's own tensors; empty otherwise), for ``lowbit.models.ggml_act``; its
        ``lowbit_input_transforms`` the layers whose inputs a compressed-tensors folder's
        ``transform_config`` rotates at run time (hooked: ``lowbit.models.input_transforms``).

    Raises:
        LowbitError: no config, an unknown architecture, names or shapes that do not match.
        MissingExtraError: torch or transformers is not installed (``lowbit[models]``).
    """
    # llama.cpp's weight types, for ``--act llamacpp``: only where the weights are the file's
    stored_gguf = checkpoint.format == "gguf" and weights is None
    if checkpoint.format == "lowbit":  # a lowbit checkpoint keeps its source's names
        checkpoint = checkpoint.as_source()  # type: ignore[attr-defined]
    cfg, model_type = _checked_config(checkpoint)  # a hostile file costs no torch import
    torch = require("torch", extra="models", what="building a model")
    require("transformers", extra="models", what="building a model")
    dtype = torch.float32 if dtype is None else dtype
    config = _hf_config(checkpoint, cfg, model_type)
    model = _instantiate(config, dtype)
    check_layouts(model, getattr(checkpoint, "layouts", {}))  # fused experts read per expert
    params = model.state_dict(keep_vars=True)
    loaded, unexpected, deferred = _load(
        model, checkpoint, weights, params, progress=progress, defer=defer
    )
    done = loaded | deferred
    missing = [k for k in params if k not in done and not _is_tied(params, k, loaded)]
    if strict and (missing or unexpected):
        raise LowbitError(_mismatch_message(checkpoint, missing, unexpected, list(params)))
    if checkpoint.format == "gguf" and ROPE_FREQS in checkpoint:
        _scale_rotary(model, np.asarray(checkpoint.get(ROPE_FREQS), dtype=np.float32))
    if deferred:  # never touched: their pages were never written (see load_deferred)
        import torch

        kept = {params[k].data_ptr() for k in loaded}
        with torch.no_grad():
            for k in deferred:
                if params[k].data_ptr() not in kept:
                    params[k].data = torch.empty(0, dtype=params[k].dtype)
    model.eval()
    model.lowbit_deferred = sorted(deferred)
    model.lowbit_gguf_types = gguf_linear_types(model, checkpoint) if stored_gguf else {}
    # a compressed-tensors folder's online input rotations (its weights are stored rotated)
    model.lowbit_input_transforms = attach_input_transforms(model, checkpoint)
    return model


#: llama.cpp's per-frequency rope divisors (Llama 3's rope scaling, stored as a tensor).
ROPE_FREQS = "rope_freqs.weight"
#: Phi-3's long-context rope factors as llama.cpp stores them (long, short).
LONGROPE = ("rope_factors_long.weight", "rope_factors_short.weight")
_ROPE_TENSORS = (ROPE_FREQS, *LONGROPE)


def _longrope_config(checkpoint: Checkpoint, cfg: dict[str, Any]) -> dict[str, Any]:
    """A Phi-3 GGUF's long-context rope as transformers configures it: ``rope_scaling``
    ``longrope`` with the file's long and short factors and ``original_max_position_embeddings``
    from ``phi3.rope.scaling.original_context_length`` (what convert_hf_to_gguf.py wrote them
    from; transformers derives the attention factor from the two lengths, as the converter's
    ``attn_factor`` was).

    Raises:
        LowbitError: factors on another family, only one of the two, factors that are not
            finite and positive, or no original context length.
    """
    arch = cfg.get("model_type")
    meta = getattr(checkpoint, "metadata", {})
    orig = meta.get(f"{arch}.rope.scaling.original_context_length")
    if arch != "phi3" or LONGROPE[1] not in checkpoint or not isinstance(orig, int):
        raise LowbitError(
            f"{checkpoint.path}: rope_factors_long/short are Phi-3's long-context rope; lowbit "
            f"rebuilds them for a phi3 GGUF with both tensors and "
            f"phi3.rope.scaling.original_context_length (this is {arch!r})"
        )
    factors = [np.asarray(checkpoint.get(n), dtype=np.float32).ravel() for n in LONGROPE]
    if any(f.size == 0 or not np.all(np.isfinite(f)) or np.any(f <= 0) for f in factors):
        raise LowbitError(f"{checkpoint.path}: rope_factors_long/short must be positive numbers")
    long, short = ([float(np.format_float_positional(v)) for v in f] for f in factors)
    return {**cfg, "original_max_position_embeddings": orig,
            "rope_scaling": {"rope_type": "longrope", "long_factor": long,
                             "short_factor": short}}  # fmt: skip


def _scale_rotary(model: Any, factors: np.ndarray) -> None:
    """Divide each rotary embedding's inverse frequencies by llama.cpp's ``rope_freqs``
    factors, as llama.cpp does (the model was configured with unscaled rope)."""
    import torch

    found = False
    for module in model.modules():
        inv = getattr(module, "inv_freq", None)
        if isinstance(inv, torch.Tensor) and inv.shape == factors.shape:
            with torch.no_grad():
                scaled = inv / torch.from_numpy(factors).to(inv.dtype)
                module.inv_freq.copy_(scaled)
                if isinstance(getattr(module, "original_inv_freq", None), torch.Tensor):
                    module.original_inv_freq = scaled.clone()
            found = True
    if not found:
        raise LowbitError(
            f"rope_freqs.weight has {factors.shape[0]} factors and the model no rotary "
            "embedding of that many frequencies"
        )


def load_deferred(
    model: Any,
    checkpoint: Checkpoint,
    keys: Collection[str],
    weights: Mapping[str, np.ndarray] | None = None,
) -> list[str]:
    """Load parameters :func:`build_model` deferred (``defer=``), by model key, now.

    Args:
        model: the model ``build_model(checkpoint, defer=...)`` returned.
        checkpoint: the same checkpoint.
        keys: model parameter keys to fill (each one deferred).
        weights: replacements as for :func:`build_model`.

    Returns:
        The keys filled.
    """
    if checkpoint.format == "lowbit":
        checkpoint = checkpoint.as_source()  # type: ignore[attr-defined]
    params = model.state_dict(keep_vars=True)  # buffers too (DeepSeek's routing bias)
    want = set(keys)
    for k in want:
        p = params[k]
        if p.numel() == 0:  # dropped after the build: its shape again, uninitialised
            import torch

            with torch.no_grad():
                p.data = torch.empty(_shapes(model)[k], dtype=p.dtype)
    loaded, _, _ = _load(model, checkpoint, weights, params, only=want)
    return sorted(loaded)


def _shapes(model: Any) -> dict[str, tuple[int, ...]]:
    return model.__dict__.setdefault("_lowbit_shapes", {})


def param_shape(model: Any, key: str) -> tuple[int, ...]:
    """A parameter's shape, also while it is deferred (see :func:`build_model`'s ``defer``)."""
    shape = _shapes(model).get(key)
    return shape if shape is not None else tuple(model.state_dict(keep_vars=True)[key].shape)


def _load(
    model: Any,
    checkpoint: Checkpoint,
    weights: Mapping[str, np.ndarray] | None,
    params: dict[str, Any],
    *,
    progress: bool | None = False,
    defer: Callable[[str], bool] | None = None,
    only: set[str] | None = None,
) -> tuple[set[str], list[str], set[str]]:
    """Copy the checkpoint's tensors into ``params``; (loaded keys, unused checkpoint names,
    deferred keys). ``only``: just these keys (the names that map elsewhere are not read)."""
    import torch

    buffers_only = {n for n, _ in model.named_buffers()} - set(params)
    prefix = _prefix_fix(model, checkpoint)
    names = None
    if only is not None or defer is not None:  # decide by name, so deferred ones are not read
        names, later = [], set()
        for name in checkpoint.names():
            key = _model_key(checkpoint, prefix, name)
            skip = defer is not None and key is not None and defer(key)
            if only is not None:
                skip = key is None or not any(_covers(key, k) for k in only)
            if skip and defer is not None and key is not None:
                later.add(key)
            if not skip:
                names.append(name)
    loaded: set[str] = set()
    unexpected: list[str] = []
    deferred: set[str] = set()
    with torch.no_grad():
        for name, whole in hf_tensors(checkpoint, weights, progress=progress, names=names):
            key = prefix(name)
            parts = split_fused(key, whole, model) if key not in params else None
            for key, arr in parts or [(key, whole)]:  # noqa: B020 - a fused tensor: per expert
                target = params.get(key)
                if target is None:
                    if key not in buffers_only and not key.endswith("position_ids"):
                        unexpected.append(name)
                    continue
                if tuple(target.shape) != arr.shape:
                    raise LowbitError(
                        f"{checkpoint.path}: tensor {name!r} has shape {arr.shape}, the model's "
                        f"{key!r} wants {tuple(target.shape)}"
                    )
                target.copy_(_readonly_tensor(arr))
                loaded.add(key)
    if defer is not None:
        shapes = _shapes(model)
        for key in later:
            covered = [k for k in params if _covers(key, k)]
            if not covered and key not in buffers_only:
                unexpected.append(key)
            for k in covered:
                if k not in loaded:
                    deferred.add(k)
                    shapes[k] = tuple(params[k].shape)
    return loaded, unexpected, deferred


def _covers(key: str, k: str) -> bool:
    """Whether the checkpoint tensor at model key ``key`` fills parameter ``k`` (itself, or a
    fused experts tensor one of its experts' weights)."""
    if k == key:
        return True
    base = fused_base(key)
    return base is not None and k.startswith(base + ".")


def _model_key(checkpoint: Checkpoint, prefix: Any, name: str) -> str | None:
    """The model key a checkpoint name fills (before a fused tensor is split), or None.

    A GGUF expert stack (``blk.L.ffn_gate_exps.weight``) fills every expert's layer of its
    block: its key is the block's fused experts key (``model.layers.L.mlp.experts.gate_up_proj``),
    which :func:`_covers` every expert's parameters with, so a later block's stacks are
    deferred with the rest of that block (before, they were read at once: a 64-expert 7B
    model's every expert in float32, 26 GB, while GPTQ started on its first block)."""
    if checkpoint.format != "gguf":
        return prefix(name)
    try:
        return prefix(gguf_to_hf_name(name, checkpoint.config))
    except LowbitError:
        pass
    first = gguf_expert_names(name, 1, checkpoint.config)
    m = _EXPERT_KEY.match(prefix(first[0])) if first else None
    return f"{m.group(1)}.gate_up_proj" if m else None


#: a per-expert model key's experts module (``model.layers.3.mlp.experts``)
_EXPERT_KEY = re.compile(r"^(.*\.experts)\.\d+\.")


def _readonly_tensor(arr: np.ndarray) -> Any:
    """A torch view of a (possibly read-only, memory-mapped) array, for reading only."""
    import warnings

    import torch

    with warnings.catch_warnings():  # torch warns that it cannot mark the view read-only
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(arr)


def _is_tied(params: dict[str, Any], key: str, loaded: set[str]) -> bool:
    ptr = params[key].data_ptr()
    return any(params[k].data_ptr() == ptr for k in loaded)


def _prefix_fix(model: Any, checkpoint: Checkpoint) -> Any:
    """Map checkpoint names onto the model's: the base-model prefix where they differ by it,
    then the family's renames (``lowbit.models.moe.checkpoint_rename``: Mixtral's experts; a
    GGUF's names, already the checkpoint's, take the renames only)."""
    rename = checkpoint_rename(getattr(model.config, "model_type", None))
    if checkpoint.format == "gguf":
        return rename
    prefix = _base_prefix(model, checkpoint, rename)
    return lambda n: rename(prefix(n))


def _base_prefix(model: Any, checkpoint: Checkpoint, rename: Any) -> Any:
    keys = set(model.state_dict())
    names = [rename(n) for n in checkpoint.names()]
    base = getattr(model, "base_model_prefix", "") or ""
    if not base or any(n in keys for n in names):
        return lambda n: n
    if any(f"{base}.{n}" in keys for n in names):
        return lambda n: f"{base}.{n}"
    if any(n.startswith(f"{base}.") and n[len(base) + 1 :] in keys for n in names):
        return lambda n: n[len(base) + 1 :] if n.startswith(f"{base}.") else n
    return lambda n: n


def _mismatch_message(
    checkpoint: Checkpoint, missing: list[str], unexpected: list[str], model_keys: list[str]
) -> str:
    import difflib

    parts = [f"{checkpoint.path}: checkpoint names do not match the model"]
    if missing:
        parts.append(f"{len(missing)} model parameters missing (e.g. {', '.join(missing[:3])})")
    if unexpected:
        close = difflib.get_close_matches(unexpected[0], model_keys, n=1)
        hint = f"; closest model name to {unexpected[0]!r}: {close[0]!r}" if close else ""
        parts.append(
            f"{len(unexpected)} checkpoint tensors unused (e.g. {', '.join(unexpected[:3])}){hint}"
        )
    return "; ".join(parts) + " (strict=False loads what matches)"


# -------------------------------------------------------------------- load_model


def load_model(
    path: str | os.PathLike[str], *, activations: bool = True, verify: bool = True, **kwargs: Any
) -> Any:
    """Build a runnable transformers model (eval mode, float32) from a checkpoint.

    Any checkpoint ``open_checkpoint`` reads gives ``build_model(open_checkpoint(path),
    **kwargs)``. A lowbit quantized checkpoint (``lowbit quantize``) gives its dequantized
    weights, with the per-token activation quantization its plan asks for simulated.

    Args:
        path: a checkpoint file or folder, or a shipped model's name (``"smollm2"``; see
            ``lowbit.checkpoints.open_checkpoint``).
        activations: for a lowbit checkpoint, simulate the activation quantization its plan
            asks for (``lowbit.models.activations.fake_quantize_per_token`` on the inputs of
            those linear layers); False gives the weight-only model. Other checkpoints have none.
        verify: for a lowbit checkpoint, check its manifest's digest and every file's sha256
            (see ``lowbit.checkpoints.lowbit_format.checkpoint.LowbitCheckpoint``).
        **kwargs: passed to :func:`build_model` (``dtype``, ``strict``, ``progress``).

    Returns:
        The model; for a lowbit checkpoint ``model.lowbit_activations`` maps hooked module
        names to their format.

    Raises:
        LowbitError: an unreadable checkpoint, or an activation rule on a tensor that is not
            an ``nn.Linear`` weight.
    """
    path = shipped_or_path(path)
    if not is_lowbit_checkpoint(path):
        return build_model(open_checkpoint(path), **kwargs)
    ckpt = LowbitCheckpoint(path, verify=verify)
    model = build_model(ckpt.as_source(), **kwargs)
    # rotated inputs first: activation quantizers hooked after them see the rotated values
    model.lowbit_rotations = attach_rotations(model, ckpt.rotations(), ckpt.source_format)
    hooked: dict[str, str] = {}
    if activations:
        hooked = attach_activation_quantization(model, ckpt.activations(), ckpt.source_format)
    model.lowbit_activations = hooked
    return model
