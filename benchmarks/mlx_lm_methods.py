"""mlx-lm's own quantization methods against lowbit's on the same model, grid and calibration
text, measured by ``lowbit eval`` on text neither calibrated on (issue 40's quality table).

The model is SmolLM2-135M-Instruct as shipped (a Q4_1 GGUF), written as a bfloat16 Hugging Face
folder by lowbit (``lowbit quantize smollm2 --plan bf16.json --out-format compressed-tensors``,
its empty quantization_config removed): that folder is the source of every file and the
reference of every measurement. Every file is MLX's affine ``--bits`` / ``--group`` grid with
bfloat16 scales and biases, embedding included, so all have the same bytes:

- mlx-lm: ``mlx_lm.convert -q`` (round to nearest), ``mlx_lm.quant.gptq`` (fallback layers at
  the same grid), ``mlx_lm.quant.awq`` (embedding at the same grid), ``mlx_lm.quant.dynamic_quant``
  (with ``--dynamic``: layers at ``bits - 1`` or ``bits + 1`` within the same bits per weight);
- lowbit: ``lowbit quantize --out-format mlx`` round to nearest, ``--method gptq`` (its group
  scales searched, the default, and with ``--scale-method absmax``: MLX's edge rule) and
  ``--method awq``.

``--skip LABEL,...`` leaves rows out (e.g. ``"mlx-lm awq"``, which did not finish in 100 minutes
on two cores).

Text: CPython's ``pydoc_data.topics``. ``lowbit eval`` measures its first 4,096 tokens; mlx-lm's
methods read their calibration from ``~/.cache/mlx-lm/calibration_v5.txt`` (which this script
writes, under a HOME of its own, with the ``samples x length`` tokens that follow a 4,096-token
gap after the evaluated ones); lowbit's draw ``samples`` windows of ``length`` tokens from the
same text outside the evaluated tokens. Neither calibrates on a token that is evaluated.

usage: python benchmarks/mlx_lm_methods.py [--work DIR] [--bits 4] [--group 64] [--samples 16]
       [--length 512] [--dynamic] [--skip LABEL,...] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from _machine import cpu

EVAL_TOKENS = 4096


def _run(cmd: list[str], env: dict[str, str] | None = None) -> float:
    t0 = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if out.returncode:
        raise RuntimeError(f"{' '.join(cmd[:4])} ... failed:\n{(out.stdout + out.stderr)[-3000:]}")
    return time.perf_counter() - t0


def _source(work: Path) -> Path:
    src = work / "smollm2-bf16"
    if (src / "config.json").exists():
        return src
    plan = work / "bf16.json"
    plan.write_text(json.dumps({"rules": [{"match": "*", "format": "bf16"}]}))
    _run([sys.executable, "-m", "lowbit.cli", "quantize", "smollm2", "--plan", str(plan),
          "--out-format", "compressed-tensors", "--out", str(src), "--no-progress"])  # fmt: skip
    cfg = json.loads((src / "config.json").read_text())
    cfg.pop("quantization_config", None)  # plain bfloat16 weights: a plain folder
    (src / "config.json").write_text(json.dumps(cfg))
    return src


def _mlx_calibration(src: Path, home: Path, samples: int, length: int) -> None:
    from tokenizers import Tokenizer

    from lowbit.calibration.text import default_text

    _, text = default_text()
    tok = Tokenizer.from_file(str(src / "tokenizer.json"))
    ids = tok.encode(text, add_special_tokens=False).ids
    start = 2 * EVAL_TOKENS
    piece = tok.decode(ids[start : start + samples * length + length])
    path = home / ".cache" / "mlx-lm" / "calibration_v5.txt"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(piece)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", type=Path, default=Path("out/mlx-methods"))
    ap.add_argument("--bits", type=int, default=4)
    ap.add_argument("--group", type=int, default=64)
    ap.add_argument("--samples", type=int, default=16)
    ap.add_argument("--length", type=int, default=512)
    ap.add_argument("--dynamic", action="store_true", help="also mlx_lm.quant.dynamic_quant")
    ap.add_argument("--skip", default="", help="rows to leave out, comma-separated labels")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    a.work.mkdir(parents=True, exist_ok=True)
    src = _source(a.work)
    home = a.work / "home"
    _mlx_calibration(src, home, a.samples, a.length)
    env = {**os.environ, "HOME": str(home), "HF_HUB_OFFLINE": "1"}
    b, g, n, L = str(a.bits), str(a.group), str(a.samples), str(a.length)
    py = sys.executable
    awq_main = "import sys; from mlx_lm.quant.awq import main; sys.argv[0] = 'awq'; main()"
    runs: dict[str, list[str]] = {
        "mlx-lm convert -q (round to nearest)": [py, "-m", "mlx_lm", "convert", "--hf-path",
            str(src), "-q", "--q-bits", b, "--q-group-size", g, "--mlx-path"],
        "mlx-lm gptq": [py, "-m", "mlx_lm.quant.gptq", "--model", str(src), "--bits", b,
            "--group-size", g, "--fallback-bits", b, "--fallback-group-size", g,
            "--num-samples", n, "--sequence-length", L, "--mlx-path"],
        "mlx-lm awq": [py, "-c", awq_main, "--model", str(src), "--bits", b, "--group-size", g,
            "--embed-bits", b, "--embed-group-size", g, "--num-samples", n,
            "--sequence-length", L, "--mlx-path"],
        "lowbit round to nearest": [py, "-m", "lowbit.cli", "quantize", str(src),
            "--out-format", "mlx", "--q-bits", b, "--q-group-size", g, "--no-progress",
            "--overwrite", "--out"],
        "lowbit gptq": [py, "-m", "lowbit.cli", "quantize", str(src), "--out-format", "mlx",
            "--q-bits", b, "--q-group-size", g, "--method", "gptq", "--calib-samples", n,
            "--calib-len", L, "--no-progress", "--overwrite", "--out"],
        "lowbit gptq (edge rule)": [py, "-m", "lowbit.cli", "quantize", str(src), "--out-format",
            "mlx", "--q-bits", b, "--q-group-size", g, "--method", "gptq", "--scale-method",
            "absmax", "--calib-samples", n, "--calib-len", L, "--no-progress", "--overwrite",
            "--out"],
        "lowbit awq": [py, "-m", "lowbit.cli", "quantize", str(src), "--out-format", "mlx",
            "--q-bits", b, "--q-group-size", g, "--method", "awq", "--calib-samples", n,
            "--calib-len", L, "--no-progress", "--overwrite", "--out"],
    }  # fmt: skip
    if a.dynamic:
        runs["mlx-lm dynamic_quant"] = [py, "-m", "mlx_lm.quant.dynamic_quant", "--model",
            str(src), "--target-bpw", str(a.bits + 2 * 16 / a.group), "--low-bits",
            str(a.bits - 1), "--low-group-size", g, "--high-bits", str(a.bits + 1),
            "--high-group-size", g, "--mlx-path"]  # fmt: skip
    skip = {x.strip() for x in a.skip.split(",") if x.strip()}
    if skip - set(runs) - {"mlx-lm dynamic_quant"}:
        ap.error(f"--skip: unknown rows {sorted(skip - set(runs))}; rows: {sorted(runs)}")
    runs = {k: v for k, v in runs.items() if k not in skip}
    folders, seconds, failed = [], {}, {}
    for label, cmd in runs.items():
        out = a.work / label.replace(" ", "-").replace("(", "").replace(")", "")
        if out.exists() and label.startswith("mlx-lm"):
            subprocess.run(["rm", "-rf", str(out)], check=True)  # mlx-lm refuses an existing one
        try:
            seconds[label] = _run([*cmd, str(out)], env=env)
        except RuntimeError as exc:
            failed[label] = str(exc).splitlines()[-1][:300]
            print(f"{label}: failed ({failed[label]})", file=sys.stderr, flush=True)
            continue
        folders.append((label, out))
        print(f"{label}: {seconds[label]:.1f} s", file=sys.stderr, flush=True)
    report = a.work / "eval.json"
    with open(report, "w") as fh:
        subprocess.run([py, "-m", "lowbit.cli", "eval", str(src), *(str(f) for _, f in folders),
                        "--tokens", str(EVAL_TOKENS), "--json"], stdout=fh, check=True, env=env)  # fmt: skip
    ev = json.loads(report.read_text())
    rows = ev["rows"]
    base = rows[0].get("perplexity")
    table = []
    for (label, _), r in zip(folders, rows[1:], strict=True):
        ppl = r.get("perplexity")
        table.append({"file": label, "bytes": r.get("bytes"), "perplexity": ppl,
                      "increase": ppl / base - 1, "kl": r["kl_mean"],
                      "top1": r["top1_agreement"], "seconds": round(seconds[label], 1)})  # fmt: skip
    result = {"cpu": cpu(), "bits": a.bits, "group": a.group, "samples": a.samples,
              "length": a.length, "source_perplexity": base, "rows": table, "failed": failed}  # fmt: skip
    if a.json:
        print(json.dumps(result, indent=1))
        return 0
    print(f"CPU: {cpu()}\naffine {a.bits}-bit g{a.group}, calibration {a.samples} x {a.length} "
          f"tokens; source (bfloat16) perplexity {base:.2f} on the first {EVAL_TOKENS} tokens\n")  # fmt: skip
    print("| file | bytes | perplexity | increase | KL | top-1 | seconds |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in table:
        mb = "?" if r["bytes"] is None else f"{r['bytes'] / 1e6:.1f} MB"
        kl = "?" if r["kl"] is None else f"{r['kl']:.3f}"
        top = "?" if r["top1"] is None else f"{100 * r['top1']:.1f} %"
        print(f"| {r['file']} | {mb} | {r['perplexity']:.2f} | {100 * r['increase']:+.1f} % | "
              f"{kl} | {top} | {r['seconds']} |")  # fmt: skip
    for label, why in failed.items():
        print(f"\n{label} did not run: {why}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
