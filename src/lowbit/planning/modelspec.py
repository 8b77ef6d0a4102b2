"""A model as the planner sees it: named tensors with shapes, components and per-token use.

:class:`ModelSpec` is what :mod:`lowbit.planning.archs` builds from a ``config.json``, a checkpoint
header or a bare parameter count; :func:`~lowbit.plans.components.classify` (re-exported here) names the component (embeddings,
attention, MLP, norms, LM head) of a tensor from its ``transformers`` or GGUF name.
Non-parameter buffers stored in checkpoints (``position_ids``, ``rotary_emb.inv_freq``,
GPT-2's causal-mask ``attn.bias``) are kept apart: they are not parameters.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from lowbit.errors import LowbitError
from lowbit.plans.components import COMPONENTS, classify, is_token_embedding

# ---------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------

__all__ = [
    "COMPONENTS",
    "ModelSpec",
    "TensorInfo",
    "classify",
    "parse_params",
    "spec_from_params",
]


@dataclass(frozen=True)
class TensorInfo:
    """One named tensor of a model.

    Attributes:
        name: the checkpoint (or ``transformers``) name.
        shape: in row-major (numpy / torch) order; GGUF's reversed order is undone.
        component: one of :data:`COMPONENTS`, or ``"buffer"`` for non-parameters.
        dtype: the stored type (``"F32"``, ``"BF16"``, ``"Q4_1"``, ...) for checkpoints.
        nbytes: the stored size in bytes for checkpoints.
        use: the fraction of this tensor read to produce one token (0 for embedding tables
            that are only looked up, k/E for each expert of a mixture of E experts with k
            active, 1 otherwise).
        offset: for checkpoints, where the data starts, relative to the data section.
    """

    name: str
    shape: tuple[int, ...]
    component: str
    dtype: str | None = None
    nbytes: int | None = None
    use: float = 1.0
    offset: int | None = None

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class ModelSpec:
    """A model as the planner sees it: named tensors and the attention/MLP dimensions.

    Dimensions are None where the source does not say (a bare parameter count, a
    safetensors file with no ``config.json``).
    """

    name: str
    source: str  # "params" | "config" | "safetensors" | "gguf"
    tensors: tuple[TensorInfo, ...]
    architecture: str | None = None
    n_layers: int | None = None
    hidden_size: int | None = None
    n_heads: int | None = None
    n_kv_heads: int | None = None
    head_dim: int | None = None
    intermediate_size: int | None = None
    active_intermediate: int | None = None
    vocab_size: int | None = None
    gated_mlp: bool | None = None
    is_decoder: bool = True
    tied_embeddings: bool | None = None
    n_experts: int | None = None
    n_active_experts: int | None = None
    path: str | None = None
    notes: tuple[str, ...] = field(default=())

    @property
    def parameters(self) -> tuple[TensorInfo, ...]:
        """The tensors that are parameters (buffers left out)."""
        return tuple(t for t in self.tensors if t.component != "buffer")

    @property
    def params(self) -> int:
        """Total parameter count."""
        return sum(t.numel for t in self.parameters)

    @property
    def params_per_token(self) -> float:
        """Parameters used per token: embedding lookups and inactive experts left out."""
        return sum(t.numel * t.use for t in self.parameters)

    @property
    def components(self) -> dict[str, int]:
        """Parameter count per component (every component listed, zeros included)."""
        out = dict.fromkeys(COMPONENTS, 0)
        for t in self.parameters:
            out[t.component] += t.numel
        return out

    @property
    def stored_bytes(self) -> int | None:
        """Bytes of the parameters as stored in the checkpoint (None for configs and counts)."""
        sizes = [t.nbytes for t in self.parameters]
        return None if not sizes or any(s is None for s in sizes) else sum(sizes)  # type: ignore[misc]

    @property
    def kv_elements_per_token(self) -> int | None:
        """K and V values cached per token per sequence: 2 * layers * kv_heads * head_dim."""
        if not self.is_decoder or None in (self.n_layers, self.n_kv_heads, self.head_dim):
            return None
        return 2 * self.n_layers * self.n_kv_heads * self.head_dim  # type: ignore[operator]

    def to_dict(self) -> dict[str, Any]:
        """JSON-able summary (tensors left out; components and dimensions in)."""
        return {
            "name": self.name,
            "source": self.source,
            "path": self.path,
            "architecture": self.architecture,
            "params": self.params,
            "params_per_token": self.params_per_token,
            "components": self.components,
            "stored_bytes": self.stored_bytes,
            "n_tensors": len(self.parameters),
            "n_layers": self.n_layers,
            "hidden_size": self.hidden_size,
            "n_heads": self.n_heads,
            "n_kv_heads": self.n_kv_heads,
            "head_dim": self.head_dim,
            "intermediate_size": self.intermediate_size,
            "vocab_size": self.vocab_size,
            "gated_mlp": self.gated_mlp,
            "is_decoder": self.is_decoder,
            "tied_embeddings": self.tied_embeddings,
            "n_experts": self.n_experts,
            "n_active_experts": self.n_active_experts,
            "kv_elements_per_token": self.kv_elements_per_token,
            "notes": list(self.notes),
        }


def _with_use(
    tensors: Iterable[TensorInfo], *, tied: bool, is_decoder: bool, expert_use: float | None
) -> tuple[TensorInfo, ...]:
    """Set how much of each tensor one token reads (embedding lookups read one row)."""
    out = []
    for t in tensors:
        use = 1.0
        if t.component == "embeddings":
            use = 1.0 if (tied and is_decoder and is_token_embedding(t.name)) else 0.0
        elif expert_use is not None and re.search(r"experts?\.\d+\.|_exps\.", t.name):
            use = expert_use
        out.append(replace(t, use=use))
    return tuple(out)


# ---------------------------------------------------------------------------------------
# Parameter counts
# ---------------------------------------------------------------------------------------

_SUFFIX = {"": 1, "K": 10**3, "M": 10**6, "B": 10**9, "G": 10**9, "T": 10**12}


def parse_params(text: str | float) -> int:
    """Parse a parameter count: ``7B``, ``1.5b``, ``135M``, ``70e9``, ``1,000,000`` (decimal).

    Raises:
        LowbitError: not a positive count.
    """
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value = float(text)
    else:
        m = re.fullmatch(
            r"\s*([0-9][0-9_,]*\.?[0-9]*(?:e[0-9]+)?)\s*([kmbgt]?)\s*", str(text), re.I
        )
        if not m:
            raise LowbitError(
                f"cannot read {text!r} as a parameter count; use e.g. 7B, 1.5B, 135M, 7e9"
            )
        value = float(m.group(1).replace(",", "").replace("_", "")) * _SUFFIX[m.group(2).upper()]
    if not math.isfinite(value) or value < 1:
        raise LowbitError(f"a parameter count must be at least 1, got {text!r}")
    return round(value)


def spec_from_params(n: int | float | str, name: str | None = None) -> ModelSpec:
    """A model known only by its parameter count: one anonymous 1-D tensor."""
    count = parse_params(n)
    return ModelSpec(
        name=name or f"{_short_count(count)} parameters",
        source="params",
        tensors=(TensorInfo("*", (count,), "other"),),
        notes=("parameter count only: no architecture, so no KV cache or activation estimate",),
    )


def _short_count(n: int) -> str:
    for unit, scale in (("T", 10**12), ("B", 10**9), ("M", 10**6), ("K", 10**3)):
        if n >= scale:
            return f"{n / scale:g}{unit}"
    return str(n)
