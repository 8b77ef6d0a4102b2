"""llama.cpp's names in lowbit's vocabulary: a tensor in a GGML block type, and the mixes.

The strings ``lowbit quantize --to`` accepts include llama.cpp's names. Three kinds:

- ``q4_0``, ``q5_0``, ``q8_0`` are lowbit schemes (:data:`lowbit.quant.scheme_text.PRESETS`,
  llama.cpp's rounding), so ``lowbit.quantize(w, "q4_0")`` is a :class:`QuantizedTensor` whose
  codes and float16 scales are llama.cpp's; ``mxfp4`` and ``nvfp4`` are lowbit schemes too.
- The other block types (``q4_k``, ``q6_k``, ``iq4_xs``, ``q4_1``, ``tq2_0``, ...) have no lowbit
  scheme (a super-block of 6-bit scales and minimums, a non-uniform grid): on one tensor
  ``lowbit.quantize(w, "q4_k")`` gives a :class:`GgmlTensor`, llama.cpp's bytes for that type
  (:func:`lowbit.ggml.blocks.quantize`, byte-identical to ``ggml_quantize_chunk``).
- The mixes (``q4_k_m``, ``q3_k_s``, ``iq3_m``, ...) choose a type per tensor from the whole
  model (:mod:`lowbit.ggml.mixes`): they exist only for a model written as GGUF, through
  ``lowbit.quantize_model(model, "q4_k_m", out, out_format="gguf")``; everywhere else they are
  one :class:`~lowbit.errors.LowbitError` saying so.
"""

from __future__ import annotations

import json
from typing import Any, Literal

import numpy as np

from lowbit.errors import LowbitError
from lowbit.ggml import blocks
from lowbit.ggml.mixes import MIXES

__all__ = ["GgmlTensor", "GgmlTypeName", "block_type_name", "mix_error", "mix_name"]

#: The names :func:`block_type_name` accepts, for type checkers (``lowbit.quantize`` returns a
#: :class:`GgmlTensor` for these); a test keeps it equal to the block types it derives from.
GgmlTypeName = Literal[
    "q4_1", "q5_1", "q2_k", "q3_k", "q4_k", "q5_k", "q6_k", "iq4_nl", "iq4_xs", "tq1_0", "tq2_0",
    "iq1_s", "iq1_m", "iq2_xxs", "iq2_xs", "iq2_s", "iq3_xxs", "iq3_s",
    "Q4_1", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS", "TQ1_0", "TQ2_0",
    "IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S",
]  # fmt: skip

#: Block types that are lowbit schemes (presets, MX, NVFP4 alias): not GgmlTensors.
_SCHEMES = {"Q4_0", "Q5_0", "Q8_0", "MXFP4", "NVFP4"}


def block_type_name(text: str) -> str | None:
    """llama.cpp's name of the GGML block type ``text`` names (any case) when it is one that
    has no lowbit scheme (``q4_k`` -> ``Q4_K``), else None."""
    name = text.strip().upper()
    return name if name in blocks.TYPES and name not in _SCHEMES else None


def mix_name(text: str) -> str | None:
    """llama-quantize's name of the mix ``text`` names (``q4_k_m`` -> ``Q4_K_M``) when it is a
    mix and not also a tensor type or lowbit format, else None."""
    name = text.strip().upper()
    if name in MIXES and name not in blocks.TYPES and name not in ("F32", "F16", "BF16"):
        return name
    return None


def mix_error(text: str, *, where: str = "") -> LowbitError:
    """The one error for a llama.cpp mix given where one tensor's scheme is expected."""
    name = text.strip().lower()
    return LowbitError(
        f"{where}{name!r} is a llama.cpp mix (llama-quantize chooses each tensor's type from the "
        f"whole model), not one scheme: write the model as GGUF with "
        f"lowbit.quantize_model(model, {name!r}, out, out_format='gguf') "
        f"(`lowbit quantize MODEL --to {name} --out-format gguf`)"
    )


class GgmlTensor:
    """A tensor in one of llama.cpp's GGML block types: the bytes llama.cpp writes for it.

    Attributes:
        data: uint8 blocks, shape ``(*shape[:-1], bytes per row)``, as in a GGUF file.
        type: llama.cpp's type name (``Q4_K``).
        shape: the tensor's shape (rows along the last axis).
    """

    __slots__ = ("data", "shape", "type")

    def __init__(self, data: np.ndarray, type: str, shape: tuple[int, ...]) -> None:
        self.data = data
        self.type = type
        self.shape = tuple(int(d) for d in shape)

    @classmethod
    def quantize(cls, x: Any, qtype: str, imatrix: Any = None) -> GgmlTensor:
        """Rows of ``x`` (last axis) in block type ``qtype``, as ``ggml_quantize_chunk``.

        Raises:
            LowbitError: an unknown type, rows that are not whole blocks, NaN/inf values.
        """
        t = blocks.ggml_type(qtype)
        arr = np.asarray(x)
        if arr.ndim == 0:
            raise LowbitError(f"{t.name} quantizes rows: give at least a 1-D array")
        return cls(blocks.quantize(arr, t.name, imatrix), t.name, arr.shape)

    @property
    def numel(self) -> int:
        """Number of values."""
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def nbytes(self) -> int:
        """Bytes of the blocks (a GGUF tensor's size)."""
        return int(self.data.nbytes)

    @property
    def bits_per_value(self) -> float:
        """Stored bits per value, scales included."""
        return 8.0 * self.nbytes / self.numel

    def dequantize(self, dtype: Any = np.float32) -> np.ndarray:
        """The values llama.cpp's ``dequantize_row_*`` gives, as ``dtype``."""
        return blocks.dequantize(self.data, self.type).reshape(self.shape).astype(dtype)

    def to_dict(self) -> dict[str, Any]:
        """What it holds, JSON-able (without the bytes)."""
        return {
            "type": self.type,
            "shape": list(self.shape),
            "nbytes": self.nbytes,
            "bits_per_value": self.bits_per_value,
        }

    def to_json(self) -> str:
        """:meth:`to_dict` as JSON text."""
        return json.dumps(self.to_dict())

    def __repr__(self) -> str:
        return (
            f"GgmlTensor(type={self.type!r}, shape={self.shape}, "
            f"bits_per_value={self.bits_per_value:.4g}, nbytes={self.nbytes})"
        )
