"""Build runnable torch / transformers models from checkpoints.

``build_model(checkpoint, weights=None)`` turns what a reader gives (see
``lowbit.checkpoints.open_checkpoint``) into a transformers model in eval mode:

- a GGUF llama-family file (the default SmolLM2-135M-Instruct): tensors dequantized, renamed to
  Hugging Face names, llama.cpp's q/k row permutation undone, ``LlamaForCausalLM`` configured from
  the GGUF metadata;
- a Hugging Face folder (or a safetensors file beside a ``config.json``): the architecture the
  config names (``BertModel`` for all-MiniLM-L6-v2), weights matched by name, strictly.

``weights`` replaces any of the checkpoint's tensors (keyed by the checkpoint's own names) before
the model is built: this is how quantized-then-dequantized weights are evaluated.

Everything runs offline: configs and tokenizers come from the files, never from the Hub.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from lowbit._optional import require
from lowbit.checkpoints.readers import Checkpoint, _progress
from lowbit.errors import LowbitError

__all__ = [
    "build_model",
    "build_tokenizer",
    "gguf_to_hf_name",
    "hf_tensors",
    "unpermute_qk",
]

# ------------------------------------------------------------------------ GGUF -> HF

# llama.cpp tensor names (gguf-py/gguf/tensor_mapping.py, LLAMA) -> transformers' LlamaModel names
_GGUF_LLAMA_NAMES = [
    (r"token_embd\.weight", "model.embed_tokens.weight"),
    (r"output_norm\.weight", "model.norm.weight"),
    (r"output\.weight", "lm_head.weight"),
    (r"blk\.(\d+)\.attn_norm\.weight", r"model.layers.\1.input_layernorm.weight"),
    (r"blk\.(\d+)\.ffn_norm\.weight", r"model.layers.\1.post_attention_layernorm.weight"),
    (r"blk\.(\d+)\.attn_q\.(weight|bias)", r"model.layers.\1.self_attn.q_proj.\2"),
    (r"blk\.(\d+)\.attn_k\.(weight|bias)", r"model.layers.\1.self_attn.k_proj.\2"),
    (r"blk\.(\d+)\.attn_v\.(weight|bias)", r"model.layers.\1.self_attn.v_proj.\2"),
    (r"blk\.(\d+)\.attn_output\.(weight|bias)", r"model.layers.\1.self_attn.o_proj.\2"),
    (r"blk\.(\d+)\.ffn_gate\.weight", r"model.layers.\1.mlp.gate_proj.weight"),
    (r"blk\.(\d+)\.ffn_up\.weight", r"model.layers.\1.mlp.up_proj.weight"),
    (r"blk\.(\d+)\.ffn_down\.weight", r"model.layers.\1.mlp.down_proj.weight"),
]
_GGUF_ARCHS = ("llama",)


def gguf_to_hf_name(name: str) -> str:
    """The transformers ``LlamaForCausalLM`` name of a llama.cpp GGUF tensor.

    Raises:
        LowbitError: a tensor with no llama counterpart (e.g. ``rope_freqs.weight``).
    """
    for pattern, repl in _GGUF_LLAMA_NAMES:
        if re.fullmatch(pattern, name):
            return re.sub(pattern, repl, name)
    raise LowbitError(f"GGUF tensor {name!r} has no counterpart in a transformers llama model")


def unpermute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's reordering of q/k projection rows (convert_hf_to_gguf.py ``permute``).

    Hugging Face's rotary embedding pairs row i with row i + d/2 of each head (``rotate_half``);
    llama.cpp pairs rows 2i and 2i+1. The converter reorders each head's rows from
    [r_0 .. r_{d/2-1}, s_0 .. s_{d/2-1}] to [r_0, s_0, r_1, s_1, ...]; this puts them back.
    Works on weights (rows, cols) and biases (rows,).
    """
    rows = w.shape[0]
    if rows % (2 * n_head):
        raise LowbitError(f"cannot split {rows} q/k rows into {n_head} heads of rotary pairs")
    half = rows // n_head // 2
    return w.reshape(n_head, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def hf_tensors(
    checkpoint: Checkpoint,
    weights: Mapping[str, np.ndarray] | None = None,
    *,
    progress: bool | None = None,
) -> Iterator[tuple[str, np.ndarray]]:
    """Yield ``(hugging_face_name, float32 array)`` for every tensor, one at a time.

    GGUF tensors are renamed and their q/k rows un-permuted; safetensors names pass through.

    Args:
        checkpoint: an open checkpoint.
        weights: replacements keyed by the checkpoint's own names (each the checkpoint's shape).
        progress: tqdm bar (``None``: only on a terminal).

    Raises:
        LowbitError: a replacement for a name the checkpoint lacks, or of the wrong shape.
    """
    weights = dict(weights or {})
    _check_replacements(checkpoint, weights)
    is_gguf = checkpoint.format == "gguf"
    cfg = checkpoint.config or {}
    names = checkpoint.names()
    for name in _progress(names, progress, f"loading {checkpoint.path.name}"):
        arr = weights[name] if name in weights else checkpoint.get(name)
        arr = np.asarray(arr, dtype=np.float32)
        if not is_gguf:
            yield name, arr
            continue
        hf = gguf_to_hf_name(name)
        if hf.endswith(("q_proj.weight", "q_proj.bias")):
            arr = unpermute_qk(arr, cfg["num_attention_heads"])
        elif hf.endswith(("k_proj.weight", "k_proj.bias")):
            arr = unpermute_qk(arr, cfg.get("num_key_value_heads", cfg["num_attention_heads"]))
        yield hf, arr


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


def _hf_config(checkpoint: Checkpoint) -> Any:
    import transformers

    cfg = dict(checkpoint.config or {})
    if checkpoint.format == "gguf":
        arch = cfg.get("model_type")
        if arch not in _GGUF_ARCHS:
            raise LowbitError(
                f"{checkpoint.path}: GGUF architecture {arch!r}: lowbit builds models for "
                f"{', '.join(_GGUF_ARCHS)} only (reading its tensors works)"
            )
    if not cfg:
        raise LowbitError(
            f"{checkpoint.path}: no config.json beside the weights, so the model cannot be built "
            f"(reading tensors works)"
        )
    model_type = cfg.pop("model_type", None)
    if model_type is None:
        raise LowbitError(f"{checkpoint.path}: config has no model_type")
    for key in ("transformers_version", "_name_or_path"):
        cfg.pop(key, None)
    try:
        return transformers.AutoConfig.for_model(model_type, **cfg)
    except ValueError as exc:
        raise LowbitError(
            f"{checkpoint.path}: transformers cannot build this config: {exc}"
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
            model = cls(config) if cls is not None else transformers.AutoModel.from_config(config)
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

    Returns:
        The model (a ``transformers.PreTrainedModel``) in eval mode on the CPU.

    Raises:
        LowbitError: no config, an unknown architecture, names or shapes that do not match.
        MissingExtraError: torch or transformers is not installed (``lowbit[models]``).
    """
    torch = require("torch", extra="models", what="building a model")
    require("transformers", extra="models", what="building a model")

    if checkpoint.format == "lowbit":  # a lowbit checkpoint keeps its source's names
        checkpoint = checkpoint.as_source()  # type: ignore[attr-defined]
    dtype = torch.float32 if dtype is None else dtype
    config = _hf_config(checkpoint)
    model = _instantiate(config, dtype)
    params = model.state_dict(keep_vars=True)
    buffers_only = {n for n, _ in model.named_buffers()} - set(params)
    prefix = _prefix_fix(model, checkpoint)
    loaded: set[str] = set()
    unexpected: list[str] = []
    with torch.no_grad():
        for name, arr in hf_tensors(checkpoint, weights, progress=progress):
            key = prefix(name)
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
    missing = [k for k in params if k not in loaded and not _is_tied(params, k, loaded)]
    if strict and (missing or unexpected):
        raise LowbitError(_mismatch_message(checkpoint, missing, unexpected, list(params)))
    model.eval()
    return model


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
    """Map checkpoint names onto the model's when they differ by the base-model prefix."""
    if checkpoint.format == "gguf":
        return lambda n: n
    keys = set(model.state_dict())
    names = checkpoint.names()
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


# -------------------------------------------------------------------------- tokenizer


def build_tokenizer(checkpoint: Checkpoint) -> Any:
    """The tokenizer that goes with a checkpoint, built offline.

    A GGUF with a byte-level BPE vocabulary (``tokenizer.ggml.model == "gpt2"``, as SmolLM2)
    gets a ``tokenizers`` BPE built from its vocabulary and merges, the same tokenizer
    transformers builds from the file (GGUF control tokens are special tokens) in a fraction of
    the time; other GGUF vocabularies go through transformers' own GGUF conversion. A folder
    uses its ``tokenizer.json`` / ``tokenizer_config.json``.

    Raises:
        LowbitError: no tokenizer files, or a GGUF pre-tokenizer lowbit does not implement.
        MissingExtraError: transformers or tokenizers is not installed (``lowbit[models]``).
    """
    transformers = require("transformers", extra="models", what="building a tokenizer")
    require("tokenizers", extra="models", what="building a tokenizer")

    if checkpoint.format == "gguf":
        md = checkpoint.metadata
        if md.get("tokenizer.ggml.model") == "gpt2" and "tokenizer.ggml.merges" in md:
            return _gguf_bpe_tokenizer(md)
        return transformers.AutoTokenizer.from_pretrained(
            checkpoint.path.parent, gguf_file=checkpoint.path.name, local_files_only=True
        )
    folder = checkpoint.path if checkpoint.path.is_dir() else checkpoint.path.parent
    if not (folder / "tokenizer.json").exists() and not (folder / "tokenizer_config.json").exists():
        raise LowbitError(f"{folder}: no tokenizer.json or tokenizer_config.json")
    return transformers.AutoTokenizer.from_pretrained(folder, local_files_only=True)


def _gguf_bpe_tokenizer(md: Mapping[str, Any]) -> Any:
    import transformers
    from tokenizers import AddedToken, Tokenizer, decoders, models

    from lowbit.checkpoints._pretokenizers import pre_tokenizer

    tokens = md["tokenizer.ggml.tokens"]
    types = md.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    merges = [tuple(m.split(" ", 1)) for m in md["tokenizer.ggml.merges"]]
    bpe = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
    bpe.pre_tokenizer = pre_tokenizer(md.get("tokenizer.ggml.pre"))  # llama.cpp's splitting
    bpe.decoder = decoders.ByteLevel()
    # llama.cpp token types: 3 = CONTROL (special), 4 = USER_DEFINED (kept whole, not special)
    bpe.add_special_tokens(
        [
            AddedToken(t, special=True, normalized=False)
            for t, k in zip(tokens, types, strict=True)
            if k == 3
        ]
    )
    bpe.add_tokens(
        [
            AddedToken(t, special=False, normalized=False)
            for t, k in zip(tokens, types, strict=True)
            if k == 4
        ]
    )

    def tok(key: str) -> str | None:
        i = md.get(f"tokenizer.ggml.{key}")
        return tokens[i] if isinstance(i, int) and 0 <= i < len(tokens) else None

    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        bos_token=tok("bos_token_id"),
        eos_token=tok("eos_token_id"),
        unk_token=tok("unknown_token_id"),
        pad_token=tok("padding_token_id"),
        chat_template=md.get("tokenizer.chat_template"),
    )
