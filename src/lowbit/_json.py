"""The one JSON reader for files that come from a user: bounded size, depth and integers.

Every JSON document lowbit reads from a user's file (a safetensors header, ``lowbit.json``,
``config.json``, a shard index, a plan file) goes through :func:`loads` / :func:`load`, so a
corrupt or hostile file is one :class:`~lowbit.errors.LowbitError` naming the file, never a
``RecursionError`` (nesting), a ``ValueError`` from Python's 4,300-digit ``int`` limit, or minutes
and gigabytes spent on one value:

- size: at most ``max_bytes`` (default 100 MB, the safetensors package's own header limit);
- nesting: at most ``max_depth`` levels of arrays/objects (default 64; real files use under 10);
- integers: at most 20 digits and within ``[-2**63, 2**64)``, checked on the digit string before
  Python converts it (``parse_int`` hook), so a shape or offset of 5,000 digits is refused cheaply;
- duplicate keys (``unique_keys=True``): refused in any object, as the safetensors package
  refuses a header naming one tensor twice (Python's ``json`` keeps the last silently).

Messages quote values through :func:`short_repr`, which never formats more than a few dozen
characters of a value (a huge integer is not even converted to decimal).
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Mapping
from itertools import accumulate
from pathlib import Path
from typing import Any

import numpy as np

from lowbit.errors import LowbitError

MAX_BYTES = 100_000_000
MAX_DEPTH = 64
_MAX_INT_DIGITS = 20  # 2**64 has 20 digits
_INT_MIN, _INT_LIMIT = -(2**63), 2**64

_YAML_STRINGS = re.compile(rb'"(?:[^"\\]|\\.)*"|\'(?:[^\']|\'\')*\'', re.DOTALL)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_NOT_SKELETON = bytes(b for b in range(256) if b not in b'[]{}"')
_DELTA = [0] * 256
_DELTA[ord("[")] = _DELTA[ord("{")] = 1
_DELTA[ord("]")] = _DELTA[ord("}")] = -1
_STEPS = np.array(_DELTA, dtype=np.int8)


class _Refused(ValueError):
    """Raised from inside the json hooks; turned into a LowbitError naming the file."""


def short_repr(value: Any, limit: int = 60, _level: int = 0) -> str:
    """``repr(value)`` cut to about ``limit`` characters, safe on any value.

    A huge ``int`` is described by its bit length (converting it to decimal could itself raise
    past Python's 4,300-digit limit, or take seconds); long or deep containers and long strings
    are cut.
    """
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 192:
        return f"<an integer of {value.bit_length()} bits>"
    if isinstance(value, (list, tuple)):
        if _level >= 2 and value:
            return f"[... {len(value)} items]"
        items = [short_repr(v, 16, _level + 1) for v in value[:6]]
        more = f", ... ({len(value)} items)" if len(value) > 6 else ""
        text = ", ".join(items) + more
        if isinstance(value, tuple):
            return f"({text}{',' if len(value) == 1 else ''})"
        return f"[{text}]"
    if isinstance(value, dict):
        return f"<an object of {len(value)} keys>" if value else "{}"
    if isinstance(value, (str, bytes)) and len(value) > limit:
        return f"{value[:limit]!r}... ({len(value)} long)"
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _parse_int(digits: str) -> int:
    if len(digits.lstrip("-")) > _MAX_INT_DIGITS:
        raise _Refused(f"an integer of {len(digits)} digits (at most {_MAX_INT_DIGITS})")
    value = int(digits)
    if not _INT_MIN <= value < _INT_LIMIT:
        raise _Refused(f"the integer {value} is outside [-2**63, 2**64)")
    return value


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _Refused(f"the key {short_repr(key)} appears twice in one object")
            seen.add(key)
    return out


def depth(raw: bytes) -> int:
    """The deepest nesting of arrays and objects in a JSON document (brackets in strings skipped).

    Linear and in C: escaped backslashes and quotes are dropped, then everything but quotes
    and brackets; a bracket counts when an even number of quotes precedes it (numpy).
    """
    skeleton = raw.replace(b"\\\\", b"").replace(b'\\"', b"").translate(None, _NOT_SKELETON)
    if not skeleton:
        return 0
    chars = np.frombuffer(skeleton, np.uint8)
    quote = (chars == ord('"')).view(np.uint8)
    steps = _STEPS[chars]
    steps[np.bitwise_xor.accumulate(quote).view(bool)] = 0  # inside a string
    return max(int(np.cumsum(steps, dtype=np.int32).max()), 0)


def _yaml_depth(raw: bytes) -> int:
    """As :func:`depth` for YAML's flow style (quoted strings of either kind skipped)."""
    skeleton = _YAML_STRINGS.sub(b"", raw).translate(None, _NOT_BRACKETS)
    return max(accumulate(map(_DELTA.__getitem__, skeleton)), default=0)


def loads(
    raw: bytes | str,
    source: str | os.PathLike[str],
    *,
    max_depth: int = MAX_DEPTH,
    unique_keys: bool = False,
) -> Any:
    """Parse one JSON document from a user's file, within lowbit's limits.

    Args:
        raw: the document (UTF-8 bytes, or text).
        source: what to name in errors (the file, or "file: what").
        max_depth: the deepest nesting of arrays/objects allowed.
        unique_keys: refuse an object that names a key twice.

    Returns:
        The parsed value (dicts, lists, str, int, float, bool, None).

    Raises:
        LowbitError: not UTF-8, not JSON, nested deeper than ``max_depth``, an integer beyond 20
            digits or ``[-2**63, 2**64)``, or (``unique_keys``) a duplicate key.
    """
    if isinstance(raw, str):
        try:
            raw = raw.encode("utf-8")
        except UnicodeEncodeError:  # lone surrogates: not text a file could hold
            raise LowbitError(f"{source}: not valid UTF-8 text") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise LowbitError(
            f"{source}: not valid JSON: not JSON or not UTF-8 (byte {exc.start} is not UTF-8)"
        ) from None
    found = depth(raw)
    if found > max_depth:
        raise LowbitError(
            f"{source}: JSON nested {found} levels deep; lowbit reads at most {max_depth}"
        )
    try:
        return json.loads(
            text, parse_int=_parse_int, object_pairs_hook=_unique if unique_keys else None
        )
    except _Refused as exc:
        raise LowbitError(f"{source}: refused JSON: {exc}") from None
    except json.JSONDecodeError as exc:
        raise LowbitError(
            f"{source}: not valid JSON: not JSON or not UTF-8 ({exc.msg} at line {exc.lineno} "
            f"column {exc.colno})"
        ) from None
    except RecursionError:  # pragma: no cover - the depth check above comes first
        raise LowbitError(f"{source}: JSON nested too deeply") from None


def load(
    path: str | os.PathLike[str],
    *,
    max_bytes: int = MAX_BYTES,
    max_depth: int = MAX_DEPTH,
    unique_keys: bool = False,
) -> Any:
    """Read and parse a JSON file from a user, within lowbit's limits (see :func:`loads`).

    Raises:
        LowbitError: not a regular file, unreadable, larger than ``max_bytes``, or a document
            :func:`loads` refuses.
    """
    p = Path(path)
    check_regular_file(p)
    try:
        with open(p, "rb") as fh:
            raw = fh.read(max_bytes + 1)
    except OSError as exc:
        raise LowbitError(f"{p}: cannot read ({exc.strerror or exc})") from None
    if len(raw) > max_bytes:
        raise LowbitError(f"{p}: larger than the {max_bytes:,}-byte limit for a JSON file")
    return loads(raw, p, max_depth=max_depth, unique_keys=unique_keys)


def load_yaml(path: str | os.PathLike[str], *, max_bytes: int = MAX_BYTES) -> Any:
    """Read a YAML file from a user (``yaml.safe_load``: no Python objects), within limits.

    Beyond :func:`load`'s size limit, the document may nest at most ``MAX_DEPTH`` levels, use
    only strings as keys (JSON's data model), and hold a million values counting every alias
    use (a "billion laughs" file of nested aliases is refused instead of walked).

    Raises:
        LowbitError: as :func:`load`, or malformed YAML.
        ImportError: PyYAML is missing.
    """
    try:
        import yaml
    except ImportError:
        raise ImportError(f"reading {path} needs PyYAML: pip install pyyaml") from None
    p = Path(path)
    check_regular_file(p)
    with open(p, "rb") as fh:
        raw = fh.read(max_bytes + 1)
    if len(raw) > max_bytes:
        raise LowbitError(f"{p}: larger than the {max_bytes:,}-byte limit for a YAML file")
    # PyYAML recurses per level and spends seconds before a RecursionError: count the flow
    # brackets first (block nesting needs indentation, so it cannot grow as fast)
    found = _yaml_depth(raw)
    if found > MAX_DEPTH:
        raise LowbitError(f"{p}: YAML nested {found} levels deep; lowbit reads at most {MAX_DEPTH}")
    try:
        doc = yaml.load(raw, Loader=_unique_key_loader(yaml))  # a SafeLoader subclass
    except yaml.YAMLError as exc:
        raise LowbitError(f"malformed YAML in {p}: {short_repr(str(exc), 200)}") from None
    except RecursionError:
        raise LowbitError(f"{p}: YAML nested too deeply") from None
    except ValueError as exc:  # e.g. an integer past Python's 4,300-digit limit
        raise LowbitError(f"malformed YAML in {p}: {short_repr(str(exc), 200)}") from None
    _check_tree(doc, p)
    return doc


def _unique_key_loader(yaml: Any) -> Any:
    """PyYAML's SafeLoader refusing a key given twice in one mapping (the YAML spec forbids
    it; PyYAML keeps the last silently, so a plan file's second ``default`` won unseen).
    Keys a ``<<`` merge brings in may still be overridden, as YAML intends."""

    class _Loader(yaml.SafeLoader):  # type: ignore[name-defined,misc]
        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            seen: set[Any] = set()
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=deep)
                try:
                    new = key not in seen
                except TypeError:  # an unhashable key: SafeLoader says so itself
                    continue
                if not new:
                    raise yaml.constructor.ConstructorError(
                        "while reading a mapping", node.start_mark,
                        f"found the key {short_repr(key, 60)} twice", key_node.start_mark,
                    )  # fmt: skip
                seen.add(key)
            return super().construct_mapping(node, deep=deep)

    return _Loader


def _check_tree(doc: Any, source: Path) -> None:
    """Depth, size and integer limits on a parsed document, walked without recursion."""
    stack = [(doc, 1)]
    seen = 0
    while stack:
        value, level = stack.pop()
        seen += 1
        if seen > 1_000_000:
            raise LowbitError(f"{source}: more than 1,000,000 values (aliases expanding?)")
        if isinstance(value, int) and not isinstance(value, bool):
            if not _INT_MIN <= value < _INT_LIMIT:
                raise LowbitError(f"{source}: the integer {short_repr(value)} is out of range")
        elif isinstance(value, (list, dict)):
            if isinstance(value, dict) and not all(isinstance(k, str) for k in value):
                bad = next(k for k in value if not isinstance(k, str))
                raise LowbitError(f"{source}: the key {short_repr(bad)} is not a string")
            if level > MAX_DEPTH:
                raise LowbitError(f"{source}: nested more than {MAX_DEPTH} levels deep")
            items = [*value.keys(), *value.values()] if isinstance(value, dict) else value
            stack.extend((v, level + 1) for v in items)


def _shown(path: object) -> str:
    text = repr(str(path))[1:-1]
    return text if len(text) <= 120 else text[:100] + f"... ({len(text)} characters)"


def path_exists(path: str | os.PathLike[str]) -> bool:
    """Whether a path names something (a dangling link does not), like ``Path.exists`` but
    with one LowbitError for a path the system refuses (too long, a symlink loop, a NUL or a
    lone surrogate) instead of an OSError or a silent False.

    Raises:
        LowbitError: the path cannot name a file.
    """
    try:
        os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return False
    except OSError as exc:
        raise LowbitError(f"{_shown(path)}: {exc.strerror or exc}") from None
    except ValueError:
        raise LowbitError(f"{_shown(path)}: not a path a file can have") from None
    return True


def check_regular_file(path: Path) -> int:
    """Refuse anything but a regular file (a FIFO would hang, a device never end); give its size.

    Raises:
        LowbitError: a missing path, or a FIFO, device, socket or folder.
    """
    import stat

    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise LowbitError(f"{path}: no such file") from None
    except OSError as exc:  # too long, a symlink loop, not a folder on the way
        raise LowbitError(f"{_shown(path)}: cannot read ({exc.strerror or exc})") from None
    except ValueError:  # a NUL, or a lone surrogate no file name can hold
        raise LowbitError(f"{_shown(path)}: not a path a file can have") from None
    if not stat.S_ISREG(st.st_mode):
        kind = (
            "a folder"
            if stat.S_ISDIR(st.st_mode)
            else "a FIFO (named pipe)"
            if stat.S_ISFIFO(st.st_mode)
            else "a socket"
            if stat.S_ISSOCK(st.st_mode)
            else "a device"
        )
        raise LowbitError(f"{path}: {kind}, not a regular file; lowbit reads only regular files")
    return st.st_size


def to_jsonable(obj: Any) -> Any:
    """Make numpy scalars/arrays, paths, NaN and inf JSON-safe (NaN/inf become strings)."""
    if isinstance(obj, Mapping):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return to_jsonable(obj.tolist())
    if isinstance(obj, np.generic):
        return to_jsonable(obj.item())
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    if isinstance(obj, float) and not math.isfinite(obj):
        return "nan" if math.isnan(obj) else ("inf" if obj > 0 else "-inf")
    return obj
