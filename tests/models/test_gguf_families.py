"""Every family lowbit converts, round trip: a random transformers model -> lowbit's GGUF
(float32) -> lowbit's model built from that GGUF gives the same logits (within 1e-4); the
mixtures' expert stacks split back per expert."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("gguf")
pytest.importorskip("tokenizers")

from lowbit.checkpoints import open_checkpoint  # noqa: E402
from lowbit.checkpoints.streaming import convert_hf_to_gguf  # noqa: E402
from lowbit.checkpoints.tokenizer import write_tokenizer  # noqa: E402
from lowbit.errors import LowbitError  # noqa: E402
from lowbit.models.build import build_model  # noqa: E402
from tiny_models import shipped_path  # noqa: E402

SHAPE = dict(
    vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
    rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2, pad_token_id=2,
)  # fmt: skip
# (config class, its extra settings); Gemma's query_pre_attn_scalar is head_dim, the scale
# llama.cpp uses (GGUF has no key for it)
FAMILIES: dict[str, tuple[str, dict[str, Any]]] = {
    "llama": ("LlamaConfig", dict(tie_word_embeddings=False, head_dim=16)),
    "mistral": ("MistralConfig", dict(tie_word_embeddings=False, sliding_window=None)),
    "qwen2": ("Qwen2Config", dict(tie_word_embeddings=True)),
    "qwen3": ("Qwen3Config", dict(tie_word_embeddings=True, head_dim=16)),
    "gemma2": ("Gemma2Config", dict(head_dim=16, query_pre_attn_scalar=16, sliding_window=512)),
    "gemma3": (
        "Gemma3TextConfig",
        dict(
            head_dim=16, query_pre_attn_scalar=16, sliding_window=512, final_logit_softcapping=30.0
        ),
    ),
    "phi3": ("Phi3Config", dict(tie_word_embeddings=False, sliding_window=None)),
    # mixtures: 4 experts, 2 per token; norm_topk_prob as llama.cpp fixes it per architecture
    "mixtral": (
        "MixtralConfig",
        dict(tie_word_embeddings=False, head_dim=16, num_local_experts=4, num_experts_per_tok=2),
    ),
    "qwen2_moe": (
        "Qwen2MoeConfig",
        dict(
            tie_word_embeddings=False, num_experts=4, num_experts_per_tok=2,
            moe_intermediate_size=32, shared_expert_intermediate_size=64, norm_topk_prob=False,
        ),
    ),
    "qwen3_moe": (
        "Qwen3MoeConfig",
        dict(
            tie_word_embeddings=False, head_dim=16, num_experts=4, num_experts_per_tok=2,
            moe_intermediate_size=32, norm_topk_prob=True,
        ),
    ),
}  # fmt: skip


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SmolLM2's tokenizer files (a byte-level BPE llama.cpp's converter knows)."""
    tok = tmp_path_factory.mktemp("tok")
    write_tokenizer(open_checkpoint(shipped_path("smollm2")), tok)
    return tok


def _random_model(family: str, seed: int = 0) -> Any:
    """A float32 transformers model of the family with every parameter random (so a norm
    offset, a swapped name or a row order shows in the logits)."""
    cls_name, extra = FAMILIES[family]
    cfg = getattr(transformers, cls_name)(**SHAPE, **extra)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(cfg).float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(torch.randn_like(p) * 0.1 + (0.0 if "gemma" in family else 1.0))
            else:
                p.copy_(torch.randn_like(p) * 0.05)
    return model


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_hf_gguf_model_round_trip(family: str, tokenizer_dir: Path, tmp_path: Path) -> None:
    """HF -> lowbit's float32 GGUF -> lowbit's model: logits equal the HF model's within
    1e-4, tied embeddings and all."""
    model = _random_model(family)
    folder = tmp_path / family
    model.save_pretrained(folder)
    for f in tokenizer_dir.iterdir():
        shutil.copy(f, folder / f.name)
    out = tmp_path / f"{family}.gguf"
    convert_hf_to_gguf(folder, out, outtype="f32", progress=False)
    ckpt = open_checkpoint(out)
    assert {ckpt.info(n).dtype for n in ckpt.names()} == {"F32"}
    built = build_model(ckpt, progress=False)
    assert type(built).__name__ == type(model).__name__ or family == "mistral"
    ids = torch.tensor([[1, 17, 400, 9000, 49151, 5, 77, 2, 300, 12]])
    with torch.no_grad():
        want = model(ids).logits.numpy()
        got = built(ids).logits.numpy()
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-4)
    # --act llamacpp knows every linear layer's GGUF type (experts, tied heads included)
    linears = {n for n, m in built.named_modules() if isinstance(m, torch.nn.Linear)}
    assert set(built.lowbit_gguf_types) == linears
    assert set(built.lowbit_gguf_types.values()) == {"F32"}


def test_unknown_gguf_architecture_is_one_line(tokenizer_dir: Path, tmp_path: Path) -> None:
    """A GGUF architecture lowbit does not build is one LowbitError naming those it does."""
    import gguf

    path = tmp_path / "m.gguf"
    w = gguf.GGUFWriter(str(path), "mamba")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((4, 32), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    archs = r"llama, qwen2, qwen3, qwen2moe, qwen3moe, gemma2, gemma3, phi3"
    with pytest.raises(LowbitError, match=rf"'mamba'.*{archs}"):
        build_model(open_checkpoint(path), progress=False)


def test_llama3_rope_scaling_round_trip(tokenizer_dir: Path, tmp_path: Path) -> None:
    """Llama 3's rope scaling goes into llama.cpp's rope_freqs tensor and back: logits equal
    at positions past the original context's high-frequency band."""
    cfg = transformers.LlamaConfig(
        **{**SHAPE, "max_position_embeddings": 4096}, head_dim=16, tie_word_embeddings=True,
        rope_theta=500000.0,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).float().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.05 + (1.0 if p.ndim == 1 else 0.0))
    folder = tmp_path / "l3"
    model.save_pretrained(folder)
    for f in tokenizer_dir.iterdir():
        shutil.copy(f, folder / f.name)
    out = tmp_path / "l3.gguf"
    convert_hf_to_gguf(folder, out, outtype="f32", progress=False)
    ckpt = open_checkpoint(out)
    assert ckpt.names()[0] == "rope_freqs.weight" and ckpt.shape("rope_freqs.weight") == (8,)
    factors = ckpt.get("rope_freqs.weight")
    assert factors[0] == 1.0 and factors[-1] == 8.0
    built = build_model(ckpt, progress=False)
    ids = torch.arange(5, 3005, 3).reshape(1, -1)
    with torch.no_grad():
        want = model(ids).logits.numpy()
        got = built(ids).logits.numpy()
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-4)
