"""The training text: CPython's bundled documentation (``pydoc_data.topics``), as bytes.

The same text lowbit's evaluation uses: every topic, in sorted key order, joined with
blank lines. Byte-level tokens (vocabulary 256); the last ``val_fraction`` of the bytes is
the held-out validation split.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lowbit.errors import LowbitError


def load_text() -> str:
    """CPython's ``pydoc_data.topics`` joined in sorted key order with blank lines."""
    try:
        from pydoc_data.topics import topics
    except ImportError as exc:  # pragma: no cover - some distributions strip it
        raise LowbitError(
            "this Python has no pydoc_data.topics (the documentation text the lab trains on)"
        ) from exc
    return "\n\n".join(topics[k] for k in sorted(topics))


@dataclass
class TextData:
    """Train/validation token tensors and deterministic batch makers.

    Args:
        train: uint8 token ids of the training split.
        val: uint8 token ids of the validation split.
    """

    train: torch.Tensor
    val: torch.Tensor

    @classmethod
    def from_text(cls, text: str | None = None, *, val_fraction: float = 0.1) -> TextData:
        """Byte-level tokens of ``text`` (default :func:`load_text`), split at the end."""
        if not 0.0 < val_fraction < 1.0:
            raise LowbitError(f"val_fraction must be in (0, 1), got {val_fraction}")
        raw = (load_text() if text is None else text).encode("utf-8")
        ids = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
        cut = int(len(ids) * (1.0 - val_fraction))
        return cls(train=ids[:cut].clone(), val=ids[cut:].clone())

    def batch(
        self, gen: torch.Generator, batch_size: int, ctx: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """A random training batch ``(inputs, targets)`` drawn with ``gen``."""
        return _windows(
            self.train,
            torch.randint(0, len(self.train) - ctx - 1, (batch_size,), generator=gen),
            ctx,
        )

    def val_batches(
        self, n: int, batch_size: int, ctx: int
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """``n`` fixed validation batches, evenly spread over the validation split."""
        span = len(self.val) - ctx - 1
        if span < 1:
            raise LowbitError(
                f"validation split ({len(self.val)} bytes) is shorter than the context"
            )
        starts = torch.linspace(0, span - 1, n * batch_size).long()
        return [
            _windows(self.val, starts[i * batch_size : (i + 1) * batch_size], ctx) for i in range(n)
        ]


def _windows(
    ids: torch.Tensor, starts: torch.Tensor, ctx: int
) -> tuple[torch.Tensor, torch.Tensor]:
    idx = starts[:, None] + torch.arange(ctx + 1)[None, :]
    w = ids[idx].long()
    return w[:, :-1], w[:, 1:]
