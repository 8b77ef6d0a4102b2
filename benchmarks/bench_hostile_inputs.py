"""Time and peak memory of lowbit on 1 MB hostile inputs of each kind issues 24 and 41 name.

Each case runs in its own process (peak RSS is per process, imports included; wall and CPU
seconds of the call, the CPU time being what a loaded machine does not inflate); the target is
under 5 s and 500 MB each (issue 24), under 1 s and 100 MB for issue 41's parsers. Run: ``PYTHONPATH=src python benchmarks/bench_hostile_inputs.py [--json]``.
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
    t0, c0 = time.perf_counter(), time.process_time()
    try:
        {call}
        outcome = "ok"
    except LowbitError as exc:
        outcome = "LowbitError: " + str(exc)[:80]
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"{{dt:.2f}}\\t{{cpu:.2f}}\\t{{rss:.0f}}\\t{{outcome}}")
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
    # issue 41: the parsers of the third round (their fuzz targets: tests/fuzz_round3.py)
    "HF config.json -> GGUF metadata, Phi-3 with 150,000 rope factors": (
        "config.json",
        lambda: json.dumps(
            {
                "model_type": "phi3",
                "hidden_size": 3072,
                "num_attention_heads": 32,
                "num_hidden_layers": 32,
                "intermediate_size": 8192,
                "vocab_size": 32064,
                "original_max_position_embeddings": 4096,
                "rope_scaling": {
                    "type": "longrope",
                    "long_factor": [1.5] * 150_000,
                    "short_factor": [1.0] * 48,
                },
            }
        ),
        "from lowbit.checkpoints.config_checks import check_config\n"
        "    from lowbit.checkpoints.gguf.hf_config import converter_config\n"
        "    from lowbit.checkpoints.readers import read_config\n"
        "    from pathlib import Path\n"
        "    check_config(converter_config(read_config(Path(path))), path, per_layer=False)",
    ),
    "tokenizer.json of 60,000 tokens, no known pre-tokenizer": (
        "tok/tokenizer.json",
        lambda: _byte_level_bpe(60_000),
        "from lowbit.checkpoints.gguf.tokenizer import check_hf_tokenizer\n"
        "    import os\n    check_hf_tokenizer(os.path.dirname(path))",
    ),
    "legacy .dat importance matrix claiming 10^8 values": ("im.dat", None, "imatrix"),
    "GGUF importance matrix, 5,000 entries": ("im.gguf", None, "imatrix"),
    "GGUF llama metadata: 1 MB of keys, block_count 10^9, into the model builder": (
        "m.gguf",
        None,
        "from lowbit.checkpoints import open_checkpoint\n"
        "    from lowbit.models.build import build_model\n"
        "    build_model(open_checkpoint(path), progress=False)",
    ),
    "transform_config with 20,000 hostile re: targets": (
        "config.json",
        lambda: json.dumps(
            {
                "quantization_config": {
                    "transform_config": {
                        "config_groups": {
                            "v": {
                                "type": "hadamard",
                                "head_dim": 64,
                                "apply": [
                                    {
                                        "location": "input",
                                        "targets": [f"re:(.*.*)*z{i}" for i in range(20_000)],
                                    }
                                ],
                            }
                        }
                    },
                },
            }
        ),
        "from lowbit import _json\n"
        "    from lowbit.checkpoints.compressed_tensors.transforms import input_transforms\n"
        "    [t] = input_transforms(_json.load(path)['quantization_config'], path)\n"
        "    [t.matches('model.layers.%d.mlp.up_proj' % i, ('Linear',)) for i in range(100)]",
    ),
    "MoE config.json: 1 MB of keys, 4,096 experts, top-k 5,000": (
        "config.json",
        lambda: json.dumps(
            {
                **{f"k{i}": i for i in range(70_000)},
                "model_type": "mixtral",
                "hidden_size": 4096,
                "intermediate_size": 14336,
                "num_attention_heads": 32,
                "num_key_value_heads": 8,
                "vocab_size": 32000,
                "num_hidden_layers": 32,
                "num_local_experts": 4096,
                "num_experts_per_tok": 5000,
            }
        ),
        "from lowbit.checkpoints.config_checks import check_config\n"
        "    from lowbit.checkpoints.readers import read_config\n"
        "    from lowbit.planning._arch_config import spec_from_config\n"
        "    from pathlib import Path\n"
        "    spec_from_config(path)\n"
        "    check_config(read_config(Path(path)), path)",
    ),
}


def _byte_level_bpe(n: int) -> str:
    """A byte-level BPE tokenizer.json of ``n`` tokens and no merges (GPT-2's pre-tokenizer
    with a prefix space, which no llama.cpp pre-tokenizer is)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    tok = Tokenizer(models.BPE(vocab={f"t{i:05d}": i for i in range(n)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    tok.decoder = decoders.ByteLevel()
    return tok.to_str()


_IMATRIX_CALL = "from lowbit.checkpoints.gguf.imatrix import read_imatrix\n    read_imatrix(path)"


def _write_imatrix_dat(path: Path) -> None:
    """One entry whose value count claims 10^8 floats, then 1 MB of them (truncated)."""
    import struct

    name = b"blk.0.attn_q.weight"
    head = struct.pack("<ii", 1, len(name)) + name + struct.pack("<ii", 1, 10**8)
    path.write_bytes(head + b"\0\0\x80\x3f" * (MB // 4))


def _write_imatrix_gguf(path: Path) -> None:
    """5,000 entries (10,000 tensors, about 1 MB), as llama.cpp's GGUF importance matrix."""
    import numpy as np

    from lowbit.checkpoints.gguf.imatrix import write_imatrix

    names = [f"blk.{i}.ffn_up.weight" for i in range(5_000)]
    sums = {n: np.ones(1, np.float32) for n in names}
    counts = {n: np.ones(1, np.float32) for n in names}
    write_imatrix(path, sums, counts, datasets=["t"], chunk_count=1, chunk_size=8)


def _write_family_gguf(path: Path) -> None:
    """A tiny llama GGUF with 1 MB of extra metadata keys and block_count 10^9."""
    import numpy as np

    from lowbit.checkpoints.gguf.writer import write_gguf

    meta = {f"x.key{i}": "v" * 8 for i in range(40_000)}
    meta |= {"llama.block_count": 10**9, "llama.embedding_length": 16,
             "llama.attention.head_count": 2, "llama.context_length": 64}  # fmt: skip
    tensors = {"token_embd.weight": np.zeros((32, 16), np.float32),
               "blk.0.attn_q.weight": np.zeros((16, 16), np.float32)}  # fmt: skip
    write_gguf(path, tensors, metadata=meta, arch="llama", progress=False)


_WRITERS = {"im.dat": _write_imatrix_dat, "im.gguf": _write_imatrix_gguf,
            "m.gguf": _write_family_gguf, "t.npy": None}  # fmt: skip


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
            path = Path(tmp) / name.split(",")[0].replace(" ", "_").replace("/", "_") / fname
            path.parent.mkdir(parents=True, exist_ok=True)
            if call == "imatrix":
                call = _IMATRIX_CALL
            if make is None:
                (_WRITERS.get(fname) or _write_npy)(path)
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
            dt, cpu, rss, outcome = r.stdout.strip().split("\t", 3)
            rows.append({"case": name, "bytes": size, "seconds": float(dt), "cpu_seconds": float(cpu), "peak_mb":
                         float(rss), "process_seconds": round(wall, 2), "outcome": outcome})  # fmt: skip
    if "--json" in sys.argv:
        print(json.dumps(rows, indent=2))
    else:
        for r in rows:
            print(f"{r['case']:<50} {r['bytes'] / MB:5.2f} MB  {r.get('seconds', '-')!s:>6} s "
                  f"({r.get('cpu_seconds', '-')!s} s CPU) "
                  f"{r.get('peak_mb', '-')!s:>6} MB  {r.get('outcome', r.get('error'))}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
