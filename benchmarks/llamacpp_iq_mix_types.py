"""llama-quantize's per-tensor types for the i-quant mixes, as a test fixture, and lowbit's against it.

Issue 38 wants every i-quant mix (IQ1_S ... IQ3_M) to pick, tensor for tensor, the types
llama-quantize picks, on SmolLM2, the widened SmolLM2 (rows of 768: the i-quants apply) and a
mixture of experts. llama-quantize makes these choices only with an importance matrix (it
refuses IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS and IQ2_S without one), so each model gets a random one
(llama-imatrix's GGUF format, every weight but token_embd, as llama-imatrix collects them): the
choices depend on the matrix being there, not on its values.

Models, built in SCRATCH:
- ``smollm2``: the shipped SmolLM2-135M (Q4_1), dequantized to F32 by llama-quantize (as
  ``types.json``'s ``smollm2``);
- ``smollm2-wide``: the same, exported to a float32 Hugging Face folder, widened to hidden 768 by
  ``benchmarks/pad_llama.py`` and converted to an F32 GGUF by lowbit;
- ``mid-qwen3moe``: a random Qwen3-MoE (4 layers, hidden 512, 8 experts of width 256, top 2,
  SmolLM2's tokenizer) converted to an F32 GGUF by lowbit.

For each model and mix: ``llama-quantize --dry-run --imatrix IM MODEL MIX``'s choices, parsed
from its log, and ``lowbit.ggml.mixes.choose_types``' choices for the same tensors. With
``--write FILE`` the llama-quantize choices are written as a fixture: per model its
architecture, the hyperparameters lowbit reads from its GGUF, every tensor's ``[ne, source
type]`` and, per mix, every tensor's type (what ``tests/ggml/test_ggml_mixes.py`` checks).

usage: python benchmarks/llamacpp_iq_mix_types.py LLAMA_QUANTIZE SCRATCH [--write FILE]
(SCRATCH is created and removed; about 2 GB and a few minutes on two cores.)
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
MIXES = ["IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ2_M", "IQ3_XXS", "IQ3_XS", "IQ3_S",
         "IQ3_M", "Q2_K_S"]  # fmt: skip
# --dry-run's lines: "[   3/ 272] blk.0.attn_k.weight - [   576,    192,      1,      1], type =
# f32, size =     0.42 MiB ->     0.07 MiB (q5_0)", or "..., size = 0.002 MiB" for a kept tensor
_LINE = re.compile(
    r"\[\s*\d+/\s*\d+\]\s+(\S+)\s+-\s+\[([\d,\s]+)\],\s+type =\s+(\w+),\s+"
    r"size =\s+[\d.]+ MiB(?:\s+->\s+[\d.]+ MiB \((\w+)\))?"
)


def _run(cmd: list[str], log: Path | None = None) -> str:
    out = subprocess.run(cmd, capture_output=True, text=True)
    text = out.stdout + out.stderr
    if log is not None:
        log.write_text(text)
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({out.returncode}):\n{text[-3000:]}")
    return text


def _choices(text: str) -> dict[str, dict]:
    got: dict[str, dict] = {}
    for m in _LINE.finditer(text):
        name, shape, src, to = m.groups()
        got[name] = {"from": src, "shape": [int(x) for x in shape.split(",")], "to": to or src}
    return got


def _random_imatrix(gguf: Path, out: Path) -> Path:
    from lowbit.checkpoints.gguf.imatrix import write_imatrix
    from lowbit.checkpoints.opener import open_checkpoint

    ckpt = open_checkpoint(gguf)
    rng = np.random.default_rng(1)
    sums, counts = {}, {}
    for n in ckpt.names():
        shape = ckpt.info(n).shape
        if len(shape) >= 2 and "token_embd" not in n:
            experts = shape[0] if len(shape) == 3 else 1
            sums[n] = rng.uniform(0, 50, size=(experts, shape[-1])).astype(np.float32)
            counts[n] = np.full(experts, 17.0, np.float32)
    return write_imatrix(out, sums, counts, datasets=["random"], chunk_count=3, chunk_size=512)


def _smollm2(quantize: str, scratch: Path) -> Path:
    from lowbit.checkpoints.streaming import resolve_model

    out = scratch / "smollm2.f32.gguf"
    _run([quantize, "--allow-requantize", str(resolve_model("smollm2")), str(out), "F32"])
    return out


def _smollm2_wide(scratch: Path) -> Path:
    import lowbit

    f32 = scratch / "smollm2-f32"
    plan = scratch / "f32.json"
    plan.write_text(json.dumps({"rules": [{"match": "*", "format": "fp32"}]}))
    _run([sys.executable, "-m", "lowbit.cli", "quantize", "smollm2", "--plan", str(plan),
          "--out-format", "compressed-tensors", "--out", str(f32), "--no-progress"])  # fmt: skip
    wide = scratch / "smollm2-wide"
    _run([sys.executable, str(ROOT / "benchmarks" / "pad_llama.py"), str(f32), str(wide)])
    cfg = json.loads((wide / "config.json").read_text())
    cfg.pop("quantization_config", None)  # the f32 export's empty one: plain weights now
    (wide / "config.json").write_text(json.dumps(cfg))
    out = scratch / "smollm2-wide.f32.gguf"
    lowbit.convert_hf_to_gguf(wide, out, outtype="f32", progress=False)
    return out


def _mid_moe(scratch: Path) -> Path:
    import torch
    import transformers

    import lowbit
    from lowbit.checkpoints.opener import open_checkpoint
    from lowbit.checkpoints.streaming import resolve_model
    from lowbit.checkpoints.tokenizer import write_tokenizer

    cfg = transformers.Qwen3MoeConfig(
        vocab_size=49152, hidden_size=512, intermediate_size=1024, moe_intermediate_size=256,
        num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2, head_dim=64,
        num_experts=8, num_experts_per_tok=2, max_position_embeddings=2048,
        tie_word_embeddings=False, decoder_sparse_step=1, mlp_only_layers=[], norm_topk_prob=True,
    )  # fmt: skip
    cfg.architectures = ["Qwen3MoeForCausalLM"]
    torch.manual_seed(0)
    model = transformers.Qwen3MoeForCausalLM(cfg).eval()
    folder = scratch / "mid-qwen3moe"
    model.save_pretrained(str(folder))
    write_tokenizer(open_checkpoint(resolve_model("smollm2")), folder)
    out = scratch / "mid-qwen3moe.f32.gguf"
    lowbit.convert_hf_to_gguf(folder, out, outtype="f32", progress=False)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("quantize", help="llama-quantize")
    ap.add_argument("scratch", type=Path)
    ap.add_argument("--write", type=Path, help="write llama-quantize's choices as a fixture")
    a = ap.parse_args()
    from lowbit.checkpoints.gguf.mix import _hparams, _specs
    from lowbit.checkpoints.opener import open_checkpoint
    from lowbit.ggml.mixes import choose_types

    a.scratch.mkdir(parents=True, exist_ok=False)
    fixture: dict[str, dict] = {}
    total = agree = 0
    try:
        models = {"smollm2": _smollm2(a.quantize, a.scratch),
                  "smollm2-wide": _smollm2_wide(a.scratch), "mid-qwen3moe": _mid_moe(a.scratch)}  # fmt: skip
        for model, gguf in models.items():
            im = _random_imatrix(gguf, a.scratch / f"{model}.imatrix.gguf")
            ckpt = open_checkpoint(gguf)
            hp = {k: v for k, v in _hparams(ckpt).items() if v is not None}
            arch = hp.pop("arch")
            fixture[model] = {"arch": arch, "hparams": hp, "tensors": {}, "mixes": {}}
            for mix in MIXES:
                text = _run([a.quantize, "--dry-run", "--imatrix", str(im), str(gguf),
                             str(a.scratch / "unused.gguf"), mix])  # fmt: skip
                want = _choices(text)
                if not want:
                    raise SystemExit(f"no tensor lines parsed for {model} {mix}:\n{text[-2000:]}")
                for n, t in want.items():  # ggml's ne (row length first) and source type
                    fixture[model]["tensors"][n] = [t["shape"], t["from"]]
                fixture[model]["mixes"][mix] = {n: t["to"] for n, t in want.items()}
                got = choose_types(arch, _specs(ckpt), mix, has_imatrix=True, **hp)
                bad = {n: (t["to"].upper(), got.get(n)) for n, t in want.items()
                       if got.get(n) != t["to"].upper()}  # fmt: skip
                total += 1
                agree += not bad
                counts: dict[str, int] = {}
                for t in want.values():
                    counts[t["to"]] = counts.get(t["to"], 0) + 1
                mixed = ", ".join(f"{n} {t}" for t, n in sorted(counts.items()))
                verdict = "same" if not bad else f"{len(bad)} differ: {dict(list(bad.items())[:4])}"
                print(
                    f"{model:>13} {mix:<8} {len(want):>4} tensors ({mixed}): {verdict}", flush=True
                )
    finally:
        shutil.rmtree(a.scratch, ignore_errors=True)
    print(f"{agree}/{total} (model, mix) pairs pick llama-quantize's type for every tensor")
    if a.write:
        a.write.write_text(json.dumps(fixture, sort_keys=True, separators=(",", ":")) + "\n")
        print(f"wrote {a.write}")
    return 0 if agree == total else 1


if __name__ == "__main__":
    raise SystemExit(main())
