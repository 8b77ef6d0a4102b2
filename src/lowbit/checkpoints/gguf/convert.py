"""Hugging Face -> GGUF: a transformers checkpoint written as llama.cpp's ``convert_hf_to_gguf.py``
writes it (metadata keys, tensor names, layouts and tokenizer), its weights as lowbit's plan says.

The rules, learnt from llama.cpp's converter and checked against what it wrote for tiny models
(``tests/fixtures/llamacpp/convert/``):

- names and layouts per family: :mod:`lowbit.checkpoints.gguf.arch` (llama's q/k rows reordered,
  Gemma's norms stored as ``w + 1`` in float32, the mixtures' experts stacked into
  ``ffn_*_exps``: a block's stacks are written together, in the family's order, where the
  block's last expert tensor comes);
- types: 1-D tensors, ``*_norm.weight``, the MoE router ``ffn_gate_inp`` and Qwen2-MoE's
  shared-expert gate ``ffn_gate_inp_shexp`` are F32; kept
  tensors stay in their stored float type; cast ones take the plan's (``--to bf16`` gives
  llama.cpp's ``--outtype bf16`` file); quantized ones Q4_0 / Q8_0;
- metadata: ``general.*`` from the ``gguf`` package's own ``Metadata`` heuristics (name from the
  folder, size label from the parameter count), the family's hyperparameters under
  ``<arch>.*``, and the tokenizer (:func:`lowbit.checkpoints.gguf.tokenizer.add_hf_vocab`).

Each tensor is read, transformed and written one at a time (peak memory about one tensor; an
expert stack, about one stack).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from lowbit.checkpoints import steps as qw
from lowbit.checkpoints.config_checks import check_config
from lowbit.checkpoints.gguf import writer as gguf_writer
from lowbit.checkpoints.gguf.arch import Family, check_moe_config, family_for, permute_qk
from lowbit.checkpoints.gguf.card_files import check_card_files
from lowbit.checkpoints.gguf.checks import GGUF_Q, _gguf_exact
from lowbit.checkpoints.gguf.hf_config import converter_config
from lowbit.checkpoints.gguf.hparams import add_hparams, phi3_rope_factors, rope_factors
from lowbit.checkpoints.gguf.tokenizer import _read_tokenizer, add_hf_vocab, check_hf_tokenizer
from lowbit.checkpoints.gguf.writer import GGUFTensor, _Raw, gguf_from_quantized
from lowbit.checkpoints.shape_checks import check_checkpoint_shapes
from lowbit.errors import LowbitError
from lowbit.plans.plan import AppliedPlan, TensorPlan
from lowbit.quant.tensor import quantize

__all__ = ["check_hf_source", "hf_family", "hf_metadata", "write_gguf_from_hf"]

_SKIPPED = (".rotary_emb.inv_freq",)  # buffers the converter drops
_CAST = {"float32": "F32", "float16": "F16", "bfloat16": "BF16"}


def hf_family(checkpoint: Any) -> Family:
    """The family of a Hugging Face checkpoint (from its config's ``model_type``).

    Raises:
        LowbitError: no config, a model type lowbit does not convert (supported ones named), or
            a mixture's config llama.cpp cannot run
            (:func:`lowbit.checkpoints.gguf.arch.check_moe_config`).
    """
    cfg = checkpoint.config or {}
    if not cfg:
        raise LowbitError(f"{checkpoint.path}: no config.json, so it cannot be written as GGUF")
    fam = family_for(cfg.get("model_type"))
    try:
        check_moe_config(fam, cfg)
    except LowbitError as exc:
        raise LowbitError(f"{checkpoint.path}: {exc}") from None
    names = checkpoint.names() if hasattr(checkpoint, "names") else None
    if fam.arch == "qwen2moe" and names is not None and "lm_head.weight" not in names:
        # the converter writes such a file, but llama.cpp's qwen2moe loader requires output.weight
        raise LowbitError(
            f"{checkpoint.path}: a Qwen2-MoE with tied embeddings (no lm_head.weight) has no GGUF "
            f"llama.cpp loads (its qwen2moe models need their own output.weight)"
        )
    return fam


def _folder(checkpoint: Any) -> Path:
    p = Path(checkpoint.path)
    return p if p.is_dir() else p.parent


@dataclass
class _Source:
    """One GGUF tensor and the checkpoint tensors it is made of (several for an expert stack)."""

    name: str
    members: list[TensorPlan] = field(default_factory=list)
    transform: Callable[[np.ndarray], np.ndarray] | None = None
    fixed: np.ndarray | None = None  # a tensor the converter computes (Llama 3's rope factors)
    rows: int | None = None  # rows kept (Gemma 3's embedding loses its out-of-vocabulary rows)


def _sources(checkpoint: Any, applied: AppliedPlan, fam: Family) -> dict[str, _Source]:
    """GGUF name -> its source tensors, in the order the converter writes them (checkpoint
    order; a block's expert stacks, in the family's order, where its last expert comes)."""
    cfg = converter_config(checkpoint.config or {})
    n_head = int(cfg.get("num_attention_heads", 0) or 0)
    n_kv = int(cfg.get("num_key_value_heads") or n_head)
    shift = fam.norm_shift
    out: dict[str, _Source] = {}
    factors = rope_factors(cfg) if fam.arch == "llama" else None
    if factors is not None:  # the converter writes it first
        out["rope_freqs.weight"] = _Source("rope_freqs.weight", fixed=factors)
    phi3 = phi3_rope_factors(cfg) if fam.arch == "phi3" else None
    if phi3 is not None:  # so are Phi-3's long-context factors
        for key, arr in (
            ("rope_factors_long.weight", phi3[1]),
            ("rope_factors_short.weight", phi3[2]),
        ):
            out[key] = _Source(key, fixed=arr)
    n_experts = check_moe_config(fam, cfg)
    # block -> GGUF stack -> {expert: tensor}, until the block has all its experts
    blocks: dict[int, dict[str, dict[int, TensorPlan]]] = {}
    for t in applied.tensors:
        if t.name.endswith(_SKIPPED) or (fam.arch == "gemma2" and t.name == "lm_head.weight"):
            continue  # the converter drops Gemma 2's lm_head (tied; AutoAWQ files carry one)
        gname = fam.to_gguf(t.name)
        found = fam.expert_of(t.name) if gname is None else None
        if found is not None:
            layer, expert, stack = found
            if expert >= n_experts:
                raise LowbitError(
                    f"{checkpoint.path}: {t.name} is expert {expert}, but the config has "
                    f"{n_experts} experts"
                )
            block = blocks.setdefault(layer, {})
            block.setdefault(stack, {})[expert] = t
            if sum(map(len, block.values())) == n_experts * len(fam.experts):
                for _, gg in fam.experts:
                    key = f"blk.{layer}.{gg}"
                    out[key] = _Source(key, [block[gg][e] for e in range(n_experts)])
                blocks[layer] = {}
            continue
        if gname is None:
            raise LowbitError(
                f"{checkpoint.path}: tensor {t.name!r} has no GGUF name in llama.cpp's "
                f"{fam.arch} layout"
            )
        src = _Source(gname, [t])
        if fam.permute_qk and gname.endswith(("attn_q.weight", "attn_q.bias")):
            src.transform = lambda a, h=n_head: permute_qk(a, h)
        elif fam.permute_qk and gname.endswith(("attn_k.weight", "attn_k.bias")):
            src.transform = lambda a, h=n_kv: permute_qk(a, h)
        elif shift and gname.endswith("norm.weight"):
            src.transform = lambda a: np.asarray(a, dtype=np.float32) + np.float32(shift)
        elif fam.arch == "gemma3" and gname == "token_embd.weight":
            n = _gemma3_vocab_rows(checkpoint)
            if n < t.shape[0]:
                src.rows = n
                src.transform = lambda a, n=n: a[:n]
        out[gname] = src
    for layer, block in blocks.items():
        if block:
            raise LowbitError(
                f"{checkpoint.path}: block {layer} lacks some of its {n_experts} experts' "
                f"{', '.join(p for p, _ in fam.experts)} tensors"
            )
    return out


def _gemma3_vocab_rows(checkpoint: Any) -> int:
    """The embedding rows llama.cpp's converter keeps for Gemma 3: the tokenizer.json's
    vocabulary plus its added tokens (counted again even when in the vocabulary, as there)."""
    # one line for a missing or broken file (tokenizers checked the vocabulary's types)
    _, doc = _read_tokenizer(_folder(checkpoint))
    return len(doc["model"]["vocab"]) + len(doc.get("added_tokens") or [])


def _forced_f32(name: str, ndim: int) -> bool:
    """Tensors llama.cpp's converter always writes as F32."""
    return (
        ndim <= 1
        or name.endswith("_norm.weight")
        or name.endswith((".ffn_gate_inp.weight", ".ffn_gate_inp_shexp.weight"))
    )


def _gguf_type(src: _Source) -> str:
    """The GGUF type of a tensor from its members' plan."""
    if src.fixed is not None:
        return "F32"
    first = src.members[0]
    if any((m.action, m.scheme, m.cast) != (first.action, first.scheme, first.cast)
           for m in src.members):  # fmt: skip
        raise LowbitError(
            f"{src.name}: its experts are planned differently ({first.label} and others); "
            f"GGUF stores them as one tensor of one type"
        )
    ndim = len(first.shape) + (len(src.members) > 1)
    if first.action == "quantize":
        assert first.scheme is not None
        return GGUF_Q[first.scheme.element_format.bits]
    if _forced_f32(src.name, ndim):
        return "F32"
    if first.action == "cast":
        return _CAST[str(first.cast)]
    return first.dtype if first.dtype in ("F32", "F16", "BF16") else "F32"


def _shape(src: _Source) -> tuple[int, ...]:
    if src.fixed is not None:
        return tuple(src.fixed.shape)
    shape = tuple(src.members[0].shape)
    if src.rows is not None:
        shape = (src.rows, *shape[1:])
    return (len(src.members), *shape) if len(src.members) > 1 else shape


def _one(
    checkpoint: Any, src: _Source, t: TensorPlan, gtype: str, rounding: str,
    done: Mapping[str, Any] | None,
) -> Any:  # fmt: skip
    """One member's values as the writer takes them: a QuantizedTensor in a Q4_0/Q8_0 layout,
    or an array (F32/F16/BF16, or float32 for llama.cpp's own rounding)."""
    if t.action == "quantize" and done is not None and t.name in done:
        qt = done[t.name]
        if not _gguf_exact(qt.scheme):
            raise LowbitError(f"{t.name}: {qt.scheme.label} is not a GGUF block type")
        return qt if src.transform is None else qw.rows_permuted(qt, src.transform)
    checkpoint.close()
    want = _DTYPES.get(gtype)
    if t.action == "cast" and gtype != "F32" and t.dtype != gtype:
        arr = qw.read_cast(checkpoint, t)  # checks that values fit float16
    else:
        arr = checkpoint.get(t.name)
    if src.transform is not None:
        arr = src.transform(arr)
    if t.action == "quantize":
        if rounding == "auto" and _gguf_exact(t.scheme):
            return quantize(arr, t.scheme)
        return np.asarray(arr, dtype=np.float32)
    arr = np.asarray(arr)
    if arr.dtype.name != want:
        arr = arr.astype(np.float32) if want == "float32" else arr.astype(np.float32).astype(want)
    return _raw(arr)


_DTYPES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}


def _raw(arr: np.ndarray) -> np.ndarray:
    """An array already in its GGUF type as the writer's raw bytes (no second conversion)."""
    a = np.ascontiguousarray(arr)
    return a.view(np.uint8).reshape(*a.shape[:-1], a.shape[-1] * a.itemsize) if a.ndim else a


def _value(checkpoint: Any, src: _Source, rounding: str, done: Mapping[str, Any] | None) -> Any:
    gtype = _gguf_type(src)
    if src.fixed is not None:
        return GGUFTensor(src.fixed, gtype)
    parts = [_one(checkpoint, src, t, gtype, rounding, done) for t in src.members]
    if len(parts) == 1:
        v = parts[0]
        if not isinstance(v, np.ndarray):
            return v
        return GGUFTensor(v, gtype, raw=v.dtype == np.uint8)
    if gtype in GGUF_Q.values():  # stack each expert's blocks: rows are independent
        raws = [
            np.asarray((p if isinstance(p, GGUFTensor) else gguf_from_quantized(p)).data)
            if not isinstance(p, np.ndarray)
            else np.asarray(gguf_writer._plan("x", GGUFTensor(p, gtype)).produce())
            for p in parts
        ]
        return GGUFTensor(np.stack(raws), gtype, raw=True)
    return GGUFTensor(np.stack([np.asarray(p) for p in parts]), gtype, raw=True)


def check_hf_source(checkpoint: Any) -> Family:
    """The family of a Hugging Face source for GGUF output, after checking its tokenizer folder.

    Raises:
        LowbitError: an unsupported family (the supported ones named), or a tokenizer lowbit
            cannot store as llama.cpp does (see
            :func:`lowbit.checkpoints.gguf.tokenizer.check_hf_tokenizer`).
    """
    fam = hf_family(checkpoint)
    check_hf_config(checkpoint)
    check_card_files(_folder(checkpoint))  # before the gguf package's readers see them
    check_hf_tokenizer(_folder(checkpoint))
    return fam


def check_hf_config(checkpoint: Any) -> None:
    """The config as the converter sees it, field by field and against the tensors, before
    anything is sized from it (:func:`lowbit.checkpoints.config_checks.check_config`).

    Raises:
        LowbitError: the first field out of its type, range or relations.
    """
    names = checkpoint.names()
    cfg = converter_config(checkpoint.config or {})
    for key in ("hidden_size", "num_attention_heads", "num_hidden_layers"):
        if cfg.get(key) is None:  # null: transformers' class keeps it, the converter needs it
            raise LowbitError(f"{_folder(checkpoint) / 'config.json'}: {key} is null or absent")
    check_config(
        cfg,
        f"{_folder(checkpoint) / 'config.json'}",
        tensors=((n, tuple(checkpoint.info(n).shape)) for n in names),
        per_layer=False,
    )
    check_checkpoint_shapes(checkpoint)


def write_gguf_from_hf(
    checkpoint: Any,
    applied: AppliedPlan,
    out: Path,
    overwrite: bool,
    progress: bool | None,
    rounding: str,
    done: Mapping[str, Any] | None = None,
) -> None:
    """Write a Hugging Face checkpoint as a GGUF file llama.cpp runs (see the module docstring).

    Tensors in ``done`` (name -> QuantizedTensor in a Q4_0/Q8_0 layout, e.g. GPTQ's) are
    stored as they are (q/k rows reordered like the weights).

    Raises:
        LowbitError: an unsupported family, a tensor with no GGUF name, experts planned
            differently, or what :func:`lowbit.checkpoints.gguf.writer.write_gguf` raises.
    """
    fam = hf_family(checkpoint)  # the tokenizer was checked when planning, and is read below
    check_hf_config(checkpoint)  # before any size is taken from it
    srcs = _sources(checkpoint, applied, fam)
    shapes = {name: _shape(s) for name, s in srcs.items()}
    metadata = hf_metadata(checkpoint, fam, shapes)
    planned: set[str] = set()

    def make(name: str) -> Any:
        src = srcs[name]
        if name not in planned:  # the writer's first look: type and shape only
            planned.add(name)
            return GGUFTensor(np.broadcast_to(np.float32(0), shapes[name]), _gguf_type(src))
        return _value(checkpoint, src, rounding, done)

    gguf_writer.write_gguf(
        out,
        qw.LazyMapping(list(srcs), make),
        metadata=metadata,
        arch=fam.arch,
        overwrite=overwrite,
        progress=progress,
    )


# ------------------------------------------------------------------------------ metadata


def _parameter_counts(shapes: Mapping[str, tuple[int, ...]]) -> tuple[int, int, int, int]:
    """(total, shared, per-expert, experts) as the ``gguf`` writer counts a file's parameters."""
    total = shared = expert = expert_sum = n_exp = 0
    for name, shape in shapes.items():
        size = int(np.prod(shape, dtype=np.int64))
        if "_exps." in name and len(shape) >= 3:
            count = shape[-2 if ".bias" in name else -3]
            expert += size // count
            expert_sum += count
            n_exp += 1
        else:
            shared += size
        total += size
    return total, shared, expert, (expert_sum // n_exp) if n_exp else 0


def hf_metadata(
    checkpoint: Any, fam: Family, shapes: Mapping[str, tuple[int, ...]]
) -> dict[str, Any]:
    """Every GGUF metadata key llama.cpp's converter writes for this checkpoint (except
    ``general.file_type``, which the writer derives from the tensors), as typed
    ``gguf.GGUFValue`` s: ``general.*``, ``<arch>.*`` hyperparameters, ``tokenizer.*``."""
    import gguf

    folder = _folder(checkpoint)
    check_card_files(folder)  # bounded and typed before SpecialVocab and Metadata.load
    cfg = converter_config(checkpoint.config or {})
    w = gguf.GGUFWriter(path=None, arch=fam.arch)
    w.add_type(gguf.GGUFType.MODEL)
    total, shared, expert, n_exp = _parameter_counts(shapes)
    meta = gguf.Metadata.load(None, folder, None, total)
    if meta.name is None:
        meta.name = folder.name
    if meta.size_label is None and total > 0:
        meta.size_label = gguf.size_label(total, shared, expert, n_exp)
    meta.set_gguf_meta_model(w)
    add_hparams(w, fam, cfg)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    add_hf_vocab(w, folder, cfg.get("vocab_size"))
    if fam.arch == "llama" and cfg.get("vocab_size", 32000) == 49152:
        w.add_add_bos_token(False)  # the converter's rule for granite-small-sized vocabularies
    kv = {k: _packed(v) for k, v in w.kv_data[0].items()}
    kv.pop("general.architecture", None)
    kv.pop("general.file_type", None)
    return kv


def _packed(value: Any) -> Any:
    """A long string or int32 array as its GGUF bytes, packed here in one pass: the ``gguf``
    package packs each item with a Python call (seconds for a 49,152-token vocabulary)."""
    import gguf
    from gguf.gguf_writer import GGUFValue

    items = value.value
    if value.type != gguf.GGUFValueType.ARRAY or len(items) < 1024:
        return value
    if all(type(x) is str for x in items):
        enc = [x.encode("utf-8") for x in items]
        lengths = np.fromiter(map(len, enc), dtype="<u8", count=len(enc))
        body = b"".join(n + b for n, b in zip(_split8(lengths), enc, strict=True))
        head = struct.pack("<IQ", int(gguf.GGUFValueType.STRING), len(items))
        return GGUFValue(_Raw(head + body), value.type, value.sub_type)
    if all(type(x) is int for x in items):
        arr = np.asarray(items, dtype=np.int64)
        if arr.min() >= -(2**31) and arr.max() < 2**31:
            head = struct.pack("<IQ", int(gguf.GGUFValueType.INT32), len(items))
            return GGUFValue(_Raw(head + arr.astype("<i4").tobytes()), value.type, value.sub_type)
    return value


def _split8(lengths: np.ndarray) -> list[bytes]:
    """Each length as its 8 little-endian bytes."""
    raw = lengths.astype("<u8").tobytes()
    return [raw[i : i + 8] for i in range(0, len(raw), 8)]
