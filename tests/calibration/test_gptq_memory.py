"""lowbit.calibration._memory: what keeps GPTQ's memory flat in a model's depth — the quantized
tensors wait on disk (SpilledTensors, read back bit for bit), no earlier block's quantized
tensors stay alive, and the checkpoint is unmapped as each block starts. The peak itself is
measured by benchmarks/bench_gptq_memory.py (not timed here)."""

from __future__ import annotations

import gc
import os
import weakref
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import lowbit
from lowbit.calibration._memory import SpilledTensors
from lowbit.quant.scheme_text import parse_scheme


def _same(a: Any, b: Any) -> None:
    assert a.scheme == b.scheme and a.shape == b.shape
    assert a.codes.dtype == b.codes.dtype and a.codes.tobytes() == b.codes.tobytes()
    assert a.scale.dtype == b.scale.dtype and a.scale.tobytes() == b.scale.tobytes()
    assert (a.zero_point is None) == (b.zero_point is None)
    if a.zero_point is not None:
        assert np.array_equal(a.zero_point, b.zero_point)
    assert a.tensor_scale == b.tensor_scale
    assert a.nbytes == b.nbytes
    assert a.dequantize().tobytes() == b.dequantize().tobytes()


@pytest.mark.parametrize(
    "spec", ["int4:g32", "int4:g32:asym", "nf4", "nvfp4", "fp8_e4m3:ch", "q4_0", "int8"]
)
def test_spilled_tensors_read_back_bit_for_bit(spec: str, rng: np.random.Generator) -> None:
    """Every field a writer reads comes back with the same bytes, for each kind of scale
    (per group, asymmetric, NF4's double quantization, NVFP4's two levels, per channel)."""
    w = rng.standard_normal((48, 96)).astype(np.float32)
    qt = lowbit.quantize(w, parse_scheme(spec))
    store = SpilledTensors()
    store["w"] = qt
    _same(store["w"], qt)
    assert store["w"] is not store["w"]  # read from disk each time: nothing kept here


def test_spilled_tensors_mapping_and_cleanup(rng: np.random.Generator) -> None:
    """A mutable mapping: replace, delete (its file goes), iterate in insertion order; the
    folder is removed with the store."""
    a = lowbit.quantize(rng.standard_normal((8, 64)).astype(np.float32), parse_scheme("int4:g32"))
    b = lowbit.quantize(rng.standard_normal((4, 32)).astype(np.float32), parse_scheme("int8"))
    store = SpilledTensors()
    store["a"], store["b"] = a, b
    folder = Path(store._folder or "")
    assert folder.is_dir() and len(os.listdir(folder)) == 2
    store["a"] = b  # replaced in place
    _same(store["a"], b)
    del store["b"]
    assert list(store) == ["a"] and len(store) == 1 and "b" not in store
    assert len(os.listdir(folder)) == 1
    with pytest.raises(KeyError):
        store["b"]
    store["c"] = a  # a new file, not the deleted one's name reused over a live one
    _same(store["a"], b)
    _same(store["c"], a)
    del store
    gc.collect()
    assert not folder.exists()


def test_spilled_tensors_keep_rotations(rng: np.random.Generator) -> None:
    """MR-GPTQ's rotated weights come back rotated (block and codes), not as plain tensors
    whose rotation a writer would then not record."""
    from lowbit.methods.mr_gptq import RotatedTensor

    w = rng.standard_normal((8, 64)).astype(np.float32)
    rt = RotatedTensor(lowbit.quantize(w, parse_scheme("mxfp4")), 32)
    store = SpilledTensors()
    store["w"] = rt
    got = store["w"]
    assert isinstance(got, RotatedTensor) and got.block == 32
    _same(got.rotated, rt.rotated)
    assert np.array_equal(got.dequantize(), rt.dequantize())


def test_spilled_tensors_pickle_to_their_own_files(rng: np.random.Generator) -> None:
    """Pickled (a calibration worker hands its run to the driver), the tensors travel as
    values into a store with its own folder: removing the sender's files loses nothing."""
    import pickle

    from lowbit.ggml import blocks
    from lowbit.methods._ggml_gptq import GgmlQuantized

    w = rng.standard_normal((4, 256)).astype(np.float32)
    a = lowbit.quantize(w, parse_scheme("int4:g32"))
    g = GgmlQuantized("Q4_K", blocks.quantize(w, "Q4_K"), (4, 256))
    store = SpilledTensors()
    store["a"], store["g"] = a, g
    copy = pickle.loads(pickle.dumps(store))
    folder = Path(store._folder or "")
    del store
    gc.collect()
    assert not folder.exists()
    assert list(copy) == ["a", "g"] and Path(copy._folder or "") != folder
    _same(copy["a"], a)
    assert copy["g"].qtype == "Q4_K" and np.array_equal(copy["g"].data, g.data)
    assert np.array_equal(copy["g"].dequantize(), blocks.dequantize(g.data, "Q4_K"))


@pytest.mark.torch
def test_gptq_keeps_no_earlier_block_in_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a 4-block llama, as each block starts: no quantized tensor GPTQ made for an earlier
    block is alive (they were spilled to disk), and the checkpoint has no memory map open
    (its read pages would count as resident memory, one block's more each time). The run's
    tensors then read back with the bytes GPTQ made."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from lowbit.calibration import gptq as gptq_model
    from lowbit.calibration.data import Calibration
    from lowbit.checkpoints import open_checkpoint
    from lowbit.methods.gptq import GPTQ
    from tiny_models import save_hf_folder, tiny_llama

    model = tiny_llama()
    cfg = model.config
    cfg.num_hidden_layers = 4
    torch.manual_seed(1)
    deep = transformers.LlamaForCausalLM(cfg).eval()
    folder = save_hf_folder(deep, tmp_path / "llama4")
    text = tmp_path / "calib.txt"
    text.write_text(" ".join(f"The river {i} keeps stone {i * 7}." for i in range(80)))
    ckpt = open_checkpoint(folder)

    made: list[tuple[str, Any, bytes]] = []  # name, weakref, codes as made
    real_solve = GPTQ.quantize_shared

    def solve(self: Any, weights: Any, H: Any, schemes: Any) -> Any:
        out = real_solve(self, weights, H, schemes)
        made.extend((n, weakref.ref(qt), qt.codes.tobytes()) for n, qt in out.items())
        return out

    seen: list[tuple[int, int, int]] = []  # block, quantized tensors alive, maps open
    real_restore = gptq_model._Deferred.restore

    def restore(self: Any, index: int) -> None:
        real_restore(self, index)
        seen.append((index, sum(r() is not None for _, r, _ in made), len(ckpt._maps)))

    monkeypatch.setattr(GPTQ, "quantize_shared", solve)
    monkeypatch.setattr(gptq_model._Deferred, "restore", restore)
    run = gptq_model.gptq_weights(
        ckpt, "int4:g32", Calibration(source=str(text), samples=2, length=32), progress=False
    )
    assert [b for b, _, _ in seen] == [0, 1, 2, 3]
    assert len(made) == 4 * 7 and set(run.methods.values()) == {"gptq"}
    assert seen == [(b, 0, 0) for b in range(4)], seen
    assert isinstance(run.weights, SpilledTensors)
    for name, _, codes in made:
        assert run.weights[name].codes.tobytes() == codes, name
