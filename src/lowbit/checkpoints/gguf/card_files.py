"""A Hugging Face folder's tokenizer and model-card files, checked as hostile input before the
``gguf`` package's ``SpecialVocab`` and ``Metadata`` read them for a GGUF conversion.

Those readers parse without limits and map no error: a 454-byte ``README.md`` of YAML aliases
took 28 s and 538 MB and gave a 201 MB GGUF, and malformed files ended in
``UnicodeDecodeError``, ``RecursionError``, ``AttributeError``, ``TypeError`` or
``JSONDecodeError`` (issue 41). :func:`check_card_files` reads each file the converter will
(``tokenizer_config.json``, ``generation_config.json``, ``special_tokens_map.json``,
``added_tokens.json``, ``chat_template.json`` / ``.jinja``, ``README.md``) first: a regular
file of at most :data:`MAX_BYTES`, strict UTF-8, JSON through ``lowbit._json`` (depth, integers,
duplicate keys) and a README's YAML front matter through its bounded YAML reader (a million
values counting alias uses), then the type of every field the converter uses. Each problem is
one ``LowbitError`` line naming the file and the field.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from lowbit import _json
from lowbit.errors import LowbitError

__all__ = ["MAX_BYTES", "check_card_files"]

#: The largest tokenizer or model-card file read (the cap on files a quantize copies).
MAX_BYTES = 50_000_000
_TOKENS = ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token",
           "mask_token")  # fmt: skip
_FLAGS = ("add_bos_token", "add_eos_token", "add_prefix_space", "legacy")
_IDS = ("bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id")


def _is_int(v: Any) -> bool:
    return type(v) is int


def _token(v: Any) -> bool:
    return (
        v is None
        or isinstance(v, str)
        or (isinstance(v, dict) and isinstance(v.get("content"), str))
    )


def _template(v: Any) -> bool:
    if v is None or isinstance(v, str):
        return True
    return isinstance(v, list) and all(
        isinstance(t, dict)
        and isinstance(t.get("name"), str)
        and isinstance(t.get("template"), str)
        for t in v
    )


def _ids(v: Any) -> bool:
    return v is None or _is_int(v) or (isinstance(v, list) and all(map(_is_int, v)))


def _tokenizer_config(doc: dict[str, Any]) -> str | None:
    for k in _TOKENS:
        if k in doc and not _token(doc[k]):
            return f"{k} must be a string or an object with a string content"
    for k in _FLAGS:
        if doc.get(k) is not None and not isinstance(doc[k], bool):
            return f"{k} must be true or false"
    if not _template(doc.get("chat_template")):
        return "chat_template must be a string or a list of {name, template} strings"
    added = doc.get("added_tokens_decoder")
    if added is not None and not (
        isinstance(added, dict)
        and all(isinstance(v, dict) and isinstance(v.get("content"), str) for v in added.values())
    ):
        return "added_tokens_decoder must map ids to objects with a string content"
    return None


def _special_tokens_map(doc: dict[str, Any]) -> str | None:
    for k in _TOKENS:
        if k in doc and not _token(doc[k]):
            return f"{k} must be a string or an object with a string content"
    extra = doc.get("additional_special_tokens")
    if extra is not None and not (isinstance(extra, list) and all(map(_token, extra))):
        return "additional_special_tokens must be a list of tokens"
    return None


def _generation_config(doc: dict[str, Any]) -> str | None:
    for k in _IDS:
        if k in doc and not _ids(doc[k]):
            return f"{k} must be an integer or a list of integers"
    return None


def _added_tokens(doc: dict[str, Any]) -> str | None:
    if not all(_is_int(v) for v in doc.values()):
        return "every token must map to an integer id"
    return None


def _chat_template_json(doc: dict[str, Any]) -> str | None:
    if not _template(doc.get("chat_template")):
        return "chat_template must be a string or a list of {name, template} strings"
    return None


_JSON: dict[str, Callable[[dict[str, Any]], str | None]] = {
    "tokenizer_config.json": _tokenizer_config,
    "special_tokens_map.json": _special_tokens_map,
    "generation_config.json": _generation_config,
    "added_tokens.json": _added_tokens,
    "chat_template.json": _chat_template_json,
}


def _read(p: Path) -> bytes:
    size = _json.check_regular_file(p)
    if size > MAX_BYTES:
        raise LowbitError(f"{p}: {size:,} bytes; lowbit reads such files up to {MAX_BYTES:,}")
    with open(p, "rb") as fh:
        raw = fh.read(MAX_BYTES + 1)
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise LowbitError(f"{p}: not UTF-8 (byte {exc.start})") from None
    return raw


def _front_matter(raw: bytes, p: Path) -> None:
    text = raw.decode("utf-8")
    if not text.startswith("---"):
        return
    lines = text.splitlines(keepends=True)
    if lines[0].strip() != "---":
        return
    end = next((i for i, line in enumerate(lines[1:], 1) if line.strip() == "---"), None)
    if end is None:
        raise LowbitError(f"{p}: the YAML front matter (from its first '---') has no closing '---'")
    body = "".join(lines[1:end]).encode("utf-8")
    doc = _json.loads_yaml(body, f"{p} (front matter)")
    if doc is not None and not isinstance(doc, dict):
        raise LowbitError(
            f"{p}: the YAML front matter is {type(doc).__name__}; a model card's is a mapping"
        )


def check_card_files(folder: str | Path) -> None:
    """Check a folder's tokenizer and model-card files before a GGUF conversion reads them.

    Raises:
        LowbitError: one line naming the file (and field) that is too large, not a regular
            file, not UTF-8, not within the JSON / YAML limits, or of the wrong type.
    """
    folder = Path(folder)
    for name, check in _JSON.items():
        p = folder / name
        if not _json.path_exists(p):
            continue
        doc = _json.loads(_read(p), str(p), unique_keys=True)
        if not isinstance(doc, dict):
            raise LowbitError(f"{p}: a JSON {type(doc).__name__}; lowbit expects an object")
        why = check(doc)
        if why is not None:
            raise LowbitError(f"{p}: {why}")
    if _json.path_exists(folder / "chat_template.jinja"):
        _read(folder / "chat_template.jinja")
    if _json.path_exists(folder / "README.md"):
        _front_matter(_read(folder / "README.md"), folder / "README.md")
