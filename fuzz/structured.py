"""Structure-aware fuzzing of lowbit's parsers without coverage guidance, for long runs.

Builds valid-ish files with ``tests/fuzz_strategies.py`` (safetensors, GGUF, lowbit.json, plan
files, compressed-tensors folders, plan regexes, --eval/--sensitivity documents, explorer
requests) and ``tests/fuzz_round3.py`` (issue 41: HF config.json -> GGUF metadata,
tokenizer.json, importance matrices, GGUF family metadata -> model, transform_config, MoE
configs; ``--target round3``), mutates them, and runs each through everything lowbit does with such a file
(``exercise_*``). Any exception other than ``LowbitError`` is a finding: it is saved under
``--crashes`` with its traceback and the run goes on. Each input is timed; the slowest and
the peak memory (RSS) are reported at the end.

    PYTHONPATH=src python fuzz/structured.py --target all --count 1000000 --seed 0

Files are written to a tmpfs folder (``/dev/shm`` when there is one).
"""

from __future__ import annotations

import argparse
import random
import resource
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import fuzz_round3 as fr
import fuzz_strategies as fs
from lowbit.errors import LowbitError

TARGETS = ("safetensors", "gguf", "manifest", "plan", "ct", "regex", "results", "explore")
#: issue 41's parsers (``tests/fuzz_round3.py``); ``--target round3`` runs these six
ROUND3 = fr.TARGETS


def _inputs(target: str, rnd: random.Random, manifest: str) -> tuple[bytes, str]:
    if target == "regex":
        return fs.hostile_plan_text(rnd).encode("utf-8", "surrogatepass"), ".json"
    if target == "results":
        return fs.sensitivity_text(rnd).encode("utf-8", "surrogatepass"), ".json"
    if target == "safetensors":
        return fs.random_safetensors_mutant(rnd), ".json"
    if target == "gguf":
        return fs.random_gguf_mutant(rnd), ".json"
    if target == "manifest":
        return fs.mutate_json_text(manifest, rnd).encode("utf-8", "surrogatepass"), ".json"
    suffix = ".yaml" if rnd.random() < 0.2 else ".json"
    return fs.random_plan_text(rnd).encode("utf-8", "surrogatepass"), suffix


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", choices=(*TARGETS, *ROUND3, "all", "round3"), default="all")
    ap.add_argument("--count", type=int, default=10_000, help="inputs in total")
    ap.add_argument("--seconds", type=float, default=None, help="stop after this long")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--crashes", type=Path, default=Path("out/fuzz/structured"))
    ap.add_argument("--report", type=int, default=50_000, help="print progress every N inputs")
    args = ap.parse_args(argv)
    warnings.simplefilter("ignore")
    base = Path("/dev/shm") if Path("/dev/shm").is_dir() else None
    groups = {"all": (*TARGETS, *ROUND3), "round3": ROUND3}
    targets = groups.get(args.target, (args.target,))
    run = {
        "safetensors": fs.exercise_safetensors,
        "gguf": fs.exercise_gguf,
        "manifest": fs.exercise_manifest,
        "plan": fs.exercise_plan,
    }
    with tempfile.TemporaryDirectory(dir=base) as tmp:
        work = Path(tmp)
        folder = work / "ckpt"
        manifest = fs.make_manifest_folder(folder).decode()
        ct_folder = work / "ct"
        ct_bases = fs.make_ct_folder(ct_folder)
        ct_originals = {p.name: p.read_bytes() for p in ct_folder.iterdir() if p.is_file()}
        ct_originals.update(ct_bases)
        seeds3 = fr.Seeds(work / "round3") if set(targets) & set(ROUND3) else None
        counts = dict.fromkeys(targets, 0)
        errors = dict.fromkeys(targets, 0)
        found = 0
        per_target_slowest = dict.fromkeys(targets, 0.0)
        slowest = (0.0, "", 0)
        start = time.perf_counter()
        for i in range(args.count):
            if args.seconds is not None and time.perf_counter() - start > args.seconds:
                break
            target = targets[i % len(targets)]
            rnd = random.Random(f"{args.seed}:{i}")
            if target in ROUND3:
                data, name = fr.mutant(target, seeds3, rnd)
            elif target == "ct":
                name, data = fs.ct_mutant(rnd, ct_originals, ct_folder)
            elif target == "explore":
                path, query = fs.explorer_request(rnd)
                data = f"{path}?{query}".encode("utf-8", "surrogatepass")
            else:
                data, suffix = _inputs(target, rnd, manifest)
            t0 = time.perf_counter()
            try:
                if target in ROUND3:
                    fr.run(target, data, seeds3, name)
                elif target == "ct":
                    fs.exercise_ct(name, data, ct_folder, ct_originals)
                elif target == "explore":
                    fs.exercise_explorer(path, query)
                elif target == "regex":
                    fs.exercise_plan_matching(data, work)
                elif target == "results":
                    fs.exercise_result_files(data, work)
                elif target == "manifest":
                    run[target](data, folder)
                elif target == "plan":
                    run[target](data, work, suffix)
                else:
                    run[target](data, work)
            except LowbitError:
                errors[target] += 1
            except (KeyboardInterrupt, SystemExit):
                raise
            except BaseException:  # a Rust panic in a parser is a BaseException
                found += 1
                args.crashes.mkdir(parents=True, exist_ok=True)
                stem = args.crashes / f"{target}-{args.seed}-{i}"
                stem.with_suffix(".bin").write_bytes(data)
                stem.with_suffix(".txt").write_text(traceback.format_exc())
                print(f"FOUND {stem}: {traceback.format_exc().splitlines()[-1][:200]}", flush=True)
            dt = time.perf_counter() - t0
            if dt > slowest[0]:
                slowest = (dt, target, i)
            per_target_slowest[target] = max(per_target_slowest[target], dt)
            counts[target] += 1
            if (i + 1) % args.report == 0:
                el = time.perf_counter() - start
                rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
                print(
                    f"{i + 1} inputs, {el:.0f} s, {found} findings, slowest {slowest[0]:.3f} s, "
                    f"peak RSS {rss:.0f} MB",
                    flush=True,
                )
        total = time.perf_counter() - start
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    n = sum(counts.values())
    print(
        f"{n} inputs in {total:.0f} s ({n / total:.0f}/s), seed {args.seed}: "
        + ", ".join(
            f"{t} {counts[t]} ({errors[t]} LowbitError, slowest {per_target_slowest[t]:.3f} s)"
            for t in targets
        )
        + f"; other exceptions: {found}; slowest input {slowest[0]:.3f} s ({slowest[1]} #{slowest[2]}); "
        f"peak RSS {rss:.0f} MB"
    )
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
