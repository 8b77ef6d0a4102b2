"""Hugging Face -> GGUF conversion speed: ``lowbit quantize HF --to bf16|f16 --out-format gguf``
against a plain read + write of the same bytes, measured in the same run.

The source is a random bf16 Hugging Face folder of SmolLM2-135M's shape (vocab 49152, hidden
576, intermediate 1536, 9 heads / 3 KV heads, tied embeddings; ``--layers`` of its 30 layers)
with SmolLM2's tokenizer. The baseline reads every tensor from the safetensors file (memory
map), makes the bytes the GGUF holds (bf16 as stored; f16: the float16 cast, as the converter
does) and writes them to one file: what any converter must do. "x baseline" is lowbit's wall
time over it (best of ``--repeat`` after a warm-up, one thread).

Anchor (issue 25): "no slower than llama.cpp's convert_hf_to_gguf.py". That script is not
installed here (it lives in llama.cpp's source tree, not in the ``gguf`` package), so only the
ratio to the I/O baseline is measured.

usage: python benchmarks/bench_hf_to_gguf.py [--layers 30] [--repeat 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from _machine import cpu

SHAPE = dict(vocab=49152, hidden=576, inter=1536, heads=9, kv=3, head_dim=64)


def make_folder(root: Path, layers: int) -> Path:
    """A random bf16 llama folder of SmolLM2's shape, with SmolLM2's tokenizer."""
    import ml_dtypes
    from safetensors.numpy import save_file

    from lowbit.checkpoints import open_checkpoint
    from lowbit.checkpoints.shipped import default_model_path
    from lowbit.checkpoints.tokenizer import write_tokenizer

    d = root / "smollm2-shape"
    d.mkdir()
    rng = np.random.default_rng(0)
    V, H, I = SHAPE["vocab"], SHAPE["hidden"], SHAPE["inter"]
    q, kv = SHAPE["heads"] * SHAPE["head_dim"], SHAPE["kv"] * SHAPE["head_dim"]

    def w(*s: int) -> np.ndarray:
        return (rng.standard_normal(s, dtype=np.float32) * 0.02).astype(ml_dtypes.bfloat16)

    t = {"model.embed_tokens.weight": w(V, H), "model.norm.weight": w(H)}
    for i in range(layers):
        p = f"model.layers.{i}."
        t.update({
            p + "input_layernorm.weight": w(H), p + "post_attention_layernorm.weight": w(H),
            p + "self_attn.q_proj.weight": w(q, H), p + "self_attn.k_proj.weight": w(kv, H),
            p + "self_attn.v_proj.weight": w(kv, H), p + "self_attn.o_proj.weight": w(H, q),
            p + "mlp.gate_proj.weight": w(I, H), p + "mlp.up_proj.weight": w(I, H),
            p + "mlp.down_proj.weight": w(H, I),
        })  # fmt: skip
    save_file(t, str(d / "model.safetensors"), metadata={"format": "pt"})
    cfg = dict(
        architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=V, hidden_size=H,
        intermediate_size=I, num_hidden_layers=layers, num_attention_heads=SHAPE["heads"],
        num_key_value_heads=SHAPE["kv"], head_dim=SHAPE["head_dim"], rms_norm_eps=1e-5,
        max_position_embeddings=8192, rope_theta=100000.0, tie_word_embeddings=True,
        bos_token_id=1, eos_token_id=2, torch_dtype="bfloat16",
    )  # fmt: skip
    (d / "config.json").write_text(json.dumps(cfg, indent=1))
    write_tokenizer(open_checkpoint(default_model_path("smollm2")), d)
    return d


def baseline(folder: Path, out: Path, to: str) -> None:
    """Read every tensor, make the GGUF's bytes (F32 norms, bf16 as stored or f16), write."""
    from safetensors import safe_open

    with safe_open(str(folder / "model.safetensors"), "np") as f, open(out, "wb") as dst:
        for name in f.keys():
            a = f.get_tensor(name)
            if a.ndim == 1:
                a = a.astype(np.float32)
            elif to == "f16":
                a = a.astype(np.float32).astype(np.float16)
            dst.write(memoryview(np.ascontiguousarray(a).view(np.uint8)))


def best(fn, repeat: int) -> float:  # type: ignore[no-untyped-def]
    fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from lowbit.checkpoints.gguf.tokenizer import _parsed
    from lowbit.checkpoints.streaming import convert_hf_to_gguf

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        folder = make_folder(root, args.layers)
        src_bytes = (folder / "model.safetensors").stat().st_size
        for to in ("bf16", "f16"):
            out = root / f"o.{to}.gguf"
            base = best(lambda to=to: baseline(folder, root / "base.bin", to), args.repeat)

            def convert(to: str = to, out: Path = out) -> None:
                out.unlink(missing_ok=True)  # a fresh write, not an overwrite's checks
                _parsed.cache_clear()  # tokenizer.json parsed as in a fresh process
                convert_hf_to_gguf(folder, out, outtype=to, progress=False)

            ours = best(convert, args.repeat)
            rows.append(dict(to=to, lowbit_s=round(ours, 3), baseline_s=round(base, 3),
                             x_baseline=round(ours / base, 2), gguf_bytes=out.stat().st_size))  # fmt: skip
    result = dict(machine=cpu(), layers=args.layers, source_bytes=src_bytes, rows=rows,
                  anchor="convert_hf_to_gguf.py not installed here: not measured")  # fmt: skip
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        print(
            f"{result['machine']}; SmolLM2 shape, {args.layers} layers, {src_bytes:,} source bytes"
        )
        for r in rows:
            print(f"  --to {r['to']}: lowbit {r['lowbit_s']:.3f} s, read+write {r['baseline_s']:.3f} s"
                  f" -> x{r['x_baseline']:.2f} ({r['gguf_bytes']:,} bytes)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
