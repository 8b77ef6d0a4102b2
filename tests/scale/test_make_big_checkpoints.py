"""benchmarks/make_big_checkpoints.py: the real architectures' folders at tiny widths build in
transformers, their tensors are the shapes the configs name, and one seed gives the same bytes
(a different seed other bytes)."""

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
        "--expert-intermediate", "32", "--top-k", "2"]  # fmt: skip


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
