"""Issue 41, third round, items 3 and 4: a tokenizer.json the GGUF vocabulary cannot reproduce
is refused in one line naming the feature (not converted approximately), and safetensors whose
tensor shapes contradict config.json are one LowbitError line in every route, before any
allocation sized from them."""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from lowbit.cli import main
from lowbit.errors import LowbitError

pytest.importorskip("tokenizers")
pytest.importorskip("gguf")


def _run(*args: str) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(args))
    return code, err.getvalue()


def _one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The converter fixtures' tiny models (SmolLM2's tokenizer, as lowbit writes it)."""
    from tiny_models import llamacpp_tiny_models

    return llamacpp_tiny_models(tmp_path_factory.mktemp("convert"))


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


# ------------------------------------------------------------------------- tokenizers


def _set(doc: dict, path: str, value: Any) -> None:
    *parents, last = path.split(".")
    for p in parents:
        doc = doc[p] if not p.isdigit() else doc[int(p)]  # type: ignore[index]
    doc[int(last) if last.isdigit() else last] = value  # type: ignore[index]


@pytest.mark.parametrize(
    ("path", "value", "says"),
    [
        ("model.dropout", 0.1, "BPE dropout 0.1"),
        ("model.continuing_subword_prefix", "##", "BPE continuing_subword_prefix '##'"),
        ("model.end_of_word_suffix", "</w>", "BPE end_of_word_suffix '</w>'"),
        ("model.byte_fallback", True, "BPE byte_fallback True"),
        ("model.ignore_merges", True, "BPE ignore_merges True"),
        ("normalizer", {"type": "Lowercase"}, "normalizer 'Lowercase'"),
        ("normalizer", {"type": "Sequence", "normalizers": [{"type": "NFC"}, {"type": "NFKC"}]},
         "normalizer 'NFKC'"),
        ("decoder", {"type": "Sequence", "decoders": [{"type": "ByteLevel"},
                                                      {"type": "Fuse"}]},
         "decoder 'Fuse'"),
        ("added_tokens.1.lstrip", True, "added token '<|im_start|>' lstrip True"),
        ("added_tokens.2.rstrip", True, "added token '<|im_end|>' rstrip True"),
        ("added_tokens.3.single_word", True, "single_word True"),
        ("post_processor", {"type": "TemplateProcessing",
                            "single": [{"SpecialToken": {"id": "<|im_start|>", "type_id": 0}},
                                       {"SpecialToken": {"id": "<|im_end|>", "type_id": 0}},
                                       {"Sequence": {"id": "A", "type_id": 0}}],
                            "pair": [{"Sequence": {"id": "A", "type_id": 0}},
                                     {"Sequence": {"id": "B", "type_id": 1}}],
                            "special_tokens": {
                                t: {"id": t, "ids": [i], "tokens": [t]}
                                for t, i in (("<|im_start|>", 1), ("<|im_end|>", 2))}},
         "post-processor template"),
        ("truncation", {"direction": "Right", "max_length": 8, "strategy": "LongestFirst",
                        "stride": 0}, "truncation"),
    ],
)  # fmt: skip
def test_tokenizer_features_a_gguf_cannot_carry(
    tiny: Path, tmp_path: Path, path: str, value: Any, says: str
) -> None:
    """Each is refused before anything is written, from the library and the CLI."""
    from lowbit.checkpoints.streaming import convert_hf_to_gguf

    folder = _copy(tiny / "tiny-llama", tmp_path / "m")
    doc = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    _set(doc, path, value)
    (folder / "tokenizer.json").write_text(json.dumps(doc), encoding="utf-8")
    out = tmp_path / "x.gguf"
    with pytest.raises(LowbitError) as info:
        convert_hf_to_gguf(folder, out, progress=False)
    msg = str(info.value)
    assert says in msg and "tokenizer.json" in msg and "\n" not in msg, msg
    code, err = _run("quantize", str(folder), "--to", "q8_0", "--out-format", "gguf",
                     "--out", str(out))  # fmt: skip
    assert code == 2 and says in _one_line(err)
    assert not out.exists()


@pytest.mark.parametrize(
    ("path", "value"),
    [
        ("normalizer", {"type": "NFC"}),  # Qwen2's: kept (llama.cpp does not normalize either)
        ("model.dropout", 0.0),
        ("model.continuing_subword_prefix", ""),  # Qwen2's empty strings
        ("decoder", {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                     "use_regex": False}),
        ("post_processor", {"type": "ByteLevel", "add_prefix_space": False,
                            "trim_offsets": False, "use_regex": False}),
    ],
)  # fmt: skip
def test_tokenizer_features_llamacpp_reproduces_still_convert(
    tiny: Path, tmp_path: Path, path: str, value: Any
) -> None:
    """What llama.cpp's GGUF vocabulary reproduces (Qwen's NFC normalizer, empty prefixes, the
    byte-level decoder and processor) converts, to the same vocabulary as SmolLM2's."""
    from lowbit.checkpoints.gguf.tokenizer import hf_vocab

    folder = _copy(tiny / "tiny-llama", tmp_path / "m")
    before = hf_vocab(folder, None)
    doc = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    _set(doc, path, value)
    (folder / "tokenizer.json").write_text(json.dumps(doc), encoding="utf-8")
    assert hf_vocab(folder, None) == before


def test_ignore_merges_with_llama3s_pre_tokenizer() -> None:
    """llama.cpp ignores merges for its llama-bpe pre-tokenizer only (Llama 3's files say
    ignore_merges: true)."""
    from lowbit.checkpoints.gguf._tokenizer_exact import check_exact, check_ignore_merges

    doc = {"model": {"type": "BPE", "ignore_merges": True}, "decoder": {"type": "ByteLevel"}}
    check_exact(doc, "tokenizer.json")
    check_ignore_merges(doc, "tokenizer.json", "llama-bpe")
    with pytest.raises(LowbitError, match="ignore_merges"):
        check_ignore_merges(doc, "tokenizer.json", "smollm")
