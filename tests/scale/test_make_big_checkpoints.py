"""benchmarks/make_big_checkpoints.py: the real architectures' folders at tiny widths build in
transformers, their tensors are the shapes the configs name, and one seed gives the same bytes
(a different seed other bytes); with SmolLM2's padded tokenizer they become GGUF."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

pytestmark = pytest.mark.torch

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "make_big_checkpoints.py"
TINY = ["--layers", "2", "--hidden", "64", "--intermediate", "96", "--heads", "4",
        "--kv-heads", "2", "--head-dim", "16", "--vocab", "600", "--experts", "4",
        "--expert-intermediate", "32", "--top-k", "2", "--tokenizer", "random"]  # fmt: skip


def _script() -> Any:
    spec = importlib.util.spec_from_file_location("make_big_checkpoints", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, module)  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def test_full_configs_have_the_real_sizes() -> None:
    """Llama-3.1-8B's published parameter count (8,030,261,248) and the MoE's 7.37 B."""
    m = _script()
    assert m.parameters(m.LLAMA_8B) == 8_030_261_248
    assert 7.3e9 < m.parameters(m.QWEN3_MOE_7B) < 7.4e9
    assert m.LLAMA_8B["rope_scaling"]["rope_type"] == "llama3"


@pytest.mark.parametrize("model", ["llama-8b", "qwen3-moe-7b"])
def test_tiny_folder_builds_and_is_deterministic(tmp_path: Path, model: str) -> None:
    """transformers builds the model from the folder (AutoConfig, from_pretrained, the
    tokenizer), with every weight read from the shards; two runs with one seed write the same
    bytes, shards of any size the same tensors."""
    import torch
    from safetensors.numpy import load_file
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    m = _script()
    args = [*TINY, "--model", model, "--shard-gb", "0.00005"]
    assert m.main([str(tmp_path / "a"), *args]) == 0
    assert m.main([str(tmp_path / "b"), *args]) == 0
    assert m.main([str(tmp_path / "c"), *args, "--seed", "1"]) == 0
    assert m.main([str(tmp_path / "d"), *TINY, "--model", model]) == 0  # one shard
    a, b = tmp_path / "a" / model, tmp_path / "b" / model
    assert _digest(a) == _digest(b)
    assert (a / "model.safetensors.index.json").exists()
    assert len(list(a.glob("model-*.safetensors"))) > 2
    other = _digest(tmp_path / "c" / model)
    assert other["config.json"] == _digest(a)["config.json"]
    assert all(other[k] != v for k, v in _digest(a).items() if k.endswith(".safetensors"))
    one = load_file(str(tmp_path / "d" / model / "model.safetensors"))
    many: dict[str, np.ndarray] = {}
    for p in a.glob("model-*.safetensors"):
        many.update(load_file(str(p)))
    assert sorted(one) == sorted(many)
    assert all(one[k].tobytes() == many[k].tobytes() for k in one)

    cfg = AutoConfig.from_pretrained(a)
    assert cfg.num_hidden_layers == 2 and cfg.hidden_size == 64 and cfg.vocab_size == 600
    net, info = AutoModelForCausalLM.from_pretrained(
        a, dtype=torch.float32, output_loading_info=True
    )
    assert not any(info.values()), info  # nothing missing, unexpected or mismatched
    state = net.state_dict()
    for name, arr in many.items():  # each stored weight is the model's (bf16 widened)
        if name in state:  # (transformers 5 fuses a mixture's experts on load)
            assert np.array_equal(state[name].numpy(), arr.astype(np.float32)), name
    tok = AutoTokenizer.from_pretrained(a)
    assert len(tok) == 600 or (model == "qwen3-moe-7b" and len(tok) <= 600)
    ids = tok("The quick brown fox", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        logits = net(ids).logits
    assert logits.shape == (1, ids.shape[1], 600) and torch.isfinite(logits).all()
    names = json.loads((a / "config.json").read_text())
    assert names["model_type"] == ("llama" if model == "llama-8b" else "qwen3_moe")


@pytest.mark.parametrize("model", ["llama-8b", "qwen3-moe-7b"])
def test_smollm2_tokenizer_padded_converts_to_gguf(tmp_path: Path, model: str) -> None:
    """The default tokenizer is SmolLM2's, padded with special reserved tokens to the
    vocabulary: texts get SmolLM2's ids, the pre-tokenizer check names it ``smollm`` (so
    ``--out-format gguf`` takes the folder), bos/eos agree in every file, and the GGUF
    lowbit writes holds the whole vocabulary with the padding as control tokens."""
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    import lowbit.cli
    from lowbit.checkpoints import open_checkpoint
    from lowbit.checkpoints.gguf.tokenizer import check_hf_tokenizer, gguf_bpe
    from lowbit.checkpoints.shipped import default_model_path

    m = _script()
    vocab = 49152 + 40
    tiny = [a for a in TINY if a not in ("--tokenizer", "random")]
    i = tiny.index("--vocab")
    tiny[i + 1] = str(vocab)
    with pytest.raises(SystemExit, match="--tokenizer random"):
        m.main([str(tmp_path / "small"), *TINY[:-2], "--model", model])
    assert not (tmp_path / "small" / model).exists()
    assert m.main([str(tmp_path / "a"), *tiny, "--model", model]) == 0
    assert m.main([str(tmp_path / "b"), *tiny, "--model", model]) == 0
    a = tmp_path / "a" / model
    assert _digest(a) == _digest(tmp_path / "b" / model)

    assert check_hf_tokenizer(a) == "smollm"
    tok = Tokenizer.from_file(str(a / "tokenizer.json"))
    with open_checkpoint(default_model_path("smollm2")) as ckpt:
        ref = gguf_bpe(ckpt.metadata)[0]
    text = "The quick brown fox, 3.14159 <|im_start|>user\nwhy?<|im_end|> naïve"
    assert tok.encode(text).ids == ref.encode(text).ids
    assert tok.get_vocab_size(with_added_tokens=True) == vocab
    last = "<|reserved_special_token_39|>"
    assert tok.token_to_id(last) == vocab - 1
    assert tok.encode(f"a{last}b").ids == [*ref.encode("a").ids, vocab - 1, *ref.encode("b").ids]

    cfg = json.loads((a / "config.json").read_text())
    gen = json.loads((a / "generation_config.json").read_text())
    hf = AutoTokenizer.from_pretrained(a)
    assert len(hf) == vocab
    assert (cfg["bos_token_id"], cfg["eos_token_id"]) == (1, 2)
    assert (gen["bos_token_id"], gen["eos_token_id"]) == (1, 2)
    assert (hf.bos_token_id, hf.eos_token_id) == (1, 2)

    out = tmp_path / "m.gguf"
    argv = ["quantize", str(a), "--to", "q8_0", "--out-format", "gguf", "--out", str(out),
            "--no-progress"]  # fmt: skip
    assert lowbit.cli.main(argv) == 0
    with open_checkpoint(out) as g:
        md = g.metadata
    assert md["tokenizer.ggml.pre"] == "smollm"
    assert len(md["tokenizer.ggml.tokens"]) == vocab
    assert md["tokenizer.ggml.tokens"][-1] == last
    assert list(md["tokenizer.ggml.token_type"][49152:]) == [3] * 40  # CONTROL
    assert (md["tokenizer.ggml.bos_token_id"], md["tokenizer.ggml.eos_token_id"]) == (1, 2)
