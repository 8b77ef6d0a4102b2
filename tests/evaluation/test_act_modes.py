"""lowbit eval --act / --kv: each activation mode equals a plain float32 reference written from
its definition, value by value; the KV cache sees E4M3 / INT8 keys and values; eval's rows."""

from __future__ import annotations

import math
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
from lowbit.evaluation.act_modes import (  # noqa: E402
    calibrate_input_scales,
    fake_quantize_activation,
    input_global_scale,
    simulate_act_mode,
    simulate_kv_cache,
)
from lowbit.models.activations import fake_quantize_per_token  # noqa: E402
from tiny_models import save_hf_folder, tiny_llama  # noqa: E402

F32 = np.float32
E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def _e2m1(t: float) -> float:
    a = min(abs(t), 6.0)
    i = min(range(8), key=lambda j: (abs(a - E2M1[j]), j % 2))
    return -E2M1[i] if t < 0 else E2M1[i]


def _e4m3(v: float) -> float:
    return float(np.array([v], F32).astype(ml_dtypes.float8_e4m3fn).astype(F32)[0])


def ref_fp8_block(x: np.ndarray) -> np.ndarray:
    out = np.empty_like(x)
    for r in range(x.shape[0]):
        for b in range(0, x.shape[1], 128):
            g = x[r, b : b + 128]
            s = F32(max(F32(np.max(np.abs(g))), F32(1e-10))) / F32(448)
            for j, v in enumerate(g):
                t = min(max(F32(v) / s, F32(-448)), F32(448))
                out[r, b + j] = F32(_e4m3(t)) * s
    return out


def ref_mxfp4(x: np.ndarray) -> np.ndarray:
    out = np.empty_like(x)
    for r in range(x.shape[0]):
        for b in range(0, x.shape[1], 32):
            g = x[r, b : b + 32]
            amax = float(np.max(np.abs(g)))
            if amax == 0:
                e = -127
            else:
                m, e2 = math.frexp(amax)  # amax = m * 2**e2, m in [0.5, 1)
                e = e2 - 1 + (2 * m >= 1.75) - 2
                e = max(-127, min(127, e))
            s = F32(2.0**e)
            for j, v in enumerate(g):
                out[r, b + j] = F32(_e2m1(float(F32(v) / s))) * s
    return out


def ref_nvfp4(x: np.ndarray, g: float) -> np.ndarray:
    g = F32(g)
    out = np.empty_like(x)
    for r in range(x.shape[0]):
        for b in range(0, x.shape[1], 16):
            blk = x[r, b : b + 16]
            amax = F32(np.max(np.abs(blk)))
            s = F32(_e4m3(min(F32(g * F32(amax * F32(1 / 6))), F32(448))))
            per = F32(s * F32(F32(1) / g))
            inv = F32(0) if per == 0 else F32(F32(1) / per)
            deq = F32(s / g)
            for j, v in enumerate(blk):
                t = min(max(F32(F32(v) * inv), F32(-6)), F32(6))
                out[r, b + j] = F32(F32(_e2m1(float(t))) * deq)
    return out


def _data(k: int) -> np.ndarray:
    rng = np.random.default_rng(k)
    x = (rng.standard_normal((6, k)) * np.logspace(-3, 3, k)).astype(F32)
    x[1] = 0.0  # all-zero groups
    x[2, :16] = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0] * 2, F32)  # ties
    x[3, :8] = -0.0
    return x


@pytest.mark.parametrize(
    ("mode", "ref"),
    [("fp8_block", ref_fp8_block), ("mxfp4", ref_mxfp4),
     ("nvfp4", lambda x: ref_nvfp4(x, 123.25))],
)  # fmt: skip
def test_modes_equal_their_reference(mode: str, ref: object) -> None:
    """fp8_block, mxfp4 and nvfp4 (a static global scale) equal the float32 references."""
    x = _data(256)
    kw = {"global_scale": 123.25} if mode == "nvfp4" else {}
    got = fake_quantize_activation(torch.from_numpy(x), mode, **kw).numpy()
    np.testing.assert_array_equal(got, ref(x))  # type: ignore[operator]


def test_per_token_modes_are_lowbits_per_token_codec() -> None:
    """int8 and fp8_token are the per-token codec (W8A8's), fp8 an alias of fp8_token."""
    x = torch.from_numpy(_data(64))
    assert torch.equal(fake_quantize_activation(x, "int8"), fake_quantize_per_token(x, "int8"))
    want = fake_quantize_per_token(x, "fp8_e4m3")
    assert torch.equal(fake_quantize_activation(x, "fp8"), want)


def test_nvfp4_dynamic_and_calibrated_global_scale() -> None:
    """Without a static scale NVFP4 uses the input's own 448*6/amax (torch's reciprocal
    times 2688); calibrate_input_scales gives that over the calibration inputs."""
    x = _data(64)
    amax = F32(np.max(np.abs(x)))
    g = F32(F32(F32(1) / amax) * F32(2688))
    assert float(input_global_scale(torch.tensor(amax))) == g
    got = fake_quantize_activation(torch.from_numpy(x), "nvfp4").numpy()
    np.testing.assert_array_equal(got, ref_nvfp4(x, float(g)))
    model = tiny_llama()
    seen: dict[str, float] = {}
    hooks = [
        m.register_forward_pre_hook(
            lambda mod, a, n=n: seen.__setitem__(n, max(seen.get(n, 0), float(a[0].abs().max())))
        )
        for n, m in model.named_modules()
        if isinstance(m, torch.nn.Linear) and n != "lm_head"
    ]
    batches = [list(range(3, 23)), list(range(40, 70))]
    scales = calibrate_input_scales(model, batches)
    for h in hooks:
        h.remove()
    assert set(scales) == set(seen)
    for n, a in seen.items():
        assert float(scales[n]) == F32(F32(F32(1) / F32(a)) * F32(2688))


def test_bad_input_is_one_line() -> None:
    """Unknown modes, widths a group cannot hold: one LowbitError each."""
    with pytest.raises(LowbitError, match="unknown activation mode"):
        fake_quantize_activation(torch.zeros(2, 32), "nf4")
    with pytest.raises(LowbitError, match="groups of 128") as info:
        fake_quantize_activation(torch.zeros(2, 96), "fp8_block")
    assert "\n" not in str(info.value)
    model = tiny_llama()  # hidden 64: not whole groups of 128
    with pytest.raises(LowbitError, match="q_proj: fp8_block activations come in groups of 128"):
        with simulate_act_mode(model, "fp8_block"):
            pass
    with pytest.raises(LowbitError, match="unknown KV-cache mode"):
        with simulate_kv_cache(model, "fp4"):
            pass


@pytest.mark.parametrize("mode", ["fp8", "int8", "f16"])
def test_kv_cache_sees_quantized_keys_and_values(
    mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Inside simulate_kv_cache attention receives keys and values on the cache's grid (E4M3
    values; int8 multiples of each token-head's amax/127) and the model's attention setting is
    restored after."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    model = tiny_llama()
    orig = model.config._attn_implementation
    inner = ALL_ATTENTION_FUNCTIONS[orig]
    seen = []

    def spy(module, q, k, v, *a, **kw):  # type: ignore[no-untyped-def]
        seen.append((k.detach().clone(), v.detach().clone()))
        return inner(module, q, k, v, *a, **kw)

    monkeypatch.setitem(ALL_ATTENTION_FUNCTIONS._global_mapping, orig, spy)
    with torch.no_grad(), simulate_kv_cache(model, mode):
        model(input_ids=torch.arange(3, 19).reshape(1, -1))
    assert model.config._attn_implementation == orig and seen
    for k, v in seen:
        for t in (k, v):
            if mode == "fp8":
                assert torch.equal(t, t.to(torch.float8_e4m3fn).to(t.dtype))
            elif mode == "f16":
                assert torch.equal(t, t.to(torch.float16).to(t.dtype))
            else:
                s = t.abs().amax(dim=-1, keepdim=True) / 127
                q = t / torch.where(s > 0, s, torch.ones_like(s))
                assert torch.allclose(q, q.round(), atol=1e-3)


def test_eval_rows(tmp_path: Path) -> None:
    """evaluate_variants(act=..., kv=...): a twin row per model with the simulation named."""
    from lowbit.calibration.data import Calibration
    from lowbit.evaluation.variants import evaluate_variants

    hf = save_hf_folder(tiny_llama(), tmp_path / "hf")
    text = tmp_path / "t.txt"
    text.write_text(" ".join(f"word{i % 17} and {i}" for i in range(2000)))
    calib = Calibration(source=str(text), samples=2, length=40)
    res = evaluate_variants(hf, [], ["mxfp4"], act="nvfp4", kv="int8", tokens=120, window=40,
                            text=text, threads=1, progress=False, calibration=calib)  # fmt: skip
    names = [r["name"] for r in res["rows"]]
    assert names == ["original", "mxfp4", "original + nvfp4+kv:int8", "mxfp4 + nvfp4+kv:int8"]
    assert res["rows"][2]["kl_mean"] > 0 and res["rows"][2]["activations"] == "nvfp4+kv:int8"
    with pytest.raises(LowbitError, match="give one"):
        evaluate_variants(hf, [], [], act="nvfp4", w8a8="int8", text=text, progress=False)
