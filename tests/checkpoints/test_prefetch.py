"""Checkpoint.prefetch: a read-ahead hint for one tensor's stored bytes, and the writers that
give it the next tensor while they round the current one."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from lowbit.checkpoints import open_checkpoint
from lowbit.checkpoints.readers import Checkpoint

pytest.importorskip("torch")
pytest.importorskip("transformers")

from tiny_models import llamacpp_tiny_models, save_hf_folder, tiny_llama

needs_fadvise = pytest.mark.skipif(
    not hasattr(os, "posix_fadvise"), reason="no posix_fadvise on this platform"
)


@pytest.fixture(scope="module")
def hf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_hf_folder(tiny_llama(), tmp_path_factory.mktemp("hf") / "hf")


@needs_fadvise
def test_the_hint_names_the_tensors_span_in_its_file(
    hf: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[tuple[str, int, int, int]] = []

    def advise(fd: int, offset: int, length: int, advice: int) -> None:
        seen.append((os.readlink(f"/proc/self/fd/{fd}"), offset, length, advice))

    monkeypatch.setattr(os, "posix_fadvise", advise)
    ckpt = open_checkpoint(hf)
    name = "model.layers.1.mlp.down_proj.weight"
    info = ckpt.info(name)
    ckpt.prefetch(name)
    assert seen == [(str(Path(info.file).resolve()), info.offset, info.nbytes,
                     os.POSIX_FADV_WILLNEED)]  # fmt: skip
    ckpt.prefetch("model.layers.9.no_such.weight")  # a hint: nothing, and no error
    assert len(seen) == 1
    fds = len(os.listdir("/proc/self/fd"))
    for n in ckpt.names():
        ckpt.prefetch(n)
    assert len(os.listdir("/proc/self/fd")) == fds  # every descriptor closed again
    assert len(seen) == 1 + len(ckpt.names())


def test_a_converted_view_hints_its_source_tensors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A GGUF tensor of a Hugging Face folder read as its conversion: the checkpoint tensors it
    is made of, every expert of a stack."""
    from lowbit.checkpoints.gguf.hf_view import ConvertedView

    pytest.importorskip("gguf")
    folder = llamacpp_tiny_models(tmp_path) / "tiny-qwen3moe"
    asked: list[str] = []
    with open_checkpoint(folder) as hf:
        view = ConvertedView(hf)
        monkeypatch.setattr(type(hf), "prefetch", lambda self, n: asked.append(n))
        view.prefetch("blk.1.attn_q.weight")
        view.prefetch("no_such.weight")
        assert asked == ["model.layers.1.self_attn.q_proj.weight"]
        asked.clear()
        view.prefetch("blk.0.ffn_gate_exps.weight")
        experts = int(hf.config["num_experts"])
        assert sorted(asked) == sorted(
            f"model.layers.0.mlp.experts.{e}.gate_proj.weight" for e in range(experts)
        )


@pytest.mark.parametrize(("spec", "out_format"), [("int4", "lowbit"),
                                                  ("nvfp4", "compressed-tensors")])  # fmt: skip
def test_writers_read_ahead_in_the_order_they_write(
    hf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spec: str, out_format: str
) -> None:
    """Each tensor, when it is made, asks for the next one: every tensor after the first,
    once, in the order of the output (a rounded tensor's source is read while the previous
    one is rounded)."""
    from lowbit.checkpoints.streaming import quantize_model
    from lowbit.plans.plan import PrecisionPlan

    asked: list[str] = []
    real = Checkpoint.prefetch

    def record(self: Any, name: str) -> None:
        asked.append(name)
        real(self, name)

    monkeypatch.setattr(Checkpoint, "prefetch", record)
    quantize_model(hf, PrecisionPlan.uniform(spec), tmp_path / "out", out_format=out_format,
                   progress=False)  # fmt: skip
    names = open_checkpoint(hf).names()
    assert asked == names[1:]
