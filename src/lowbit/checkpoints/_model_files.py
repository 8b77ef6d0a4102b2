"""Which files of a Hugging Face source go into a quantized checkpoint: an allowlist.

Only files that belong to a model are copied: its config, generation config, tokenizer files,
chat templates, processor config, README and licence, and sentence-transformers' module
configs (``modules.json``, ``1_Pooling/config.json`` ...). Each must be a regular file inside
the source folder: a symbolic link is followed only when its target stays inside the folder
(or, for a Hugging Face cache snapshot ``.../snapshots/REV``, inside that repository's
``blobs`` folder). Python files (custom modelling code) are copied only on request
(``copy_code``). Everything else -- notes, keys, datasets, other weights -- is left out, and
listed with the reason, so a checkpoint never carries what the user did not mean to share.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

COPY_LIMIT = 50 * 2**20  # bytes; a tokenizer.json of a 256k vocabulary is about 35 MB
_NAMES = frozenset({
    "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
    "tokenizer.model", "spiece.model", "sentencepiece.bpe.model", "special_tokens_map.json",
    "added_tokens.json", "vocab.txt", "vocab.json", "merges.txt", "chat_template.json",
    "chat_template.jinja", "preprocessor_config.json", "processor_config.json", "README.md",
    "modules.json", "sentence_bert_config.json", "config_sentence_transformers.json",
})  # fmt: skip
_LICENCE = re.compile(r"(LICEN[CS]E|NOTICE|COPYING)(\.(md|txt))?", re.IGNORECASE)
_MODULE_CONFIG = re.compile(r"\d+_[A-Za-z]+/[A-Za-z0-9_]+\.json")  # sentence-transformers
_WEIGHTS = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".pkl", ".gguf", ".h5", ".msgpack",
            ".onnx", ".ot", ".npy", ".npz")  # fmt: skip
_LIST_LIMIT = 200  # left-out entries listed; more are counted in one last entry


@dataclass(frozen=True)
class ModelFiles:
    """What a quantized checkpoint takes from its source folder.

    Attributes:
        copied: ``(real file, relative name)`` to copy.
        left_out: ``(relative name, why)`` of every other entry (the source's own weight files
            excepted), at most 200 listed.
    """

    copied: tuple[tuple[Path, str], ...] = ()
    left_out: tuple[tuple[str, str], ...] = ()

    @property
    def copied_names(self) -> list[str]:
        return [rel for _, rel in self.copied]

    def left_out_list(self) -> list[dict[str, str]]:
        """``[{"file", "why"}]`` for a manifest or ``--json``."""
        return [{"file": rel, "why": why} for rel, why in self.left_out]


def model_files(checkpoint: Any, *, copy_code: bool = False) -> ModelFiles:
    """The files of a checkpoint's source folder that belong in its quantized version.

    Args:
        checkpoint: an open checkpoint; a GGUF source or a lone ``.safetensors`` file (no
            ``config.json`` beside it) has none.
        copy_code: also copy the folder's top-level ``.py`` files (custom modelling code that
            ``trust_remote_code`` runs).

    Returns:
        A :class:`ModelFiles`.
    """
    if checkpoint.format == "gguf":
        return ModelFiles()
    path = Path(checkpoint.path)
    folder = path if path.is_dir() else path.parent
    if not path.is_dir() and not (folder / "config.json").is_file():
        return ModelFiles()
    root = Path(os.path.realpath(folder))
    allowed_roots = [root]
    if root.parent.name == "snapshots":  # a Hugging Face cache: links into ../../blobs
        allowed_roots.append(root.parent.parent / "blobs")
    weights = _weight_files(checkpoint)
    copied: list[tuple[Path, str]] = []
    left: list[tuple[str, str]] = []
    for rel, full in _entries(folder):
        if Path(os.path.realpath(full)) in weights or rel.endswith(".safetensors.index.json"):
            continue  # the source's own weights: the quantized ones replace them
        why = _why_not(rel, full, allowed_roots, copy_code)
        if why is None:
            copied.append((Path(os.path.realpath(full)), rel))
        else:
            left.append((rel, why))
    if len(left) > _LIST_LIMIT:
        more = len(left) - _LIST_LIMIT
        left = [*left[:_LIST_LIMIT], ("...", f"{more} more entries, not listed")]
    return ModelFiles(tuple(copied), tuple(left))


def _weight_files(checkpoint: Any) -> set[Path]:
    out = set()
    for name in checkpoint.names():
        f = getattr(checkpoint.info(name), "file", None)
        if f is not None:
            out.add(Path(os.path.realpath(f)))
    if Path(checkpoint.path).is_file():
        out.add(Path(os.path.realpath(checkpoint.path)))
    return out


def _entries(folder: Path) -> list[tuple[str, Path]]:
    """Top-level entries and those one folder down (not inside hidden folders or links)."""
    out = []
    for entry in sorted(os.scandir(folder), key=lambda e: e.name):
        full = Path(entry.path)
        if entry.is_dir(follow_symlinks=False) and not entry.name.startswith("."):
            try:
                subs = sorted(os.scandir(full), key=lambda e: e.name)
            except OSError:
                subs = []
            if not subs:
                out.append((entry.name + "/", full))
            for sub in subs:
                rel = f"{entry.name}/{sub.name}"
                out.append(
                    (rel + ("/" if sub.is_dir(follow_symlinks=False) else ""), Path(sub.path))
                )
        else:
            out.append((entry.name + ("/" if entry.is_dir(follow_symlinks=False) else ""), full))
    return out


def _why_not(rel: str, full: Path, roots: list[Path], copy_code: bool) -> str | None:
    """Why an entry is not copied, or None when it is."""
    name = rel.rsplit("/", 1)[-1]
    if rel.endswith("/"):
        return "a folder (only a model's own files are copied)"
    if any(part.startswith(".") for part in rel.split("/")):
        return "a hidden file"
    code = name.endswith(".py") and "/" not in rel
    if not (rel in _NAMES or _LICENCE.fullmatch(rel) or _MODULE_CONFIG.fullmatch(rel) or code):
        if name.endswith(_WEIGHTS):
            return "weights that are not part of this checkpoint"
        return "not on the list of model files (config, tokenizer, chat template, README, licence)"
    if code and not copy_code:
        return "Python code: copied only with --copy-code (copy_code=True)"
    real = Path(os.path.realpath(full))
    if full.is_symlink() and not any(real == r or r in real.parents for r in roots):
        return "a symbolic link leading outside the model folder"
    try:
        st = os.stat(real)
    except OSError as exc:
        return f"unreadable ({exc.strerror})"
    if not stat.S_ISREG(st.st_mode):
        return "not a regular file"
    if st.st_size > COPY_LIMIT:
        return f"larger than {COPY_LIMIT // 2**20} MB"
    return None
