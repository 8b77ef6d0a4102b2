"""The tokenizer that goes with a checkpoint, built offline (needs ``transformers`` and
``tokenizers``, imported on use): a GGUF file's own vocabulary, or a folder's tokenizer files.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lowbit.checkpoints._pretokenizers import pre_tokenizer
from lowbit.checkpoints.readers import Checkpoint
from lowbit.errors import LowbitError

__all__ = ["build_tokenizer"]


def build_tokenizer(checkpoint: Checkpoint) -> Any:
    """The tokenizer that goes with a checkpoint, built offline.

    A GGUF with a byte-level BPE vocabulary (``tokenizer.ggml.model == "gpt2"``, as SmolLM2)
    gets a ``tokenizers`` BPE built from its vocabulary and merges, the same tokenizer
    transformers builds from the file (GGUF control tokens are special tokens) in a fraction of
    the time; other GGUF vocabularies go through transformers' own GGUF conversion. A folder
    uses its ``tokenizer.json`` / ``tokenizer_config.json``.

    Raises:
        LowbitError: no tokenizer files.
    """
    import transformers

    if checkpoint.format == "gguf":
        md = checkpoint.metadata
        if md.get("tokenizer.ggml.model") == "gpt2" and "tokenizer.ggml.merges" in md:
            return _gguf_bpe_tokenizer(md)
        return transformers.AutoTokenizer.from_pretrained(
            checkpoint.path.parent, gguf_file=checkpoint.path.name, local_files_only=True
        )
    folder = checkpoint.path if checkpoint.path.is_dir() else checkpoint.path.parent
    if not (folder / "tokenizer.json").exists() and not (folder / "tokenizer_config.json").exists():
        raise LowbitError(f"{folder}: no tokenizer.json or tokenizer_config.json")
    return transformers.AutoTokenizer.from_pretrained(folder, local_files_only=True)


def _gguf_bpe_tokenizer(md: Mapping[str, Any]) -> Any:
    import transformers
    from tokenizers import AddedToken, Tokenizer, decoders, models

    tokens = md["tokenizer.ggml.tokens"]
    types = md.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    merges = [tuple(m.split(" ", 1)) for m in md["tokenizer.ggml.merges"]]
    bpe = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
    bpe.pre_tokenizer = pre_tokenizer(md.get("tokenizer.ggml.pre"))  # llama.cpp's splitting
    bpe.decoder = decoders.ByteLevel()
    # llama.cpp token types: 3 = CONTROL (special), 4 = USER_DEFINED (kept whole, not special)
    bpe.add_special_tokens(
        [
            AddedToken(t, special=True, normalized=False)
            for t, k in zip(tokens, types, strict=True)
            if k == 3
        ]
    )
    bpe.add_tokens(
        [
            AddedToken(t, special=False, normalized=False)
            for t, k in zip(tokens, types, strict=True)
            if k == 4
        ]
    )

    def tok(key: str) -> str | None:
        i = md.get(f"tokenizer.ggml.{key}")
        return tokens[i] if isinstance(i, int) and 0 <= i < len(tokens) else None

    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        bos_token=tok("bos_token_id"),
        eos_token=tok("eos_token_id"),
        unk_token=tok("unknown_token_id"),
        pad_token=tok("padding_token_id"),
        chat_template=md.get("tokenizer.chat_template"),
    )
