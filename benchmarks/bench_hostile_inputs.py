"""Time and peak memory of lowbit on 1 MB hostile inputs of each kind issue 24 names.

Each case runs in its own process (peak RSS is per process); the target is under 5 s and
500 MB each. Run: ``PYTHONPATH=src python benchmarks/bench_hostile_inputs.py [--json]``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

MB = 1_000_000

_CASE = textwrap.dedent(
    """
    import resource, sys, time, warnings
    warnings.simplefilter("ignore")
    from lowbit.errors import LowbitError
    path = sys.argv[2]
    t0 = time.perf_counter()
    try:
        {call}
        outcome = "ok"
    except LowbitError as exc:
        outcome = "LowbitError: " + str(exc)[:80]
    dt = time.perf_counter() - t0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"{{dt:.2f}}\\t{{rss:.0f}}\\t{{outcome}}")
    """
)

CASES = {
    "plan file, 20,000 glob rules": (
        "plan.json",
        lambda: json.dumps(
            {
                "default": "int8",
                "rules": [
                    {"match": f"*layer{i}.nothing*", "format": "int4"} for i in range(20_000)
                ],
            }
        ),
        "from lowbit.plans.plan import PrecisionPlan\n"
        "    p = PrecisionPlan.from_file(path)\n"
        "    p.apply([(f'model.layers.{i}.mlp.{k}.weight', (64, 64), 'F32', 16384)"
        " for i in range(32) for k in ('up_proj', 'down_proj', 'gate_proj')])",
    ),
    "plan file, 2,000 distinct hostile regexes": (
        "plan.json",
        lambda: json.dumps(
            {
                "default": "int8",
                "rules": [
                    {"regex": f"(.*.*)*z{i}" + "x" * 480, "format": "int4"} for i in range(2000)
                ],
            }
        ),
        "from lowbit.plans.plan import PrecisionPlan\n"
        "    p = PrecisionPlan.from_file(path)\n"
        "    p.apply([('a' * 200 + str(i), (64, 64), 'F32', 16384) for i in range(50)])",
    ),
    "config.json, 1 MB of keys, 10^9 layers": (
        "config.json",
        lambda: json.dumps(
            {
                **{f"k{i}": i for i in range(70_000)},
                "model_type": "mixtral",
                "hidden_size": 64,
                "intermediate_size": 128,
                "num_attention_heads": 4,
                "vocab_size": 10,
                "num_hidden_layers": 10**9,
            }
        ),
        "from lowbit.planning._arch_config import spec_from_config\n    spec_from_config(path)",
    ),
    "--sensitivity document, 1 MB": (
        "s.json",
        lambda: json.dumps(
            {
                "model": "m",
                "kind": "k",
                "measure": "proxy",
                "metric": "kl",
                "calibration": "c",
                "schemes": ["int4"],
                "entries": [
                    {
                        "tensor": f"t{i}",
                        "scheme": "int4",
                        "numel": 256,
                        "bits": 1024,
                        "proxy": 1.0,
                        "damage": None,
                    }
                    for i in range(10_000)
                ],
            }
        ),
        "from lowbit import _json\n"
        "    from lowbit.evaluation.sensitivity_result import SensitivityResult\n"
        "    SensitivityResult.from_dict(_json.load(path))",
    ),
    "--eval document, 1 MB of rows with their own keys": (
        "e.json",
        lambda: json.dumps({"rows": [{f"key{i}": i} for i in range(60_000)]}),
        "from lowbit import _json\n"
        "    from lowbit.view.html import _evaluation\n"
        "    _evaluation(_json.load(path))",
    ),
    "explorer request, 1 MB query": (
        "q.txt",
        lambda: "value=" + "9" * MB,
        "from lowbit.cli._explore_server import api\n    api('/api/show', open(path).read())",
    ),
    ".npy header claiming 37 GiB, 1 MB file": (
        "t.npy",
        None,
        "from lowbit.cli.cmd_quantize_tensor import load_tensor\n    load_tensor(path)",
    ),
}


def _write_npy(path: Path) -> None:
    import numpy as np

    with open(path, "wb") as fh:
        np.lib.format.write_array_header_1_0(
            fh, {"descr": "<f4", "fortran_order": False, "shape": (100_000, 100_000)}
        )
        fh.write(b"\0" * MB)


def main() -> int:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, (fname, make, call) in CASES.items():
            path = Path(tmp) / fname
            if make is None:
                _write_npy(path)
            else:
                path.write_text(make())
            size = path.stat().st_size
            t0 = time.perf_counter()
            r = subprocess.run([sys.executable, "-c", _CASE.format(call=call), "x", str(path)],
                               capture_output=True, text=True, timeout=300)  # fmt: skip
            wall = time.perf_counter() - t0
            if r.returncode:
                rows.append({"case": name, "bytes": size, "error": r.stderr.strip()[-300:]})
                continue
            dt, rss, outcome = r.stdout.strip().split("\t", 2)
            rows.append({"case": name, "bytes": size, "seconds": float(dt), "peak_mb":
                         float(rss), "process_seconds": round(wall, 2), "outcome": outcome})  # fmt: skip
    if "--json" in sys.argv:
        print(json.dumps(rows, indent=2))
    else:
        for r in rows:
            print(f"{r['case']:<50} {r['bytes'] / MB:5.2f} MB  {r.get('seconds', '-')!s:>6} s "
                  f"{r.get('peak_mb', '-')!s:>6} MB  {r.get('outcome', r.get('error'))}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
