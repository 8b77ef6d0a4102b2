"""Reading the small data files users give lowbit (plan files, hardware rows): JSON or YAML."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lowbit import _json

__all__ = ["read_data_file"]


def read_data_file(path: str | Path) -> Any:
    """Read a JSON file, or YAML when the name ends in .yaml/.yml (needs PyYAML).

    Both go through :mod:`lowbit._json`'s limits (size, depth, integers; only regular files).

    Raises:
        LowbitError: the file is missing, not a regular file, too large or does not parse.
        ImportError: a YAML file without PyYAML installed.
    """

    p = Path(path)
    if p.suffix.lower() in (".yaml", ".yml"):
        return _json.load_yaml(p)
    return _json.load(p)
