"""The tokenizer that goes with a checkpoint, built offline (needs ``transformers`` and
``tokenizers``, imported on use): a GGUF file's own vocabulary, or a folder's tokenizer files;
and a folder's tokenizer as llama.cpp's converter stores it in a GGUF.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lowbit.checkpoints._pretokenizers import pre_tokenizer, pre_tokenizer_name
from lowbit.checkpoints.readers import Checkpoint
from lowbit.errors import LowbitError

__all__ = ["add_hf_vocab", "build_tokenizer", "hf_vocab", "write_tokenizer"]


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
            return _gguf_bpe_tokenizer(md)
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
        bpe, specials, template = _gguf_bpe(md)
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


def _gguf_bpe_tokenizer(md: Mapping[str, Any]) -> Any:
    import transformers

    bpe, specials, template = _gguf_bpe(md)
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=bpe, **specials, chat_template=template
    )


def _gguf_bpe(md: Mapping[str, Any]) -> tuple[Any, dict[str, str | None], str | None]:
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
    pre = pre_tokenizer_name(tok)
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
            tokenizer that is not BPE, or a pre-tokenizer llama.cpp does not name.
    """
    tok, _ = _read_tokenizer(folder)
    return pre_tokenizer_name(tok)


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
    except Exception as exc:  # tokenizers raises its own exception types
        raise LowbitError(f"{path}: cannot read the tokenizer ({exc})") from None
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
    return Tokenizer.from_str(text), json.loads(text)


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
