"""MLX output of a 1.1B-parameter bf16 checkpoint by round to nearest: lowbit against
``mlx_lm.convert -q`` on the same CPU, alternated in one run (issue 40's speed target: within
1.5x of mlx-lm, or of the time to read and write the bytes if mlx-lm is slower than that).

The checkpoint is TinyLlama-1.1B's shape (hidden 2,048, MLP 5,632, 22 layers, 32 heads / 4
key-value heads) with random bf16 weights (benchmarks/bench_gptq_memory.py writes them) and
SmolLM2's tokenizer (vocabulary 49,152: 1.17B parameters). Both tools write mlx-lm's default
(affine, 4 bits, group 64); the run then checks that the two folders hold the same tensors,
byte for byte. The floor is the time to read the source's bytes and write the output's bytes
once (``cat`` of the safetensors to /dev/null, then a file of the output's size written and
fsynced), measured in the same run.

Not part of ``make bench`` (it writes 2.9 GB and needs ``pip install 'lowbit[mlx]'``).

usage: python benchmarks/mlx_convert_speed.py [--work DIR] [--layers 22] [--repeat 3] [--json]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from _machine import cpu
from bench_gptq_memory import write_checkpoint
from gguf_quantize_speed import _timed, smollm2_tokenizer


def _floor(src: Path, out_bytes: int, scratch: Path) -> float:
    """Read every source safetensors byte, then write and fsync ``out_bytes`` bytes."""
    t0 = time.perf_counter()
    for f in sorted(src.glob("*.safetensors")):
        with open(f, "rb") as fh:
            while fh.read(1 << 24):
                pass
    block = b"\0" * (1 << 24)
    with open(scratch, "wb") as fh:
        left = out_bytes
        while left > 0:
            fh.write(block[: min(left, len(block))])
            left -= len(block)
        fh.flush()
        os.fsync(fh.fileno())
    scratch.unlink()
    return time.perf_counter() - t0


def _tensor_digests(folder: Path) -> dict[str, str]:
    """name -> sha256 of each tensor's bytes, across the folder's shards."""
    from safetensors import safe_open

    out = {}
    for f in sorted(folder.glob("*.safetensors")):
        with safe_open(str(f), framework="numpy") as fh:
            for name in fh.keys():
                out[name] = hashlib.sha256(fh.get_tensor(name).tobytes()).hexdigest()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", type=Path, default=Path("out/mlx-speed"))
    ap.add_argument("--layers", type=int, default=22)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    work = a.work
    work.mkdir(parents=True, exist_ok=True)
    shape = argparse.Namespace(hidden=2048, inter=5632, heads=32, kv=4, vocab=49152)
    hf = work / f"llama-1.1b-{a.layers}L"
    if not (hf / "model.safetensors").exists():
        write_checkpoint(shape, a.layers, hf)
        smollm2_tokenizer(hf)
    ours_out, theirs_out = work / "lowbit-mlx", work / "mlx-lm"
    lowbit = [sys.executable, "-m", "lowbit.cli", "quantize", str(hf), "--out-format", "mlx",
              "--out", str(ours_out), "--overwrite", "--no-progress"]  # fmt: skip
    mlx_lm = [sys.executable, "-m", "mlx_lm", "convert", "--hf-path", str(hf), "--mlx-path",
              str(theirs_out), "-q"]  # fmt: skip
    ours, theirs, floors = [], [], []
    for _ in range(a.repeat):  # alternated, so both see the same machine
        shutil.rmtree(theirs_out, ignore_errors=True)  # mlx_lm.convert refuses an existing one
        theirs.append(_timed(mlx_lm))
        ours.append(_timed(lowbit))
        out_bytes = sum(f.stat().st_size for f in ours_out.glob("*.safetensors"))
        floors.append(_floor(hf, out_bytes, work / "floor.bin"))
    same = _tensor_digests(ours_out) == _tensor_digests(theirs_out)
    m_ours, m_theirs, m_floor = (statistics.median(x) for x in (ours, theirs, floors))
    row = {
        "cpu": cpu(),
        "layers": a.layers,
        "lowbit_s": ours,
        "mlx_lm_s": theirs,
        "read_write_floor_s": floors,
        "ratio_vs_mlx_lm": round(m_ours / m_theirs, 2),
        "ratio_vs_floor": round(m_ours / m_floor, 2),
        "same_tensors": same,
    }
    if a.json:
        print(json.dumps(row, indent=1))
        return 0 if same else 1
    print(f"CPU: {cpu()}; {a.layers} layers; median of {a.repeat} alternated runs\n")
    print("| lowbit s | mlx_lm.convert -q s | read + write floor s | vs mlx-lm | vs floor | "
          "same tensors |")  # fmt: skip
    print("|---:|---:|---:|---:|---:|---|")
    print(f"| {m_ours:.1f} | {m_theirs:.1f} | {m_floor:.1f} | {row['ratio_vs_mlx_lm']} | "
          f"{row['ratio_vs_floor']} | {same} |")  # fmt: skip
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
