"""A :class:`~lowbit.planning.modelspec.ModelSpec` counted from checkpoint headers.

Safetensors files or folders (shards from the index) and GGUF files, read header-only
(:mod:`lowbit.planning.headers`: no tensor data); the architecture numbers come from a
``config.json`` beside the safetensors or from the GGUF metadata.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

from lowbit import _json
from lowbit._json import check_regular_file
from lowbit.errors import LowbitError
from lowbit.planning._arch_config import spec_from_config
from lowbit.planning.headers import read_gguf_header, read_safetensors_header
from lowbit.planning.modelspec import ModelSpec, TensorInfo, _with_use

__all__ = ["spec_from_checkpoint"]


def _gguf_spec(path: Path) -> ModelSpec:
    tensors, meta = read_gguf_header(path)
    arch = str(meta.get("general.architecture", "")) or None

    def m(key: str) -> int | None:
        v = meta.get(f"{arch}.{key}")
        if isinstance(v, list):  # per-layer values (some archs): take the first
            v = v[0] if v else None
        return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None

    h, n_heads = m("embedding_length"), m("attention.head_count")
    kv_heads = m("attention.head_count_kv") or n_heads
    head_dim = m("attention.key_length") or (h // n_heads if h and n_heads else None)
    vocab = m("vocab_size") or meta.get("tokenizer.ggml.tokens")
    n_exp, k_exp = m("expert_count"), m("expert_used_count")
    names = {t.name for t in tensors}
    tied = "output.weight" not in names
    is_decoder = arch not in ("bert", "nomic-bert", "jina-bert-v2", "t5encoder")
    inter = m("feed_forward_length") or m("expert_feed_forward_length")
    notes = []
    if tied and is_decoder:
        notes.append("no output.weight: lm_head tied to token_embd")
    return ModelSpec(
        name=str(meta.get("general.name") or path.stem),
        source="gguf",
        tensors=_with_use(tensors, tied=tied, is_decoder=is_decoder,
                          expert_use=(k_exp / n_exp) if n_exp and k_exp else None),
        architecture=arch,
        n_layers=m("block_count"),
        hidden_size=h,
        n_heads=n_heads,
        n_kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=inter,
        active_intermediate=(k_exp * inter if n_exp and k_exp and inter else inter),
        vocab_size=int(vocab) if isinstance(vocab, int) else None,
        gated_mlp=any(".ffn_gate" in n for n in names),
        is_decoder=is_decoder,
        tied_embeddings=tied,
        n_experts=n_exp,
        n_active_experts=k_exp,
        path=str(path),
        notes=tuple(notes),
    )  # fmt: skip


def _shard_files(folder: Path) -> list[Path]:
    """The shards an index names (a folder may also hold e.g. consolidated.safetensors)."""
    index = folder / "model.safetensors.index.json"
    if not index.exists():
        return sorted(folder.glob("*.safetensors"))

    doc = _json.load(index)
    weight_map = doc.get("weight_map") if isinstance(doc, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise LowbitError(f"malformed {index}: weight_map is not an object of file names")
    names = sorted(set(weight_map.values()))
    missing = [n for n in names if not (folder / n).exists()]
    if missing:
        raise LowbitError(f"{index} names shards that are not there: {', '.join(missing)}")
    return [folder / n for n in names]


def _mxfp4_as_weights(tensors: list[TensorInfo]) -> list[TensorInfo]:
    """gpt-oss's MXFP4 experts (``*_blocks`` ``[E, R, G, 16]`` uint8 with ``*_scales``
    ``[E, R, G]``) as the ``[E, R, G * 32]`` weights they hold, stored as ``MXFP4`` in the
    bytes of both (see ``lowbit.checkpoints.experts_view``)."""
    by_name = {t.name: t for t in tensors}
    out = []
    for t in tensors:
        if t.name.endswith("_scales") and t.name.removesuffix("_scales") + "_blocks" in by_name:
            continue  # counted with its blocks
        stem = t.name.removesuffix("_blocks")
        scales = by_name.get(stem + "_scales")
        if stem == t.name or scales is None or len(t.shape) != 4 or t.shape[-1] != 16:
            out.append(t)
            continue
        shape = (*t.shape[:-2], t.shape[-2] * 32)
        out.append(replace(t, name=stem, shape=shape, dtype="MXFP4",
                           nbytes=(t.nbytes or 0) + (scales.nbytes or 0)))  # fmt: skip
    return out


def _safetensors_spec(path: Path) -> ModelSpec:
    files = _shard_files(path) if path.is_dir() else [path]
    if not files:
        raise LowbitError(f"no *.safetensors files in {path}")
    tensors: list[TensorInfo] = []
    for f in files:
        tensors.extend(read_safetensors_header(f)[0])
    tensors = _mxfp4_as_weights(tensors)
    folder = path if path.is_dir() else path.parent
    notes: list[str] = []
    base: ModelSpec | None = None
    if (folder / "config.json").exists():
        try:
            base = spec_from_config(folder / "config.json")
        except LowbitError as exc:
            notes.append(f"config.json not used ({exc}); counted from the tensors")
    name = folder.name if path.is_dir() else path.stem
    if base is None:
        layers = {int(m.group(1)) for t in tensors if (m := re.search(r"layers?\.(\d+)\.", t.name))}
        tied = not any(t.component == "lm_head" for t in tensors)
        if not (folder / "config.json").exists():
            notes.append("no config.json: no KV cache or activation estimate")
        return ModelSpec(
            name=name,
            source="safetensors",
            tensors=_with_use(tensors, tied=tied, is_decoder=True, expert_use=None),
            n_layers=max(layers) + 1 if layers else None,
            tied_embeddings=tied,
            path=str(path),
            notes=tuple(notes),
        )
    expert_use = (
        base.n_active_experts / base.n_experts if base.n_experts and base.n_active_experts else None
    )
    counted = sum(t.numel for t in tensors if t.component != "buffer")
    if counted != base.params:
        notes.append(
            f"the tensors hold {counted:,} parameters, the config describes {base.params:,}: "
            "the tensors are used"
        )
    return replace(
        base,
        name=name,
        source="safetensors",
        tensors=_with_use(
            tensors,
            tied=bool(base.tied_embeddings),
            is_decoder=base.is_decoder,
            expert_use=expert_use,
        ),
        path=str(path),
        notes=base.notes + tuple(notes),
    )


def spec_from_checkpoint(path: str | Path) -> ModelSpec:
    """Count a checkpoint's parameters from its header(s): safetensors file or folder, GGUF.

    A ``config.json`` beside safetensors supplies the architecture numbers (layers, heads,
    KV heads); the parameter count always comes from the tensors. An unknown architecture in
    that config is noted and the tensors are used alone.

    Raises:
        LowbitError: not a checkpoint, or a malformed header.
        FileNotFoundError: the path does not exist.
    """
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(2, "No such file or directory", str(p))
    if p.is_dir():
        ggufs = sorted(p.glob("*.gguf"))
        if not list(p.glob("*.safetensors")) and len(ggufs) == 1:
            return _gguf_spec(ggufs[0])
        return _safetensors_spec(p)

    check_regular_file(p)  # a FIFO or device would hang the read below
    with open(p, "rb") as f:
        magic = f.read(4)
    if magic == b"GGUF":
        return _gguf_spec(p)
    if p.suffix == ".safetensors":
        return _safetensors_spec(p)
    raise LowbitError(f"{p} is not a checkpoint lowbit can count (safetensors or GGUF)")
