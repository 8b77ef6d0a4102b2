"""lowbit.calibration._group_walk: GPTQ's layers order through blocks the llama walk cannot
decompose (BERT's post-norm layers), group by group of the block's own forward passes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.torch

import lowbit.calibration.gptq as gptq_model  # noqa: E402
from layer_inputs import assert_groups_match_alone  # noqa: E402
from lowbit.calibration._group_walk import linear_groups  # noqa: E402
from lowbit.calibration.data import Calibration  # noqa: E402
from lowbit.calibration.gptq import gptq_weights  # noqa: E402
from lowbit.methods.gptq import GPTQ  # noqa: E402
from lowbit.plans.plan import PrecisionPlan  # noqa: E402
from tiny_models import save_hf_folder, tiny_bert, tiny_llama  # noqa: E402

WORDS = "river stone cloud garden lantern harbor meadow signal copper violet winter orchard"
BERT_GROUPS = [
    ("attention.self.query", "attention.self.key", "attention.self.value"),
    ("attention.output.dense",),
    ("intermediate.dense",),
    ("output.dense",),
]


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_hf_folder(tiny_bert(), tmp_path_factory.mktemp("walk") / "bert")


@pytest.fixture(scope="module")
def bert_calib(tmp_path_factory: pytest.TempPathFactory) -> Calibration:
    """40 short texts of different lengths (padding masked out)."""
    text = tmp_path_factory.mktemp("walk_text") / "sentences.txt"
    words = WORDS.split() * 6
    text.write_text(
        " ".join(f"The {w} stays near sentence number {i}." for i, w in enumerate(words))
    )
    return Calibration(source=str(text), samples=40, length=64)


@pytest.fixture()
def walked(monkeypatch: pytest.MonkeyPatch) -> list[list[list[str]]]:
    """The groups of every block the generic walk ran, in order (a spy on the driver's call)."""
    got: list[list[list[str]]] = []
    real = gptq_model.walk_groups

    def spy(*args: Any, **kwargs: Any) -> list[list[str]]:
        got.append(real(*args, **kwargs))
        return got[-1]

    monkeypatch.setattr(gptq_model, "walk_groups", spy)
    return got


def test_linear_groups_of_a_bert_layer() -> None:
    """A BERT layer's planned linears, grouped by the tensor they read, in call order: q/k/v
    share the layer's input; a subset of the layers gives the subset's groups."""
    model = tiny_bert()
    _, blocks = gptq_model._find_blocks(model)
    ids = torch.randint(0, 250, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        states = gptq_model._capture(model, blocks[0], [({"input_ids": ids}, None)], False)
        linears = {n: m for n, m in blocks[0].named_modules() if isinstance(m, torch.nn.Linear)}
        assert linear_groups(blocks[0], states, linears) == [list(g) for g in BERT_GROUPS]
        some = {n: linears[n] for n in ("output.dense", "attention.self.value")}
        assert linear_groups(blocks[0], states, some) == [
            ["attention.self.value"],
            ["output.dense"],
        ]


def test_linear_groups_look_past_the_first_sample() -> None:
    """A layer the first sample does not reach (a data-dependent branch) is found in the next
    one, and a layer reading the tensor another layer reads there joins its group."""

    class Branchy(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b, self.c = (torch.nn.Linear(4, 4) for _ in range(3))

        def forward(self, x: Any) -> Any:
            y = self.a(x)
            if x.sum() > 0:  # only then are b and c called, both on y
                y = self.b(y) + self.c(y)
            return y

    block = Branchy()
    linears = {"a": block.a, "b": block.b, "c": block.c}
    neg, pos = -torch.ones(2, 4), torch.ones(2, 4)
    calls: list[int] = []
    block.register_forward_pre_hook(lambda m, a: calls.append(1))
    with torch.inference_mode():
        assert linear_groups(block, [(neg, (), {})], linears) == [["a"]]
        calls.clear()
        got = linear_groups(block, [(neg, (), {}), (pos, (), {}), (pos, (), {})], linears)
    assert got == [["a"], ["b", "c"]]
    assert len(calls) == 2  # it stopped once every layer was found


@pytest.mark.parametrize("block", [0, 1])
def test_bert_layers_order_sees_earlier_groups_quantized(
    bert_dir: Path,
    bert_calib: Calibration,
    tmp_path: Path,
    block: int,
    walked: list[list[list[str]]],
) -> None:
    """BERT runs the layers order through the generic walk: each group's codes equal a
    ``blocks`` GPTQ of that group alone on a copy of the model holding the run's weights for
    every group before it (and every earlier block)."""
    run = gptq_weights(bert_dir, "int4:g32", bert_calib, progress=False)
    assert run.sequential == "layers"
    assert walked == [[[f"encoder.layer.{i}.{m}" for m in g] for g in BERT_GROUPS] for i in (0, 1)]
    assert_groups_match_alone(
        run, bert_dir, bert_calib, "encoder.layer.", block, BERT_GROUPS, tmp_path
    )


def test_bert_blocks_order_is_unchanged(
    bert_dir: Path, bert_calib: Calibration, walked: list[list[list[str]]]
) -> None:
    """``sequential="blocks"`` never walks groups: in block 0 every group is calibrated on the
    float block (each group alone, on the original model, gives its codes), so the first group
    (q/k/v, same inputs in both orders) has the layers order's codes and the later ones not."""
    run = gptq_weights(bert_dir, "int4:g32", bert_calib, GPTQ(sequential="blocks"), progress=False)
    assert run.sequential == "blocks" and walked == []
    layers = gptq_weights(bert_dir, "int4:g32", bert_calib, progress=False)
    pre = "encoder.layer.0."
    for g, group in enumerate(BERT_GROUPS):
        names = [pre + m + ".weight" for m in group]
        only = PrecisionPlan.uniform(
            "keep", rules=[{"match": n, "format": "int4:g32"} for n in names]
        )
        ref = gptq_weights(bert_dir, only, bert_calib, GPTQ(sequential="blocks"), progress=False)
        for n in names:
            np.testing.assert_array_equal(ref.weights[n].codes, run.weights[n].codes, err_msg=n)
            same = np.array_equal(layers.weights[n].codes, run.weights[n].codes)
            assert same == (g == 0), n


def test_generic_walk_equals_the_llama_walk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, walked: list[list[list[str]]]
) -> None:
    """On a llama, the generic walk (the llama walk switched off) gives the llama walk's codes
    and scales exactly: both compute each group's input with the block's own operations on the
    same values (the llama walk's staged norm + sublayer calls are the block's, and its
    residual adds the same tensors in the same order), so the Hessians are bit for bit equal."""
    folder = save_hf_folder(tiny_llama(), tmp_path / "llama")
    w = WORDS.split()
    text = tmp_path / "calib.txt"
    text.write_text(" ".join(f"The {w[i % 12]} keeps {w[i * 7 % 12]}." for i in range(60)))
    calib = Calibration(source=str(text), samples=4, length=64)
    for spec in ("int4:g32", "nf4"):
        walked.clear()
        llama = gptq_weights(folder, spec, calib, progress=False)
        assert walked == []  # the llama walk ran
        with monkeypatch.context() as m:
            m.setattr(gptq_model._LayerWalk, "of", classmethod(lambda cls, *a: None))
            generic = gptq_weights(folder, spec, calib, progress=False)
        assert generic.sequential == "layers"
        assert [[len(g) for g in groups] for groups in walked] == [[3, 1, 2, 1]] * 2
        assert set(generic.weights) == set(llama.weights)
        for name, qt in llama.weights.items():
            np.testing.assert_array_equal(qt.codes, generic.weights[name].codes, err_msg=name)
            np.testing.assert_array_equal(qt.scale, generic.weights[name].scale, err_msg=name)


def test_walk_passes_stop_at_the_group() -> None:
    """Every pass of the walk, the first included, stops once the group has its input: with
    only q/k/v planned, no layer after them is ever called; the group is solved once, on the
    tokens of every sample."""
    from lowbit.calibration._group_walk import walk_groups

    model = tiny_bert()
    _, blocks = gptq_model._find_blocks(model)
    gen = torch.Generator().manual_seed(0)
    samples = [
        ({"input_ids": torch.randint(0, 250, (2, 12), generator=gen)}, None) for _ in range(3)
    ]
    block = blocks[0]
    qkv = {m: block.get_submodule(m) for m in BERT_GROUPS[0]}
    later = [block.get_submodule(m) for g in BERT_GROUPS[1:] for m in g]
    solved: list[tuple[list[str], int]] = []
    with torch.inference_mode():
        states = gptq_model._capture(model, block, samples, False)
        calls: list[Any] = []
        handles = [m.register_forward_pre_hook(lambda m, a: calls.append(m)) for m in later]
        try:
            groups = walk_groups(
                block, states, samples, qkv,
                lambda col, ls: solved.append((sorted(ls), col.tokens(next(iter(ls))))),
            )  # fmt: skip
        finally:
            for h in handles:
                h.remove()
    assert groups == [list(BERT_GROUPS[0])] and calls == []
    assert solved == [(sorted(BERT_GROUPS[0]), 3 * 2 * 12)]
