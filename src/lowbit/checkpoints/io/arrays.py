"""Array input for the writers: numpy arrays as they are, torch tensors without a float copy."""

from __future__ import annotations

from typing import Any

import numpy as np

from lowbit._arrays import ml_dtype


def as_numpy(x: Any) -> np.ndarray:
    """``x`` as a numpy array of the same dtype (torch bfloat16/float8 become ml_dtypes arrays)."""
    if type(x).__module__.startswith("torch") and hasattr(x, "detach"):
        import torch

        t = x.detach().cpu().contiguous()
        ml = _ML_FROM_TORCH.get(str(t.dtype))
        if ml is not None:
            carrier = torch.int16 if t.element_size() == 2 else torch.uint8
            return t.view(carrier).numpy().view(ml_dtype(ml))
        return t.numpy()
    return np.asarray(x)


_ML_FROM_TORCH = {
    "torch.bfloat16": "bfloat16",
    "torch.float8_e4m3fn": "float8_e4m3fn",
    "torch.float8_e5m2": "float8_e5m2",
}
