"""A config.json's counts are checked against stated ceilings before any tensor is listed: a
300-byte file with num_hidden_layers or num_local_experts of 10^9 is one LowbitError at once
(``lowbit plan`` grew by 1 GB per 30 s before), and malformed counts are refused."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from lowbit.cli import main
from lowbit.errors import LowbitError
from lowbit.planning._arch_config import spec_from_config
from lowbit.planning._arch_families import MAX_TENSORS

BASE = {
    "architectures": ["MixtralForCausalLM"],
    "model_type": "mixtral",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 100,
}


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        ({"num_hidden_layers": 10**9}, "num_hidden_layers is 1,000,000,000"),
        ({"num_local_experts": 10**9}, "num_local_experts is 1,000,000,000"),
        ({"num_experts": 10**9}, "num_experts is"),
        ({"num_hidden_layers": 4096, "num_local_experts": 4096}, "more than the"),
        ({"num_attention_heads": 0}, "num_attention_heads is 0"),
        ({"num_attention_heads": 10**12}, "num_attention_heads"),
        ({"mlp_only_layers": [{}]}, "mlp_only_layers"),
        ({"num_hidden_layers": -1}, "non-negative"),
    ],
)
def test_counts_past_the_ceiling(extra: dict, match: str) -> None:
    """Each is refused in milliseconds, before anything is listed."""
    t0 = time.perf_counter()
    with pytest.raises(LowbitError, match=match):
        spec_from_config({**BASE, **extra})
    assert time.perf_counter() - t0 < 0.5


def test_gpt2_and_bert_layers(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The other families' layer counts have the same ceiling; the CLI says it in one line."""
    for cfg in (
        {"model_type": "gpt2", "n_embd": 64, "n_layer": 10**9, "n_head": 4, "vocab_size": 10,
         "n_positions": 16},
        {"model_type": "bert", "hidden_size": 64, "num_hidden_layers": 10**9,
         "num_attention_heads": 4, "intermediate_size": 64, "vocab_size": 10,
         "max_position_embeddings": 16},
    ):  # fmt: skip
        with pytest.raises(LowbitError, match="at most 4,096"):
            spec_from_config(cfg)
    p = tmp_path / "config.json"
    p.write_text(json.dumps({**BASE, "num_hidden_layers": 10**9}))
    assert p.stat().st_size < 300
    assert main(["plan", str(p)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("lowbit plan: error:") and "\n" not in err


def test_real_sizes_still_plan() -> None:
    """A 61-layer, 384-expert model (Kimi K2's shape) lists its tensors, under the ceiling."""
    spec = spec_from_config({**BASE, "num_hidden_layers": 61, "num_local_experts": 384})
    assert 61 * 384 * 3 < len(spec.tensors) < MAX_TENSORS
