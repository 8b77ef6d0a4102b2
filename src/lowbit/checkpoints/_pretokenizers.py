"""llama.cpp's BPE pre-tokenizers, as ``tokenizers`` pre-tokenizer configurations.

A GGUF with a byte-level BPE vocabulary names its pre-tokenizer in ``tokenizer.ggml.pre``;
llama.cpp (``llama_vocab::impl::load`` and ``llm_tokenizer_bpe`` in llama-vocab.cpp) splits
the text with that type's regular expressions, applied one after another: each expression
cuts every piece so far into its matches and the text between them (both kept), and BPE then
runs inside each piece on its UTF-8 bytes. ``tokenizers``' ``Split(..., behavior="isolated")``
does exactly that cut, so a type is a sequence of Splits followed by a byte-level mapping that
does no splitting of its own.

:data:`PRE_TOKENIZERS` holds the types lowbit implements (those of the llama-architecture
GGUFs lowbit runs); :func:`pre_tokenizer` refuses any other type instead of silently
tokenizing differently from llama.cpp.
"""

from __future__ import annotations

from typing import Any

from lowbit.errors import LowbitError

__all__ = ["PRE_TOKENIZERS", "pre_tokenizer"]

# GPT-2's expression (llama.cpp writes it without the trailing ``|\s+``: its splitter keeps
# the text between matches, as an isolated Split does, so the two cut alike).
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
# Llama 3's expression, with llama.cpp's case-insensitive contractions spelled out.
_LLAMA3 = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

#: ``tokenizer.ggml.pre`` -> the regular expressions llama.cpp applies in order.
PRE_TOKENIZERS: dict[str, tuple[str, ...]] = {
    # llama.cpp's LLAMA_VOCAB_PRE_TYPE_DEFAULT (also used when the key is absent)
    "default": (r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"),
    "llama-bpe": (_LLAMA3,),  # LLAMA3 (Llama 3.x)
    "gpt-2": (_GPT2,),  # GPT2
    # SMOLLM (SmolLM/SmolLM2): every digit is a piece of its own, then GPT-2's expression;
    # STARCODER, REFACT, COMMAND_R, CODESHELL and EXAONE share these expressions
    "smollm": (r"\p{N}", _GPT2),
    "starcoder": (r"\p{N}", _GPT2),
    "refact": (r"\p{N}", _GPT2),
    "command-r": (r"\p{N}", _GPT2),
    "codeshell": (r"\p{N}", _GPT2),
    "exaone": (r"\p{N}", _GPT2),
}


def pre_tokenizer(pre: str | None) -> Any:
    """The ``tokenizers`` pre-tokenizer that cuts text as llama.cpp's type ``pre`` does.

    Args:
        pre: the GGUF's ``tokenizer.ggml.pre`` (None, when the key is absent: ``default``, as
            in llama.cpp).

    Returns:
        A ``tokenizers.pre_tokenizers.Sequence``: one isolated ``Split`` per expression, then
        ``ByteLevel`` without a regex of its own (it maps bytes to BPE symbols only).

    Raises:
        LowbitError: a type lowbit does not implement (the message lists those it does).
    """
    from tokenizers import Regex, pre_tokenizers

    name = "default" if pre is None else str(pre)
    if name not in PRE_TOKENIZERS:
        raise LowbitError(
            f"GGUF pre-tokenizer {name!r} (tokenizer.ggml.pre) is not implemented, so lowbit "
            f"would not tokenize as llama.cpp does; implemented: {', '.join(PRE_TOKENIZERS)}"
        )
    splits = [pre_tokenizers.Split(Regex(e), behavior="isolated") for e in PRE_TOKENIZERS[name]]
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    return pre_tokenizers.Sequence([*splits, byte_level])
