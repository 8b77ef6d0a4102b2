"""Write an MLX folder that ``mlx_lm.load`` reads, with the tensors ``mlx_lm.convert -q`` writes.

Byte for byte (``lowbit.quant.mlx`` is MLX's CPU quantizer).

As mlx-lm does: every float tensor is cast to the model dtype (config.json's ``torch_dtype``,
else the source's own float dtype), then each 2-D ``<path>.weight`` whose rows are whole groups
(the linear layers and the embedding, which a tied model also uses as its output layer) is
quantized; ``lm_head.weight`` of a tied model and rotary ``inv_freq`` buffers are dropped. A
GGUF source is renamed to transformers names, its q/k rows put back in transformers' order and
its tokenizer written beside. The experts of a mixture (Mixtral, Qwen2-MoE, Qwen3-MoE) are
stacked into mlx-lm's ``switch_mlp`` tensors (``lowbit.checkpoints.mlx.experts``), one layer's
projection at a time.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from lowbit._arrays import ml_dtype
from lowbit._progress import progress_bar
from lowbit.checkpoints._model_files import ModelFiles
from lowbit.checkpoints.gguf.names import gguf_to_hf_array, gguf_to_hf_name
from lowbit.checkpoints.io import safetensors_write as st
from lowbit.checkpoints.io.atomic import atomic_dir
from lowbit.checkpoints.io.outputs import writer_metadata
from lowbit.checkpoints.mlx.experts import MOE_FAMILIES, family_entry, layout
from lowbit.checkpoints.mlx.params import MLXParams
from lowbit.checkpoints.tokenizer import write_tokenizer
from lowbit.errors import LowbitError
from lowbit.quant import mlx as Q

__all__ = ["MLX_DTYPES", "MLX_FAMILIES", "write_mlx"]

#: model families whose MLX folders are checked against mlx_lm.convert's (same tensors, same
#: config.json; tests/checkpoints/test_mlx_folders.py): mlx-lm keeps their transformers names
#: and gives them no quantization predicate of their own
MLX_FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "gemma3_text", "phi3", *MOE_FAMILIES)

#: the model dtypes mlx-lm converts to (``mlx_lm.convert``'s MODEL_CONVERSION_DTYPES)
MLX_DTYPES = ("float16", "bfloat16", "float32")
_ST = {"F16": "float16", "BF16": "bfloat16", "F32": "float32"}
DEFAULT_SHARD = 5 * 2**30  # mlx-lm's make_shards: 5 GB files


def model_dtype(ckpt: Any, dtype: str | None = None) -> np.dtype:
    """The dtype every float tensor is cast to: ``dtype``, else config.json's ``torch_dtype``
    (or ``dtype``), else the first float tensor's stored dtype; float16 for a GGUF whose
    weights are blocks (llama.cpp's own float outtype)."""
    cfg = ckpt.config or {}
    name = dtype or cfg.get("torch_dtype") or cfg.get("dtype")
    if name is None:
        stored = [_ST.get(ckpt.info(n).dtype) for n in ckpt.names()]
        name = next((s for s in stored if s is not None and s != "float32"), None)
        name = name or ("float16" if ckpt.format == "gguf" else "float32")
    if name not in MLX_DTYPES:
        raise LowbitError(f"MLX model dtype {name!r}; allowed: {', '.join(MLX_DTYPES)}")
    return np.dtype(ml_dtype("bfloat16")) if name == "bfloat16" else np.dtype(name)


_INTS = {"I8": np.int8, "I16": np.int16, "I32": np.int32, "I64": np.int64, "U8": np.uint8,
         "U16": np.uint16, "U32": np.uint32, "U64": np.uint64, "BOOL": np.bool_}  # fmt: skip


def _is_float(ckpt: Any, name: str) -> bool:
    """Stored as floats, or as blocks and codes that read back as floats (GGUF, quantized
    folders): everything but integers and booleans."""
    return ckpt.info(name).dtype not in _INTS


class _Plan:
    """The output's tensors: (out name, first source name, kind) in source order, the sources
    of each stack of experts, and each quantized module's params."""

    def __init__(
        self,
        ckpt: Any,
        params: MLXParams,
        modules: Mapping[str, MLXParams | None],
    ) -> None:
        cfg = ckpt.config or {}
        family = cfg.get("model_type")
        if family not in MLX_FAMILIES:
            raise LowbitError(
                f"model_type {family!r}: lowbit's MLX output is checked against mlx-lm for "
                f"{', '.join(MLX_FAMILIES)}; other families (their own names or quantization "
                "choices in mlx-lm) are not written yet"
            )
        self.is_gguf = ckpt.format == "gguf"
        self.cfg = cfg
        self.quantized: dict[str, MLXParams] = {}
        self.entries: list[tuple[str, str, str]] = []  # (out name, source name, kind)
        self.stacks: dict[str, tuple[str, ...]] = {}  # out name -> every expert's source
        self.config_entries: dict[str, dict[str, Any]] = {}  # a family's own entries
        tied = bool(cfg.get("tie_word_embeddings", False))
        for hf, srcs in output_layout(ckpt):
            n = srcs[0]
            if "rotary_emb.inv_freq" in hf or (tied and hf == "lm_head.weight"):
                continue
            shape = tuple(ckpt.info(n).shape)
            stacked = len(srcs) > 1 or ".switch_mlp." in hf
            if stacked:
                self.stacks[hf] = srcs
            module = hf[: -len(".weight")] if hf.endswith(".weight") else None
            p = modules.get(module, params) if module is not None else None
            own = family_entry(module, cfg) if module is not None else None
            if own is not None and module not in modules:
                p, self.config_entries[module] = own  # type: ignore[index]
            if (
                p is not None
                and len(shape) == 2
                and _is_float(ckpt, n)
                and shape[-1] % p.group_size == 0  # type: ignore[operator]
                # mlx-lm's test of the default groups (a module given its own grid: its own)
                and (module in modules or shape[-1] % params.group_size == 0)  # type: ignore[operator]
            ):
                self.quantized[module] = p  # type: ignore[index]
                self.entries.append((hf, n, "weight"))
            else:
                self.entries.append((hf, n, "plain"))
                self.config_entries.pop(module, None)  # type: ignore[arg-type]

    def shape(self, ckpt: Any, hf: str, src: str) -> tuple[int, ...]:
        """An output tensor's shape: a stack's is ``[experts, *expert shape]``."""
        shape = tuple(int(v) for v in ckpt.info(src).shape)
        return (len(self.stacks[hf]), *shape) if hf in self.stacks else shape


def output_layout(ckpt: Any) -> list[tuple[str, tuple[str, ...]]]:
    """The output's tensor names (transformers names, experts stacked as mlx-lm's
    ``switch_mlp``) with their source tensors; see :func:`lowbit.checkpoints.mlx.experts.layout`."""
    cfg = ckpt.config or {}
    if ckpt.format == "gguf":
        names = {gguf_to_hf_name(n, cfg): n for n in ckpt.names()}
        return [(hf, tuple(names[s] for s in srcs)) for hf, srcs in layout(list(names), cfg)]
    return layout(ckpt.names(), cfg)


def write_mlx(
    ckpt: Any,
    out: str | Path,
    params: MLXParams,
    *,
    modules: Mapping[str, MLXParams | None] | None = None,
    dtype: str | None = None,
    files: ModelFiles | None = None,
    overwrite: bool = False,
    progress: bool | None = None,
    max_shard_size: int | None = None,
    done: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Write ``ckpt`` as an MLX folder quantized with ``params``.

    Args:
        ckpt: an open checkpoint (Hugging Face folder, safetensors, GGUF).
        out: the folder to write (swapped in complete; see ``lowbit.checkpoints.io.outputs``).
        params: the default quantization (``MLXParams()``: affine, 4 bits, groups of 64).
        modules: module path -> its own params (mixed recipes) or None (kept in the model dtype).
        dtype: the model dtype (default: config.json's, see :func:`model_dtype`).
        files: the source's files to copy (tokenizer, generation config); config.json is
            written anew.
        overwrite: replace an existing folder that lowbit wrote.
        progress: a progress bar (None: only on a terminal).
        max_shard_size: bytes per safetensors file (default 5 GiB, mlx-lm's).
        done: source tensor name -> a weight already on its module's grid (GPTQ's
            :class:`~lowbit.methods._mlx_gptq.MLXQuantized`, a GGUF source's q/k rows in
            llama.cpp's order), written as it is; the others are rounded to nearest.

    Returns:
        ``{"quantized": {module: params dict}, "dtype", "files": [names written]}``.

    Raises:
        LowbitError: a mixture of experts, an unknown dtype, a weight with NaN or infinite
            values, an output that exists (without ``overwrite``) or that lowbit did not write.
    """
    plan = _Plan(ckpt, params, dict(modules or {}))
    dt = model_dtype(ckpt, dtype)
    cfg = dict(plan.cfg)
    qblock: dict[str, Any] = params.to_dict()
    for m, p in (modules or {}).items():
        if m in plan.quantized:
            qblock[m] = p.to_dict()  # type: ignore[union-attr]
        elif p is None:
            qblock[m] = False
    qblock.update(plan.config_entries)
    cfg["quantization"] = qblock
    cfg["quantization_config"] = dict(qblock)
    cfg.pop("_name_or_path", None)
    if "torch_dtype" in cfg or plan.is_gguf:
        cfg["torch_dtype"] = "bfloat16" if dt == ml_dtype("bfloat16") else dt.name
    entries = _entries(ckpt, plan, dt, dict(done or {}))
    shards = _shards(entries, max_shard_size or DEFAULT_SHARD)
    names = (
        ["model.safetensors"]
        if len(shards) == 1
        else [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    )
    with tempfile.TemporaryDirectory() as extra:
        copies = _copies(ckpt, files, Path(extra))
        written = [*names, "model.safetensors.index.json", "config.json", *(f.name for f in copies)]
        meta = {"format": "mlx", **writer_metadata(written)}
        with atomic_dir(out, overwrite=overwrite) as tmp:
            with progress_bar(len(entries), progress, f"writing {Path(out).name}", "tensor") as bar:
                for fname, shard in zip(names, shards, strict=True):
                    st.write_file(tmp / fname, shard, meta, on_tensor=lambda e: bar.update(1))
            index = {
                "metadata": {"total_size": sum(e.nbytes for e in entries)},
                "weight_map": {e.name: f for f, s in zip(names, shards, strict=True) for e in s},
            }
            index["weight_map"] = dict(sorted(index["weight_map"].items()))
            (tmp / "model.safetensors.index.json").write_text(json.dumps(index, indent=4))
            (tmp / "config.json").write_text(json.dumps(cfg, indent=4, sort_keys=True))
            for f in copies:
                shutil.copyfile(f, tmp / f.name)
    return {
        "quantized": {m: p.to_dict() for m, p in plan.quantized.items()},
        "dtype": "bfloat16" if dt == ml_dtype("bfloat16") else dt.name,
        "files": written,
    }


def _copies(ckpt: Any, files: ModelFiles | None, extra: Path) -> list[Path]:
    """Top-level model files to copy (config.json excepted); a GGUF's tokenizer, written."""
    if ckpt.format == "gguf":
        try:
            write_tokenizer(ckpt, extra)
        except (LowbitError, OSError, ValueError, KeyError) as exc:
            warnings.warn(
                f"{ckpt.path.name}: no tokenizer written ({exc})", UserWarning, stacklevel=3
            )
        return sorted(p for p in extra.iterdir() if p.is_file())
    return [
        f for f, rel in (files.copied if files else ()) if "/" not in rel and rel != "config.json"
    ]


def _entries(ckpt: Any, plan: _Plan, dt: np.dtype, done: dict[str, Any]) -> list[st.Entry]:
    cache: dict[str, tuple[np.ndarray, ...]] = {}

    def values(hf: str, src: str) -> np.ndarray:
        ckpt.close()  # unmap the previous tensor's pages
        arr = ckpt.get(src)
        if plan.is_gguf:
            arr = gguf_to_hf_array(hf, np.asarray(arr), plan.cfg)
        arr = np.asarray(arr)
        if arr.dtype.kind == "f" or arr.dtype == ml_dtype("bfloat16"):
            if arr.dtype == dt:
                return arr
            with np.errstate(over="ignore"):
                out = arr.astype(np.float32).astype(dt)
            if not np.isfinite(out).all() and np.isfinite(arr.astype(np.float32)).all():
                raise LowbitError(
                    f"tensor {hf!r}: values overflow the model dtype {dt}; pass --dtype "
                    "bfloat16 or float32"
                )
            return out
        return arr

    def one(module: str, hf: str, src: str) -> tuple[np.ndarray, ...]:
        if src in done:
            return _given(done[src], plan.quantized[module], dt, hf, plan)
        p = plan.quantized[module]
        try:
            got = Q.quantize(values(hf, src), mode=p.mode, group_size=p.group_size, bits=p.bits)
            return tuple(a for a in got if a is not None)
        except LowbitError as exc:
            raise LowbitError(f"tensor {hf!r}: {exc}") from None

    def stacked(module: str, hf: str) -> tuple[np.ndarray, ...]:
        """Every expert quantized in turn into the stack's arrays (one expert's floats at a
        time; mlx-lm quantizes the stack along its last axis, which is the same)."""
        srcs = plan.stacks[hf]
        parts: list[np.ndarray] = []
        for e, src in enumerate(srcs):
            got = one(module, hf, src)
            if not parts:
                parts = [np.empty((len(srcs), *a.shape), a.dtype) for a in got]
            for whole, a in zip(parts, got, strict=True):
                whole[e] = a
        return tuple(parts)

    def quantized(module: str, hf: str, src: str, part: int) -> Callable[[], np.ndarray]:
        def make() -> np.ndarray:
            if module not in cache:
                cache.clear()  # one module's arrays at a time
                cache[module] = stacked(module, hf) if hf in plan.stacks else one(module, hf, src)
            return cache[module][part]

        return make

    def plain_stack(hf: str) -> Callable[[], np.ndarray]:
        def make() -> np.ndarray:
            arrays = [values(hf, src) for src in plan.stacks[hf]]
            return np.stack(arrays)

        return make

    out: list[st.Entry] = []
    for hf, src, kind in plan.entries:
        shape = plan.shape(ckpt, hf, src)
        if kind == "plain":
            sdt = st_dtype(ckpt, src, dt)
            make = plain_stack(hf) if hf in plan.stacks else lambda hf=hf, src=src: values(hf, src)
            out.append(st.Entry(hf, sdt, shape, make))
            continue
        module = hf[: -len(".weight")]
        p = plan.quantized[module]
        *lead, n = shape
        out.append(st.Entry(hf, np.dtype(np.uint32), (*lead, n * p.bits // 32),  # type: ignore[operator]
                            quantized(module, hf, src, 0)))  # fmt: skip
        sdt = dt if p.has_biases else np.dtype(np.uint8)
        sshape = (*lead, n // p.group_size)  # type: ignore[operator]
        out.append(st.Entry(f"{module}.scales", sdt, sshape, quantized(module, hf, src, 1)))
        if p.has_biases:
            out.append(st.Entry(f"{module}.biases", dt, sshape, quantized(module, hf, src, 2)))
    return out


def _given(qt: Any, p: MLXParams, dt: np.dtype, hf: str, plan: _Plan) -> tuple[np.ndarray, ...]:
    """A weight quantized elsewhere (GPTQ), checked against the plan; q/k rows of a GGUF
    source put in transformers' order (rows of words, scales and biases alike)."""
    if (qt.bits, qt.group_size) != (p.bits, p.group_size) or qt.scales.dtype != dt:
        raise LowbitError(
            f"tensor {hf!r}: the given weight is {qt.bits}-bit g{qt.group_size} "
            f"{qt.scales.dtype}, not {p.label} {dt} as planned"
        )
    arrays = (qt.words, qt.scales, qt.biases)
    if plan.is_gguf:
        arrays = tuple(np.ascontiguousarray(gguf_to_hf_array(hf, a, plan.cfg)) for a in arrays)
    return arrays


def st_dtype(ckpt: Any, name: str, dt: np.dtype) -> np.dtype:
    """A kept tensor's stored dtype: the model dtype for floats, else its own."""
    d = ckpt.info(name).dtype
    return dt if d not in _INTS else np.dtype(_INTS[d])


def _shards(entries: list[st.Entry], limit: int) -> list[list[st.Entry]]:
    """mlx-lm's make_shards: a new file when the next tensor would pass the limit."""
    shards: list[list[st.Entry]] = [[]]
    size = 0
    for e in entries:
        if shards[-1] and size + e.nbytes > limit:
            shards.append([])
            size = 0
        shards[-1].append(e)
        size += e.nbytes
    return shards
