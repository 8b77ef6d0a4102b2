"""mlx-lm's quantization block of ``config.json``: default parameters and per-module entries.

One :class:`MLXParams` by default and, per module path, another (a mixed recipe) or ``false``
(left unquantized).

mlx-lm writes ``{"group_size": 64, "bits": 4, "mode": "affine", "model.layers.0.mlp.down_proj":
{"group_size": 64, "bits": 6, "mode": "affine"}, ...}`` as ``quantization`` and the same
object again as ``quantization_config`` (for Hugging Face's tree); older files lack ``mode``
(affine). A module whose ``<path>.scales`` is stored is quantized with its own entry, else the
default; mlx-lm's loader does the same.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from lowbit.errors import LowbitError
from lowbit.quant.mlx import check_params, mode_defaults

__all__ = ["MLXParams", "is_mlx_config", "read_quantization"]

_KEYS = ("group_size", "bits", "mode")


@dataclass(frozen=True)
class MLXParams:
    """How MLX quantizes one module: ``mode`` (``affine``, ``mxfp4``, ``mxfp8``, ``nvfp4``),
    ``bits`` and ``group_size`` (MLX's defaults for the mode when None).

    Which lowbit scheme each mode is: ``affine`` b bits group g is an asymmetric integer grid
    with a float scale and a float offset (``w ~ scale * q + bias``, ``q`` in ``0 .. 2**b-1``,
    scale and bias in the model dtype: llama.cpp's Q4_1 kind, not lowbit's integer zero point);
    ``mxfp4`` is lowbit's ``mxfp4`` with the ``ceil`` scale rule and ties toward zero;
    ``mxfp8`` is ``mxfp8_e4m3`` with the ``ceil`` rule; ``nvfp4`` is E2M1 in groups of 16 with
    E4M3 scales and no tensor scale.

    Raises:
        LowbitError: a mode, bits or group size MLX does not hold.
    """

    mode: str = "affine"
    bits: int | None = None
    group_size: int | None = None

    def __post_init__(self) -> None:
        gs, b = mode_defaults(self.mode)
        object.__setattr__(self, "bits", b if self.bits is None else self.bits)
        object.__setattr__(self, "group_size", gs if self.group_size is None else self.group_size)
        check_params(self.mode, self.group_size, self.bits)  # type: ignore[arg-type]

    def to_dict(self) -> dict[str, Any]:
        """mlx-lm's spelling: ``{"group_size", "bits", "mode"}``."""
        return {"group_size": self.group_size, "bits": self.bits, "mode": self.mode}

    @property
    def has_biases(self) -> bool:
        return self.mode == "affine"

    @property
    def label(self) -> str:
        if self.mode == "affine":
            return f"mlx affine {self.bits}-bit g{self.group_size}"
        return f"mlx {self.mode}"


def is_mlx_config(config: Mapping[str, Any] | None) -> bool:
    """Whether a ``config.json`` is mlx-lm's: a ``quantization`` object with ``group_size`` and
    ``bits``."""
    q = (config or {}).get("quantization")
    return isinstance(q, dict) and "group_size" in q and "bits" in q


def _params(entry: Any, where: str) -> MLXParams:
    if not isinstance(entry, dict):
        raise LowbitError(f"{where} is {type(entry).__name__}, not an object or false")
    mode = entry.get("mode", "affine")
    bits, gs = entry.get("bits"), entry.get("group_size")
    for key, v in (("bits", bits), ("group_size", gs)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise LowbitError(f"{where}.{key} is {v!r}, not an integer")
    if not isinstance(mode, str):
        raise LowbitError(f"{where}.mode is {mode!r}, not a string")
    try:
        return MLXParams(mode=mode, bits=bits, group_size=gs)
    except LowbitError as exc:
        raise LowbitError(f"{where}: {exc}") from None


def read_quantization(
    config: Mapping[str, Any], where: str
) -> tuple[MLXParams, dict[str, MLXParams | None]]:
    """The default parameters and the per-module entries (``None``: ``false``, unquantized) of
    a config's ``quantization`` block.

    Raises:
        LowbitError: a block that is not mlx-lm's, or an entry MLX cannot hold.
    """
    q = config.get("quantization")
    if not isinstance(q, dict):
        raise LowbitError(f"{where}: no mlx-lm quantization object")
    default = _params({k: q[k] for k in _KEYS if k in q}, f"{where}: quantization")
    modules: dict[str, MLXParams | None] = {}
    for key, entry in q.items():
        if key in _KEYS:
            continue
        if entry is False:
            modules[key] = None
        elif entry is True:
            modules[key] = default
        else:
            modules[key] = _params(entry, f"{where}: quantization[{key!r}]")
    return default, modules
