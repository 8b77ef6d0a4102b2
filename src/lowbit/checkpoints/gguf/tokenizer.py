"""Tokenizers and GGUF vocabularies, both ways: a folder's tokenizer as llama.cpp's converter
stores it in a GGUF, and a GGUF's byte-level BPE vocabulary as a ``tokenizers`` BPE (needs
``transformers`` and ``tokenizers``, imported on use).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lowbit import _json
from lowbit._json import short_repr
from lowbit.checkpoints.gguf._pretokenizers import pre_tokenizer, pre_tokenizer_name
from lowbit.checkpoints.gguf._tokenizer_exact import check_exact, check_ignore_merges
from lowbit.errors import LowbitError

__all__ = ["add_hf_vocab", "hf_vocab"]


def gguf_bpe_tokenizer(md: Mapping[str, Any]) -> Any:
    import transformers

    bpe, specials, template = gguf_bpe(md)
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=bpe, **specials, chat_template=template
    )


def gguf_bpe(md: Mapping[str, Any]) -> tuple[Any, dict[str, str | None], str | None]:
    """The ``tokenizers`` BPE of a GGUF's byte-level vocabulary, its special tokens
    (``bos_token`` ... as transformers names them) and its chat template."""
    from tokenizers import AddedToken, Tokenizer, decoders, models

    tokens = md["tokenizer.ggml.tokens"]
    types = md.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    vocab = {t: i for i, t in enumerate(tokens)}
    merges = []
    for k, m in enumerate(md["tokenizer.ggml.merges"]):
        a, sep, b = m.partition(" ")
        # tokenizers raises a bare Exception (or a TypeError) for a merge of two tokens, or
        # into one, that the vocabulary lacks: say which, in one line
        if not sep or a not in vocab or b not in vocab or a + b not in vocab:
            shown = m if len(m) <= 40 else m[:37] + "..."
            raise LowbitError(
                f"GGUF tokenizer: merge {k} {shown!r} does not fit the vocabulary (a merge is "
                f"two tokens separated by one space, and both and their join are tokens)"
            )
        merges.append((a, b))
    bpe = Tokenizer(models.BPE(vocab=vocab, merges=merges))
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

    specials = {
        "bos_token": tok("bos_token_id"),
        "eos_token": tok("eos_token_id"),
        "unk_token": tok("unknown_token_id"),
        "pad_token": tok("padding_token_id"),
    }
    return bpe, specials, md.get("tokenizer.chat_template")


# llama.cpp token types (gguf.TokenType)
_NORMAL, _CONTROL, _USER_DEFINED, _UNUSED = 1, 3, 4, 5


def _looks_special(token: str) -> bool:
    """Added tokens llama.cpp's converter makes CONTROL although not marked special."""
    return (
        token in ("<pad>", "<mask>", "<2mass>", "[@BOS@]")
        or (token.startswith("<|") and token.endswith("|>"))
        or (token.startswith("<\uff5c") and token.endswith("\uff5c>"))
        or (token.startswith("<unused") and token.endswith(">"))
    )


def hf_vocab(
    folder: str | os.PathLike[str], vocab_size: int | None
) -> tuple[list[str], list[int], str, list[str]]:
    """A Hugging Face byte-level BPE tokenizer as llama.cpp's converter stores it: the token
    list (ids without a token become ``[PADi]``, type UNUSED), their types (NORMAL; added
    tokens CONTROL when special or special-looking, else USER_DEFINED), the pre-tokenizer
    name (``tokenizer.ggml.pre``) and the merges (:func:`_merges`).

    Args:
        folder: holds ``tokenizer.json``.
        vocab_size: the model's (config ``vocab_size``); None: the tokenizer's.

    Raises:
        LowbitError: no ``tokenizer.json``, a tokenizer that is not BPE, or an unknown
            pre-tokenizer.
    """
    tok, doc = _read_tokenizer(folder)
    vocab = tok.get_vocab(with_added_tokens=True)
    n = int(vocab_size) if vocab_size is not None else len(vocab)
    if vocab and max(vocab.values()) >= n:
        raise LowbitError(
            f"{Path(folder) / 'tokenizer.json'}: token id {max(vocab.values())} is past "
            f"vocab_size {n}"
        )
    pre = pre_tokenizer_name(tok)  # (check_exact ran when the file was read)
    check_ignore_merges(doc, str(Path(folder) / "tokenizer.json"), pre)
    by_id = {i: t for t, i in vocab.items()}
    added = tok.get_added_tokens_decoder()
    tokens: list[str] = []
    types: list[int] = []
    for i in range(n):
        token = by_id.get(i)
        if token is None:
            tokens.append(f"[PAD{i}]")
            types.append(_UNUSED)
            continue
        if i in added:
            if not added[i].normalized:  # llama.cpp expects added tokens pre-normalized
                ids = tok.encode(token, add_special_tokens=False).ids
                token = tok.decode(ids, skip_special_tokens=False)
            if added[i].special or _looks_special(token):
                types.append(_CONTROL)
            else:
                token = token.replace("\u2581", " ")
                types.append(_USER_DEFINED)
        else:
            types.append(_NORMAL)
        tokens.append(token)
    return tokens, types, pre, _merges(doc)


def check_hf_tokenizer(folder: str | os.PathLike[str]) -> str:
    """Check that a folder's tokenizer can be stored as llama.cpp's converter stores it, before
    any work; its ``tokenizer.ggml.pre``.

    Raises:
        LowbitError: no ``tokenizer.json``, a SentencePiece ``tokenizer.model`` beside it, a
            tokenizer that is not BPE, a pre-tokenizer llama.cpp does not name, or a feature
            a GGUF vocabulary would drop (:func:`~lowbit.checkpoints.gguf._tokenizer_exact.check_exact`).
    """
    tok, doc = _read_tokenizer(folder)  # check_exact runs as the file is read
    pre = pre_tokenizer_name(tok)
    check_ignore_merges(doc, str(Path(folder) / "tokenizer.json"), pre)
    return pre


def _read_tokenizer(folder: str | os.PathLike[str]) -> tuple[Any, dict[str, Any]]:
    """The ``tokenizers.Tokenizer`` of a folder's tokenizer.json and its JSON, checked."""

    path = Path(folder) / "tokenizer.json"
    if not path.is_file():
        raise LowbitError(
            f"{folder}: GGUF conversion reads a byte-level BPE tokenizer from tokenizer.json, "
            "and there is none (SentencePiece tokenizer.model files are not converted)"
        )
    try:
        st = path.stat()
        tok, doc = _parsed(str(path), st.st_mtime_ns, st.st_size)
        kind = doc["model"]["type"]
    except LowbitError:
        raise
    except BaseException as exc:  # tokenizers raises its own types, and panics (Rust)
        if not isinstance(exc, Exception) and type(exc).__name__ != "PanicException":
            raise  # KeyboardInterrupt, SystemExit
        said = " ".join(str(exc).split())[:200]
        raise LowbitError(f"{path}: cannot read the tokenizer ({said})") from None
    if kind != "BPE":
        raise LowbitError(f"{path}: a {kind} tokenizer; lowbit's GGUF conversion takes BPE ones")
    if (Path(folder) / "tokenizer.model").is_file():  # llama.cpp's converter reads that one
        raise LowbitError(
            f"{folder}: a SentencePiece tokenizer.model, which llama.cpp's converter stores as a "
            "'llama' vocabulary; lowbit converts byte-level BPE tokenizers (tokenizer.json) only"
        )
    return tok, doc


@functools.lru_cache(maxsize=2)
def _parsed(path: str, mtime_ns: int, size: int) -> tuple[Any, dict[str, Any]]:
    """A tokenizer.json parsed once per version of the file (planning checks it, writing reads
    it: half a second each for a 50k vocabulary). The caller must not modify the results."""
    from tokenizers import Tokenizer

    text = Path(path).read_text(encoding="utf-8")
    doc = _json.loads(text, path)  # depth-bounded: 3 million nested brackets took 9 s
    check_exact(doc, path)  # naming a feature the GGUF would drop, not its consequence
    _check_merges(doc, path)  # before tokenizers, which panics on some (a Rust panic)
    return Tokenizer.from_str(text), doc


def _check_merges(doc: Any, path: str) -> None:
    """Each BPE merge is two tokens of the vocabulary whose join is one too."""
    model = doc.get("model") if isinstance(doc, dict) else None
    if not isinstance(model, dict) or model.get("type") != "BPE":
        return  # refused by kind later
    vocab, merges = model.get("vocab"), model.get("merges") or []
    if not isinstance(vocab, dict) or not isinstance(merges, list):
        raise LowbitError(f"{path}: model.vocab is not a mapping or model.merges not a list")
    for k, m in enumerate(merges):  # (check_exact refused word-piece prefixes and suffixes)
        pair = m.split(" ") if isinstance(m, str) else m
        ok = isinstance(pair, list) and len(pair) == 2 and all(isinstance(p, str) for p in pair)
        if ok:
            a, b = pair
            ok = a in vocab and b in vocab and a + b in vocab
        if not ok:
            raise LowbitError(
                f"{path}: merge {k} {short_repr(m)} does not fit the vocabulary (two tokens "
                f"whose join is a token)"
            )


def add_hf_vocab(writer: Any, folder: str | os.PathLike[str], vocab_size: int | None) -> None:
    """Add a Hugging Face tokenizer's ``tokenizer.ggml.*`` keys (and the chat template) to a
    ``gguf.GGUFWriter``, as llama.cpp's converter does for a byte-level BPE vocabulary: model
    ``gpt2``, pre-tokenizer, tokens, types, then merges, special token ids, add-BOS/EOS and the
    chat template as the ``gguf`` package's ``SpecialVocab`` reads them from the folder."""
    import gguf

    tokens, types, pre, merges = hf_vocab(folder, vocab_size)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    if merges:
        writer.add_token_merges(merges)
    gguf.SpecialVocab(Path(folder), load_merges=False).add_to_gguf(writer, quiet=True)


def _merges(doc: Mapping[str, Any]) -> list[str]:
    """A BPE's merges as GGUF keeps them, ``"left right"``: pairs given as two strings (newer
    tokenizer.json files) have their spaces written as U+0120, as the ``gguf`` package's
    ``SpecialVocab`` does (a tenth of its time: it maps each character)."""
    merges = doc["model"].get("merges") or []
    if merges and isinstance(merges[0], str):
        return list(merges)
    return [" ".join(part.replace(" ", "\u0120") for part in pair) for pair in merges]
