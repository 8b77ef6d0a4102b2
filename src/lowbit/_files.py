"""Reading the small data files users give lowbit (plan files, hardware rows): JSON or YAML."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lowbit.errors import LowbitError

__all__ = ["read_data_file"]


def read_data_file(path: str | Path) -> Any:
    """Read a JSON file, or YAML when the name ends in .yaml/.yml (needs PyYAML).

    Raises:
        LowbitError: the file does not parse.
        ImportError: a YAML file without PyYAML installed.
    """
    p = Path(path)
    text = p.read_text(encoding="utf-8")
    if p.suffix.lower() in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError:
            raise ImportError(f"reading {p} needs PyYAML: pip install pyyaml") from None
        try:
            return yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise LowbitError(f"malformed YAML in {p}: {exc}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise LowbitError(f"malformed JSON in {p}: {exc}") from None
