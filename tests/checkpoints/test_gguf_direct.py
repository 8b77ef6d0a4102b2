"""The direct route: a Hugging Face folder seen as its converted GGUF
(:class:`lowbit.checkpoints.gguf.hf_view.ConvertedView`) gives the GGUF jobs what the converted
file gives them, so mixes, budgets and GPTQ onto a mix write the same bytes as converting first,
and create no file but the output."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np
import pytest

from lowbit.checkpoints import open_checkpoint
from lowbit.checkpoints.gguf import writer as gguf_writer
from lowbit.checkpoints.gguf.hf_view import ConvertedView
from lowbit.checkpoints.io.gguf_file import raw_metadata
from lowbit.checkpoints.streaming import quantize_model
from lowbit.jobs.gguf import gguf_budget, gguf_mix
from lowbit.plans.plan import PrecisionPlan

pytest.importorskip("gguf")
pytest.importorskip("transformers")

from tiny_models import llamacpp_tiny_models


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return llamacpp_tiny_models(tmp_path_factory.mktemp("direct"))


def _converted(folder: Path, out: Path) -> Path:
    keep = PrecisionPlan.from_dict({"rules": [{"match": "*", "format": "keep"}]})
    quantize_model(folder, keep, out, out_format="gguf", progress=False)
    return out


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-gemma3", "tiny-qwen3moe"])
def test_view_is_the_converted_file(tiny: Path, tmp_path: Path, name: str) -> None:
    """Names, infos, values (bit for bit, in the stored dtype), parsed metadata, config and the
    metadata's stored bytes are those of the file the conversion writes."""
    path = _converted(tiny / name, tmp_path / f"{name}.gguf")
    with open_checkpoint(tiny / name) as hf, open_checkpoint(path) as gg:
        view = ConvertedView(hf)
        assert view.format == "gguf" and view.path == tiny / name
        assert view.names() == gg.names()
        for n in gg.names():
            a, b = view.info(n), gg.info(n)
            assert (a.shape, a.dtype, a.nbytes) == (b.shape, b.dtype, b.nbytes)
            x, y = view.get(n), gg.get(n)
            assert x.dtype == y.dtype and x.shape == y.shape
            assert x.tobytes() == y.tobytes()
        assert view.metadata == gg.metadata
        assert view.config == gg.config
        assert view.gguf_fields() == raw_metadata(path)
        view.close()


def test_mix_creates_no_file_but_the_output(
    tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Q4_K_M from a folder: the converted file's bytes, the output the only file written
    (beside it or in the temporary folder), no temporary directory made but the output's own
    (its atomic write's, beside it, renamed into place)."""
    out_dir, tmp_dir = tmp_path / "out", tmp_path / "tmp"
    out_dir.mkdir()
    tmp_dir.mkdir()
    two = tmp_path / "two.gguf"
    gguf_mix(_converted(tiny / "tiny-mixtral", tmp_path / "c.gguf"), "q4_k_m", two, progress=False)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_dir))
    made: list[Path] = []
    real = gguf_writer.atomic_file

    def atomic(path: os.PathLike[str], **kw: object) -> object:
        made.append(Path(path))
        return real(path, **kw)

    real_mkdtemp = tempfile.mkdtemp
    dirs: list[tuple[object, object]] = []

    def mkdtemp(suffix: object = None, prefix: object = None, dir: object = None) -> str:
        dirs.append((prefix, dir))
        return real_mkdtemp(suffix, prefix, dir)  # type: ignore[arg-type]

    def no_temp(*a: object, **kw: object) -> None:
        raise AssertionError("a temporary directory was made")

    monkeypatch.setattr(gguf_writer, "atomic_file", atomic)
    monkeypatch.setattr(tempfile, "TemporaryDirectory", no_temp)
    monkeypatch.setattr(tempfile, "mkdtemp", mkdtemp)
    direct = out_dir / "direct.gguf"
    res = gguf_mix(tiny / "tiny-mixtral", "q4_k_m", direct, progress=False)
    assert made == [direct]
    assert dirs == [("direct.gguf.tmp-", out_dir)]
    assert [p.name for p in out_dir.iterdir()] == ["direct.gguf"]
    assert list(tmp_dir.iterdir()) == []
    assert res.source == str(tiny / "tiny-mixtral")
    assert direct.read_bytes() == two.read_bytes()


def test_budget_from_a_folder_equals_the_converted_files(
    tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A GGUF --size budget from a folder: the same trials, solution and bytes as from its
    converted GGUF, and no file written but the output (its overhead counted, not probed)."""
    conv = _converted(tiny / "tiny-llama", tmp_path / "c.gguf")
    kw = {"candidates": ["Q4_0", "Q8_0"], "scan_samples_count": 1, "scan_length": 16}
    b = gguf_budget(conv, tmp_path / "b.gguf", bits_per_weight=6.0, **kw)
    tmp_dir = tmp_path / "tmp"
    tmp_dir.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_dir))
    made: list[Path] = []
    real = gguf_writer.atomic_file

    def atomic(path: os.PathLike[str], **kw: object) -> object:
        made.append(Path(path))
        return real(path, **kw)

    monkeypatch.setattr(gguf_writer, "atomic_file", atomic)
    a = gguf_budget(tiny / "tiny-llama", tmp_path / "a.gguf", bits_per_weight=6.0, **kw)
    assert made == [tmp_path / "a.gguf"]
    assert list(tmp_dir.iterdir()) == []
    assert (tmp_path / "a.gguf").read_bytes() == (tmp_path / "b.gguf").read_bytes()
    assert a.types == b.types and set(a.types.values()) >= {"Q4_0", "Q8_0"}
    assert a.details["damages"] == b.details["damages"]
    assert a.bytes == (tmp_path / "a.gguf").stat().st_size


@pytest.mark.torch
@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen3moe"])
def test_gptq_onto_a_mix_from_a_folder(tiny: Path, tmp_path: Path, name: str) -> None:
    """--method gptq onto Q4_K_M from a folder writes what it writes from the converted GGUF
    (a mixture of experts' stacks split into experts alike from both)."""
    from lowbit.calibration.data import Calibration

    pytest.importorskip("torch")
    conv = _converted(tiny / name, tmp_path / "c.gguf")
    cal = Calibration(samples=2, length=16)
    a = gguf_mix(tiny / name, "q4_k_m", tmp_path / "a.gguf", method="gptq",
                 calibration=cal, progress=False)  # fmt: skip
    gguf_mix(conv, "q4_k_m", tmp_path / "b.gguf", method="gptq", calibration=cal, progress=False)
    assert a.method is not None and a.method["gptq_tensors"] > 0
    assert (tmp_path / "a.gguf").read_bytes() == (tmp_path / "b.gguf").read_bytes()
    np.testing.assert_equal(a.method["mean_error"]["gptq"] > 0, True)


@pytest.mark.torch
def test_gptq_walk_sees_the_files_other_tensors(tiny: Path, tmp_path: Path) -> None:
    """GPTQ of ffn_down alone with the other tensors ``rounded`` as the mix writes them equals
    GPTQ on a source whose other tensors already hold those values: the walk feeds each target
    the inputs the file gives it. Without ``rounded`` it feeds the float model's (other bytes)."""
    from lowbit.calibration.data import Calibration
    from lowbit.checkpoints.gguf.mix import gptq_targets, mix_rounded
    from lowbit.jobs.gguf import gptq_onto

    pytest.importorskip("torch")
    conv = _converted(tiny / "tiny-llama", tmp_path / "c.gguf")
    cal = Calibration(samples=2, length=16)
    with open_checkpoint(conv) as ck:
        targets = {n: t for n, t in gptq_targets(ck, "q2_k").items() if "ffn_down" in n}
        rounded = mix_rounded(ck, "q2_k", skip=targets)
        assert "token_embd.weight" in rounded and "blk.0.ffn_up.weight" in rounded
        assert not set(rounded) & set(targets)
        as_file = {n: rounded[n]() if n in rounded else np.asarray(ck.get(n)) for n in ck.names()}
        gguf_writer.write_gguf(tmp_path / "s.gguf", as_file, source=conv, progress=False)
        walked, _ = gptq_onto(ck, targets, False, calibration=cal, progress=False,
                              rounded=rounded)  # fmt: skip
        floats, _ = gptq_onto(ck, targets, False, calibration=cal, progress=False)
    with open_checkpoint(tmp_path / "s.gguf") as ck:
        direct, _ = gptq_onto(ck, targets, False, calibration=cal, progress=False)
    assert set(walked) == set(targets) == set(direct)
    for n in targets:
        assert bytes(walked[n].data) == bytes(direct[n].data), n
    assert any(bytes(walked[n].data) != bytes(floats[n].data) for n in targets)


@pytest.mark.torch
@pytest.mark.parametrize("name", ["tiny-qwen3moe", "tiny-qwen2moe", "tiny-mixtral"])
def test_gptq_reaches_every_expert_of_a_gguf_stack(tiny: Path, tmp_path: Path, name: str) -> None:
    """--method gptq into a GGUF mix of a mixture of experts GPTQs each expert of every
    ``ffn_*_exps`` stack on its own (less layer error than llama.cpp's rounding on its routed
    tokens), and the stack holds each expert's result at its own index: expert e's slice
    decodes nearest to the source's expert e."""
    from lowbit.calibration.data import Calibration

    pytest.importorskip("torch")
    cal = Calibration(samples=2, length=16, experts="all")
    out = tmp_path / "q.gguf"
    res = gguf_mix(tiny / name, "q8_0", out, method="gptq", calibration=cal, progress=False)
    assert res.method is not None
    layers = res.method["layers"]
    experts = [n for n in layers if ".experts." in n]
    with open_checkpoint(tiny / name) as hf:
        n_exp = int(hf.config.get("num_local_experts") or hf.config["num_experts"])
        n_layers = int(hf.config["num_hidden_layers"])
    assert len(experts) == 3 * n_exp * n_layers
    assert res.method["gptq_tensors"] >= len(experts)
    assert all(layers[n]["gptq"] <= layers[n]["rtn"] for n in experts)
    with open_checkpoint(out) as q, open_checkpoint(tiny / name) as hf:
        view = ConvertedView(hf)
        stacks = [n for n in q.names() if "_exps" in n]
        assert stacks and all(q.info(n).dtype == "Q8_0" for n in stacks)
        for s in stacks:
            got, src = np.asarray(q.get(s), np.float32), np.asarray(view.get(s), np.float32)
            assert got.shape == src.shape
            err = np.abs(got[:, None] - src[None]).mean(axis=(2, 3))  # [decoded e, source e']
            assert np.array_equal(err.argmin(axis=1), np.arange(len(err))), (s, err)


def test_expert_without_a_result_is_rounded_as_llama_cpp(tiny: Path, tmp_path: Path) -> None:
    """A stack's expert GPTQ did not reach (no routed tokens) is llama.cpp's rounding of it,
    with its slice of the stack's importance vector; the others are GPTQ's bytes as they are."""
    from lowbit.checkpoints.gguf.expert_split import Stacks, expert_stacks
    from lowbit.ggml import blocks
    from lowbit.methods._ggml_gptq import GgmlQuantized, GgmlTarget

    with open_checkpoint(tiny / "tiny-qwen3moe") as hf:
        view = ConvertedView(hf)
        stack = "blk.0.ffn_up_exps.weight"
        names = expert_stacks(view, [stack])[stack]
        W = np.asarray(view.get(stack), np.float32)
        vec = np.linspace(0.5, 2.0, W.shape[0] * W.shape[2]).astype(np.float32)
        fake = np.full((W.shape[1], blocks.row_bytes("Q8_0", W.shape[2])), 7, np.uint8)
        done = {names[0]: GgmlQuantized("Q8_0", fake, W.shape[1:])}
        st = Stacks(done, view, {stack: names}, {stack: GgmlTarget("Q8_0", vec)})
        assert set(st) == {stack}
        got = np.asarray(st[stack].data)
    assert got.shape == (W.shape[0], *fake.shape)
    assert got[0].tobytes() == fake.tobytes()
    per = vec.reshape(W.shape[0], -1)
    for e in range(1, W.shape[0]):
        assert got[e].tobytes() == blocks.quantize(W[e], "Q8_0", imatrix=per[e]).tobytes()


@pytest.mark.torch
@pytest.mark.parametrize("name", ["tiny-qwen3moe", "tiny-mixtral"])
def test_later_blocks_expert_stacks_wait_their_turn(tiny: Path, tmp_path: Path, name: str) -> None:
    """GPTQ's model build defers every block after the first, expert stacks included (a GGUF
    stack fills all of its block's experts: before, the stacks were read at once, 26 GB of
    float32 for the generated 64-expert 7B model); each block's experts come back with the
    block, equal to an eager build's."""
    torch = pytest.importorskip("torch")
    from lowbit.calibration._memory import _Deferred, _later_block
    from lowbit.calibration.gptq import _find_blocks
    from lowbit.models.build import build_model

    path = _converted(tiny / name, tmp_path / "m.gguf")
    with open_checkpoint(path) as ckpt:
        want = build_model(ckpt, progress=False).state_dict()
        model = build_model(ckpt, progress=False, defer=_later_block)
        prefix, blocks = _find_blocks(model)
        later = [k for k in model.lowbit_deferred if ".experts." in k]
        n_later = len(blocks) - 1
        assert n_later >= 1
        per_block = [k for k in want if ".experts." in k and ".layers.1." in k]
        assert per_block and len(later) == n_later * len(per_block)
        assert all(p.numel() == 0 for n, p in blocks[1].named_parameters() if "experts" in n)
        deferred = _Deferred(model, ckpt, prefix)
        with torch.inference_mode():
            for i in range(1, len(blocks)):
                deferred.restore(i)
        for k, v in model.state_dict().items():
            if k == "lm_head.weight":
                continue
            assert torch.equal(v, want[k]), k


@pytest.mark.torch
def test_experts_sharing_a_hessian_solve_in_parts_to_the_same_bytes(
    tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With every token through every expert all experts of a block share one Hessian; GPTQ
    solves them in parts of whole experts (bounded memory: one stacked solve of a 64-expert
    block's gate/up took 13 GB) and writes the bytes of one stacked solve."""
    import lowbit.calibration.gptq as cg
    from lowbit.calibration.data import Calibration

    pytest.importorskip("torch")
    cal = Calibration(samples=2, length=16, experts="all")
    seen: list[int] = []
    parts = cg._expert_parts

    def spy(group: list[str], mine: dict[str, str], ckpt: object) -> list[list[str]]:
        out = parts(group, mine, ckpt)
        seen.append(len(out))
        return out

    monkeypatch.setattr(cg, "_expert_parts", spy)
    gguf_mix(tiny / "tiny-qwen3moe", "q8_0", tmp_path / "whole.gguf", method="gptq",
             calibration=cal, progress=False)  # fmt: skip
    assert max(seen) == 1  # the tiny experts fit one part
    seen.clear()
    monkeypatch.setattr(cg, "_EXPERT_PART_BYTES", 1)  # one expert per part
    gguf_mix(tiny / "tiny-qwen3moe", "q8_0", tmp_path / "parts.gguf", method="gptq",
             calibration=cal, progress=False)  # fmt: skip
    with open_checkpoint(tiny / "tiny-qwen3moe") as hf:
        n_exp = int(hf.config["num_experts"])
    assert max(seen) == n_exp
    assert (tmp_path / "whole.gguf").read_bytes() == (tmp_path / "parts.gguf").read_bytes()
