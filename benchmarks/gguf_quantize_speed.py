"""Q4_K_M of a 1.1B-parameter bf16 checkpoint: lowbit from the Hugging Face folder against
llama-quantize from the equivalent GGUF, alternated in one run (issue 25's speed target:
within 2x, the importance-matrix path included).

Not part of ``make bench``: it needs llama.cpp's ``llama-quantize`` (how to build it:
benchmarks/gguf_kld.py). The checkpoint is TinyLlama-1.1B's shape (hidden 2,048, MLP 5,632,
22 layers, 32 heads / 4 key-value heads) with random bf16 weights (benchmarks/bench_gptq_memory.py
writes them) and SmolLM2's tokenizer, so the vocabulary is 49,152 (1.17B parameters); the equivalent GGUF is lowbit's bf16 conversion of
it (``lowbit quantize HF --to bf16 --out-format gguf``, the file ``convert_hf_to_gguf.py
--outtype bf16`` makes). The importance matrix is a synthetic one of the right names and
lengths (lowbit's writer), so both tools take their importance-weighted search.

``--mix`` times another of llama-quantize's mixes the same way (issue 38: an i-quant mix such
as IQ3_XXS or IQ2_XXS, whose rows of 2,048 and 5,632 are whole 256-blocks; the mixes that
llama-quantize refuses without an importance matrix are timed with one only).

usage: python benchmarks/gguf_quantize_speed.py --llamacpp BIN [--layers 22] [--repeat 3]
       [--mix Q4_K_M]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from _machine import cpu
from bench_gptq_memory import write_checkpoint


def _timed(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.returncode:
        raise SystemExit(f"{cmd[0]} failed:\n" + "\n".join(proc.stdout.splitlines()[-15:]))
    return time.perf_counter() - t0


def smollm2_tokenizer(folder: Path) -> None:
    """SmolLM2's tokenizer files in ``folder`` (a pre-tokenizer llama.cpp knows)."""
    from lowbit.checkpoints import open_checkpoint
    from lowbit.checkpoints.shipped import default_model_path
    from lowbit.checkpoints.tokenizer import write_tokenizer

    for name in ("tokenizer.json", "tokenizer_config.json"):
        (folder / name).unlink(missing_ok=True)
    with open_checkpoint(default_model_path("smollm2")) as ck:
        write_tokenizer(ck, folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(bos_token_id=1, eos_token_id=2)
    (folder / "config.json").write_text(json.dumps(cfg))


def synthetic_imatrix(gguf_path: Path, out: Path) -> None:
    """An importance matrix for every 2-D tensor of a GGUF: positive random sums, 512 tokens."""
    from gguf import GGUFReader

    from lowbit.checkpoints.gguf.imatrix import write_imatrix

    rng = np.random.default_rng(0)
    sums, counts = {}, {}
    for t in GGUFReader(str(gguf_path)).tensors:
        if len(t.shape) >= 2 and t.name != "token_embd.weight":
            cols = int(t.shape[0])  # GGUF lists the row length first
            sums[t.name] = rng.gamma(2.0, 1.0, cols).astype(np.float32) * 512
            counts[t.name] = np.array([512.0], np.float32)
    write_imatrix(out, sums, counts, datasets=["synthetic"], chunk_count=1, chunk_size=512)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--llamacpp", required=True, type=Path, help="folder of llama-quantize")
    ap.add_argument("--work", type=Path, default=Path("out/gguf-speed"))
    ap.add_argument("--layers", type=int, default=22)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--mix", default="Q4_K_M", help="llama-quantize's type name (default Q4_K_M)")
    ap.add_argument("--hf", type=Path, help="time this Hugging Face folder instead (e.g. the "
                    "widened SmolLM2 of benchmarks/pad_llama.py)")  # fmt: skip
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    work = a.work
    work.mkdir(parents=True, exist_ok=True)
    shape = argparse.Namespace(hidden=2048, inter=5632, heads=32, kv=4, vocab=49152)
    hf = a.hf or work / f"llama-1.1b-{a.layers}L"
    if a.hf is None and not (hf / "model.safetensors").exists():
        write_checkpoint(shape, a.layers, hf)
        smollm2_tokenizer(hf)
    lowbit = [sys.executable, "-m", "lowbit.cli", "quantize"]
    bf16 = work / "bf16.gguf"
    if not bf16.exists():
        _timed([*lowbit, str(hf), "--to", "bf16", "--out-format", "gguf", "--out", str(bf16),
                "--no-progress"])  # fmt: skip
    imx = work / "imatrix.gguf"
    if not imx.exists():
        synthetic_imatrix(bf16, imx)
    threads = str(os.cpu_count() or 1)
    rows = []
    mix = a.mix.upper()
    runs = [(mix, []), (f"{mix} + imatrix", ["--imatrix", str(imx)])]
    if mix.startswith(("IQ1", "IQ2", "IQ3")) or mix == "Q2_K_S":
        runs = runs[1:]  # their tensors of IQ2_S or below need an importance matrix
    for label, extra in runs:
        ours, theirs = [], []
        for _ in range(a.repeat):  # alternated, so both see the same machine
            theirs.append(_timed([str(a.llamacpp / "llama-quantize"), *extra, str(bf16),
                                  str(work / "llama.gguf"), mix, threads]))  # fmt: skip
            ours.append(_timed([*lowbit, str(hf), "--to", mix.lower(), "--out-format", "gguf",
                                "--out", str(work / "lowbit.gguf"), "--overwrite",
                                "--no-progress", *extra]))  # fmt: skip
        m_ours, m_theirs = statistics.median(ours), statistics.median(theirs)
        rows.append({"run": label, "lowbit_s": ours, "llama_quantize_s": theirs,
                     "ratio": round(m_ours / m_theirs, 2)})  # fmt: skip
    if a.json:
        print(json.dumps({"cpu": cpu(), "source": str(hf), "mix": mix, "rows": rows}, indent=1))
        return 0
    print(f"CPU: {cpu()}; {hf.name}; median of {a.repeat} alternated runs\n")
    print("| run | lowbit (HF folder) s | llama-quantize (bf16 GGUF) s | ratio |")
    print("|---|---:|---:|---:|")
    for r in rows:
        print(f"| {r['run']} | {statistics.median(r['lowbit_s']):.1f} | "
              f"{statistics.median(r['llama_quantize_s']):.1f} | {r['ratio']} |")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
