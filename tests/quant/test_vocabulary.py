"""One vocabulary: every scheme string the CLI's ``--to`` accepts means the same in
``lowbit.quantize``, ``lowbit.parse_scheme`` and ``PrecisionPlan.uniform`` (lowbit.quant.ggml_tensor,
lowbit.quant.tensor, lowbit.quant.scheme_text)."""

from __future__ import annotations

import typing
from pathlib import Path

import numpy as np
import pytest

import lowbit
from lowbit.errors import LowbitError, UnknownFormatError
from lowbit.ggml import blocks
from lowbit.plans.plan import PrecisionPlan
from lowbit.quant.ggml_tensor import GgmlTensor, GgmlTypeName, block_type_name
from lowbit.quant.scheme import Scheme
from lowbit.quant.scheme_text import parse_scheme


@pytest.fixture
def w() -> np.ndarray:
    return np.random.default_rng(7).standard_normal((6, 512)).astype(np.float32)


def _same(a: lowbit.QuantizedTensor, b: lowbit.QuantizedTensor) -> None:
    assert a.scheme == b.scheme
    assert a.codes.tobytes() == b.codes.tobytes()
    assert a.scale.tobytes() == b.scale.tobytes()


# ---- quantize ------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["int4:g128", "nvfp4", "q4_0", "q8_0", "fp8_block", "nf4:g64:dq",
                                  "int4:g32:fp16:asym", "mxfp4:ceil"])  # fmt: skip
def test_quantize_takes_scheme_text(w: np.ndarray, text: str) -> None:
    """A scheme string gives exactly the scheme ``parse_scheme`` reads from it."""
    scheme = parse_scheme(text)
    assert isinstance(scheme, Scheme)
    _same(lowbit.quantize(w, text), lowbit.quantize(w, scheme))
    assert lowbit.quantize(w, text).scheme == lowbit.parse_scheme(text)


def test_text_equals_options(w: np.ndarray) -> None:
    """``int4:g128:fp16`` is ``int4`` with group_size=128 along the rows and float16 scales."""
    _same(
        lowbit.quantize(w, "int4:g128:fp16"),
        lowbit.quantize(w, "int4", axis=-1, group_size=128, scale_format="float16"),
    )


def test_text_takes_option_overrides(w: np.ndarray) -> None:
    """Options given with a scheme string apply on top of it, as ``--group`` on ``--to``."""
    _same(lowbit.quantize(w, "int4:g128", group_size=64), lowbit.quantize(w, "int4:g64"))


def test_plain_names_keep_their_meaning(w: np.ndarray) -> None:
    """A bare catalog name still means one scale per tensor (the documented default)."""
    assert lowbit.quantize(w, "int4").scheme.label == "int4:t:fp32"


def test_q4_0_is_llama_cpp_bytes(w: np.ndarray) -> None:
    """``quantize(w, "q4_0")`` stored as GGUF is byte for byte llama.cpp's Q4_0 of ``w``."""
    from lowbit.checkpoints.gguf.writer import gguf_from_quantized

    for text in ("q4_0", "q8_0"):
        stored = gguf_from_quantized(lowbit.quantize(w, text))
        assert stored.raw and stored.qtype == text.upper()
        assert np.asarray(stored.data).tobytes() == blocks.quantize(w, text.upper()).tobytes()


@pytest.mark.parametrize("text", ["q4_k", "Q6_K", "iq4_xs", "q4_1", "q2_k", "tq2_0"])
def test_block_types_give_llama_cpp_blocks(w: np.ndarray, text: str) -> None:
    """A block type with no lowbit scheme gives a GgmlTensor of llama.cpp's bytes, and
    ``dequantize`` decodes them as ggml does."""
    got = lowbit.quantize(w, text)
    assert isinstance(got, GgmlTensor)
    want = blocks.quantize(w, text.upper())
    assert got.type == text.upper() and got.shape == w.shape
    assert got.data.tobytes() == want.tobytes()
    assert lowbit.dequantize(got).tobytes() == blocks.dequantize(want, text.upper()).tobytes()
    assert got.nbytes == want.nbytes and got.bits_per_value == 8 * want.nbytes / w.size
    assert len(repr(got)) < 120 and got.to_dict()["type"] == text.upper()


def test_block_type_names_literal_is_complete() -> None:
    """``GgmlTypeName`` (for type checkers) lists exactly the names that give a GgmlTensor."""
    listed = set(typing.get_args(GgmlTypeName))
    derived = {n for n in blocks.TYPES if block_type_name(n) is not None}
    assert {n.upper() for n in listed} == derived
    assert {n.lower() for n in derived} | derived == listed


def test_block_type_with_options_is_one_line(w: np.ndarray) -> None:
    with pytest.raises(LowbitError, match="Q4_K block type, which takes no options"):
        lowbit.quantize(w, "q4_k", group_size=32)


@pytest.mark.parametrize("call", ["quantize", "parse", "uniform", "parse_scheme"])
def test_mix_is_one_error_naming_quantize_model(w: np.ndarray, call: str) -> None:
    """A llama.cpp mix is not one scheme: every entry point says to write it as GGUF."""
    fn = {
        "quantize": lambda: lowbit.quantize(w, "q4_k_m"),
        "parse": lambda: lowbit.parse_scheme("q4_k_m"),
        "uniform": lambda: PrecisionPlan.uniform("q4_k_m"),
        "parse_scheme": lambda: parse_scheme("Q3_K_S"),
    }[call]
    with pytest.raises(LowbitError) as err:
        fn()
    msg = str(err.value)
    assert "llama.cpp mix" in msg and "out_format='gguf'" in msg and "\n" not in msg
    assert "quantize_model(model, 'q" in msg


def test_block_type_as_plan_says_what_to_call() -> None:
    """``PrecisionPlan.uniform("q4_k")`` names both the tensor call and the model call."""
    with pytest.raises(LowbitError, match=r"lowbit.quantize\(w, 'q4_k'\).*quantize_model"):
        PrecisionPlan.uniform("q4_k")


def test_unknown_name_is_still_unknown(w: np.ndarray) -> None:
    with pytest.raises(UnknownFormatError, match="unknown format 'bogus'"):
        lowbit.quantize(w, "bogus")


# ---- Scheme and PrecisionPlan ------------------------------------------------------------


def test_parse_scheme_is_top_level() -> None:
    assert lowbit.parse_scheme is parse_scheme
    assert parse_scheme("int4:g128") == Scheme(format="int4", group_size=128, axis=-1)
    assert parse_scheme("int4", group_size=32) == parse_scheme("int4:g32")


def test_scheme_constructor_points_to_parse() -> None:
    """``Scheme(format="int4:g128")`` says that ``lowbit.parse_scheme`` reads scheme strings."""
    with pytest.raises(UnknownFormatError, match=r"lowbit.parse_scheme\('int4:g128'\)"):
        Scheme(format="int4:g128")
    with pytest.raises(UnknownFormatError) as err:
        Scheme(format="bogus")
    assert "parse_scheme" not in str(err.value)


def test_uniform_group_size_is_group() -> None:
    """``group_size`` (the Scheme field's name) and the older ``group`` make the same plan; the
    older name warns that it is deprecated."""
    a = PrecisionPlan.uniform("int4", group_size=64)
    with pytest.warns(DeprecationWarning, match="group_size"):
        assert a == PrecisionPlan.uniform("int4", group=64)
    assert a.default == parse_scheme("int4:g64")
    with pytest.raises(LowbitError, match="disagree"), pytest.warns(DeprecationWarning):
        PrecisionPlan.uniform("int4", group=32, group_size=64)


@pytest.mark.parametrize("text", ["int4:g128", "nvfp4", "q4_0", "fp8_block"])
def test_uniform_takes_every_scheme_string(text: str) -> None:
    assert PrecisionPlan.uniform(text).default == parse_scheme(text)


# ---- against the command line's bytes ----------------------------------------------------


@pytest.mark.torch
def test_cli_gguf_bytes_equal_quantize(tmp_path: Path) -> None:
    """``lowbit quantize X.gguf --to q4_0 --out-format gguf`` stores, for each weight, the bytes
    of ``gguf_from_quantized(lowbit.quantize(w, "q4_0"))``; ``--to q4_k_m`` stores a Q4_K
    weight as ``lowbit.quantize(w, "q4_k")``."""
    pytest.importorskip("transformers")
    gguf = pytest.importorskip("gguf")
    from lowbit.checkpoints.gguf.writer import gguf_from_quantized
    from lowbit.cli import main
    from tiny_models import save_gguf, tiny_llama

    src = save_gguf(tiny_llama(hidden=256, inter=512), tmp_path / "tiny.gguf")
    ckpt = lowbit.open_checkpoint(src)
    weights = {name: np.asarray(ckpt.get(name), np.float32) for name in ckpt.names()}
    checked = {"Q4_0": 0, "Q4_K": 0}
    for to in ("q4_0", "q4_k_m"):
        out = tmp_path / f"{to}.gguf"
        argv = ["quantize", str(src), "--to", to, "--out-format", "gguf", "--out", str(out)]
        assert main([*argv, "--no-progress"]) == 0
        for t in gguf.GGUFReader(out).tensors:
            kind = t.tensor_type.name
            if kind == "Q4_0" and to == "q4_0":
                want = np.asarray(
                    gguf_from_quantized(lowbit.quantize(weights[t.name], "q4_0")).data
                )
            elif kind == "Q4_K":
                want = lowbit.quantize(weights[t.name], "q4_k").data
            else:
                continue
            assert np.array(t.data).tobytes() == want.tobytes(), t.name
            checked[kind] += 1
    assert checked["Q4_0"] >= 7 and checked["Q4_K"] >= 4, checked
