"""What calibration of a mixture of experts reports per expert (GPTQ and AWQ): the tokens
each expert layer saw, the rank of its Hessian, and the fallback of those under the floor of
tokens (:class:`~lowbit.calibration.data.Calibration`'s ``experts`` and
``expert_min_tokens``)."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import numpy as np

from lowbit.models.moe import expert_of

__all__ = ["RANK_WIDTH", "expert_floor", "hessian_rank", "unreached_experts"]

#: Widest input whose Hessian rank the expert report computes (an eigendecomposition).
RANK_WIDTH = 4096


def hessian_rank(H: np.ndarray) -> int:
    """Numerical rank of a collected Hessian: eigenvalues above ``n * eps(float32)`` times the
    largest (its products are float32, so smaller ones are rounding noise)."""
    eig = np.linalg.eigvalsh(H)
    top = float(eig[-1]) if eig.size else 0.0
    if top <= 0.0:
        return 0
    return int(np.count_nonzero(eig > top * H.shape[0] * float(np.finfo(np.float32).eps)))


def expert_floor(
    group: list[str], experts: list[str], col: Any, H: np.ndarray, mine: dict[str, str],
    calib: Any, layers: dict[str, dict[str, Any]],
) -> list[str]:  # fmt: skip
    """Record tokens and Hessian rank of a group's expert layers; those under the calibration's
    floor of tokens are left out of the group (rounded to nearest later)."""
    tokens = col.tokens(experts[0])
    rank = hessian_rank(H) if 0 < H.shape[0] <= RANK_WIDTH else None
    low = tokens < calib.expert_min_tokens
    for m in experts:
        layers[mine[m]] = {"tokens": tokens, "rank": rank, "expert": expert_of(mine[m])[0]}
        if low:
            layers[mine[m]]["fallback"] = f"rtn: {tokens} tokens < floor {calib.expert_min_tokens}"
    return [m for m in group if not (low and m in experts)]


def unreached_experts(
    wanted: Collection[str], done: Collection[str], layers: dict[str, dict[str, Any]]
) -> list[str]:
    """Record the expert layers of ``wanted`` that calibration never reached (no token routed
    to them: they are rounded to nearest); returns their names."""
    missed = [n for n in wanted if n not in done and n not in layers and expert_of(n)]
    for name in missed:
        layers[name] = {"tokens": 0, "rank": 0, "fallback": "rtn: no calibration token"}
    return missed
