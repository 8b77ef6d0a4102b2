"""lowbit.ggml.mixes: llama-quantize's per-tensor type choices, its file types and overrides."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lowbit.errors import LowbitError
from lowbit.ggml import mixes
from lowbit.ggml.mixes import TensorSpec, choose_types

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "llamacpp" / "mixes" / "types.json"
TYPES = json.loads(FIXTURE.read_text())
ARCH = {"mid-llama": "llama", "smollm2": "llama", "tiny-gemma3": "gemma3", "tiny-mixtral": "llama"}
CASES = [(model, mix) for model in TYPES for mix in TYPES[model]]


def _specs(model: str, mix: str) -> list[TensorSpec]:
    # the fixture lists ggml's ne (row length first); TensorSpec takes numpy order
    return [
        TensorSpec(name, tuple(reversed(t["shape"])), t["from"])
        for name, t in TYPES[model][mix].items()
    ]


@pytest.mark.parametrize(("model", "mix"), CASES, ids=[f"{m}-{x}" for m, x in CASES])
def test_choose_types_equals_llama_quantize(model: str, mix: str) -> None:
    """Every tensor gets the type llama-quantize --dry-run chose."""
    got = choose_types(ARCH[model], _specs(model, mix), mix)
    want = {name: t["to"].upper() for name, t in TYPES[model][mix].items()}
    assert got == want


def test_file_types_are_llamas() -> None:
    """general.file_type values are llama.cpp's LLAMA_FTYPE_MOSTLY_* numbers (gguf's table)."""
    gguf = pytest.importorskip("gguf")
    for m in mixes.MIXES.values():
        key = "ALL_F32" if m.name == "F32" else f"MOSTLY_{m.name}"
        assert gguf.LlamaFileType[key].value == m.file_type


def test_mix_names_and_aliases() -> None:
    """Names are case-free; Q4_K means Q4_K_M; unknown names are one LowbitError."""
    assert mixes.mix("q4_k_m") is mixes.MIXES["Q4_K_M"]
    assert mixes.mix("Q4_K").name == "Q4_K_M"
    with pytest.raises(LowbitError, match=r"unknown llama\.cpp mix 'q4_k_x'"):
        mixes.mix("q4_k_x")


def test_tensor_type_override_first_match_wins() -> None:
    """--tensor-type: the first matching regex sets the type and skips the mix's rules."""
    specs = _specs("mid-llama", "Q4_K_M")
    got = choose_types(
        "llama", specs, "Q4_K_M", tensor_types=[(r"attn_v", "q8_0"), (r"blk\.0\.", "q2_k")]
    )
    assert got["blk.0.attn_v.weight"] == "Q8_0"
    assert got["blk.0.attn_q.weight"] == "Q2_K"
    assert got["blk.1.attn_q.weight"] == "Q4_K"
    # the fallback still applies: 576-wide rows cannot hold Q2_K
    small = _specs("smollm2", "Q4_K_M")
    assert (
        choose_types("llama", small, "Q4_K_M", tensor_types={"ffn_up": "q2_k"})[
            "blk.0.ffn_up.weight"
        ]
        == "Q4_0"
    )


def test_output_and_embedding_types() -> None:
    """--output-tensor-type / --token-embedding-type set those tensors, without fallback."""
    specs = _specs("mid-llama", "Q4_K_M")
    got = choose_types(
        "llama", specs, "Q4_K_M", output_tensor_type="q8_0", token_embedding_type="f16"
    )
    assert got["output.weight"] == "Q8_0" and got["token_embd.weight"] == "F16"
    tied = _specs("smollm2", "Q4_K_M")  # tied: token_embd follows the output's type
    assert (
        choose_types("llama", tied, "Q6_K", output_tensor_type="q4_0")["token_embd.weight"]
        == "Q4_0"
    )


def test_pure_and_leave_output() -> None:
    """--pure uses the default type everywhere; --leave-output-tensor keeps output.weight."""
    specs = _specs("mid-llama", "Q4_K_M")
    got = choose_types("llama", specs, "Q4_K_M", pure=True, leave_output_tensor=True)
    assert got["output.weight"] == TYPES["mid-llama"]["Q4_K_M"]["output.weight"]["from"].upper()
    assert {v for k, v in got.items() if k.startswith("blk.") and "norm" not in k} == {"Q4_K"}


def test_imatrix_rules() -> None:
    """With an importance matrix, Q4_0's first-eighth ffn_down layers become Q4_1."""
    specs = _specs("smollm2", "Q4_0")
    got = choose_types("llama", specs, "Q4_0", has_imatrix=True)
    assert got["blk.0.ffn_down.weight"] == "Q4_1" and got["blk.5.ffn_down.weight"] == "Q4_0"


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"tensor_types": [("(", "q4_0")]}, "does not compile"),
        ({"tensor_types": [("x", "q9_9")]}, "unknown GGML type"),
        ({"output_tensor_type": "nope"}, "unknown GGML type"),
    ],
)
def test_bad_overrides(kwargs: dict, match: str) -> None:
    """Bad overrides are one LowbitError each."""
    with pytest.raises(LowbitError, match=match):
        choose_types("llama", _specs("mid-llama", "Q4_K_M"), "Q4_K_M", **kwargs)


def test_requires_imatrix_as_llama_quantize() -> None:
    """tensor_requires_imatrix: the 1-3 bit i-quants (IQ3_S and IQ4_* not) and Q2_K in Q2_K_S,
    never token_embd / output."""
    need = mixes.requires_imatrix
    for t in ("IQ3_XXS", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ1_M", "IQ1_S"):
        assert need("blk.0.ffn_down.weight", t, "IQ3_M")
        assert not need("output.weight", t, "IQ1_S")
        assert not need("token_embd.weight", t, "IQ1_S")
    for t in ("IQ3_S", "IQ4_XS", "IQ4_NL", "Q4_K", "Q2_K"):
        assert not need("blk.0.ffn_down.weight", t, "IQ2_M")
    assert need("blk.0.ffn_down.weight", "Q2_K", "Q2_K_S")
    assert not need("token_embd.weight", "Q2_K", "Q2_K_S")


IQ_FIXTURE = FIXTURE.with_name("iq_types.json")
IQ_TYPES = json.loads(IQ_FIXTURE.read_text()) if IQ_FIXTURE.exists() else {}
IQ_CASES = [(model, mix) for model in IQ_TYPES for mix in IQ_TYPES[model]["mixes"]]


@pytest.mark.parametrize(("model", "mix"), IQ_CASES, ids=[f"{m}-{x}" for m, x in IQ_CASES])
def test_iquant_mixes_equal_llama_quantize(model: str, mix: str) -> None:
    """With an importance matrix, every i-quant mix (and Q2_K_S) gives every tensor the type
    llama-quantize --dry-run chose, on SmolLM2, SmolLM2 widened to rows of 768 (where the
    i-quants apply) and a Qwen3-MoE with rows of 512 and 256 (benchmarks/llamacpp_iq_mix_types.py
    made the fixture)."""
    entry = IQ_TYPES[model]
    want = entry["mixes"][mix]
    specs = [TensorSpec(n, tuple(reversed(ne)), src) for n, (ne, src) in entry["tensors"].items()]
    got = choose_types(entry["arch"], specs, mix, has_imatrix=True, **entry["hparams"])
    assert got == {n: t.upper() for n, t in want.items()}


def test_iquant_fixture_is_there() -> None:
    """The fixture covers the ten i-quant mixes on three models, one a mixture of experts."""
    assert len(IQ_CASES) >= 30
    assert any(e["hparams"].get("n_expert") for e in IQ_TYPES.values())
