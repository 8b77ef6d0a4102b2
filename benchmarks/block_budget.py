"""A GGUF ``--size`` budget measured block by block against the whole-model measure (issue 39).

Not part of ``make bench`` (minutes to tens of minutes on two shared cores). On the shipped
SmolLM2-135M (``smollm2``, stored as Q4_1) it writes the budget file of each measure at the
bytes of its Q4_K_M file (105,454,208, the docs/export.md example), with the candidates and
scan windows of that example (Q3_K,Q4_K,Q5_K,Q6_K,Q8_0; one window of 128 tokens from token
32,768 of the default text), then runs ``lowbit eval smollm2 FILES --json`` on the held-out
slice (the first ``--eval-tokens`` tokens of the default text: what ``lowbit eval`` scores;
the scan window lies far after it) and prints per measure: the sensitivity's wall and CPU
seconds, the chosen types, the file's bytes and its mean KL against the original::

    python benchmarks/block_budget.py --out /tmp/bb [--measures block,exact] [--reuse]

``--reuse`` keeps a budget file (and its ``.json`` record) already in ``--out``. The record
of each run (the job's ``details``: every damage, seconds) is written beside its file.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from _machine import cpu

SIZE = 105_454_208  # SmolLM2's Q4_K_M file (docs/export.md)
CANDIDATES = ("Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q8_0")


def budget(out: Path, measure: str, samples: int, length: int) -> dict:
    """One budget file; its record with wall and CPU seconds of the whole job."""
    from lowbit.jobs.gguf import gguf_budget

    t0, c0 = time.perf_counter(), time.process_time()
    res = gguf_budget(
        "smollm2", out, size=SIZE, candidates=CANDIDATES, scan_samples_count=samples,
        scan_length=length, measure=measure, progress=False, overwrite=True,
    )  # fmt: skip
    doc = dict(res.details)
    doc["job_wall_s"] = time.perf_counter() - t0
    doc["job_cpu_s"] = time.process_time() - c0
    doc["types"] = dict(Counter(r["type"] for r in doc["tensors"]))
    return doc


def evaluate(files: list[Path], tokens: int) -> dict[str, dict]:
    """``lowbit eval smollm2 FILES --json``: per file its row (mean KL, perplexity, ...)."""
    from lowbit.cli import main

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = main(["eval", "smollm2", *map(str, files), "--tokens", str(tokens), "--json",
                   "--no-progress"])  # fmt: skip
    if rc:
        raise SystemExit(f"lowbit eval failed ({rc})")
    return json.loads(buf.getvalue())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--measures", default="block,exact")
    ap.add_argument("--scan-samples", type=int, default=1)
    ap.add_argument("--scan-len", type=int, default=128)
    ap.add_argument("--eval-tokens", type=int, default=4096)
    ap.add_argument("--reuse", action="store_true")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    print(f"# {cpu()}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    records = {}
    for m in args.measures.split(","):
        f, rec = args.out / f"{m}.gguf", args.out / f"{m}.json"
        if not (args.reuse and f.exists() and rec.exists()):
            rec.write_text(json.dumps(budget(f, m, args.scan_samples, args.scan_len), indent=1))
        records[m] = json.loads(rec.read_text())
    ev = evaluate([args.out / f"{m}.gguf" for m in records], args.eval_tokens)
    print(json.dumps(ev, indent=1)[:4000])
    for m, doc in records.items():
        sec = doc["seconds"]
        sens = sum(v for k, v in sec.items() if k not in ("solve", "write", "total"))
        print(f"{m}: sensitivity {sens:.1f} s wall ({sec}), job {doc.get('job_wall_s', 0):.1f} s "
              f"wall / {doc.get('job_cpu_s', 0):.1f} s CPU; {doc['bytes']} bytes; "
              f"types {doc['types']}; predicted {doc['predicted_damage']:.4g}")  # fmt: skip


if __name__ == "__main__":
    main()
