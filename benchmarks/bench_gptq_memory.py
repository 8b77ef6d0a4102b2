"""GPTQ's peak memory against a model's depth: a llama-shaped checkpoint 1.1B parameters wide
(TinyLlama-1.1B's shape: hidden 2,048, MLP 5,632, 32 heads, 4 key-value heads, vocabulary
32,000) with random bf16 weights written by this script, cut to a few depths.

GPTQ holds the embeddings until the first block's inputs are captured, then one block's
weights (read from the checkpoint at its turn), the calibration activations and one layer
group's Hessian: its peak should not grow with the number of layers. Each depth runs in a
fresh process (``ru_maxrss`` is the process's peak resident memory).

Usage: ``python benchmarks/bench_gptq_memory.py [--layers 4,8] [--samples 8] [--length 256]
[--scheme int4:g128] [--hidden 2048 --inter 5632 --heads 32 --kv 4 --vocab 32000] [--json F]``.
``--layers 22`` is the full 1.1B model (about 2.2 GB of bf16 to write first).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np


def _shapes(a: argparse.Namespace, layers: int) -> list[tuple[str, tuple[int, ...]]]:
    h, i, d = a.hidden, a.inter, a.hidden // a.heads
    out = [("model.embed_tokens.weight", (a.vocab, h))]
    for n in range(layers):
        p = f"model.layers.{n}."
        out += [
            (p + "input_layernorm.weight", (h,)),
            (p + "self_attn.q_proj.weight", (h, h)),
            (p + "self_attn.k_proj.weight", (a.kv * d, h)),
            (p + "self_attn.v_proj.weight", (a.kv * d, h)),
            (p + "self_attn.o_proj.weight", (h, h)),
            (p + "post_attention_layernorm.weight", (h,)),
            (p + "mlp.gate_proj.weight", (i, h)),
            (p + "mlp.up_proj.weight", (i, h)),
            (p + "mlp.down_proj.weight", (h, i)),
        ]
    return [*out, ("model.norm.weight", (h,)), ("lm_head.weight", (a.vocab, h))]


def write_checkpoint(a: argparse.Namespace, layers: int, folder: Path) -> int:
    """Random bf16 safetensors written tensor by tensor (never the whole model in memory),
    config.json and a byte-level tokenizer; returns the parameter count."""
    import ml_dtypes

    folder.mkdir(parents=True, exist_ok=True)
    shapes = _shapes(a, layers)
    header: dict[str, Any] = {}
    offset = 0
    for name, shape in shapes:
        n = int(np.prod(shape)) * 2
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    rng = np.random.default_rng(0)
    with open(folder / "model.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        for _, shape in shapes:
            if len(shape) == 1:
                arr = np.ones(shape, np.float32)
            else:
                arr = rng.standard_normal(shape, dtype=np.float32) * 0.02
            f.write(arr.astype(ml_dtypes.bfloat16).tobytes())
    cfg = {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": a.hidden,
        "intermediate_size": a.inter,
        "num_hidden_layers": layers,
        "num_attention_heads": a.heads,
        "num_key_value_heads": a.kv,
        "vocab_size": a.vocab,
        "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "bos_token_id": 1,
        "eos_token_id": 2,
    }
    (folder / "config.json").write_text(json.dumps(cfg))
    _write_tokenizer(folder)
    return sum(int(np.prod(s)) for _, s in shapes)


def _write_tokenizer(folder: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE(vocab={c: i + 3 for i, c in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<unk>", "<s>", "</s>"])
    (folder / "tokenizer.json").write_text(tok.to_str())
    (folder / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>",
                    "eos_token": "</s>", "unk_token": "<unk>"})
    )  # fmt: skip


def child(folder: str, a: argparse.Namespace) -> dict[str, Any]:
    """One GPTQ run in this process: its peak resident memory and seconds per phase."""
    from lowbit.calibration.data import Calibration
    from lowbit.calibration.gptq import gptq_weights

    t0 = time.perf_counter()
    run = gptq_weights(
        folder, a.scheme, Calibration(samples=a.samples, length=a.length),
        threads=a.threads, progress=False,
    )  # fmt: skip
    return {
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "seconds": run.seconds,
        "wall": time.perf_counter() - t0,
        "gptq_tensors": sum(m == "gptq" for m in run.methods.values()),
        "tokens": run.calibration["tokens"],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", default="4,8")
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--length", type=int, default=256)
    p.add_argument("--scheme", default="int4:g128")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--inter", type=int, default=5632)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv", type=int, default=4)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--json")
    p.add_argument("--child", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child:
        json.dump(child(a.child, a), sys.stdout)
        return 0
    rows = []
    with tempfile.TemporaryDirectory() as d:
        for layers in (int(x) for x in a.layers.split(",")):
            folder = Path(d) / f"llama-{layers}"
            params = write_checkpoint(a, layers, folder)
            argv2 = [sys.executable, __file__, "--child", str(folder), *sys.argv[1:]]
            env = {**os.environ, "OMP_NUM_THREADS": str(a.threads)}
            out = subprocess.run(argv2, check=True, env=env, capture_output=True, text=True)
            r = json.loads(out.stdout)
            r.update(layers=layers, params=params,
                     checkpoint_mb=(folder / "model.safetensors").stat().st_size / 1e6)  # fmt: skip
            rows.append(r)
            print(
                f"{layers:>3} layers, {params / 1e9:.2f}B params ({r['checkpoint_mb']:,.0f} MB "
                f"bf16): GPTQ {a.scheme} of {r['gptq_tensors']} tensors on {r['tokens']:,} "
                f"tokens, peak RSS {r['peak_rss_mb']:,.0f} MB, {r['wall']:.0f} s "
                f"(collect {r['seconds']['collect']:.0f}, solve {r['seconds']['solve']:.0f})",
                flush=True,
            )
            for f in folder.iterdir():
                f.unlink()
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
