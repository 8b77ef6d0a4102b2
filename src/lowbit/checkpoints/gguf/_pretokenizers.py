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


# llama.cpp's converter names a Hugging Face tokenizer's pre-tokenizer by what the tokenizer
# makes of one text (convert_hf_to_gguf.py, ``get_vocab_base_pre``): the sha256 of ``str()`` of
# the token ids of :data:`_CHECK_TEXT` (special tokens added, as ``tokenizer.encode`` does).
_CHECK_TEXT = (
    "\n \n\n \n\n\n \t \t\t \t\n  \n   \n    \n     \n\U0001f680 (normal) "
    "\U0001f636\u200d\U0001f32b\ufe0f (multiple emojis concatenated) \u2705 \U0001f999\U0001f999 "
    "3 33 333 3333 33333 333333 3333333 33333333 3.3 3..3 3...3 "
    "\u1780\u17b6\u1793\u17cb\u178f\u17c2\u1796\u17b7\u179f\u17c1\u179f\u17a2\u17b6\u1785"
    "\U0001f601 ?\u6211\u60f3\u5728apple\u5de5\u4f5c1314151\u5929\uff5e ------======= "
    "\u043d\u0435\u0449\u043e \u043d\u0430 \u0411\u044a\u043b\u0433\u0430\u0440\u0441\u043a\u0438 "
    "''''''```````\"\"\"\"......!!!!!!?????? I've been 'told he's there, 'RE you sure? "
    "'M not sure I'll make it, 'D you like some tea? We'Ve a'lL"
)
#: sha256 of the check text's token ids -> ``tokenizer.ggml.pre`` (llama.cpp's own table, for the
#: pre-tokenizers of the families lowbit converts).
PRE_TOKENIZER_HASHES = {
    "0ef9807a4087ebef797fc749390439009c3b9eda9ad1a097abbe738f486c01e5": "llama-bpe",
    "35d91631860c815f952d711435f48d356ebac988362536bed955d43bfa436e34": "starcoder",
    "3ce83efda5659b07b1ad37ca97ca5797ea4285d9b9ab0dc679e4a720c9da7454": "gpt-2",
    "6221ad2852e85ce96f791f476e0b390cf9b474c9e3d1362f53a24a06dc8220ff": "refact",
    "9c2227e4dd922002fb81bde4fc02b0483ca4f12911410dee2255e4987644e3f8": "command-r",
    "e636dc30a262dcc0d8c323492e32ae2b70728f4df7dfe9737d9f920a282b8aea": "qwen2",
    "7b3e7548e4308f52a76e8229e4e6cc831195d0d1df43aed21ac6c93da05fec5f": "codeshell",
    "63b97e4253352e6f357cc59ea5b583e3a680eaeaf2632188c2b952de2588485e": "tekken",
    "855059429035d75a914d1eda9f10a876752e281a054a7a3d421ef0533e5b6249": "smollm",
    "4e2b24cc4770243d65a2c9ec19770a72f08cffc161adbb73fcbb6b7dd45a0aae": "exaone",
}


def pre_tokenizer_name(tokenizer: Any) -> str:
    """The ``tokenizer.ggml.pre`` llama.cpp's converter writes for a ``tokenizers.Tokenizer``.

    Raises:
        LowbitError: a pre-tokenizer outside :data:`PRE_TOKENIZER_HASHES` (llama.cpp's converter
            refuses those too: a GGUF naming the wrong one would tokenize differently).
    """
    import hashlib

    ids = tokenizer.encode(_CHECK_TEXT).ids
    digest = hashlib.sha256(str(list(ids)).encode()).hexdigest()
    name = PRE_TOKENIZER_HASHES.get(digest)
    if name is None:
        raise LowbitError(
            f"the tokenizer's pre-tokenizer (check hash {digest[:16]}...) is not one lowbit "
            f"knows for GGUF; known: {', '.join(sorted(set(PRE_TOKENIZER_HASHES.values())))}"
        )
    return name
