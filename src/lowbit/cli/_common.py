"""Shared CLI helpers: --json, tables, colour, parsing lists of formats, checking options."""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from lowbit._json import to_jsonable
from lowbit.errors import LowbitError, UnderflowWarning
from lowbit.models._compute import check_compute

#: The largest --seed: numpy's generators take any size, torch.manual_seed 0 .. 2**64 - 1,
#: and train-lab seeds a second generator with seed + 1.
SEED_MAX = 2**63 - 1


def add_json(parser: argparse.ArgumentParser) -> None:
    """Add the ``--json`` flag every command has."""
    parser.add_argument(
        "--json", action="store_true", help="print machine-readable JSON instead of a table"
    )


def print_json(obj: Any) -> None:
    print(json.dumps(to_jsonable(obj), indent=2))


def use_colour(stream: Any = None) -> bool:
    stream = stream or sys.stdout
    return hasattr(stream, "isatty") and stream.isatty() and "NO_COLOR" not in os.environ


def colour(text: str, code: str, enabled: bool) -> str:
    return f"\033[{code}m{text}\033[0m" if enabled and text else text


def fmt_num(v: Any, digits: int = 6) -> str:
    """Compact number formatting for tables."""
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, (int, np.integer)):
        return f"{int(v):,}"
    v = float(v)
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    if v == 0:
        return "0"
    if 1e-4 <= abs(v) < 1e7:
        return f"{v:.{digits}g}"
    return f"{v:.{max(digits - 3, 2)}e}"


def print_table(
    rows: Sequence[Sequence[Any]],
    headers: Sequence[str],
    *,
    align: str | None = None,
    stream: Any = None,
) -> None:
    """Print a plain-text table; ``align`` is one of l/r per column (default: r for numbers)."""
    stream = stream or sys.stdout
    cells = [[c if isinstance(c, str) else fmt_num(c) for c in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        for i, c in enumerate(row):
            widths[i] = max(widths[i], _visible_len(c))
    if align is None:
        align = "".join(
            "r"
            if rows
            and isinstance(rows[0][i], (int, float, np.number))
            and not isinstance(rows[0][i], bool)
            else "l"
            for i in range(len(headers))
        )

    def line(vals: Sequence[str]) -> str:
        out = []
        for i, v in enumerate(vals):
            pad = widths[i] - _visible_len(v)
            out.append(" " * pad + v if align[i] == "r" else v + " " * pad)
        return "  ".join(out).rstrip()

    print(line(headers), file=stream)
    print(line(["-" * w for w in widths]), file=stream)
    for row in cells:
        print(line(row), file=stream)


def _visible_len(s: str) -> int:
    import re

    return len(re.sub(r"\033\[[0-9;]*m", "", s))


def parse_list(text: str | None) -> list[str]:
    """Split a comma-separated option into stripped, non-empty items."""
    if not text:
        return []
    return [t.strip() for t in text.split(",") if t.strip()]


def parse_names(text: str | None, flag: str) -> list[str] | None:
    """A comma-separated list option: None when it was not given, else its items.

    Raises:
        LowbitError: the option was given but names nothing (``--formats ''``, ``,``), which
            would otherwise fall back to the default list without a word.
    """
    if text is None:
        return None
    items = parse_list(text)
    if not items:
        raise LowbitError(f"{flag} is empty: give one or more comma-separated names")
    return items


def check_args(args: argparse.Namespace) -> None:
    """Checks shared by every command, run before it: ``--seed`` in 0 .. 2**63 - 1.

    Raises:
        LowbitError: a negative or too large seed (numpy would raise a bare ValueError).
    """
    seed = getattr(args, "seed", None)
    if seed is not None and not 0 <= seed <= SEED_MAX:
        raise LowbitError(f"--seed must be an integer from 0 to 2**63-1, got {seed}")


@contextlib.contextmanager
def warnings_as_lines(command: str) -> Iterator[None]:
    """Print lowbit's :class:`~lowbit.errors.UnderflowWarning` s raised inside as one line
    each on stderr (``lowbit CMD: warning: ...``), once per distinct message, also when the
    command then fails. Other warnings keep Python's handling."""
    shown = warnings.showwarning
    seen: list[str] = []

    def show(message: Any, category: Any, *args: Any, **kwargs: Any) -> None:
        if not issubclass(category, UnderflowWarning):
            shown(message, category, *args, **kwargs)
        elif str(message) not in seen:
            seen.append(str(message))
            print(f"lowbit {command}: warning: {message}", file=sys.stderr)

    with warnings.catch_warnings():
        warnings.simplefilter("always", UnderflowWarning)
        warnings.showwarning = show
        yield


def add_compute(parser: argparse.ArgumentParser, what: str) -> None:
    """The ``--compute fp32|bf16|auto`` option (checked by the command, so a bad value is one
    error line): the precision of ``what``'s matrix products."""
    parser.add_argument(
        "--compute",
        metavar="P",
        default="fp32",
        help=f"precision of the matrix products of {what}: fp32 (default), bf16, or auto (bf16 "
        "where the CPU has bfloat16 units and they are timed faster, once per machine, else "
        "fp32); quantization, "
        "Hessians and everything that decides codes stay float32",
    )


def compute_option(text: str) -> str:
    """``--compute``'s value, checked: ``fp32``, ``bf16`` or ``auto`` (else one error line)."""
    try:
        return check_compute(text)
    except LowbitError as exc:
        raise LowbitError(f"--compute: {exc}") from None
