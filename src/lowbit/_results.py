"""How lowbit's result objects show themselves: a one-line repr, JSON, a table in Jupyter, pandas.

A result class defines ``to_dict()`` (JSON-able, what it holds), ``_summary()`` (the words of its
one-line repr) and ``_rows()`` (one dict per table row, with the same keys); :class:`TableView`
gives it the rest:

- ``repr(r)``: ``ClassName(summary)``, one line however large the result (a scan of a 135 M
  model holds thousands of trials; an importance matrix, 1.7 M characters of arrays);
- ``r.to_json()``: ``to_dict()`` as JSON text;
- ``r._repr_html_()``: a small HTML table of the first rows, which Jupyter shows;
- ``r.to_pandas()``: every row as a ``pandas.DataFrame`` (pandas is optional: without it, an
  ImportError that says ``pip install pandas``).
"""

from __future__ import annotations

import html
import json
import math
from typing import Any

__all__ = ["TableView"]

#: Rows shown by ``_repr_html_`` (the rest are counted under the table).
HTML_ROWS = 20


class TableView:
    """Mixin: a short repr, ``to_json``, ``_repr_html_`` and ``to_pandas`` from ``to_dict``,
    ``_summary`` and ``_rows``."""

    def to_dict(self) -> dict[str, Any]:  # pragma: no cover - every subclass defines it
        raise NotImplementedError

    def _summary(self) -> str:  # pragma: no cover - every subclass defines it
        raise NotImplementedError

    def _rows(self) -> list[dict[str, Any]]:  # pragma: no cover - every subclass defines it
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._summary()})"

    def to_json(self, indent: int | None = None) -> str:
        """:meth:`to_dict` as JSON text (NaN and infinities as null)."""
        return json.dumps(_finite(self.to_dict()), indent=indent)

    def to_pandas(self) -> Any:
        """Every row of the table as a ``pandas.DataFrame``.

        Raises:
            ImportError: pandas is not installed (the message says how to install it).
        """
        try:
            import pandas as pd
        except ImportError:
            raise ImportError(
                f"{type(self).__name__}.to_pandas needs pandas: pip install pandas"
            ) from None
        return pd.DataFrame(self._rows())

    def _repr_html_(self) -> str:
        rows = self._rows()
        keys = list(rows[0]) if rows else []
        head = "".join(f"<th>{html.escape(str(k))}</th>" for k in keys)
        body = "".join(
            "<tr>" + "".join(f"<td>{html.escape(_cell(r.get(k)))}</td>" for k in keys) + "</tr>"
            for r in rows[:HTML_ROWS]
        )
        more = (
            f"<p>... {len(rows) - HTML_ROWS} more rows (to_pandas() has them all)</p>"
            if len(rows) > HTML_ROWS
            else ""
        )
        title = html.escape(repr(self))
        return (
            f"<div><p><b>{title}</b></p><table><thead><tr>{head}</tr></thead>"
            f"<tbody>{body}</tbody></table>{more}</div>"
        )


def _cell(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.6g}"
    return "" if v is None else str(v)


def _finite(obj: Any) -> Any:
    """``obj`` with non-finite floats as None (strict JSON has no NaN)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj
