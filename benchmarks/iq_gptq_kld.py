"""GPTQ onto llama.cpp's i-quant grids against llama.cpp's rounding, at identical file bytes.

On the shipped SmolLM2-135M (its Q4_1 GGUF decoded to an all-F32 GGUF, the reference), for each
``--types`` mix (default IQ2_XXS and IQ3_XXS): lowbit writes the mix with llama.cpp's rounding
(RTN: llama-quantize's bytes) and again with ``ffn_down`` (SmolLM2's only rows of whole 256-value
super-blocks, so the only tensors in the i-quant type) GPTQ'd onto the same type; every other
tensor is as the mix puts it, the same bytes in both files. One importance matrix for both
(``lowbit imatrix`` on the calibration slice).

With ``--widen 768`` (issue 38's protocol b) the model is SmolLM2 widened with zeros to hidden
768 (``benchmarks/pad_llama.py``: the same function, every row a whole number of 256-blocks), so
the whole mix is in the i-quant types; use it with ``--scope all`` and the mixes ``iq2_m``,
``iq3_xxs``, ``iq3_m``.

Text (as ``benchmarks/gguf_kld.py``): the default text (``pydoc_data.topics``) tokenized by
SmolLM2's tokenizer; evaluation on its first ``--eval-tokens`` tokens, calibration (importance
matrix and GPTQ) from token 32,768 on: disjoint slices.

Measured by lowbit (``lowbit eval --act llamacpp``'s arithmetic: each layer's input rounded as
llama.cpp's CPU backend rounds it, keys and values through its F16 cache) by llama-perplexity's
protocol (``--ctx``-token chunks, each chunk's second half scored): mean KL divergence of the
file's next-token distribution from the reference's, its 99.9th percentile, how often the top
token agrees. With ``--llamacpp BIN`` also by ``llama-perplexity --kl-divergence``.

``--walk``: what the tensors GPTQ does not round hold while it calibrates: ``file`` (the
default: llama.cpp's rounding, as the written file holds them, so every target sees the inputs
it will get) or ``float`` (the source's values, as before 2026-12-07); ``--walk file,float``
writes both (``gptq-...`` and ``gptq-float-...``). Only ``ffn_down``'s scope has such tensors in
blocks; with ``--scope all`` it is the token embedding.

    python benchmarks/iq_gptq_kld.py --work /tmp/iqg [--llamacpp .../build/bin]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _machine import cpu
from gguf_kld import CALIB_AT, EVAL_AT, _run, kld, lowbit, tensor_digest, texts


def _logits(path: Path, text: str, n_ctx: int, llamacpp: bool, chunks: int = 0) -> np.ndarray:
    """Log-probabilities (tokens, vocab) float32 of every scored token (chunks' second halves;
    the first ``chunks`` chunks only, if given)."""
    import torch

    from lowbit.calibration.text import tokenize
    from lowbit.checkpoints import open_checkpoint
    from lowbit.checkpoints.tokenizer import build_tokenizer
    from lowbit.evaluation.act_modes import simulate_llamacpp_activations
    from lowbit.models.build import load_model

    with open_checkpoint(path) as ck:
        tok = build_tokenizer(ck)
        md = ck.metadata
    bos = md.get("tokenizer.ggml.bos_token_id")
    add_bos = bool(md.get("tokenizer.ggml.add_bos_token", False)) and bos is not None
    ids = ([int(bos)] if add_bos else []) + tokenize(tok, text)
    model = load_model(path)
    out = []
    emulate = simulate_llamacpp_activations(model) if llamacpp else contextlib.nullcontext()
    with torch.inference_mode(), emulate:
        for c in range(min(len(ids) // n_ctx, chunks or len(ids))):
            chunk = torch.tensor([ids[c * n_ctx : (c + 1) * n_ctx]])
            if add_bos:
                chunk[0, 0] = int(bos)
            logp = torch.log_softmax(model(input_ids=chunk).logits[0].float(), dim=-1)
            out.append(logp[n_ctx // 2 : -1].numpy())
    return np.concatenate(out)


def _kld_stats(ref: np.ndarray, q: np.ndarray) -> dict:
    kl = (np.exp(ref) * (ref - q)).sum(axis=1)
    return {
        "mean_kld": float(kl.mean()),
        "kld_99_9": float(np.quantile(kl, 0.999)),
        "same_top": float((ref.argmax(1) == q.argmax(1)).mean() * 100),
        "tokens": int(kl.size),
    }


def _gptq_file(
    base: Path, mix: str, imatrix: Path, calib: Path, out: Path, a, walk: str = "file"
) -> dict:
    """The mix with ffn_down GPTQ'd onto its type (every other tensor llama.cpp's rounding), or
    with ``--scope all`` every tensor GPTQ can reach onto the type the mix gives it; ``walk``
    ``file``: the other tensors rounded as the file holds them while GPTQ calibrates."""
    from lowbit.calibration.data import Calibration
    from lowbit.checkpoints import open_checkpoint
    from lowbit.checkpoints.gguf.imatrix import read_imatrix
    from lowbit.checkpoints.gguf.mix import gptq_targets, mix_rounded, write_gguf_mix
    from lowbit.jobs.gguf import gptq_onto
    from lowbit.methods.gptq import GPTQ

    imat = read_imatrix(imatrix)
    cal = Calibration(source=str(calib), samples=a.calib_samples, length=a.calib_len)
    with open_checkpoint(base) as ck:
        targets = {n: t for n, t in gptq_targets(ck, mix, imatrix=imat).items()
                   if a.scope == "all" or "ffn_down" in n}  # fmt: skip
        t0 = time.perf_counter()
        rounded = mix_rounded(ck, mix, imatrix=imat, skip=targets) if walk == "file" else None
        gptq = GPTQ(act_order=a.act_order)
        done, record = gptq_onto(
            ck, targets, True, gptq=gptq, calibration=cal, progress=False, rounded=rounded
        )
        seconds = time.perf_counter() - t0
        write_gguf_mix(ck, out, mix, imatrix=imat, overwrite=True, progress=False, weights=done)
    types = sorted({t.qtype for t in targets.values()})
    return {
        "tensors": len(done),
        "types": types,
        "seconds": round(seconds, 1),
        "layer_error": record["mean_error"],
        "walk": walk,
    }


def _widened_base(w: Path, hidden: int, base: Path) -> None:
    """SmolLM2 as float32 Hugging Face weights, widened with zeros to ``hidden``, as an F32 GGUF."""
    import shutil

    import pad_llama

    src, wide = w / "smollm2-f32", w / f"smollm2-f32-{hidden}"
    plan = w / "f32-plan.json"
    plan.write_text(json.dumps({"rules": [{"match": "*", "format": "fp32"}]}))
    shutil.rmtree(src, ignore_errors=True)
    shutil.rmtree(wide, ignore_errors=True)
    lowbit(["smollm2", "--plan", str(plan), "--out-format", "compressed-tensors", "--out",
            str(src)], w / "f32-hf.log")  # fmt: skip
    cfg = json.loads((src / "config.json").read_text())
    cfg.pop("quantization_config", None)  # plain float32 weights: a plain folder
    (src / "config.json").write_text(json.dumps(cfg))
    pad_llama.main([str(src), str(wide), "--hidden", str(hidden)])
    lowbit([str(wide), "--plan", str(plan), "--out-format", "gguf", "--out", str(base)],
           w / "f32.log")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--types", default="iq2_xxs,iq3_xxs")
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--eval-tokens", type=int, default=8192)
    ap.add_argument("--calib-tokens", type=int, default=16384)
    ap.add_argument("--calib-samples", type=int, default=16)
    ap.add_argument("--calib-len", type=int, default=512)
    ap.add_argument("--act-order", default="static", choices=("static", "none"))
    ap.add_argument("--llamacpp", type=Path, help="llama.cpp's build/bin: also its KLD")
    ap.add_argument("--reuse", action="store_true", help="keep files of an earlier run")
    ap.add_argument(
        "--scope",
        default="ffn_down",
        choices=("ffn_down", "all"),
        help="GPTQ ffn_down only (the i-quant tensors), or every tensor of the mix",
    )
    ap.add_argument(
        "--llamacpp-only",
        action="store_true",
        help="measure with llama-perplexity only (skip lowbit's own, slower, KLD)",
    )
    ap.add_argument(
        "--walk",
        default="file",
        help="file, float or file,float: the other tensors while GPTQ calibrates (above)",
    )
    ap.add_argument("--widen", type=int, help="SmolLM2 widened to this hidden size (768)")
    a = ap.parse_args(argv)
    walks = a.walk.split(",")
    if not walks or set(walks) - {"file", "float"}:
        ap.error("--walk: file, float or file,float")
    w = a.work
    w.mkdir(parents=True, exist_ok=True)
    ev, ca = texts(w, a.eval_tokens, a.calib_tokens)
    base, imatrix = w / "f32.gguf", w / "imatrix.gguf"
    if a.widen and not (a.reuse and base.exists()):
        _widened_base(w, a.widen, base)
    elif not (a.reuse and base.exists()):
        plan = w / "f32-plan.json"
        plan.write_text(json.dumps({"rules": [{"match": "*", "format": "fp32"}]}))
        lowbit(["smollm2", "--plan", str(plan), "--out-format", "gguf", "--out", str(base)],
               w / "f32.log")  # fmt: skip
    if not (a.reuse and imatrix.exists()):
        cmd = [sys.executable, "-m", "lowbit.cli", "imatrix", str(base), "--out", str(imatrix),
               "--calib", str(ca), "--calib-samples", "32", "--calib-len", "512", "--overwrite",
               "--no-progress"]  # fmt: skip
        _run(cmd, w / "imatrix.log")
    text = ev.read_text()
    cached = w / f"f32-logprobs-{a.ctx}-{a.eval_tokens}.npy"
    if a.llamacpp_only:
        ref = None
    elif a.reuse and cached.exists():
        ref = np.load(cached)
    else:
        ref = _logits(base, text, a.ctx, True)
        np.save(cached, ref)
    rows = []
    for mix in a.types.split(","):
        scope = "" if a.scope == "ffn_down" else "all-"
        rtn, gq = w / f"rtn-{mix}.gguf", w / f"gptq-{scope}{mix}.gguf"
        if not (a.reuse and rtn.exists()):
            args = [str(base), "--to", mix, "--imatrix", str(imatrix), "--out-format", "gguf"]
            t_rtn = lowbit([*args, "--out", str(rtn)], w / f"rtn-{mix}.log")
        else:
            t_rtn = float("nan")
        infos, files = {}, {}
        for walk in walks:
            tag = scope + ("float-" if walk == "float" else "")
            files[walk] = gq = w / f"gptq-{tag}{mix}.gguf"
            side = w / f"gptq-{tag}{mix}.json"
            if a.reuse and gq.exists() and side.exists():
                infos[walk] = json.loads(side.read_text())
            else:
                infos[walk] = _gptq_file(base, mix, imatrix, ca, gq, a, walk)
                side.write_text(json.dumps(infos[walk]))
        d_rtn = tensor_digest(rtn)
        same_as_llama = None
        if a.llamacpp is not None:  # llama-quantize's own file of the mix: lowbit's RTN bytes?
            llq = w / f"llama-quantize-{mix}.gguf"
            if not (a.reuse and llq.exists()):
                _run([str(a.llamacpp / "llama-quantize"), "--imatrix", str(imatrix), str(base),
                      str(llq), mix.upper(), "2"], w / f"llama-quantize-{mix}.log")  # fmt: skip
            same_as_llama = tensor_digest(llq) == d_rtn
        differ = {}
        for walk, gq in files.items():
            d_gq = tensor_digest(gq)
            differ[walk] = sorted(n for n in d_rtn if d_rtn[n] != d_gq[n])
            assert a.scope == "all" or all("ffn_down" in n for n in differ[walk]), differ
            assert rtn.stat().st_size == gq.stat().st_size
        labelled = [("lowbit RTN (llama.cpp's bytes)", rtn, None)]
        labelled += [(f"lowbit GPTQ, walk {k}", p, k) for k, p in files.items()]
        for label, path, walk in labelled:
            row = {"mix": mix, "file": label, "bytes": path.stat().st_size, "path": str(path)}
            if walk is None:
                row.update(quantize_s=round(t_rtn, 1), equals_llama_quantize=same_as_llama)
            else:
                info = infos[walk]
                row.update(quantize_s=info["seconds"], gptq=info, differ=len(differ[walk]))
            if not a.llamacpp_only:
                row["lowbit"] = _kld_stats(ref, _logits(path, text, a.ctx, True))
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)  # partial results survive
    if a.llamacpp is not None:
        base_logits = w / "f32.kld"
        threads = "2"
        if not (a.reuse and base_logits.exists()):
            _run([str(a.llamacpp / "llama-perplexity"), "-m", str(base), "-f", str(ev), "-c",
                  str(a.ctx), "--kl-divergence-base", str(base_logits), "-t", threads],
                 w / "f32-ppl.log")  # fmt: skip
        for row in rows:
            path = Path(row["path"])
            log = w / f"{path.stem}-kld.log"
            row["llamacpp"] = kld(a.llamacpp, path, base_logits, [], log)
    print(json.dumps({"cpu": cpu(), "eval_tokens": [EVAL_AT, EVAL_AT + a.eval_tokens],
                      "calib_at": CALIB_AT, "rows": rows}, indent=1))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
