"""The block Hadamard rotation folded into attention's value -> output projections: the model's
function unchanged (every family it accepts, GQA, v biases, GGUF names), refusals one line."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from lowbit.errors import LowbitError
from lowbit.methods.hadamard import rotate_rows
from lowbit.methods.hadamard_fold import fold_v_o, head_dim_of, v_o_pairs

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytestmark = pytest.mark.torch
torch.set_num_threads(1)
sys.path[:0] = [str(Path(__file__).resolve().parents[1])]
from tiny_models import save_gguf, save_hf_folder, tiny_bert, tiny_family, tiny_llama  # noqa: E402


def _out(model: Any, ids: Any) -> Any:
    res = model(ids)
    return res.logits if getattr(res, "logits", None) is not None else res.last_hidden_state


def _check_exact(path: Path, block: int, pairs: int, bias: bool = False) -> None:
    """The folded checkpoint's model gives the original's outputs to float32 rounding; the
    fold changed the weights; folding only the value rows breaks the model (so the check
    can fail)."""
    from lowbit.checkpoints import open_checkpoint
    from lowbit.evaluation.rotated import fold_checkpoint
    from lowbit.models.build import build_model

    ckpt = open_checkpoint(path)
    folded, record = fold_checkpoint(ckpt, block)
    assert record == {"kind": "block-hadamard", "where": "v_proj -> o_proj", "block": block,
                      "pairs": pairs}  # fmt: skip
    changed = sorted(folded.replaced)
    assert len(changed) == pairs * (3 if bias else 2)
    for n in changed:
        assert not np.allclose(folded.get(n), ckpt.get(n), atol=1e-3), n
    ids = torch.randint(0, 200, (2, 24), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        ref = _out(build_model(ckpt), ids)
        got = _out(build_model(folded), ids)
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=2e-5)
        v_only = {n: a for n, a in folded.replaced.items() if "v" in n.split(".")[-2]}
        assert v_only and len(v_only) < len(changed)
        wrong = _out(build_model(ckpt, weights=v_only), ids)
        assert (wrong - ref).abs().max() > 1e-3


@pytest.mark.parametrize("block", [16, 32])
def test_fold_llama_gqa_is_exact(tmp_path: Path, block: int) -> None:
    """Llama with 4 query heads on 2 value heads of 32 channels: blocks of 16 and 32."""
    _check_exact(save_hf_folder(tiny_llama(hidden=128), tmp_path / "hf"), block, pairs=2)


def test_fold_llama_gguf_names_is_exact(tmp_path: Path) -> None:
    """A GGUF llama (its own tensor names, permuted q/k): the same fold, the same function."""
    _check_exact(save_gguf(tiny_llama(), tmp_path / "m.gguf"), 16, pairs=2)


@pytest.mark.parametrize("kind", ["qwen2", "qwen3", "mistral", "gemma2", "gemma3_text"])
def test_fold_families_is_exact(tmp_path: Path, kind: str) -> None:
    """Qwen2 (its value bias rotates with the rows), Qwen3 and Gemma (q/k norms only), Mistral."""
    model = tiny_family(kind)
    bias = kind == "qwen2"
    assert (model.model.layers[0].self_attn.v_proj.bias is not None) == bias
    _check_exact(save_hf_folder(model, tmp_path / kind), 16, pairs=2, bias=bias)


def test_fold_bert_is_exact(tmp_path: Path) -> None:
    """BERT: attention.self.value -> attention.output.dense, value biases random."""
    _check_exact(save_hf_folder(tiny_bert(bias_std=0.1), tmp_path / "bert"), 16, pairs=2,
                 bias=True)  # fmt: skip


def test_fold_arrays() -> None:
    """R W_v, b_v R and W_o R exactly as rotate_rows makes them (R symmetric)."""
    rng = np.random.default_rng(0)
    t = {"a.self_attn.v_proj.weight": rng.standard_normal((32, 24)),
         "a.self_attn.v_proj.bias": rng.standard_normal(32),
         "a.self_attn.o_proj.weight": rng.standard_normal((24, 64))}  # fmt: skip
    names = [
        "a.self_attn.v_proj.weight",
        "a.self_attn.v_proj.bias",
        "a.self_attn.o_proj.weight",
        "a.self_attn.q_proj.weight",
    ]
    (pair,) = v_o_pairs(names, "llama")
    assert (pair.v_weight, pair.v_bias, pair.o_weight) == tuple(names[:3])
    out = fold_v_o(t.__getitem__, [pair], head_dim=16, block=16)
    h = rotate_rows(np.eye(16), 16)
    np.testing.assert_allclose(out["a.self_attn.v_proj.weight"][:16], h @ t["a.self_attn.v_proj.weight"][:16],
                               rtol=1e-6, atol=1e-6)  # fmt: skip
    np.testing.assert_allclose(out["a.self_attn.v_proj.bias"], rotate_rows(t["a.self_attn.v_proj.bias"], 16),
                               rtol=1e-6, atol=1e-6)  # fmt: skip
    np.testing.assert_allclose(out["a.self_attn.o_proj.weight"], rotate_rows(t["a.self_attn.o_proj.weight"], 16),
                               rtol=1e-6, atol=1e-6)  # fmt: skip


def test_refusals() -> None:
    """Phi-3's fused qkv_proj, families without an exact fold, checkpoints without a pair, a
    block that straddles heads, widths that are not whole heads: one LowbitError line each."""
    cases = [
        (lambda: v_o_pairs(["model.layers.0.self_attn.qkv_proj.weight"], "phi3"), "qkv_proj"),
        (lambda: v_o_pairs(["h.0.attn.c_attn.weight"], "gpt2"), "'gpt2'"),
        (lambda: v_o_pairs(["model.layers.0.self_attn.kv_b_proj.weight"], "deepseek_v3"),
         "no value -> output"),
        (lambda: fold_v_o(np.zeros, [], head_dim=16, block=32), "blocks of 32"),
        (lambda: fold_v_o(lambda n: np.zeros((24, 8) if "v" in n else (8, 64)),
                          v_o_pairs(["l.self_attn.v_proj.weight", "l.self_attn.o_proj.weight"], "llama"), 16, 16),
         "whole heads"),
    ]  # fmt: skip
    for call, match in cases:
        with pytest.raises(LowbitError, match=match) as info:
            call()
        assert "\n" not in str(info.value)
    assert head_dim_of({"hidden_size": 384, "num_attention_heads": 12}) == 32
    assert head_dim_of({"text_config": {"hidden_size": 64, "num_attention_heads": 4}}) == 16
    assert head_dim_of({"head_dim": 256, "hidden_size": 64, "num_attention_heads": 4}) == 256
