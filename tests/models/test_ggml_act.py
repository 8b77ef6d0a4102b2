"""--act llamacpp: activations rounded as llama.cpp's CPU backend rounds them before a product.

Each kind equals a plain numpy float32 transcription of llama.cpp's x86 code (quantize_row_q8_0
and q8_1 in ggml-cpu/arch/x86/quants.c, quantize_row_q8_K_ref in ggml-quants.c, with its signed
maximum and its clamp), bit for bit; the layers of a model built from a GGUF get their
weights' types, a tied output the token embedding's; eval's rows and its refusals."""

from __future__ import annotations

import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from lowbit.errors import LowbitError

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytestmark = pytest.mark.torch
torch.set_num_threads(1)

sys.path[:0] = [str(Path(__file__).resolve().parents[1])]
from lowbit.evaluation.act_modes import simulate_llamacpp_activations  # noqa: E402
from lowbit.models.ggml_act import (  # noqa: E402
    VEC_DOT_TYPE,
    fake_quantize_ggml,
    vec_dot_type,
)
from tiny_models import gguf_metadata, gguf_tensors, tiny_llama  # noqa: E402

F32 = np.float32


def ref_q8_0(x: np.ndarray) -> np.ndarray:
    """x86 quantize_row_q8_0, dequantized as the dot product sees it: codes * fp16(d)."""
    out = np.empty_like(x)
    for i, b in enumerate(x.reshape(-1, 32)):
        amax = F32(np.max(np.abs(b)))
        d = np.float16(F32(amax / F32(127.0)))
        inv = F32(F32(127.0) / amax) if amax != 0 else F32(0.0)
        codes = np.rint(b * inv).astype(np.int32)  # _mm256_round_ps: ties to even
        assert np.all(np.abs(codes) <= 127)
        out.reshape(-1, 32)[i] = codes.astype(F32) * F32(d)
    return out


def ref_q8_k(x: np.ndarray) -> np.ndarray:
    """quantize_row_q8_K_ref: the signed maximum (first of largest magnitude), iscale =
    -127/max, codes min(127, nearest_int(iscale * x)), d = 1/iscale in float32."""
    out = np.empty_like(x)
    for i, b in enumerate(x.reshape(-1, 256)):
        amax, mx = F32(0.0), F32(0.0)
        for v in b:
            if abs(v) > amax:
                amax, mx = F32(abs(v)), v
        if amax == 0:
            out.reshape(-1, 256)[i] = 0.0
            continue
        iscale = F32(F32(-127.0) / mx)
        codes = np.minimum(127, np.rint(iscale * b).astype(np.int32))
        out.reshape(-1, 256)[i] = codes.astype(F32) * F32(F32(1.0) / iscale)
    return out + F32(0.0)  # a zero code is zero (a negative d would make it -0.0)


def _data(k: int, rows: int = 6) -> np.ndarray:
    rng = np.random.default_rng(k)
    x = rng.standard_t(3, size=(rows, k)).astype(F32)
    x[1] = 0.0  # all-zero blocks
    x[2, : k // 2] = -x[2, : k // 2]
    x[3] *= F32(1e-30)  # tiny scales (subnormal fp16 d for Q8_0)
    x[4] = np.float32(np.round(rng.standard_normal(k) * 4) / 2)  # ties at x * 127 / amax
    x[4, ::32] = 127.0  # so that the multiplier is exactly 1: ±0.5, ±1.5, ... are ties
    x[5, 7] = -1e4  # one outlier sets a block's (negative) maximum
    return x


@pytest.mark.parametrize(("kind", "ref", "k"), [("Q8_0", ref_q8_0, 96), ("Q8_1", ref_q8_0, 64),
                                                 ("Q8_K", ref_q8_k, 512)])  # fmt: skip
def test_blocks_equal_llamacpp_code(kind: str, ref: object, k: int) -> None:
    x = _data(k)
    got = fake_quantize_ggml(torch.from_numpy(x.copy()), kind).numpy()
    want = ref(x)  # type: ignore[operator]
    assert got.view(np.uint32).tolist() == want.view(np.uint32).tolist()


def test_ties_round_to_even() -> None:
    """With amax = 127 the multiplier is 1: 0.5 -> 0, 1.5 -> 2, 2.5 -> 2, -2.5 -> -2."""
    x = np.zeros(32, F32)
    x[:6] = [127.0, 0.5, 1.5, 2.5, -2.5, -0.5]
    got = fake_quantize_ggml(torch.from_numpy(x), "Q8_0").numpy()
    assert got[:6].tolist() == [127.0, 0.0, 2.0, 2.0, -2.0, -0.0]


@pytest.mark.parametrize(("kind", "dt"), [("F16", np.float16), ("BF16", ml_dtypes.bfloat16)])
def test_half_types_round_to_nearest_even(kind: str, dt: object) -> None:
    bits = np.random.default_rng(0).integers(0, 2**32, 1 << 16, dtype=np.uint32)
    x = bits.view(F32)
    x = x[np.isfinite(x) & (np.abs(x) < 6e4)]
    got = fake_quantize_ggml(torch.from_numpy(x.copy()), kind).numpy()
    want = x.astype(dt).astype(F32)
    assert got.view(np.uint32).tolist() == want.view(np.uint32).tolist()
    assert fake_quantize_ggml(torch.from_numpy(x.copy()), "F32").numpy().tobytes() == x.tobytes()


def test_vec_dot_types_and_bad_input() -> None:
    assert vec_dot_type("q4_k") == "Q8_K" and vec_dot_type("Q5_0") == "Q8_0"
    assert vec_dot_type("Q4_1") == "Q8_1" and vec_dot_type("IQ4_XS") == "Q8_K"
    assert vec_dot_type("BF16") == "BF16" and vec_dot_type("IQ4_NL") == "Q8_0"
    assert set(VEC_DOT_TYPE.values()) == {"F32", "F16", "BF16", "Q8_0", "Q8_1", "Q8_K"}
    with pytest.raises(LowbitError, match=r"no llama\.cpp CPU matrix product"):
        vec_dot_type("I32")
    with pytest.raises(LowbitError, match="blocks of 256"):
        fake_quantize_ggml(torch.ones(2, 96), "Q8_K")
    with pytest.raises(LowbitError, match=r"unknown llama\.cpp activation type"):
        fake_quantize_ggml(torch.ones(2, 96), "Q4_0")


def _gguf(tmp_path: Path, types: dict[str, str], tie: bool = True) -> Path:
    from lowbit.checkpoints.gguf.writer import GGUFTensor, write_gguf

    model = tiny_llama(tie=tie)
    tensors = {
        n: GGUFTensor(a, types[n.split(".")[-2]]) if n.split(".")[-2] in types else a
        for n, a in gguf_tensors(model).items()
    }
    path = tmp_path / "mixed.gguf"
    return write_gguf(path, tensors, metadata=gguf_metadata(model), arch="llama", progress=False)


def test_layers_take_their_weight_types(tmp_path: Path) -> None:
    """A GGUF's linear layers get their stored types' activations (the tied output: the token
    embedding's), and each hooked input is exactly fake_quantize_ggml of the raw input."""
    from lowbit.models.build import load_model

    types = {"attn_q": "Q4_0", "attn_v": "F16", "ffn_down": "BF16", "ffn_up": "Q4_1",
             "token_embd": "Q8_0"}  # fmt: skip
    model = load_model(_gguf(tmp_path, types))
    got = model.lowbit_gguf_types
    assert got["model.layers.0.self_attn.q_proj"] == "Q4_0"
    assert got["model.layers.1.mlp.down_proj"] == "BF16"
    assert got["model.layers.0.self_attn.k_proj"] == "F32"
    assert got["lm_head"] == "Q8_0"  # tied: llama.cpp multiplies by token_embd.weight
    raw, seen = {}, {}
    for name, m in model.named_modules():
        if name in got:
            m.register_forward_pre_hook(lambda _m, a, n=name: raw.__setitem__(n, a[0].clone()))
            m.register_forward_hook(lambda _m, a, _o, n=name: seen.__setitem__(n, a[0].clone()))
    ids = torch.arange(3, 19).reshape(1, -1)
    with torch.no_grad():
        plain = model(input_ids=ids).logits
        with simulate_llamacpp_activations(model) as kinds:
            emulated = model(input_ids=ids).logits
            before, hooked = dict(raw), dict(seen)  # this pass's inputs around the hooks
        after = model(input_ids=ids).logits
    assert kinds["model.layers.0.mlp.up_proj"] == "Q8_1"
    assert "model.layers.0.self_attn.k_proj" not in kinds  # F32: multiplied as it is
    for name, kind in kinds.items():
        assert torch.equal(hooked[name], fake_quantize_ggml(before[name], kind)), name
    assert not torch.equal(plain, emulated) and torch.equal(plain, after)


def test_eval_rows_and_refusals(tmp_path: Path) -> None:
    from lowbit.evaluation.variants import evaluate_variants
    from tiny_models import save_gguf, save_hf_folder

    text = tmp_path / "t.txt"
    text.write_text(" ".join(f"word{i % 17} and {i}" for i in range(2000)))
    f32 = save_gguf(tiny_llama(), tmp_path / "f32.gguf")
    q = _gguf(tmp_path, {"attn_q": "Q4_0", "ffn_gate": "Q5_0", "token_embd": "Q8_0"})
    res = evaluate_variants(f32, [q], None, act="llamacpp", tokens=120, window=40, text=text,
                            threads=1, progress=False)  # fmt: skip
    names = [r["name"] for r in res["rows"]]
    assert names == ["original", "mixed.gguf", "original + llamacpp", "mixed.gguf + llamacpp"]
    assert res["rows"][3]["activations"] == "llamacpp" and res["rows"][3]["kl_mean"] > 0
    with pytest.raises(LowbitError, match="--schemes none"):
        evaluate_variants(f32, [], ["int4:g32"], act="llamacpp", text=text, progress=False)
    with pytest.raises(LowbitError, match="not a GGUF file"):
        evaluate_variants(save_hf_folder(tiny_llama(), tmp_path / "hf"), [], None,
                          act="llamacpp", text=text, progress=False)  # fmt: skip
    res = evaluate_variants(f32, [q], None, act="llamacpp", kv="f16", tokens=80, window=40,
                            text=text, threads=1, progress=False)  # fmt: skip
    assert res["rows"][3]["name"] == "mixed.gguf + llamacpp+kv:f16"


def test_llamacpp_attention_reads_the_f16_cache(tmp_path: Path) -> None:
    """--act llamacpp also reads keys and values through llama.cpp's default F16 cache (queries
    stay float32, as its batched flash attention reads them): the logits equal the linear-input
    emulation nested with simulate_kv_cache(f16), and differ from it without the cache."""
    from lowbit.evaluation.act_modes import simulate_kv_cache
    from lowbit.models.build import load_model

    model = load_model(_gguf(tmp_path, {"attn_q": "Q4_0", "ffn_gate": "Q5_0"}))
    ids = torch.arange(3, 40).reshape(1, -1)
    with torch.no_grad():
        with simulate_llamacpp_activations(model):
            full = model(input_ids=ids).logits
        with simulate_llamacpp_activations(model, cache=False):
            linear_only = model(input_ids=ids).logits
            with simulate_kv_cache(model, "f16"):
                nested = model(input_ids=ids).logits
    assert torch.equal(full, nested)
    assert not torch.equal(full, linear_only)
