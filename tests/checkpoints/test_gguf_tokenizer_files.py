"""The tokenizer files written for a GGUF source (compressed-tensors outputs): written without
transformers, loaded by transformers as the tokenizer lowbit builds in memory."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("tokenizers")
transformers = pytest.importorskip("transformers")
pytest.importorskip("torch")

from lowbit.checkpoints import open_checkpoint  # noqa: E402
from lowbit.checkpoints.tokenizer import build_tokenizer, write_tokenizer  # noqa: E402
from tiny_models import save_gguf, save_hf_folder, shipped_path, tiny_llama  # noqa: E402

TEMPLATE = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + "
    "'<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{% endif %}"
)
TEXTS = ["the cat sat", " tt t  t\tt\n", "year 2024: x'll 7 tt", ""]


def _same_tokenizer(folder: Path, ref: object, texts: list[str]) -> None:
    """transformers loads ``folder`` as a tokenizer that encodes, decodes and names its
    special tokens as ``ref`` does."""
    got = transformers.AutoTokenizer.from_pretrained(folder, local_files_only=True)
    for text in texts:
        ids = got(text)["input_ids"]
        assert ids == ref(text)["input_ids"], text
        assert got.decode(ids) == ref.decode(ids), text
    for key in ("bos_token", "eos_token", "unk_token", "pad_token"):
        assert getattr(got, key) == getattr(ref, key), key
    assert got.all_special_tokens == ref.all_special_tokens
    pair = got("t t", "tt")
    assert pair["input_ids"] == ref("t t", "tt")["input_ids"]


def test_gguf_bpe_files_load_as_the_built_tokenizer(tmp_path: Path) -> None:
    """tokenizer.json and tokenizer_config.json (PreTrainedTokenizerFast, the specials, the
    chat template) load in transformers as build_tokenizer's tokenizer: same ids, specials,
    pair encoding and chat template; tokenizer.json is the built one's backend, exactly."""
    src = save_gguf(
        tiny_llama(),
        tmp_path / "t.gguf",
        metadata={"tokenizer.ggml.pre": "smollm", "tokenizer.chat_template": TEMPLATE},
    )
    ckpt = open_checkpoint(src)
    out = tmp_path / "tok"
    out.mkdir()
    assert write_tokenizer(ckpt, out) == ["tokenizer.json", "tokenizer_config.json"]
    assert sorted(p.name for p in out.iterdir()) == ["tokenizer.json", "tokenizer_config.json"]
    ref = build_tokenizer(ckpt)
    config = json.loads((out / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert config["chat_template"] == TEMPLATE
    assert config["bos_token"] == ref.bos_token and config["pad_token"] == ref.pad_token
    written = json.loads((out / "tokenizer.json").read_text())
    built = json.loads(ref.backend_tokenizer.to_str())
    if transformers.__version__.split(".")[0] != "4":  # 4.x leaves the post-processor unset
        assert written == built
    else:
        written.pop("post_processor"), built.pop("post_processor")
        assert written == built
    _same_tokenizer(out, ref, TEXTS)
    got = transformers.AutoTokenizer.from_pretrained(out, local_files_only=True)
    chat = [{"role": "user", "content": "t t"}]
    assert got.apply_chat_template(
        chat, tokenize=False, add_generation_prompt=True
    ) == ref.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)


def test_gguf_bpe_files_are_written_without_transformers(tmp_path: Path) -> None:
    """Writing a GGUF's BPE tokenizer files never imports transformers (about 0.8 s)."""
    src = save_gguf(tiny_llama(), tmp_path / "t.gguf", metadata={"tokenizer.ggml.pre": "smollm"})
    out = tmp_path / "tok"
    out.mkdir()
    code = (
        "import sys\n"
        "from lowbit.checkpoints import open_checkpoint\n"
        "from lowbit.checkpoints.tokenizer import write_tokenizer\n"
        f"names = write_tokenizer(open_checkpoint({str(src)!r}), {str(out)!r})\n"
        "print(','.join(names), 'transformers' in sys.modules)\n"
    )
    got = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.split()
    assert got == ["tokenizer.json,tokenizer_config.json", "False"]


def test_other_sources_save_through_transformers(tmp_path: Path) -> None:
    """A folder source's tokenizer is saved by transformers (save_pretrained): the files it
    wrote are named, name no class transformers 4 lacks, and load as the source's tokenizer."""
    folder = save_hf_folder(tiny_llama(), tmp_path / "hf")
    ckpt = open_checkpoint(folder)
    out = tmp_path / "tok"
    out.mkdir()
    (out / "keep.txt").write_text("not the tokenizer's")
    names = write_tokenizer(ckpt, out)
    assert "tokenizer.json" in names and "keep.txt" not in names
    config = json.loads((out / "tokenizer_config.json").read_text())
    assert config.get("tokenizer_class") != "TokenizersBackend"  # transformers 4 lacks it
    _same_tokenizer(out, build_tokenizer(ckpt), TEXTS[:3])


def test_smollm2_files_give_its_ids(tmp_path: Path) -> None:
    """The shipped SmolLM2 GGUF: the written files encode the default text's first 20,000
    characters and a chat as the built tokenizer does."""
    from lowbit.evaluation.perplexity import default_text

    ckpt = open_checkpoint(shipped_path("smollm2"))
    out = tmp_path / "tok"
    out.mkdir()
    write_tokenizer(ckpt, out)
    ref = build_tokenizer(ckpt)
    _same_tokenizer(out, ref, [default_text()[1][:20_000], "<|im_start|>user\nhi<|im_end|>"])
    got = transformers.AutoTokenizer.from_pretrained(out, local_files_only=True)
    chat = [{"role": "user", "content": "What is 2+2?"}]
    assert got.apply_chat_template(
        chat, tokenize=False, add_generation_prompt=True
    ) == ref.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)


@pytest.mark.parametrize(
    ("flags", "before", "after"),
    [
        ({"tokenizer.ggml.add_bos_token": True}, [257], []),
        ({"tokenizer.ggml.add_eos_token": True}, [], [258]),
        (
            {"tokenizer.ggml.add_bos_token": True, "tokenizer.ggml.add_eos_token": True},
            [257],
            [258],
        ),
        ({"tokenizer.ggml.add_bos_token": False}, [], []),
    ],
)
def test_gguf_add_bos_and_eos_flags_are_honoured(
    tmp_path: Path, flags: dict[str, bool], before: list[int], after: list[int]
) -> None:
    """A GGUF whose tokenizer.ggml.add_bos_token / add_eos_token is true (Llama 3's) gets a
    tokenizer.json that adds those tokens around each text, as llama.cpp does; the text's own
    ids are unchanged, add_special_tokens=False adds nothing, and a pair gets them per text."""
    src = save_gguf(
        tiny_llama(), tmp_path / "t.gguf", metadata={"tokenizer.ggml.pre": "smollm", **flags}
    )
    out = tmp_path / "tok"
    out.mkdir()
    write_tokenizer(open_checkpoint(src), out)
    got = transformers.AutoTokenizer.from_pretrained(out, local_files_only=True)
    plain = build_tokenizer(open_checkpoint(src))("t t")["input_ids"]  # no tokens added
    assert got("t t")["input_ids"] == before + plain + after
    assert got("t t", add_special_tokens=False)["input_ids"] == plain
    pair = got("t t", "tt")
    second = build_tokenizer(open_checkpoint(src))("tt")["input_ids"]
    assert pair["input_ids"] == before + plain + after + before + second + after
