"""Issue 41, the third adversarial round: every probe is one ``LowbitError`` line (exit 2 from
the CLI), and where an input is involved its bytes are unchanged."""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from lowbit.cli import main
from lowbit.errors import LowbitError


def _run(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(args))
    return code, out.getvalue(), err.getvalue()


def _one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


def _digest(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


# ---------------------------------------------------------------- outputs are never inputs


@pytest.fixture(scope="module")
def model_gguf(tmp_path_factory: Any) -> Path:
    """A GGUF lowbit wrote (so ``--overwrite`` alone would let it be replaced)."""
    from tiny_models import save_gguf, tiny_llama

    return save_gguf(tiny_llama(), tmp_path_factory.mktemp("m") / "model.gguf")


@pytest.fixture(scope="module")
def imatrix_gguf(tmp_path_factory: Any) -> Path:
    from lowbit.checkpoints.gguf.imatrix import write_imatrix

    p = tmp_path_factory.mktemp("im") / "im.gguf"
    sums = {"blk.0.attn_q.weight": np.ones(64, np.float32)}
    counts = {"blk.0.attn_q.weight": np.ones(1, np.float32)}
    return write_imatrix(p, sums, counts, datasets=["t"], chunk_count=1, chunk_size=8)


def _refused_unchanged(path: Path, *args: str) -> str:
    before = _digest(path)
    code, out, err = _run(*args)
    line = _one_line(err)
    assert code == 2, (out, err)
    assert "would destroy the input" in line, line
    assert _digest(path) == before
    return line


@pytest.mark.parametrize("how", ["itself", "symlink", "hardlink"])
def test_imatrix_out_onto_its_model(model_gguf: Path, tmp_path: Path, how: str) -> None:
    out = model_gguf
    if how == "symlink":
        out = tmp_path / "link.gguf"
        out.symlink_to(model_gguf)
    elif how == "hardlink":
        out = tmp_path / "hard.gguf"
        os.link(model_gguf, out)
    _refused_unchanged(model_gguf, "imatrix", str(model_gguf), "--out", str(out), "--overwrite")


def test_imatrix_out_onto_its_calibration_text(model_gguf: Path, tmp_path: Path) -> None:
    calib = tmp_path / "corpus.txt"
    calib.write_text("hello world " * 100)
    _refused_unchanged(
        calib, "imatrix", str(model_gguf), "--calib", str(calib), "--out", str(calib),
        "--overwrite",
    )  # fmt: skip


def test_quantize_out_onto_its_imatrix(
    model_gguf: Path, imatrix_gguf: Path, tmp_path: Path
) -> None:
    hard = tmp_path / "hard-im.gguf"
    os.link(imatrix_gguf, hard)
    for out in (imatrix_gguf, hard):
        _refused_unchanged(
            imatrix_gguf, "quantize", str(model_gguf), "--to", "q4_0", "--out-format", "gguf",
            "--imatrix", str(imatrix_gguf), "--out", str(out), "--overwrite",
        )  # fmt: skip


def test_quantize_out_hard_link_to_its_gguf_input(model_gguf: Path, tmp_path: Path) -> None:
    hard = tmp_path / "hard.gguf"
    os.link(model_gguf, hard)
    _refused_unchanged(
        model_gguf, "quantize", str(model_gguf), "--to", "q8_0", "--out-format", "gguf",
        "--out", str(hard), "--overwrite",
    )  # fmt: skip


def test_report_out_onto_its_eval_file(model_gguf: Path, tmp_path: Path) -> None:
    ev = tmp_path / "eval.json"
    ev.write_text("{}")
    _refused_unchanged(
        ev, "report", str(model_gguf), "--eval", str(ev), "--out", str(ev), "--overwrite"
    )


def test_compare_plot_onto_its_data(tmp_path: Path) -> None:
    data = tmp_path / "x.npy"
    np.save(data, np.ones(64, np.float32))
    link = tmp_path / "x.png"
    link.symlink_to(data)
    _refused_unchanged(data, "compare", "--data", str(data), "--plot", str(link), "--overwrite")


def test_quantize_tensor_out_hard_link_to_its_input(tmp_path: Path) -> None:
    data = tmp_path / "x.npy"
    np.save(data, np.ones(64, np.float32))
    hard = tmp_path / "x.safetensors"
    os.link(data, hard)
    _refused_unchanged(
        data, "quantize-tensor", str(data), "--to", "int8", "--out", str(hard), "--overwrite"
    )


def test_write_imatrix_and_write_gguf_refuse_an_input(imatrix_gguf: Path, tmp_path: Path) -> None:
    from lowbit.checkpoints.gguf.imatrix import write_imatrix
    from lowbit.checkpoints.gguf.writer import write_gguf

    before = _digest(imatrix_gguf)
    hard = tmp_path / "h.gguf"
    os.link(imatrix_gguf, hard)
    sums = {"w": np.ones(4, np.float32)}
    counts = {"w": np.ones(1, np.float32)}
    with pytest.raises(LowbitError, match="would destroy the input"):
        write_imatrix(
            hard, sums, counts, datasets=["t"], chunk_count=1, chunk_size=1, overwrite=True,
            inputs=[imatrix_gguf],
        )  # fmt: skip
    with pytest.raises(LowbitError, match="would destroy the input"):
        write_gguf(imatrix_gguf, {"w": np.ones(4, np.float32)}, arch="x", overwrite=True,
                   inputs=[hard])  # fmt: skip
    assert _digest(imatrix_gguf) == before


# ---------------------------------------------------------------- bounded resources and numbers


def test_workers_capped_by_the_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    from lowbit import _workers_cap as cap

    monkeypatch.setattr(cap, "usable_cores", lambda: 3)
    assert cap.local_workers(4096) == 3
    assert cap.local_workers(2) == 2
    assert cap.ray_workers(1, 16.0) == 16  # 1: one actor per cluster CPU
    assert cap.ray_workers(100, 4.0) == 4  # an actor takes a CPU: more would wait for ever
    for bad in (0, -1, 10**23, 2.5, True, "4"):
        with pytest.raises(LowbitError) as info:
            cap.check_workers(bad)
        assert len(str(info.value).splitlines()) == 1 and len(str(info.value)) < 200


@pytest.mark.parametrize("n", ["1000000", str(10**23), "0"])
def test_workers_out_of_range_is_one_line(model_gguf: Path, tmp_path: Path, n: str) -> None:
    code, _, err = _run(
        "sensitivity", str(model_gguf), "--schemes", "int8:ch", "--workers", n,
        "--out", str(tmp_path / "s.json"),
    )  # fmt: skip
    line = _one_line(err)
    assert code == 2 and "--workers" in line and len(line) < 200, line
    assert not (tmp_path / "s.json").exists()


@pytest.mark.parametrize(
    "text", ["1" + "0" * 30, "9" * 400, 10**30, "9" * 100_000 + "x", "1e999", "inf", "nan"]
)
def test_gguf_budget_size_past_any_model(text: Any) -> None:
    import time

    from lowbit.plans.mixed import parse_size

    start = time.perf_counter()
    with pytest.raises(LowbitError) as info:
        parse_size(text)
    assert time.perf_counter() - start < 0.5  # the old pattern was quadratic in the digits
    assert len(str(info.value).splitlines()) == 1 and len(str(info.value)) < 200
    assert parse_size("80MB") == 80 * 10**6 and parse_size("1.5GiB") == 3 * 2**29
    assert parse_size(".5k") == 500 and parse_size(2**53) == 2**53


def test_gguf_budget_size_from_the_cli(model_gguf: Path, tmp_path: Path) -> None:
    out = tmp_path / "o.gguf"
    code, _, err = _run(
        "quantize", str(model_gguf), "--size", "1" + "0" * 30, "--out-format", "gguf",
        "--out", str(out),
    )  # fmt: skip
    assert code == 2 and "8 PiB" in _one_line(err)
    assert not out.exists()


@pytest.mark.parametrize(
    ("flag", "argv"),
    [
        ("--percentile", ["quantize-tensor", "x.npy", "--percentile", "nan", "--to", "int8"]),
        ("--lr", ["train-lab", "--lr", "inf", "--steps", "1"]),
        ("--steps", ["train-lab", "--steps", str(10**30)]),
        ("--memory-fraction", ["plan", "--params", "7B", "--memory-fraction", "nan"]),
    ],
)
def test_numbers_out_of_any_range_are_one_line(flag: str, argv: list[str]) -> None:
    code, _, err = _run(*argv)
    line = _one_line(err)
    assert code == 2 and flag in line, line


# ---------------------------------------------------------------- paths that ended in tracebacks


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory: Any) -> Path:
    from tiny_models import save_hf_folder, tiny_llama

    return save_hf_folder(tiny_llama(), tmp_path_factory.mktemp("hf") / "hf")


@pytest.mark.parametrize("activations", [None, "fp8"])
def test_fp8_block_to_compressed_tensors_from_the_cli(
    hf_folder: Path, tmp_path: Path, activations: str | None
) -> None:
    """``--to fp8_block --out-format compressed-tensors`` writes llm-compressor's FP8_BLOCK
    layout (a TypeError in the size summary before); with ``--activations fp8`` its dynamic
    per-group-of-128 fp8 inputs too."""
    import json

    out = tmp_path / "fp8b"
    extra = ["--activations", activations] if activations else []
    code, _, err = _run(
        "quantize", str(hf_folder), "--to", "fp8_block", "--out-format", "compressed-tensors",
        *extra, "--out", str(out),
    )  # fmt: skip
    assert code == 0, err
    qc = json.loads((out / "config.json").read_text())["quantization_config"]
    [group] = qc["config_groups"].values()
    w = group["weights"]
    assert (w["type"], w["num_bits"], w["strategy"], w["block_structure"], w["symmetric"]) == (
        "float", 8, "block", [128, 128], True,
    )  # fmt: skip
    if activations:
        assert qc["format"] == "float-quantized"
        assert group["input_activations"] == {
            "dynamic": True, "group_size": 128, "num_bits": 8, "strategy": "group",
            "symmetric": True, "type": "float",
        }  # fmt: skip
    assert _run("verify", str(out))[0] == 0


@pytest.fixture(scope="module")
def gguf_without_tokenizer(tmp_path_factory: Any) -> Path:
    from lowbit.checkpoints.gguf.writer import write_gguf
    from tiny_models import gguf_metadata, gguf_tensors, tiny_llama

    m = tiny_llama()
    meta = {k: v for k, v in gguf_metadata(m).items() if not k.startswith("tokenizer.")}
    p = tmp_path_factory.mktemp("notok") / "notok.gguf"
    return write_gguf(p, gguf_tensors(m), metadata=meta, arch="llama", progress=False)


def test_imatrix_on_a_gguf_without_a_tokenizer(
    gguf_without_tokenizer: Path, tmp_path: Path
) -> None:
    code, _, err = _run("imatrix", str(gguf_without_tokenizer), "--out", str(tmp_path / "i.gguf"))
    assert code == 2 and "holds no tokenizer" in _one_line(err)


def test_imatrix_given_an_imatrix_as_the_model(imatrix_gguf: Path, tmp_path: Path) -> None:
    code, _, err = _run("imatrix", str(imatrix_gguf), "--out", str(tmp_path / "i.gguf"))
    assert code == 2 and "an importance matrix" in _one_line(err)


@pytest.mark.parametrize(
    "record",
    ['{"text":' * 100_000 + '"x"' + "}" * 100_000, '{"text": {"a": {"b": "c"}}}', "[" * 50_000],
)
def test_nested_calibration_jsonl(model_gguf: Path, tmp_path: Path, record: str) -> None:
    calib = tmp_path / "c.jsonl"
    calib.write_text(record + "\n")
    code, _, err = _run(
        "imatrix", str(model_gguf), "--calib", str(calib), "--out", str(tmp_path / "i.gguf")
    )
    line = _one_line(err)
    assert code == 2 and "c.jsonl:1" in line, line


# ---------------------------------------------------------------- leftovers of killed runs
# A Hugging Face folder goes to a GGUF mix or budget through a converted view of the folder
# (lowbit.checkpoints.gguf.hf_view): no converted copy is written, so a killed run leaves
# nothing beside the output (tests/checkpoints/test_gguf_direct.py checks that no other file
# is made).


@pytest.fixture(scope="module")
def convertible(tmp_path_factory: Any) -> Path:
    """A tiny llama with SmolLM2's tokenizer, which lowbit converts to GGUF (the fixture
    tests/checkpoints/test_gguf_convert.py uses)."""
    import subprocess
    import sys

    from lowbit.checkpoints import open_checkpoint
    from lowbit.checkpoints.tokenizer import write_tokenizer
    from tiny_models import shipped_path

    root = tmp_path_factory.mktemp("convert")
    (root / "tok").mkdir()
    write_tokenizer(open_checkpoint(shipped_path("smollm2")), root / "tok")
    make = Path(__file__).resolve().parents[1] / "fixtures/llamacpp/convert/make_tiny.py"
    subprocess.run(
        [sys.executable, str(make), str(root / "models"), str(root / "tok")],
        check=True, capture_output=True,
    )  # fmt: skip
    return root / "models" / "tiny-llama"


def _mutated(src: Path, tmp_path: Path, **changes: Any) -> Path:
    import json
    import shutil

    folder = tmp_path / "m"
    shutil.copytree(src, folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(changes)
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


@pytest.mark.parametrize(
    ("changes", "says"),
    [
        ({"vocab_size": 10**8}, "vocab_size is 100000000; it must be from 1 to"),
        ({"vocab_size": 60000}, "vocab_size is 60,000 but the token embedding has"),
        ({"head_dim": 10**8}, "head_dim is 100000000"),
        ({"num_hidden_layers": 10**9}, "num_hidden_layers is 1000000000"),
        ({"num_hidden_layers": 5}, "num_hidden_layers is 5 but the tensors hold layers 0..1"),
        ({"num_attention_heads": 0}, "num_attention_heads is 0"),
        ({"num_key_value_heads": 3}, "num_key_value_heads 3 does not divide"),
        ({"num_key_value_heads": 8}, "num_key_value_heads 8 does not divide"),
        ({"rope_theta": -1.0}, "rope_theta is -1.0"),
        ({"rms_norm_eps": "1e-5"}, "rms_norm_eps is '1e-5'; lowbit expects a number"),
        ({"hidden_size": 64.0}, "hidden_size is 64.0; lowbit expects an integer"),
        ({"max_position_embeddings": 2**40}, "max_position_embeddings is 1099511627776"),
        ({"rope_scaling": {"rope_type": "linear", "factor": -2.0}}, "factor is -2.0"),
        ({"num_hidden_layers": True}, "lowbit expects an integer"),
    ],
)
def test_hf_config_to_gguf_checked_first(
    convertible: Path, tmp_path: Path, changes: dict, says: str
) -> None:
    import time

    from lowbit.checkpoints.streaming import convert_hf_to_gguf

    folder = _mutated(convertible, tmp_path, **changes)
    out = tmp_path / "x.gguf"
    start = time.perf_counter()
    with pytest.raises(LowbitError) as info:
        convert_hf_to_gguf(folder, out, progress=False)
    assert time.perf_counter() - start < 20  # was a minute (head_dim 10**8) or MemoryError
    assert says in str(info.value) and "\n" not in str(info.value), str(info.value)
    assert not out.exists()
    code, _, err = _run("quantize", str(folder), "--to", "q8_0", "--out-format", "gguf",
                        "--out", str(out))  # fmt: skip
    assert code == 2 and says in _one_line(err)


@pytest.mark.parametrize(
    ("metadata", "says"),
    [
        ({"llama.block_count": 10**9}, "llama.block_count is 1000000000"),
        ({"llama.block_count": 3}, "llama.block_count is 3 but the tensors hold layers 0..1"),
        ({"llama.attention.head_count": 0}, "llama.attention.head_count is 0"),
        ({"llama.attention.head_count_kv": 3}, "head_count_kv 3 does not divide"),
        ({"llama.rope.freq_base": float("nan")}, "llama.rope.freq_base is nan"),
        ({"llama.attention.layer_norm_rms_epsilon": float("inf")}, "is inf"),
    ],
)
def test_gguf_metadata_checked_before_the_model_is_built(
    tmp_path: Path, metadata: dict, says: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from lowbit.checkpoints import open_checkpoint
    from lowbit.checkpoints.gguf import writer as gguf_writer
    from lowbit.models.build import build_model
    from tiny_models import save_gguf, tiny_llama

    with monkeypatch.context() as m:  # another writer's file: lowbit's refuses NaN metadata
        m.setattr(gguf_writer, "check_value", lambda *a: None)
        path = save_gguf(tiny_llama(), tmp_path / "m.gguf", metadata=metadata)
    with open_checkpoint(path) as ckpt, pytest.raises(LowbitError) as info:
        build_model(ckpt, progress=False)
    assert says in str(info.value) and "\n" not in str(info.value), str(info.value)


def test_moe_top_k_past_the_experts(convertible: Path, tmp_path: Path) -> None:
    from lowbit.checkpoints.streaming import convert_hf_to_gguf

    mixtral = convertible.parent / "tiny-mixtral"
    for k in (100, 0, -1):
        folder = _mutated(mixtral, tmp_path / str(k), num_experts_per_tok=k)
        with pytest.raises(LowbitError, match="num_experts_per_tok") as info:
            convert_hf_to_gguf(folder, tmp_path / "x.gguf", progress=False)
        assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("u32", "does not fit UINT32"),
        (1e39, "is not a finite FLOAT32 value"),
        (float("nan"), "is not a finite FLOAT32 value"),
        ([1.0, float("inf")], "is not a finite FLOAT32 value"),
        ("i8", "does not fit INT8"),
    ],
)
def test_gguf_metadata_packed_in_range(tmp_path: Path, value: Any, says: str) -> None:
    """What the GGUF writer packs is checked against its GGUF type first (struct.error,
    OverflowError or a NaN written before); nothing is written."""
    import gguf
    from gguf.gguf_writer import GGUFValue

    from lowbit.checkpoints.gguf.writer import write_gguf

    if value == "u32":
        value = GGUFValue(2**40, gguf.GGUFValueType.UINT32)
    elif value == "i8":
        value = GGUFValue(200, gguf.GGUFValueType.INT8)
    out = tmp_path / "t.gguf"
    with pytest.raises(LowbitError, match=says) as info:
        write_gguf(out, {"w": np.ones(4, np.float32)}, metadata={"x.k": value}, arch="x")
    assert "\n" not in str(info.value) and not out.exists()


# ---------------------------------------------------------------- tokenizer and model-card files

_BOMB = (
    "---\na: &a ["
    + ",".join(['"lol"'] * 9)
    + "]\n"
    + "".join(
        f"{n}: &{n} [{','.join([f'*{p}'] * 9)}]\n"
        for p, n in zip("abcdefg", "bcdefgh", strict=True)
    )
    + "---\n# a model\n"
)


@pytest.mark.parametrize(
    ("name", "content", "says"),
    [
        ("README.md", _BOMB, "more than 1,000,000 values"),
        ("README.md", "---\n- a\n- b\n---\n", "a model card's is a mapping"),
        ("README.md", "---\n" + "[" * 5000 + "\n---\n", "nested"),
        ("README.md", b"---\nname: \xff\xfe\n---\n", "not UTF-8"),
        ("tokenizer_config.json", '{"chat_template": 5}', "chat_template must be"),
        ("tokenizer_config.json", '{"add_bos_token": "yes"}', "add_bos_token must be true"),
        ("tokenizer_config.json", '{"eos_token": ["a"]}', "eos_token must be a string"),
        ("tokenizer_config.json", "[" * 100_000, "nested"),
        ("tokenizer_config.json", b'{"bos_token": "\xc3"}', "not UTF-8"),
        ("tokenizer_config.json", '{"a": 1, "a": 2}', "twice"),
        ("tokenizer_config.json", "[1]", "lowbit expects an object"),
        ("generation_config.json", '{"eos_token_id": "2"}', "eos_token_id must be an integer"),
        ("generation_config.json", '{"eos_token_id": 1' + "0" * 5000 + "}", "digits"),
        ("special_tokens_map.json", '{"additional_special_tokens": 3}', "additional_special"),
        ("added_tokens.json", '{"<x>": "1"}', "integer id"),
        ("chat_template.json", '{"chat_template": [{"name": 1}]}', "chat_template must be"),
    ],
)
def test_tokenizer_and_card_files_are_hostile_input(
    convertible: Path, tmp_path: Path, name: str, content: str | bytes, says: str
) -> None:
    import shutil
    import time

    from lowbit.checkpoints.streaming import convert_hf_to_gguf

    folder = tmp_path / "m"
    shutil.copytree(convertible, folder)
    p = folder / name
    if isinstance(content, bytes):
        p.write_bytes(content)
    else:
        p.write_text(content)
    out = tmp_path / "x.gguf"
    start = time.perf_counter()
    with pytest.raises(LowbitError) as info:
        convert_hf_to_gguf(folder, out, progress=False)
    assert time.perf_counter() - start < 20  # the alias README took 28 s and 538 MB
    assert says in str(info.value) and name in str(info.value), str(info.value)
    assert "\n" not in str(info.value) and not out.exists()


def test_a_plain_model_card_still_converts(convertible: Path, tmp_path: Path) -> None:
    import shutil

    from lowbit.checkpoints.streaming import convert_hf_to_gguf

    folder = tmp_path / "m"
    shutil.copytree(convertible, folder)
    (folder / "README.md").write_text("---\nlicense: apache-2.0\ntags: [a, b]\n---\n# Tiny\n")
    (folder / "generation_config.json").write_text('{"eos_token_id": [1, 2], "bos_token_id": 0}')
    convert_hf_to_gguf(folder, tmp_path / "x.gguf", progress=False)
    assert (tmp_path / "x.gguf").exists()
