"""_compute: the compute precision of model work (fp32 | bf16 | auto): fp32 and auto without
bf16 units are today's numbers exactly; bf16 runs, close to fp32; bad values are one line."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from lowbit.errors import LowbitError
from lowbit.models import _compute

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from lowbit.calibration.data import Calibration  # noqa: E402
from lowbit.calibration.gptq import gptq_weights  # noqa: E402
from lowbit.calibration.hessians import HessianCollector  # noqa: E402
from lowbit.cli import main  # noqa: E402
from lowbit.evaluation.perplexity import perplexity  # noqa: E402
from tiny_models import save_hf_folder, tiny_llama  # noqa: E402

pytestmark = pytest.mark.torch

#: bf16 matrix products on the tiny llama: perplexity within this relative distance of fp32
#: (measured: at most 0.0034 % over seeds 0-4; SmolLM2's figures are in docs/benchmarks.md)
BF16_PPL_RTOL = 0.01


class CharTokenizer:
    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [ord(c) % 64 for c in text]


def _tiny(seed: int = 0) -> torch.nn.Module:
    cfg = transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
    )  # fmt: skip
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(cfg).eval()


TEXT = "The quick brown fox jumps over the lazy dog. " * 12


@pytest.fixture
def no_bf16_units(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_compute, "fast_bf16", lambda: False)


def test_check_compute_accepts_three_values_and_rejects_the_rest() -> None:
    """fp32, bf16, auto (any case, spaces trimmed); anything else one LowbitError line."""
    assert [_compute.check_compute(v) for v in ("fp32", " BF16 ", "Auto")] == [
        "fp32",
        "bf16",
        "auto",
    ]
    for bad in ("fp16", "", "bfloat16", None, 32):
        with pytest.raises(LowbitError) as err:
            _compute.check_compute(bad)
        assert "\n" not in str(err.value) and "fp32, bf16, auto" in str(err.value)


def test_auto_is_fp32_without_bf16_flags_and_timed_with_them(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Without AMX or AVX512-BF16 flags auto is fp32 and nothing is timed; with either,
    the timing decides: bf16 only when at least MIN_SPEEDUP faster (an AVX512-BF16 Intel
    Xeon timed bf16 2x slower), measured once per machine key and then read back."""
    choice = _compute.PathChoice(
        file=lambda: tmp_path / _compute.CACHE_NAME,
        key=lambda: "machine",
        paths=("bf16", "fp32"),
        fields=("bf16_ns", "fp32_ns"),
        margin=_compute.MIN_SPEEDUP,
    )
    monkeypatch.setattr(_compute, "_choice", choice)
    timed: list[tuple[float, float]] = []

    def timing(bf16_s: float, fp32_s: float) -> None:
        def fake() -> tuple[float, float]:
            timed.append((bf16_s, fp32_s))
            return bf16_s, fp32_s

        monkeypatch.setattr(_compute, "_time_products", fake)

    timing(1.0, 3.0)
    monkeypatch.setattr(_compute, "cpu_flags", lambda: frozenset({"avx2", "avx512f"}))
    assert not _compute.fast_bf16() and _compute.resolve_compute("auto") == "fp32"
    assert timed == []
    for flag in ("amx_bf16", "avx512_bf16"):
        monkeypatch.setattr(_compute, "cpu_flags", lambda f=flag: frozenset({"avx2", f}))
        choice.known = None
        (tmp_path / _compute.CACHE_NAME).unlink(missing_ok=True)
        timing(1.0, 2.5)  # the AMD EPYC's 2.5x
        assert _compute.fast_bf16() and _compute.resolve_compute("auto") == "bf16"
        choice.known = None
        (tmp_path / _compute.CACHE_NAME).unlink()
        timing(2.0, 1.0)  # the Intel Xeon's 0.5x
        assert not _compute.fast_bf16() and _compute.resolve_compute("auto") == "fp32"
        choice.known = None
        (tmp_path / _compute.CACHE_NAME).unlink()
        timing(1.0, 1.1)  # faster, but by less than MIN_SPEEDUP
        assert _compute.resolve_compute("auto") == "fp32"
    assert len(timed) == 6
    timing(1.0, 9.0)  # a new process reads the verdict and does not time again
    choice.known = None
    assert _compute.resolve_compute("auto") == "fp32" and len(timed) == 6
    assert _compute.resolve_compute("fp32") == "fp32"
    assert _compute.resolve_compute("bf16") == "bf16"


def test_the_product_timing_runs_and_is_cached(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The real timing of this machine: positive seconds both ways, and a cache entry
    naming the shape and thread count (whatever the verdict)."""
    monkeypatch.setenv("LOWBIT_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(_compute, "cpu_flags", lambda: frozenset({"avx512_bf16"}))
    monkeypatch.setattr(_compute._choice, "known", None)
    bf16_s, fp32_s = _compute._time_products()
    assert bf16_s > 0 and fp32_s > 0
    verdict = _compute.resolve_compute("auto")
    import json

    entry = json.loads((tmp_path / _compute.CACHE_NAME).read_text())["machines"]
    (mine,) = entry.values()
    assert mine["linear"]["path"] == verdict
    assert mine["linear"]["shape"] == list(_compute.SHAPE)
    assert mine["linear"]["threads"] == torch.get_num_threads()


def test_fp32_and_auto_without_bf16_units_are_todays_numbers(no_bf16_units: None) -> None:
    """Perplexity, KL and top-1 with compute fp32 or auto (no bf16 units) equal, bit for
    bit, a run without the argument; the result says fp32."""
    model, ref = _tiny(0), _tiny(1)
    kw = {"window": 64, "max_tokens": 300, "reference": ref, "progress": False, "threads": 1}
    today = perplexity(model, CharTokenizer(), TEXT, **kw)
    for compute in ("fp32", "auto"):
        got = perplexity(model, CharTokenizer(), TEXT, compute=compute, **kw)
        assert got["compute"] == "fp32"
        for key in ("perplexity", "nll", "kl_mean", "kl_max", "top1_agreement"):
            assert got[key] == today[key], (compute, key)


@pytest.mark.parametrize("seed", [0, 1])
def test_bf16_runs_close_to_fp32(seed: int) -> None:
    """bf16 matrix products: a different run (the result says bf16), perplexity within
    BF16_PPL_RTOL of fp32's."""
    model = _tiny(seed)
    kw = {"window": 64, "max_tokens": 300, "progress": False, "threads": 1}
    fp32 = perplexity(model, CharTokenizer(), TEXT, **kw)
    bf16 = perplexity(model, CharTokenizer(), TEXT, compute="bf16", **kw)
    assert bf16["compute"] == "bf16" and bf16["perplexity"] != fp32["perplexity"]
    assert abs(bf16["perplexity"] / fp32["perplexity"] - 1) < BF16_PPL_RTOL


def test_hessians_are_float32_sums_under_bf16() -> None:
    """A Hessian collected inside a bf16 block is the float32 one of the same inputs."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(48, 16)
    x = torch.randn(4, 20, 48)
    hs = []
    for compute in ("fp32", "bf16"):
        with _compute.compute_context(compute), torch.inference_mode():
            with HessianCollector({"lin": lin}) as col:
                col.next_sample(None)
                col.run(lin, x)
            hs.append(col.hessian("lin"))
    np.testing.assert_array_equal(hs[0], hs[1])


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("compute")
    text = d / "calib.txt"
    text.write_text(" ".join(f"Sentence {i} says {i * 7 % 13} things." for i in range(40)))
    return save_hf_folder(tiny_llama(), d / "llama"), text


def test_gptq_fp32_and_auto_without_bf16_units_are_todays_codes(
    llama: tuple[Path, Path], no_bf16_units: None
) -> None:
    """GPTQ's codes with compute fp32 / auto (no bf16 units) are those of a run without it."""
    folder, text = llama
    calib = Calibration(source=str(text), samples=3, length=50)
    today = gptq_weights(folder, "int4:g32", calib, progress=False, threads=1)
    for compute in ("fp32", "auto"):
        run = gptq_weights(folder, "int4:g32", calib, progress=False, threads=1, compute=compute)
        for name, qt in today.weights.items():
            np.testing.assert_array_equal(run.weights[name].codes, qt.codes)
    bf16 = gptq_weights(folder, "int4:g32", calib, progress=False, threads=1, compute="bf16")
    assert bf16.weights.keys() == today.weights.keys()


@pytest.mark.parametrize("command", ["eval", "sensitivity", "quantize"])
def test_bad_compute_is_one_error_line(
    llama: tuple[Path, Path], command: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """--compute with another value than fp32/bf16/auto: exit 2, one line, before any work."""
    folder, _ = llama
    extra = {
        "eval": [],
        "sensitivity": [],
        "quantize": ["--to", "int4:g32", "--method", "gptq", "--out", str(tmp_path / "q")],
    }[command]
    assert main([command, str(folder), *extra, "--compute", "fp16", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--compute" in err[0] and "fp16" in err[0]


def test_sensitivity_compute(llama: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """A scan with compute fp32 / auto (no bf16 units) is today's, entry for entry; bf16 runs
    (on workers too: each gets the driver's resolved precision) and ranks alike."""
    from lowbit.checkpoints import open_checkpoint
    from lowbit.evaluation.scan_samples import ScanSamples
    from lowbit.evaluation.sensitivity import sensitivity, spearman

    monkeypatch.setattr(_compute, "fast_bf16", lambda: False)
    folder, _ = llama
    rng = np.random.default_rng(7)
    ids = rng.integers(0, 256, size=(4, 24))
    calib = ScanSamples("random", windows=tuple(tuple(int(t) for t in w) for w in ids))
    ckpt = open_checkpoint(folder)
    schemes = ("int4:g32", "int2:g32")
    today = sensitivity(ckpt, schemes, calib, batch=4)
    for compute in ("fp32", "auto"):
        got = sensitivity(ckpt, schemes, calib, batch=4, compute=compute)
        assert [(e.damage, e.proxy) for e in got.entries] == [
            (e.damage, e.proxy) for e in today.entries
        ]
    bf16 = sensitivity(ckpt, schemes, calib, batch=4, compute="bf16")
    damage = [e.damage for e in today.entries]
    assert spearman(damage, [e.damage for e in bf16.entries]) > 0.9
    with pytest.raises(LowbitError):
        sensitivity(ckpt, schemes, calib, compute="fp64")
