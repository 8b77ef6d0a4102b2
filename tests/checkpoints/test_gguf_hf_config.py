"""The converter's view of a config.json (lowbit.checkpoints.gguf.hf_config): transformers'
defaults and rope standardisation, compared with transformers' own AutoConfig."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from lowbit.checkpoints.gguf.hf_config import DEFAULTS, converter_config

_CASES = [
    {},
    {"hidden_size": 64, "num_attention_heads": 4},
    {"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32},
    {"rope_scaling": {"type": "yarn", "factor": 4.0}, "original_max_position_embeddings": 1024},
    {"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 512,
                      "beta_fast": 16.0}, "max_position_embeddings": 8192},
    {"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0}, "max_position_embeddings": 131072},
    {"rope_theta": 500000.0, "rope_scaling": {"rope_type": "dynamic", "factor": 2.0}},
]  # fmt: skip


@pytest.mark.parametrize("model_type", sorted(set(DEFAULTS) - {"gemma3"}))
@pytest.mark.parametrize("case", range(len(_CASES)))
def test_defaults_and_rope_equal_transformers(tmp_path: Path, model_type: str, case: int) -> None:
    """Every key of the family's table, and the flat rope settings, equal what transformers'
    AutoConfig(...).to_dict() gives the converter for the same config.json (the rope settings
    after the converter's own mirroring of a top-level original context length)."""
    transformers = pytest.importorskip("transformers")
    cfg = {"model_type": model_type, **_CASES[case]}
    if model_type.startswith("gemma3") and "rope_scaling" in cfg:
        pytest.skip("Gemma 3 keeps its per-layer-kind rope settings")
    if model_type == "phi3" and "rope_scaling" in cfg:
        pytest.skip("transformers' Phi-3 config takes longrope only")
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = transformers.AutoConfig.from_pretrained(tmp_path).to_dict()
    got = converter_config(cfg)
    for key in DEFAULTS[model_type]:
        assert got.get(key, "absent") == want.get(key, "absent"), key
    if not model_type.startswith("gemma3"):
        rope = dict(want["rope_parameters"])
        if want.get("original_max_position_embeddings") is not None:  # the converter's mirror
            rope.setdefault(
                "original_max_position_embeddings", want["original_max_position_embeddings"]
            )
        assert got["rope_parameters"] == rope


def test_idempotent() -> None:
    """Completing a completed config changes nothing (the converter paths call it twice)."""
    for model_type in DEFAULTS:
        for case in _CASES:
            once = converter_config({"model_type": model_type, **case})
            assert converter_config(once) == once
