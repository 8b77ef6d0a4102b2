"""Every corrupt input is one LowbitError (exit 2, one line): the crashes of issue 11, each pinned.

Each test builds one of the files that used to end in a traceback (RecursionError, ValueError,
IndexError, ZeroDivisionError, a hang) and checks the clean refusal. docs/security.md lists
them, one row per test.
"""

from __future__ import annotations

import json
import os
import struct
import threading
from pathlib import Path
from typing import Any

import pytest

from fuzz_strategies import (
    ARRAY,
    F32,
    GGML_F32,
    GGML_Q4_0,
    GGML_Q8_0,
    STRING,
    U8,
    U32,
    gguf_bytes,
    gguf_model,
    gguf_nested,
    llama_kvs,
    safetensors_bytes,
    safetensors_model,
)
from lowbit._json import short_repr
from lowbit.checkpoints import open_checkpoint
from lowbit.checkpoints.io import gguf_file as _gguf
from lowbit.checkpoints.io import safetensors as _safetensors
from lowbit.cli import main
from lowbit.errors import LowbitError
from lowbit.planning.archs import spec_from_checkpoint
from lowbit.planning.headers import read_gguf_header, read_safetensors_header

pytest.importorskip("gguf")

DEEP = "[" * 1000 + "]" * 1000
HUGE = "9" * 5000  # past Python's 4,300-digit int limit


def _refused(path: Path, match: str, *readers: Any) -> None:
    """Every reader refuses ``path`` with a LowbitError naming it; the message stays short."""
    for read in readers or (open_checkpoint,):
        with pytest.raises(LowbitError, match=match) as info:
            read(path)
        assert str(path) in str(info.value)
        assert len(str(info.value)) < 600 and "\n" not in str(info.value)


def _cli_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """The CLI exits 2 with one line on stderr (no traceback)."""
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1
    return err


def _st(tmp_path: Path, header: str | dict[str, Any], data: bytes = b"") -> Path:
    path = tmp_path / "m.safetensors"
    path.write_bytes(safetensors_bytes(header, data))
    return path


def _gg(tmp_path: Path, data: bytes, name: str = "m.gguf") -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


# ---------------------------------------------------------------------------- JSON limits


def test_safetensors_header_nested_1000_deep(tmp_path: Path) -> None:
    """A header nested 1,000 deep (RecursionError before) is refused by its depth."""
    path = _st(tmp_path, '{"a": ' + DEEP + "}")
    _refused(path, "nested 1001 levels deep", open_checkpoint, read_safetensors_header)


def test_safetensors_header_object_nested_deep(tmp_path: Path) -> None:
    """Deep objects too, and brackets inside strings do not count."""
    path = _st(tmp_path, "{" + '"a":{' * 900 + "}" * 901)
    _refused(path, "nested 901 levels deep")
    ok = _st(tmp_path, {"__metadata__": {"note": "[" * 500}})
    assert open_checkpoint(ok).names() == []


@pytest.mark.parametrize("where", ["shape", "data_offsets"])
def test_safetensors_int_of_5000_digits(tmp_path: Path, where: str) -> None:
    """An integer of 5,000 digits (ValueError from Python's int limit before) is refused
    before conversion, and no message formats it."""
    entry = {"dtype": "F32", "shape": "[1]", "data_offsets": "[0, 4]"}
    entry[where] = f"[{HUGE}]" if where == "shape" else f"[0, {HUGE}]"
    body = ", ".join(f'"{k}": {v}' if k != "dtype" else f'"{k}": "{v}"' for k, v in entry.items())
    path = _st(tmp_path, '{"w": {' + body + "}}", bytes(4))
    _refused(path, "an integer of 5000 digits", open_checkpoint, read_safetensors_header)


def test_safetensors_int_past_2_64(tmp_path: Path) -> None:
    """Integers beyond [-2**63, 2**64) are refused: no shape or offset needs them."""
    path = _st(tmp_path, '{"w": {"dtype": "F32", "shape": [18446744073709551616], '
                         '"data_offsets": [0, 4]}}', bytes(4))  # fmt: skip
    _refused(path, "outside")


def test_short_repr_never_formats_a_huge_value() -> None:
    """Messages quote values through short_repr: a 10**5000 is named by its bit length."""
    assert short_repr(10**5000) == "<an integer of 16610 bits>"
    assert len(short_repr(["x" * 10_000] * 10_000)) < 300
    assert short_repr((3, 4)) == "(3, 4)" and short_repr("abc") == "'abc'"


def test_lowbit_manifest_nested_1000_deep_and_huge_int(tmp_path: Path) -> None:
    """lowbit.json nested 1,000 deep, or holding a 5,000-digit integer, is refused."""
    from lowbit.checkpoints.lowbit_format.checkpoint import LowbitCheckpoint

    folder = tmp_path / "ck"
    folder.mkdir()
    for text, match in ((DEEP, "nested 1000 levels"), (f'{{"version": {HUGE}}}', "5000 digits")):
        (folder / "lowbit.json").write_text(text)
        with pytest.raises(LowbitError, match=match):
            LowbitCheckpoint(folder)


def test_config_json_nested_deep_beside_safetensors(tmp_path: Path) -> None:
    """A config.json nested 1,000 deep beside the weights is refused, naming it."""
    path = _st(tmp_path, {})
    (tmp_path / "config.json").write_text('{"a": ' + DEEP + "}")
    with pytest.raises(LowbitError, match=r"config\.json.*nested"):
        open_checkpoint(path)
    with pytest.raises(LowbitError, match=r"config\.json.*nested"):
        open_checkpoint(tmp_path)


@pytest.mark.parametrize(
    ("suffix", "text", "match"),
    [
        (".json", '{"rules": ' + DEEP + "}", "nested 1001 levels"),
        (".json", f'{{"rules": [], "version": {HUGE}}}', "5000 digits"),
        (".yaml", "rules: " + DEEP, "nested 1000 levels"),
        (".yaml", f"version: {HUGE}", "malformed YAML|out of range"),
        (".yaml", "1.5: []", "not a string"),
        (".json", '{"rules": [{"regex": 7, "format": "int8"}]}', "list of strings"),
    ],
)
def test_plan_file_limits(tmp_path: Path, suffix: str, text: str, match: str) -> None:
    """Plan files (JSON or YAML) go through the same limits."""
    pytest.importorskip("yaml")
    from lowbit.plans.plan import PrecisionPlan

    path = tmp_path / f"plan{suffix}"
    path.write_text(text)
    with pytest.raises(LowbitError, match=match):
        PrecisionPlan.from_file(path)


def test_safetensors_duplicate_tensor_names(tmp_path: Path) -> None:
    """A header naming a tensor twice is refused (as the safetensors package does), not
    read as the last one."""
    e = '{"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}'
    path = _st(tmp_path, f'{{"w": {e}, "w": {e}}}', bytes(4))
    _refused(path, "'w' appears twice", open_checkpoint, read_safetensors_header)


# ------------------------------------------------------------------- shapes numpy refuses


def test_zero_size_tensor_with_dim_2_63(tmp_path: Path) -> None:
    """A zero-size tensor of shape (0, 2**63) or (0, 2**62, 4) (numpy's ValueError before)."""
    for shape in ([0, 2**63], [0, 2**62, 4], [2**40, 2**40, 0]):
        path = _st(tmp_path, {"w": {"dtype": "F32", "shape": shape, "data_offsets": [0, 0]}})
        _refused(path, "2\\*\\*63 bytes or more", open_checkpoint, spec_from_checkpoint)


def test_zero_size_tensor_of_65_dims(tmp_path: Path) -> None:
    """A zero-size tensor of 65 dimensions (numpy's ValueError before) is refused."""
    path = _st(tmp_path, {"w": {"dtype": "F32", "shape": [0] + [1] * 64, "data_offsets": [0, 0]}})
    _refused(path, "65 dimensions; at most 32", open_checkpoint, read_safetensors_header)


def test_safetensors_tensor_count_cap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """More tensors than the cap are refused before any is checked."""
    monkeypatch.setattr(_safetensors, "MAX_TENSORS", 3)
    shapes = {f"t{i}": ("F32", [1]) for i in range(4)}
    path = tmp_path / "many.safetensors"
    path.write_bytes(safetensors_model(shapes))
    _refused(path, "more than 3 tensors; lowbit reads at most 3")


# ------------------------------------------------------------------------------- GGUF


def test_gguf_metadata_arrays_nested_900_deep(tmp_path: Path) -> None:
    """Metadata arrays nested 900 deep (RecursionError before) are refused by depth."""
    kvs = [*llama_kvs(), ("x.deep", *gguf_nested(900))]
    path = _gg(tmp_path, gguf_model(kvs))
    _refused(path, "nests arrays more than 4 deep", open_checkpoint, read_gguf_header)
    shallow = _gg(tmp_path, gguf_model([*llama_kvs(), ("x.two", *gguf_nested(2))]), "ok.gguf")
    assert open_checkpoint(shallow).metadata["x.two"] == [[]]


@pytest.mark.parametrize("dims", [[32, 0], [0], []], ids=["zero-dim", "zero-only", "n_dims=0"])
@pytest.mark.parametrize("ttype", [GGML_Q4_0, GGML_Q8_0])
def test_gguf_block_tensor_without_values(tmp_path: Path, dims: list[int], ttype: int) -> None:
    """A block-quantized tensor with a zero dimension or none at all (ValueError, IndexError
    or ZeroDivisionError in `lowbit plan` before) is refused."""
    data = gguf_bytes(llama_kvs(), [("bad", dims, ttype, 0)], bytes(64))
    path = _gg(tmp_path, data)
    _refused(path, "needs at least one dimension, none zero", open_checkpoint,
             read_gguf_header, spec_from_checkpoint)  # fmt: skip


def test_gguf_plain_scalar_and_empty_tensors_still_read(tmp_path: Path) -> None:
    """F32 tensors of no dimensions (a scalar) or a zero one stay readable."""
    data = gguf_bytes(llama_kvs(), [("s", [], GGML_F32, 0), ("e", [4, 0], GGML_F32, 32)],
                      struct.pack("<f", 2.5) + bytes(28))  # fmt: skip
    ckpt = open_checkpoint(_gg(tmp_path, data))
    assert ckpt.get("s") == 2.5 and ckpt.get("e").shape == (0, 4)


@pytest.mark.parametrize(
    ("key", "vtype", "value", "expects"),
    [
        ("llama.attention.layer_norm_rms_epsilon", STRING, "1e-5", "a number"),
        ("tokenizer.ggml.tokens", U32, 5, "an array of strings"),
        ("llama.block_count", F32, 1.0, "an integer"),
        ("tokenizer.ggml.bos_token_id", ARRAY, (U32, [0]), "an integer"),
        ("tokenizer.ggml.token_type", STRING, "x", "an array of integers"),
        ("general.architecture", U8, 1, "a UTF-8 string"),
    ],
)
def test_gguf_used_key_of_wrong_type(
    tmp_path: Path, key: str, vtype: int, value: Any, expects: str
) -> None:
    """A metadata key lowbit uses, of the wrong type (TypeError/ValueError before), is
    refused naming the key and the type lowbit expects."""
    kvs = [(k, vtype, value) if k == key else (k, t, v) for k, t, v in llama_kvs()]
    path = _gg(tmp_path, gguf_model(kvs))
    _refused(path, f"{key}.*expects {expects}", open_checkpoint, read_gguf_header)


def test_gguf_architecture_not_utf8(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Invalid UTF-8 in general.architecture (read, then a crash in quantize before) is refused
    at read; `lowbit quantize` exits 2 with one line."""
    kvs = llama_kvs(arch=b"ll\xffama")
    path = _gg(tmp_path, gguf_model(kvs))
    _refused(path, "general.architecture.*not UTF-8", open_checkpoint, read_gguf_header)
    out = tmp_path / "q.gguf"
    err = _cli_exit_2(["quantize", str(path), "--to", "q8_0", "--out-format", "gguf",
                       "--out", str(out), "--no-progress"], capsys)  # fmt: skip
    assert "not UTF-8" in err and not out.exists()


def test_gguf_key_and_tensor_name_not_utf8(tmp_path: Path) -> None:
    """Keys and tensor names are decoded strictly."""
    path = _gg(tmp_path, gguf_bytes([(b"ke\xffy", U8, 1)]))  # type: ignore[list-item]
    _refused(path, "metadata key is not valid UTF-8")
    path = _gg(tmp_path, gguf_bytes([], [(b"w\xff", [1], GGML_F32, 0)], bytes(32)))  # type: ignore[list-item]
    _refused(path, "name of tensor 0 is not valid UTF-8")


def test_gguf_byte_tokens_not_utf8_kept_for_sentencepiece(tmp_path: Path) -> None:
    """Vocabulary strings that are not UTF-8 are kept (byte tokens), except in a byte-level
    BPE vocabulary, whose tokens are text by construction."""
    kvs = [(k, t, v) for k, t, v in llama_kvs() if k != "tokenizer.ggml.model"]
    kvs = [(k, t, (STRING, ["a", b"\xff"]) if k == "tokenizer.ggml.tokens" else v)
           for k, t, v in kvs]  # fmt: skip
    ok = _gg(tmp_path, gguf_model([*kvs, ("tokenizer.ggml.model", STRING, "llama")]), "ok.gguf")
    assert len(open_checkpoint(ok).metadata["tokenizer.ggml.tokens"]) == 2
    bad = _gg(tmp_path, gguf_model([*kvs, ("tokenizer.ggml.model", STRING, "gpt2")]))
    _refused(bad, "tokens' item 1 is not valid UTF-8")


def test_gguf_metadata_element_cap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Metadata arrays holding more elements in all than the cap are refused."""
    monkeypatch.setattr(_gguf, "MAX_METADATA_ELEMENTS", 10)
    kvs = [*llama_kvs()[:3], ("x.a", ARRAY, (U8, [1] * 6)), ("x.b", ARRAY, (U8, [1] * 6))]
    _refused(_gg(tmp_path, gguf_model(kvs)), "more than 10 elements")


def test_plan_cli_on_zero_dim_gguf_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`lowbit plan` on a zero-dim Q4_0 tensor (ZeroDivisionError before) exits 2."""
    path = _gg(tmp_path, gguf_bytes(llama_kvs(), [("bad", [32, 0], GGML_Q4_0, 0)], bytes(32)))
    assert "needs at least one dimension" in _cli_exit_2(["plan", str(path)], capsys)


# ----------------------------------------------------------------------- regular files only


def _returns_within(fn: Any, seconds: float = 20.0) -> BaseException | None:
    """Run ``fn`` in a thread; fail if it does not return in time (a FIFO read hangs)."""
    box: list[BaseException | None] = [None]

    def run() -> None:
        try:
            fn()
        except BaseException as exc:
            box[0] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    if t.is_alive():
        # unblock the reader so the thread can end, then fail
        pytest.fail(f"{fn} did not return within {seconds} s (blocked on a FIFO?)")
    return box[0]


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this system")
@pytest.mark.parametrize(
    "name", ["m.safetensors", "m.gguf", "model", "config.json", "plan.json", "lowbit.json"]
)
def test_fifo_is_refused_not_read(tmp_path: Path, name: str) -> None:
    """A FIFO as the model path (a hang before), as config.json, a plan file or lowbit.json
    is refused before it is opened."""
    from lowbit.checkpoints.lowbit_format.checkpoint import LowbitCheckpoint
    from lowbit.plans.plan import PrecisionPlan

    fifo = tmp_path / name
    os.mkfifo(fifo)
    if name == "config.json":
        _st(tmp_path, {})
        call = lambda: open_checkpoint(tmp_path / "m.safetensors")  # noqa: E731
    elif name == "plan.json":
        call = lambda: PrecisionPlan.from_file(fifo)  # noqa: E731
    elif name == "lowbit.json":
        call = lambda: LowbitCheckpoint(tmp_path)  # noqa: E731
    else:
        call = lambda: open_checkpoint(fifo)  # noqa: E731
    exc = _returns_within(call)
    if exc is None and name in ("plan.json", "lowbit.json"):
        pytest.fail("a FIFO was accepted")
    assert isinstance(exc, LowbitError), exc
    assert "FIFO" in str(exc) or "not a regular file" in str(exc)
    if name not in ("config.json", "plan.json", "lowbit.json"):
        assert isinstance(_returns_within(lambda: spec_from_checkpoint(fifo)), LowbitError)


def test_device_is_refused(tmp_path: Path) -> None:
    """A character device (/dev/zero would be read forever) is refused."""
    if not Path("/dev/zero").exists():
        pytest.skip("no /dev/zero")
    with pytest.raises(LowbitError, match="a device, not a regular file"):
        open_checkpoint("/dev/zero")
    with pytest.raises(LowbitError, match="a device, not a regular file"):
        _safetensors.parse(Path("/dev/zero"))


# ------------------------------------------------------------------------- bounded cost


def test_gguf_metadata_copy_of_a_5m_element_array(tmp_path: Path) -> None:
    """A 5 MB GGUF whose metadata holds one 5M-element array (157 s and 3.7 GB through
    gguf.GGUFReader before) is copied into a GGUF output byte for byte by lowbit's parser."""
    from lowbit.checkpoints.gguf.writer import write_gguf

    n = 5_000_000
    big = struct.pack("<IQ", U8, n) + bytes(range(256)) * (n // 256) + bytes(n % 256)
    kvs = [("general.architecture", STRING, "llama"), ("x.big", ARRAY, big)]
    src = _gg(tmp_path, gguf_bytes(kvs))
    out = write_gguf(tmp_path / "out.gguf", {}, source=src, progress=False)
    copied = _gguf.raw_metadata(out)["x.big"]
    assert copied == (ARRAY, big)
    assert len(_gguf.parse(out).metadata["x.big"]) == n


@pytest.mark.slow
def test_safetensors_header_of_many_empty_tensors(tmp_path: Path) -> None:
    """A 13 MB header of 200k empty tensors (the issue's 67 MB / 1M-tensor case, whose cost is
    linear in the count: docs/security.md) parses: every tensor is checked, none is left out."""
    n = 200_000
    entry = '{"dtype":"F32","shape":[0,4096],"data_offsets":[0,0]}'
    header = "{" + ",".join(f'"model.layers.{i}.weight":{entry}' for i in range(n)) + "}"
    path = _st(tmp_path, header)
    assert path.stat().st_size > 12_000_000
    tensors, _ = read_safetensors_header(path)
    assert len(tensors) == n and tensors[-1].shape == (0, 4096)


def test_json_limits_are_not_hit_by_real_files() -> None:
    """A real manifest-like document (deep enough, big ints) passes the limits unchanged."""
    from lowbit import _json

    doc = {"a": [[[[{"b": 2**64 - 1, "c": -(2**63), "d": 1.5e300}]]]]}
    assert _json.loads(json.dumps(doc), "x") == doc


# ------------------------------------------------------------------ found by the fuzzers


def test_gguf_copy_refuses_an_empty_architecture(tmp_path: Path) -> None:
    """An empty general.architecture (GGUFWriter drops it silently, so the copy lost it) is
    refused when the metadata is copied into a new GGUF."""
    from lowbit.checkpoints.gguf.writer import write_gguf

    src = _gg(tmp_path, gguf_model(llama_kvs(arch="")))
    with pytest.raises(LowbitError, match=r"non-empty general\.architecture"):
        write_gguf(tmp_path / "out.gguf", {}, source=src, progress=False)
    assert not (tmp_path / "out.gguf").exists()


def test_gguf_inf_block_scales_read_without_warnings(tmp_path: Path) -> None:
    """A Q8_0 block whose float16 scale is inf reads as the file says (inf/NaN), with no
    RuntimeWarning (an error under strict warnings)."""
    block = struct.pack("<e", float("inf")) + bytes([0] + [1] * 31)
    data = gguf_bytes(llama_kvs(), [("q", [32], GGML_Q8_0, 0)], block + bytes(-len(block) % 32))
    values = open_checkpoint(_gg(tmp_path, data)).get("q")
    assert values.shape == (32,) and not (values[1:] < float("inf")).any()


def test_quantized_tensor_metadata_string_goes_through_the_limits() -> None:
    """Quantized-tensor metadata given as a JSON string is read with the same limits."""
    from lowbit.quant.quantized_tensor import QuantizedTensor

    with pytest.raises(LowbitError, match="nested 1000 levels"):
        QuantizedTensor.from_arrays({}, DEEP)
