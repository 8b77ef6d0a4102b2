"""What a job returns: a typed, read-only record with a one-line repr, ``to_dict()`` /
``to_json()`` (what ``--json`` prints), a small table in Jupyter (``_repr_html_``) and
``to_pandas()`` when pandas is installed (:class:`~lowbit._results.TableView`).

Every result keeps the whole summary the command prints under ``--json`` in ``details``;
``result["key"]`` reads it, as the dicts these functions returned before did.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lowbit._json import to_jsonable
from lowbit._results import TableView

__all__ = ["GGUFResult", "QuantizeResult", "Result"]


def _mb(n: int | None) -> str:
    return "?" if n is None else f"{n / 1e6:,.1f} MB"


@dataclass(frozen=True, repr=False)
class Result(TableView, Mapping[str, Any]):
    """The common face of job results: typed fields, a Mapping over ``details`` (the summary
    ``--json`` prints), and :class:`~lowbit._results.TableView`'s one-line repr, ``to_json``,
    ``_repr_html_`` and ``to_pandas``."""

    details: dict[str, Any] = field(default_factory=dict)

    # Mapping over the --json summary, so code written against the old dicts keeps working
    def __getitem__(self, key: str) -> Any:
        if key not in self.details and key in type(self).__dataclass_fields__:
            return getattr(self, key)  # a typed field the summary leaves out (method: None)
        return self.details[key]

    def __iter__(self) -> Any:
        return iter(self.details)

    def __len__(self) -> int:
        return len(self.details)

    def to_dict(self) -> dict[str, Any]:
        """The summary as plain JSON-ready Python (what the command's ``--json`` prints)."""
        out: dict[str, Any] = to_jsonable(self.details)
        return out

    def _summary(self) -> str:
        where = self.details.get("path") or self.details.get("out") or self.details.get("kind")
        return str(where)

    def _rows(self) -> list[dict[str, Any]]:
        return [{"field": k, "value": v} for k, v in self.details.items()
                if not isinstance(v, dict | list)]  # fmt: skip


@dataclass(frozen=True, repr=False)
class QuantizeResult(Result):
    """What :func:`lowbit.quantize_model` wrote (or, with ``dry_run``, would write).

    Attributes:
        out: the folder or ``.gguf`` file written (None on a dry run).
        out_format: ``lowbit``, ``compressed-tensors`` or ``gguf``.
        source: the checkpoint read.
        bytes: bytes written (on a dry run: the output's predicted bytes).
        tensors: tensors in the output.
        seconds: the whole call (``total``) and its parts (``plan``, ``calibration``,
            ``write``, ...), wall-clock seconds.
        method: the record of a calibrated or rotating method (None: round to nearest).
        dry_run: nothing was written.
    """

    out: Path | None = None
    out_format: str = "lowbit"
    source: str = ""
    bytes: int = 0
    tensors: int = 0
    seconds: Mapping[str, float] = field(default_factory=dict)
    method: Mapping[str, Any] | None = None
    dry_run: bool = False

    def _summary(self) -> str:
        what = "dry run" if self.dry_run else str(self.out)
        name = (self.method or {}).get("method") if self.method else "rtn"
        total = self.seconds.get("total")
        took = "" if total is None else f", {total:.1f} s"
        return f"{what}: {self.out_format}, {_mb(self.bytes)}, {self.tensors} tensors, {name}{took}"

    def _rows(self) -> list[dict[str, Any]]:
        rows: list[tuple[str, Any]] = [
            ("out", str(self.out)),
            ("format", self.out_format),
            ("source", self.source),
            ("bytes", self.bytes),
            ("tensors", self.tensors),
            ("method", (self.method or {}).get("method", "rtn")),
        ]
        rows += [(f"seconds: {k}", v) for k, v in self.seconds.items()]
        return [{"field": k, "value": v} for k, v in rows]


@dataclass(frozen=True, repr=False)
class GGUFResult(QuantizeResult):
    """A GGUF written as one of llama-quantize's mixes or within a size budget.

    Attributes:
        types: tensor name -> llama.cpp type chosen.
        imatrix: the importance matrix used (its path), if any.
        plan: a budget's solved plan (:class:`~lowbit.checkpoints.gguf.budget.GgufPlan`:
            rows, allocation, predicted damage); None for a fixed mix.
    """

    types: Mapping[str, str] = field(default_factory=dict)
    imatrix: str | None = None
    plan: Any = None

    def _summary(self) -> str:
        counts: dict[str, int] = {}
        for t in self.types.values():
            counts[t] = counts.get(t, 0) + 1
        mix = ", ".join(f"{n} {t}" for t, n in sorted(counts.items()))
        return f"{super()._summary()}; {mix}"
