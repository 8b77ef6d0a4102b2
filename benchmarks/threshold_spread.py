"""Measure how much the model-quality numbers the tests assert move between CPU kernel paths.

The tests in tests/evaluation and tests/cli put thresholds on perplexity, KL, cosine and
nearest-neighbour agreement of real models. Those numbers depend on float summation order,
which differs between thread counts and between the SIMD kernels a CPU gets (AVX-512, AVX2,
SSE). This script runs each measured quantity in one child process per configuration:

- torch threads 1 and 2 (``torch.set_num_threads``);
- lowbit's numba kernels on and off (``lowbit.codecs._numba.numpy_only``);
- instruction-set paths: native, ``avx2`` (``MKL_CBWR=AVX2`` makes MKL's GEMM compute as
  an AVX2 machine would; ``ATEN_CPU_CAPABILITY=avx2`` does the same for torch's own kernels)
  and ``sse`` (``MKL_CBWR=COMPATIBLE``, ``ATEN_CPU_CAPABILITY=default``);

and prints each quantity's range. Run from the repository root::

    PYTHONPATH=src python benchmarks/threshold_spread.py [--quick] [--only minilm,...]

A full run takes about 15 minutes on two cores.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

ISA = {
    "native": {},
    "avx2": {"MKL_CBWR": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"},
    "sse": {"MKL_CBWR": "COMPATIBLE", "ATEN_CPU_CAPABILITY": "default"},
}
TESTS = Path(__file__).resolve().parents[1] / "tests"


def _child(what: str, threads: int, numba: bool) -> dict:
    """Measure ``what`` in this process (the environment already chose the ISA)."""
    import contextlib
    import copy

    import numpy as np
    import torch

    sys.path.insert(0, str(TESTS))
    sys.path.insert(0, str(TESTS / "evaluation"))
    from lowbit.codecs import _numba
    from lowbit.evaluation import perplexity as ev
    from lowbit.models.activations import simulate_activations

    ctx = contextlib.nullcontext() if numba else _numba.numpy_only()
    out: dict = {}
    with ctx:
        if what == "minilm_w8a8":  # tests/evaluation/test_perplexity.py::test_minilm_w8a8_fidelity
            from tiny_models import shipped_model

            _, _, model, tok = shipped_model("minilm")
            sim = copy.deepcopy(model)
            sents, _ = ev._fidelity_sentences(None, None, None, 64, 0)
            with simulate_activations(sim, "int8"):
                a = ev.embed(sim, tok, sents, threads=threads, progress=False)
            b = ev.embed(model, tok, sents, threads=threads, progress=False)
            cos = np.sum(a.astype(np.float64) * b, axis=1)
            ref_sim = b.astype(np.float64) @ b.T.astype(np.float64)
            np.fill_diagonal(ref_sim, -np.inf)
            top2 = np.sort(ref_sim, axis=1)[:, -2:]
            na, nb = ev._nearest(a), ev._nearest(b)
            out = {
                "mean_cosine": float(cos.mean()),
                "min_cosine": float(cos.min()),
                "nn_agreement": float(np.mean(na == nb)),
                "nn_disagree": [int(i) for i in np.flatnonzero(na != nb)],
                # how close each sentence's two best reference neighbours are
                "ref_top2_gap_lt_1e-2": int(np.sum(top2[:, 1] - top2[:, 0] < 1e-2)),
                "emb_q": a.tolist(),
                "emb_f": b.tolist(),
            }
        elif what == "minilm_eval":  # tests/cli/test_cli_models.py::test_real_minilm_eval
            from lowbit.evaluation.variants import evaluate_variants

            res = evaluate_variants(
                "minilm", schemes=["int8:ch"], sentences=32, threads=threads, progress=False
            )
            row = res["rows"][1]
            out = {k: row[k] for k in ("mean_cosine", "min_cosine", "nn_agreement")}
        elif what == "smollm2_ppl":  # test_smollm2_perplexity_short_prefix
            from tiny_models import shipped_model

            _, _, model, tok = shipped_model("smollm2")
            got = ev.perplexity(model, tok, max_tokens=2048, threads=threads, progress=False)
            out = {"perplexity": got["perplexity"]}
        elif what == "smollm2_w8a8":  # test_smollm2_w8a8_kl
            from tiny_models import shipped_model

            _, _, model, tok = shipped_model("smollm2")
            sim = copy.deepcopy(model)
            with simulate_activations(sim, "int8"):
                got = ev.perplexity(
                    sim, tok, max_tokens=512, reference=model, threads=threads, progress=False
                )
            out = {
                k: got[k]
                for k in ("kl_mean", "kl_max", "top1_agreement", "perplexity",
                          "reference_perplexity")
            }  # fmt: skip
        elif what == "tiny_variants":  # tests/evaluation/test_variants.py's orderings
            import tempfile

            import test_variants as tv

            from lowbit.checkpoints.streaming import quantize_model
            from lowbit.evaluation.variants import evaluate_variants
            from lowbit.plans.plan import PrecisionPlan
            from tiny_models import save_hf_folder, tiny_bert, tiny_llama

            with tempfile.TemporaryDirectory() as tmp:
                tmp = Path(tmp)
                src = save_hf_folder(tiny_llama(), tmp / "src")
                (tmp / "text.txt").write_text(tv._text())
                quantize_model(src, PrecisionPlan.uniform("int8:ch"), tmp / "int8", progress=False)
                res = evaluate_variants(src, [tmp / "int8"], ["int8:ch", "int4:g32"], w8a8="int8",
                                        tokens=200, window=40, text=tmp / "text.txt",
                                        threads=threads, progress=False)  # fmt: skip
                rows = {r["name"]: r for r in res["rows"]}
                folder = tmp / "bert"
                tiny_bert().save_pretrained(folder, safe_serialization=True)
                (folder / "tokenizer.json").write_text(tv.byte_tokenizer_json())
                (folder / "tokenizer_config.json").write_text(
                    '{"tokenizer_class": "PreTrainedTokenizerFast", "pad_token": "<pad>"}'
                )
                enc = evaluate_variants(folder, schemes=["int8:ch", "int4:g32"], sentences=20,
                                        text=tmp / "text.txt", threads=threads,
                                        progress=False)  # fmt: skip
            out = {
                "kl_int4g32": rows["int4:g32"]["kl_mean"],
                "kl_int8ch": rows["int8:ch"]["kl_mean"],
                "kl_int8ch_act": rows["int8:ch + int8 act"]["kl_mean"],
                "cos_bert_int8": enc["rows"][1]["mean_cosine"],
                "cos_bert_int4": enc["rows"][2]["mean_cosine"],
            }
        else:
            raise SystemExit(f"unknown measurement {what!r}")
    out["torch_capability"] = torch.backends.cpu.get_cpu_capability()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", default="minilm_w8a8,minilm_eval,smollm2_ppl,smollm2_w8a8")
    p.add_argument("--quick", action="store_true", help="numba on only (it cannot change "
                   "torch-only measurements; minilm_eval still runs both)")  # fmt: skip
    p.add_argument("--child", nargs=3, metavar=("WHAT", "THREADS", "NUMBA"))
    p.add_argument("--save", type=Path, help="write every result as JSON here")
    args = p.parse_args()
    if args.child:
        what, threads, numba = args.child
        print(json.dumps(_child(what, int(threads), numba == "1")))
        return
    results = []
    for what in args.only.split(","):
        numbas = (1, 0) if not args.quick or what == "minilm_eval" else (1,)
        for isa, threads, numba in itertools.product(ISA, (1, 2), numbas):
            env = {**os.environ, **ISA[isa]}
            cmd = [sys.executable, __file__, "--child", what, str(threads), str(numba)]
            r = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
            got = json.loads(r.stdout.strip().splitlines()[-1])
            emb = (got.pop("emb_q", None), got.pop("emb_f", None))
            results.append({"what": what, "isa": isa, "threads": threads, "numba": numba,
                            **got, "_emb": emb})  # fmt: skip
            shown = {k: v for k, v in got.items() if not k.startswith("emb")}
            print(what, isa, f"threads={threads}", f"numba={numba}", shown, flush=True)
    for what in args.only.split(","):
        rows = [r for r in results if r["what"] == what]
        keys = [k for k, v in rows[0].items() if isinstance(v, float)]
        for k in keys:
            vals = [r[k] for r in rows]
            print(f"{what:14s} {k:22s} min {min(vals):.6g}  max {max(vals):.6g}  "
                  f"spread {max(vals) - min(vals):.3g}")  # fmt: skip
        if rows[0]["_emb"][0] is not None:
            import numpy as np

            q = np.array([r["_emb"][0] for r in rows])
            f = np.array([r["_emb"][1] for r in rows])
            print(f"{what:14s} largest embedding difference between configurations: "
                  f"w8a8 {np.abs(q - q[0]).max():.3g}, float {np.abs(f - f[0]).max():.3g}")  # fmt: skip
    if args.save:
        for r in results:
            r.pop("_emb")
        args.save.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
