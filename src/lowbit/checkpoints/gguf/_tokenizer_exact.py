"""The tokenizer.json features a GGUF vocabulary cannot carry: refused before conversion.

A GGUF stores a byte-level BPE as tokens, types, merges, special ids and a pre-tokenizer name;
llama.cpp tokenizes from those alone (llama-vocab.cpp). Whatever else a ``tokenizer.json``
asks of ``tokenizers`` would be dropped by the conversion, and the GGUF would tokenize (or
decode) differently from the model's own tokenizer. llama.cpp's ``convert_hf_to_gguf.py``
converts such files anyway (it reads the vocabulary and hashes one text); lowbit refuses each,
naming the feature, so a GGUF it writes tokenizes as the folder does:

- the BPE model's ``dropout``, ``continuing_subword_prefix``, ``end_of_word_suffix`` and
  ``byte_fallback`` (llama.cpp's BPE has none of them); ``ignore_merges`` except with the
  ``llama-bpe`` and ``tekken`` pre-tokenizers, those of lowbit's names llama.cpp ignores
  merges for (``tokenizer_ignore_merges`` in llama-vocab.cpp);
- a normalizer other than Unicode NFC (Qwen's, kept: llama.cpp does not normalize, so text
  must already be NFC, as nearly all text is; refusing it would refuse every Qwen model);
- a decoder other than ``ByteLevel``;
- added tokens with ``lstrip``, ``rstrip`` or ``single_word`` (the GGUF has no such flags);
- a post-processor template that adds more than one token before or after the text, or
  anything between (llama.cpp adds at most a BOS before and an EOS after);
- ``truncation`` or ``padding`` set in the file (llama.cpp tokenizes whole texts).

The pre-tokenizer itself is checked by its behaviour
(:func:`lowbit.checkpoints.gguf._pretokenizers.pre_tokenizer_name`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lowbit._json import short_repr
from lowbit.errors import LowbitError

__all__ = ["check_exact", "check_ignore_merges"]

_POST = ("ByteLevel", "TemplateProcessing", "RobertaProcessing")
#: the pre-tokenizers llama.cpp tokenizes with ``tokenizer_ignore_merges`` (llama-vocab.cpp)
_IGNORES_MERGES = ("llama-bpe", "tekken")


def _type(node: Any) -> Any:
    return node.get("type") if isinstance(node, Mapping) else node


def _parts(node: Any) -> list[Any]:
    """A Sequence's members (normalizers, decoders and processors nest one level)."""
    if isinstance(node, Mapping) and node.get("type") == "Sequence":
        items = node.get("normalizers") or node.get("decoders") or node.get("processors") or []
        return list(items) if isinstance(items, list) else [items]
    return [] if node is None else [node]


def _refusal(where: str, feature: str, value: Any, why: str) -> LowbitError:
    return LowbitError(
        f"{where}: {feature} {short_repr(value)} cannot be stored in a GGUF vocabulary "
        f"({why}); lowbit converts tokenizers llama.cpp reproduces exactly"
    )


def check_ignore_merges(doc: Mapping[str, Any], where: str, pre: str) -> None:
    """Refuse ``ignore_merges`` unless llama.cpp ignores merges for the pre-tokenizer ``pre``
    (Llama 3's and Tekken's).

    Raises:
        LowbitError: one line naming the feature.
    """
    model = doc.get("model")
    if isinstance(model, Mapping) and model.get("ignore_merges") and pre not in _IGNORES_MERGES:
        raise _refusal(where, "BPE ignore_merges", True, f"llama.cpp merges with pre {pre!r}")


def check_exact(doc: Mapping[str, Any], where: str) -> None:
    """Refuse a tokenizer.json whose tokenization a GGUF vocabulary would not reproduce
    (before its pre-tokenizer is named: most of these change the check text's tokens, and the
    message should name the feature, not a hash; ``ignore_merges`` is checked with the name,
    :func:`check_ignore_merges`).

    Args:
        doc: the parsed tokenizer.json (already read by ``tokenizers``).
        where: the file, for messages.

    Raises:
        LowbitError: one line naming the first feature the conversion would drop.
    """

    def refuse(feature: str, value: Any, why: str) -> LowbitError:
        return _refusal(where, feature, value, why)

    if not isinstance(doc, Mapping):
        return  # tokenizers refuses it
    model = doc.get("model")
    if not isinstance(model, Mapping) or model.get("type") != "BPE":
        return  # refused for its kind (or by tokenizers)
    if model.get("dropout") not in (None, 0, 0.0):
        raise refuse("BPE dropout", model["dropout"], "llama.cpp merges deterministically")
    for key in ("continuing_subword_prefix", "end_of_word_suffix"):
        if model.get(key):
            raise refuse(f"BPE {key}", model[key], "llama.cpp's BPE marks no word pieces")
    if model.get("byte_fallback"):
        raise refuse("BPE byte_fallback", True, "llama.cpp's byte-level BPE has no <0xNN> tokens")
    for norm in _parts(doc.get("normalizer")):
        if _type(norm) != "NFC":
            raise refuse("normalizer", _type(norm), "llama.cpp does not normalize text")
    for dec in _parts(doc.get("decoder")):
        if _type(dec) != "ByteLevel":
            raise refuse("decoder", _type(dec), "llama.cpp decodes byte-level tokens only")
    added = doc.get("added_tokens")
    for tok in added if isinstance(added, list) else []:
        if not isinstance(tok, Mapping):
            continue
        for flag in ("lstrip", "rstrip", "single_word"):
            if tok.get(flag):
                raise refuse(f"added token {short_repr(tok.get('content'))} {flag}", True,
                             "the GGUF keeps no per-token flags")  # fmt: skip
    for proc in _parts(doc.get("post_processor")):
        kind = _type(proc)
        if kind not in _POST:
            raise refuse("post-processor", kind, "llama.cpp adds at most a BOS and an EOS")
        if kind == "TemplateProcessing" and not _simple(proc.get("single")):
            raise refuse("post-processor template", proc.get("single"),
                         "llama.cpp adds at most a BOS before the text and an EOS after")  # fmt: skip
    for key in ("truncation", "padding"):
        if doc.get(key) is not None:
            raise refuse(key, doc[key], "llama.cpp tokenizes whole texts")


def _simple(single: Any) -> bool:
    """A single-sequence template of at most one special token, the text, one special token."""
    if not isinstance(single, list):
        return False
    kinds = [next(iter(p), None) if isinstance(p, Mapping) else None for p in single]
    seqs = [i for i, k in enumerate(kinds) if k == "Sequence"]
    if len(seqs) != 1 or any(k not in ("Sequence", "SpecialToken") for k in kinds):
        return False
    seq = single[seqs[0]]["Sequence"]
    if not isinstance(seq, Mapping) or seq.get("id") != "A":
        return False
    return seqs[0] <= 1 and len(single) - seqs[0] - 1 <= 1
