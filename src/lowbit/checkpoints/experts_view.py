"""Fused and MXFP4 mixture-of-experts tensors on disk, read as one 2-D weight per expert.

Two on-disk layouts hold a block's experts as 3-D tensors instead of one tensor per expert:

- *fused* (transformers 5's own state dict, written by ``save_pretrained`` for gpt-oss and by
  any ``save_file(model.state_dict())``): ``<base>.experts.gate_up_proj`` ``[E, 2I, H]`` and
  ``down_proj`` ``[E, H, I]``, or transposed ``[E, H, 2I]`` / ``[E, I, H]`` (gpt-oss), with
  optional ``gate_up_proj_bias`` ``[E, 2I]`` and ``down_proj_bias`` ``[E, H]``;
- *MXFP4* (OpenAI's gpt-oss release, ``quantization_config.quant_method: mxfp4``):
  ``<base>.experts.gate_up_proj_blocks`` ``[E, 2I, H/32, 16]`` uint8 and ``gate_up_proj_scales``
  ``[E, 2I, H/32]`` uint8 (``down_proj_*`` likewise over ``[E, H, I]``). Each row is an output
  feature (the layout of an ``nn.Linear`` weight); each group of 32 inputs is 16 bytes of
  E2M1 codes, element ``2k`` in the **low** nibble of byte ``k`` (byte ``0x21`` holds codes
  1 then 2: 0.5, 1.0), times ``2 ** (scale - 127)`` (the E8M0 byte; 255 is NaN).
  transformers' ``integrations.mxfp4.convert_moe_packed_tensors`` decodes the same way.

:class:`ExpertsView` presents either as per-expert weights under the names per-expert
checkpoints and vLLM use, ``<base>.experts.{e}.gate_proj.weight``, ``up_proj``, ``down_proj``
(and ``.bias``; Mixtral's ``block_sparse_moe.experts.{e}.w1`` / ``w3`` / ``w2``, as its
``save_pretrained`` writes them), so planning, round-to-nearest, GPTQ, AWQ and the writers quantize each
expert's 2-D slice as its own linear layer, and a lowbit or compressed-tensors output stores
per-expert names. The gate and up rows of ``gate_up_proj`` are either concatenated (gate rows
then up rows: transformers' default) or interleaved (gate0, up0, gate1, ...: gpt-oss, the
only family in transformers 5.24 whose experts say ``is_concatenated=False``). Whether a fused
pair is transposed follows from the two shapes alone (``[E, 2I, H]`` with ``[E, H, I]``, or
``[E, H, 2I]`` with ``[E, I, H]``).
"""

from __future__ import annotations

import functools
import re
from typing import Any

import numpy as np

from lowbit._arrays import ml_dtype
from lowbit.checkpoints.readers import Checkpoint, TensorInfo, as_dtype, readonly
from lowbit.codecs.packing import unpack
from lowbit.errors import LowbitError
from lowbit.formats import catalog

__all__ = ["INTERLEAVED_FAMILIES", "ExpertsView", "decode_mxfp4", "expert_slices", "has_fused"]

#: ``model_type`` of the families whose fused ``gate_up_proj`` interleaves gate and up rows.
INTERLEAVED_FAMILIES = frozenset({"gpt_oss"})

#: ``model_type`` -> (module path rename, projection names) of the per-expert names a family's
#: checkpoints use on disk where they differ from the module's (Mixtral's ``save_pretrained``
#: and vLLM's loader: ``block_sparse_moe.experts.{e}.w1`` / ``w3`` / ``w2``).
_DISK_NAMES: dict[str, tuple[tuple[str, str], dict[str, str]]] = {
    "mixtral": ((".mlp.experts", ".block_sparse_moe.experts"),
                {"gate_proj": "w1", "up_proj": "w3", "down_proj": "w2"}),
}  # fmt: skip
_DISK_NAMES["minimax"] = _DISK_NAMES["mixtral"]

_FUSED = re.compile(r"^(.*\.experts)\.(gate_up_proj|down_proj)(_bias|_blocks|_scales)?$")


def has_fused(names: list[str]) -> bool:
    """Whether any name is a fused or MXFP4 experts tensor."""
    return any(_FUSED.match(n) for n in names)


@functools.cache
def _fp4_values() -> np.ndarray:
    return np.asarray(
        catalog.format("float4_e2m1fn").decode(np.arange(16, dtype=np.uint8)), np.float32
    )


def decode_mxfp4(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """MXFP4 blocks ``[..., R, G, 16]`` uint8 and E8M0 scales ``[..., R, G]`` uint8 as float32
    ``[..., R, G * 32]`` (see the module docstring for the layout).

    Raises:
        LowbitError: not uint8, or shapes that do not pair.
    """
    blocks, scales = np.asarray(blocks), np.asarray(scales)
    if blocks.dtype != np.uint8 or scales.dtype != np.uint8:
        raise LowbitError(f"MXFP4 blocks and scales must be uint8, got {blocks.dtype}, "
                          f"{scales.dtype}")  # fmt: skip
    if blocks.ndim < 2 or blocks.shape[-1] != 16 or blocks.shape[:-1] != scales.shape:
        raise LowbitError(
            f"MXFP4 blocks {blocks.shape} and scales {scales.shape} do not pair "
            f"(blocks [..., G, 16], scales [..., G])"
        )
    codes = unpack(blocks, 4, blocks.size * 2).reshape(*scales.shape, 32)
    nan = scales == 255
    scale = np.ldexp(np.float32(1.0), np.where(nan, 0, scales.astype(np.int32) - 127))
    with np.errstate(over="ignore"):  # 6 * 2**127 is past float32, as past bfloat16: inf
        vals = _fp4_values()[codes] * scale.astype(np.float32)[..., None]
    vals[nan] = np.nan
    return vals.reshape(*scales.shape[:-1], scales.shape[-1] * 32)


def expert_slices(
    what: str, arr: np.ndarray, *, rows_out: bool, interleaved: bool, bias: bool = False
) -> list[tuple[str, np.ndarray]]:
    """One expert's parts of a fused tensor: ``[("gate_proj", g), ("up_proj", u)]`` for
    ``gate_up_proj``, ``[("down_proj", w)]`` for ``down_proj``.

    Args:
        what: ``gate_up_proj`` or ``down_proj``.
        arr: the expert's slice: a weight (2-D) or, with ``bias``, a bias (1-D).
        rows_out: the weight's rows are output features (``nn.Linear``'s layout); else it is
            transposed and is turned round.
        interleaved: gate and up rows alternate (else gate rows, then up rows).
        bias: ``arr`` is a bias.
    """
    w = arr if (rows_out or bias) else arr.T
    if what == "down_proj":
        return [("down_proj", np.ascontiguousarray(w))]
    half = w.shape[0] // 2
    g, u = (w[0::2], w[1::2]) if interleaved else (w[:half], w[half:])
    return [("gate_proj", np.ascontiguousarray(g)), ("up_proj", np.ascontiguousarray(u))]


class _Virtual:
    """How one per-expert tensor is made from the tensors on disk."""

    __slots__ = ("base", "dtype", "expert", "kind", "nbytes", "part", "shape", "sources", "what")

    def __init__(self, **kw: Any) -> None:
        for k, v in kw.items():
            setattr(self, k, v)


class ExpertsView(Checkpoint):
    """A checkpoint whose fused or MXFP4 experts tensors read as per-expert 2-D tensors
    (everything else passes through from ``base``).

    A per-expert tensor's :meth:`info` names the file of the tensor it comes from with offset
    ``-1`` (it is no contiguous span there; ``lowbit.checkpoints.steps.raw_bytes`` reads it
    through :meth:`get`) and, for MXFP4, the bytes its share of blocks and scales takes on
    disk; MXFP4 weights read as bfloat16, which holds every E2M1 value times a power of two
    exactly.

    Attributes:
        base: the checkpoint read.
        layouts: experts module path -> ``{"transposed": bool | None, "interleaved": bool,
            "mxfp4": bool}`` (``transposed`` None for MXFP4, whose rows are output features).

    Raises:
        LowbitError: a fused tensor without its partner (blocks without scales, gate_up without
            down), shapes that do not fit together, an MXFP4 tensor outside an experts
            module, or a per-expert tensor both on disk and in a fused one.
    """

    def __init__(self, base: Checkpoint) -> None:
        super().__init__()
        self.base = base
        self.path, self.format, self.metadata = base.path, base.format, base.metadata
        cfg = dict(base.config or {}) if base.config is not None else None
        qc = (cfg or {}).get("quantization_config")
        if isinstance(qc, dict) and qc.get("quant_method") == "mxfp4":
            cfg.pop("quantization_config")  # type: ignore[union-attr]  # read dequantized
            stray = [n for n in base.names()
                     if n.endswith(("_blocks", "_scales")) and not _FUSED.match(n)]  # fmt: skip
            if stray:  # read as they are, packed codes would pass for weights
                raise LowbitError(
                    f"{self.path}: MXFP4 tensor {stray[0]!r} is not an experts projection; "
                    f"lowbit reads MXFP4 experts (<...>.experts.gate_up_proj_blocks, "
                    f"down_proj_blocks) only"
                )
        self.config = cfg
        family = (cfg or {}).get("model_type")
        self._interleaved = family in INTERLEAVED_FAMILIES
        self._disk_names = _DISK_NAMES.get(str(family))
        self._virtual: dict[str, _Virtual] = {}
        self._names: list[str] = []
        self.layouts: dict[str, dict[str, Any]] = {}
        self._on_disk = set(base.names())
        groups: dict[str, dict[str, str]] = {}
        for n in base.names():
            m = _FUSED.match(n)
            if m:
                groups.setdefault(m.group(1), {})[m.group(2) + (m.group(3) or "")] = n
        for n in base.names():
            m = _FUSED.match(n)
            if m is None:
                self._names.append(n)
                continue
            self._add(m.group(1), m.group(2), m.group(3) or "", groups[m.group(1)])

    # ------------------------------------------------------------------ building the index

    def _transposed(self, base: str, parts: dict[str, str]) -> bool:
        if "gate_up_proj" not in parts or "down_proj" not in parts:
            raise LowbitError(
                f"{self.path}: fused experts {base!r} need both gate_up_proj and down_proj "
                f"(found {', '.join(sorted(parts))})"
            )
        _, a, b = self._shape3(parts["gate_up_proj"])
        _, c, d = self._shape3(parts["down_proj"])
        if b == c and a == 2 * d:
            return False
        if a == d and b == 2 * c:
            return True
        raise LowbitError(
            f"{self.path}: fused experts {base!r}: gate_up_proj {(a, b)} and down_proj {(c, d)} "
            f"per expert fit neither [2I, H] with [H, I] nor [H, 2I] with [I, H]"
        )

    def _shape3(self, name: str) -> tuple[int, ...]:
        shape = self.base.shape(name)
        if len(shape) != 3:
            raise LowbitError(f"{self.path}: fused experts tensor {name!r} has shape {shape}")
        return shape

    def _share(self, name: str, n: int, what: str) -> int:
        """Bytes on disk of one expert's one projection in fused tensor ``name``."""
        return self.base.info(name).nbytes // max(n, 1) // (2 if what == "gate_up_proj" else 1)

    def _add(self, base: str, what: str, suffix: str, parts: dict[str, str]) -> None:
        if suffix == "_scales":
            if what + "_blocks" not in parts:
                raise LowbitError(f"{self.path}: {parts[what + suffix]!r} has no _blocks beside")
            return  # read with its blocks
        lay = self.layouts.setdefault(base, {"interleaved": self._interleaved, "mxfp4": False})
        if suffix == "_blocks":
            lay["mxfp4"] = True
            lay["transposed"] = None
            sources = (parts[what + "_blocks"], parts.get(what + "_scales"))
            if sources[1] is None:
                raise LowbitError(f"{self.path}: {sources[0]!r} has no _scales beside")
            shape = self.base.shape(sources[0])
            if len(shape) != 4 or shape[-1] != 16 or self.base.shape(sources[1]) != shape[:-1]:
                raise LowbitError(
                    f"{self.path}: MXFP4 {sources[0]!r} {shape} and its scales "
                    f"{self.base.shape(sources[1])} are not [E, R, G, 16] and [E, R, G]"
                )
            n, rows, cols = shape[0], shape[1], shape[2] * 32
            per = (shape[1] * shape[2] * 17) // (2 if what == "gate_up_proj" else 1)
            kind, dtype = "weight", "BF16"
        elif suffix == "_bias":
            sources = (parts[what + suffix],)
            shape = self.base.shape(sources[0])
            if len(shape) != 2:
                raise LowbitError(f"{self.path}: fused experts bias {sources[0]!r} is {shape}")
            n, rows, cols = shape[0], shape[1], 0
            kind, dtype = "bias", self.base.dtype(sources[0])
            per = self._share(sources[0], n, what)
        else:
            sources = (parts[what],)
            transposed = self._transposed(base, parts)
            lay["transposed"] = transposed
            n, a, b = self._shape3(sources[0])
            rows, cols = (b, a) if transposed else (a, b)
            kind, dtype = "weight", self.base.dtype(sources[0])
            per = self._share(sources[0], n, what)
        projs = ("gate_proj", "up_proj") if what == "gate_up_proj" else ("down_proj",)
        if what == "gate_up_proj" and rows % 2:
            raise LowbitError(f"{self.path}: {sources[0]!r} has an odd gate/up size {rows}")
        out_rows = rows // 2 if what == "gate_up_proj" else rows
        shape_one = (out_rows, cols) if kind == "weight" else (out_rows,)
        for e in range(n):
            for p in projs:
                name = self._name(base, e, p, kind)
                if name in self._virtual or name in self._on_disk:
                    raise LowbitError(f"{self.path}: {name!r} is both on disk and in a fused "
                                      f"experts tensor ({sources[0]!r})")  # fmt: skip
                self._virtual[name] = _Virtual(
                    base=base, dtype=dtype, expert=e, kind=suffix, nbytes=int(per),
                    part=p, shape=shape_one, sources=sources, what=what,
                )  # fmt: skip
                self._names.append(name)

    def _name(self, base: str, e: int, proj: str, kind: str) -> str:
        if self._disk_names is None:
            return f"{base}.{e}.{proj}.{kind}"
        (old, new), projs = self._disk_names
        if base.endswith(old):
            base = base[: -len(old)] + new
        return f"{base}.{e}.{projs.get(proj, proj)}.{kind}"

    # ------------------------------------------------------------------ Checkpoint

    def names(self) -> list[str]:
        return list(self._names)

    def __contains__(self, name: object) -> bool:
        return name in self._virtual or (name in self.base and not _FUSED.match(str(name)))

    def info(self, name: str) -> TensorInfo:
        v = self._virtual.get(name)
        if v is None:
            if _FUSED.match(name):
                raise self._missing(name)
            return self.base.info(name)
        src = self.base.info(v.sources[0])
        return TensorInfo(name, v.shape, v.dtype, v.nbytes, src.file, -1)

    def get(self, name: str, dtype: Any = None) -> np.ndarray:
        v = self._virtual.get(name)
        if v is None:
            if _FUSED.match(name):
                raise self._missing(name)
            return self.base.get(name, dtype)
        lay = self.layouts[v.base]
        if v.kind == "_blocks":
            blocks = np.asarray(self.base.get(v.sources[0]))[v.expert]
            scales = np.asarray(self.base.get(v.sources[1]))[v.expert]
            w = decode_mxfp4(blocks, scales).astype(ml_dtype("bfloat16"))
            rows_out = True
        else:
            w = np.asarray(self.base.get(v.sources[0]))[v.expert]
            rows_out = not lay.get("transposed")
        parts = dict(expert_slices(v.what, w, rows_out=rows_out, interleaved=lay["interleaved"],
                                   bias=v.kind == "_bias"))  # fmt: skip
        return readonly(as_dtype(parts[v.part], dtype))

    def close(self) -> None:
        self.base.close()
        super().close()
