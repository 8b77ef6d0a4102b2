"""The tokenizer that goes with a checkpoint, built offline (needs ``transformers`` and
``tokenizers``, imported on use): a GGUF file's own vocabulary or a folder's tokenizer files; and
the tokenizer files written beside an output.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lowbit.checkpoints.gguf.tokenizer import gguf_bpe, gguf_bpe_tokenizer
from lowbit.checkpoints.readers import Checkpoint
from lowbit.errors import LowbitError

__all__ = ["build_tokenizer", "write_tokenizer"]


def build_tokenizer(checkpoint: Checkpoint) -> Any:
    """The tokenizer that goes with a checkpoint, built offline.

    A GGUF with a byte-level BPE vocabulary (``tokenizer.ggml.model == "gpt2"``, as SmolLM2)
    gets a ``tokenizers`` BPE built from its vocabulary and merges, the same tokenizer
    transformers builds from the file (GGUF control tokens are special tokens) in a fraction of
    the time; other GGUF vocabularies go through transformers' own GGUF conversion. A folder
    uses its ``tokenizer.json`` / ``tokenizer_config.json``.

    Raises:
        LowbitError: no tokenizer files; a GGUF without a tokenizer, an importance matrix, or
            a vocabulary transformers cannot convert.
    """
    import transformers

    if checkpoint.format == "gguf":
        md = checkpoint.metadata
        if md.get("general.type") == "imatrix" or md.get("general.architecture") == "imatrix":
            raise LowbitError(
                f"{checkpoint.path}: an importance matrix (general.type imatrix), not a model; "
                "give the GGUF model it was computed for"
            )
        kind = md.get("tokenizer.ggml.model")
        if kind is None:
            raise LowbitError(
                f"{checkpoint.path}: the GGUF holds no tokenizer (no tokenizer.ggml.model); "
                "this needs the model's vocabulary to read text"
            )
        if kind == "gpt2" and "tokenizer.ggml.merges" in md:
            return gguf_bpe_tokenizer(md)
        try:
            return transformers.AutoTokenizer.from_pretrained(
                checkpoint.path.parent, gguf_file=checkpoint.path.name, local_files_only=True
            )
        except (ValueError, KeyError, TypeError, IndexError) as exc:  # transformers' converter
            why = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
            raise LowbitError(
                f"{checkpoint.path}: transformers cannot build its {str(kind)[:40]!r} tokenizer "
                f"({why})"
            ) from None
    folder = checkpoint.path if checkpoint.path.is_dir() else checkpoint.path.parent
    if not (folder / "tokenizer.json").exists() and not (folder / "tokenizer_config.json").exists():
        raise LowbitError(f"{folder}: no tokenizer.json or tokenizer_config.json")
    return transformers.AutoTokenizer.from_pretrained(folder, local_files_only=True)


def write_tokenizer(checkpoint: Checkpoint, folder: str | os.PathLike[str]) -> list[str]:
    """Write the tokenizer that goes with a checkpoint into ``folder`` as Hugging Face files;
    the names written.

    A GGUF with a byte-level BPE vocabulary gets ``tokenizer.json`` (the ``tokenizers`` BPE
    :func:`build_tokenizer` wraps, adding BOS / EOS where the GGUF's ``add_bos_token`` /
    ``add_eos_token`` say so, as llama.cpp does) and a ``tokenizer_config.json`` naming
    ``PreTrainedTokenizerFast``, its special tokens and the chat template, written without
    importing transformers (about 0.8 s) and readable by transformers 4 and 5 alike
    (transformers 5's own ``save_pretrained`` names ``TokenizersBackend``, a class
    transformers 4 lacks). Other checkpoints go through :func:`build_tokenizer` and
    ``save_pretrained``, with that class renamed ``PreTrainedTokenizerFast`` (transformers 5's
    alias of it).

    Raises:
        LowbitError: no tokenizer (see :func:`build_tokenizer`).
    """
    out = Path(folder)
    md = checkpoint.metadata if checkpoint.format == "gguf" else {}
    if md.get("tokenizer.ggml.model") == "gpt2" and "tokenizer.ggml.merges" in md:
        bpe, specials, template = gguf_bpe(md)
        config: dict[str, Any] = {
            "tokenizer_class": "PreTrainedTokenizerFast",
            **{k: v for k, v in specials.items() if v is not None},
            "clean_up_tokenization_spaces": False,
        }
        if template is not None:
            config["chat_template"] = template
        bpe.post_processor = _post_processor(md, specials)
        (out / "tokenizer.json").write_text(bpe.to_str(), encoding="utf-8")
        _write_json(out / "tokenizer_config.json", config)
        return ["tokenizer.json", "tokenizer_config.json"]
    before = {p.name for p in out.iterdir()}
    build_tokenizer(checkpoint).save_pretrained(out)
    config_file = out / "tokenizer_config.json"
    if config_file.is_file():  # transformers 5's generic class, unknown to transformers 4
        config = json.loads(config_file.read_text(encoding="utf-8"))
        if config.get("tokenizer_class") == "TokenizersBackend":
            config["tokenizer_class"] = "PreTrainedTokenizerFast"  # its name in both
            _write_json(config_file, config)
    return sorted(p.name for p in out.iterdir() if p.name not in before)


def _write_json(path: Path, obj: Any) -> None:
    """``obj`` as indented UTF-8 JSON, as transformers writes its configs."""
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _post_processor(md: Mapping[str, Any], specials: Mapping[str, str | None]) -> Any:
    """What the written tokenizer adds around a text: the BOS / EOS token where the GGUF says
    ``tokenizer.ggml.add_bos_token`` / ``add_eos_token`` is true (as llama.cpp adds them, e.g.
    Llama 3's ``<|begin_of_text|>``), nothing otherwise; a pair's second text gets type id 1.
    With neither, this is the pass-through transformers 5 sets when it wraps the BPE."""
    from tokenizers import processors

    ends: dict[str, str] = {}  # "bos" / "eos" -> the token added there
    ids: dict[str, int] = {}
    for end in ("bos", "eos"):
        token = specials[f"{end}_token"]
        if md.get(f"tokenizer.ggml.add_{end}_token") is True and token is not None:
            ends[end] = token
            ids[token] = int(md[f"tokenizer.ggml.{end}_token_id"])

    def side(seq: str, type_id: int) -> str:
        parts = [f"{ends['bos']}:{type_id}"] if "bos" in ends else []
        parts.append(f"${seq}:{type_id}")
        if "eos" in ends:
            parts.append(f"{ends['eos']}:{type_id}")
        return " ".join(parts)

    return processors.TemplateProcessing(
        single=side("A", 0), pair=f"{side('A', 0)} {side('B', 1)}", special_tokens=list(ids.items())
    )
