"""``lowbit eval``: the quality a model keeps in each quantized variant, in one table."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from lowbit.checkpoints.lowbit_format.checkpoint import LowbitCheckpoint, is_lowbit_checkpoint
from lowbit.cli import _common
from lowbit.cli._calibrated import add_calibration_options, calibration_of
from lowbit.errors import LowbitError
from lowbit.evaluation.perplexity import DEFAULT_BATCH
from lowbit.evaluation.variants import evaluate_variants
from lowbit.methods.awq import AWQ
from lowbit.methods.gptq import GPTQ
from lowbit.methods.smoothquant import SmoothQuant, parse_alpha

_EPILOG = """\
MODEL is a checkpoint (.safetensors, Hugging Face folder, .gguf) or a shipped model: smollm2
(SmolLM2-135M-Instruct, the default) or minilm (all-MiniLM-L6-v2, a sentence encoder).
QUANTIZED are checkpoints of it on disk (lowbit quantize outputs, GGUF files). Without
QUANTIZED or --schemes, the default schemes are quantized in memory (nothing is written):
int8:ch, int4:g128, int4:g128:asym, nf4, fp8_e4m3:ch, mxfp4.

Causal LMs: perplexity over the first --tokens tokens of the text in windows of --window
(non-overlapping by default), with KL(original || variant) of the next-token distributions
and top-1 agreement. Encoders: mean/min cosine similarity of sentence embeddings against the
original and nearest-neighbour agreement on --sentences sentences of the text.

examples:
  lowbit eval                                   SmolLM2, default schemes, 4,096 tokens
  lowbit eval minilm                            all-MiniLM-L6-v2 embedding fidelity
  lowbit eval smollm2 smol-int4 --schemes none  a checkpoint written by lowbit quantize
  lowbit eval --schemes int8:ch,int4:g32 --w8a8 --tokens 16384
  lowbit eval --schemes int4:g128 --methods rtn,gptq --calib-samples 32
                                                round to nearest vs GPTQ, side by side
  lowbit eval minilm --schemes int4:g128 --methods rtn,gptq,awq
  lowbit eval --schemes int8:ch --w8a8 int8 --smooth
                                                W8A8 with and without SmoothQuant
  lowbit eval --schemes mxfp4 --methods rtn,hadamard+gptq --act mxfp4
                                                W4A4: round to nearest vs MR-GPTQ
  lowbit eval minilm --schemes mxfp4 --methods rtn,hadamard-fold --act mxfp4
                                                the v -> o rotation folded offline
  lowbit eval --schemes nvfp4 --act nvfp4 --smooth
                                                NVFP4 W4A4 with and without SmoothQuant
"""


def register(sub: Any) -> None:
    p = sub.add_parser(
        "eval",
        help="perplexity / embedding fidelity of a model and its quantized variants",
        description="Measure a model and its quantized variants on the same data and print "
        "one table: format, bits per weight, size, quality and change against the original.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("paths", nargs="*", metavar="MODEL [QUANTIZED ...]")
    p.add_argument(
        "--schemes",
        metavar="LIST",
        help="comma-separated schemes quantized in memory ('none': no others); default: "
        "int8:ch,int4:g128,int4:g128:asym,nf4,fp8_e4m3:ch,mxfp4 when no QUANTIZED is given",
    )
    p.add_argument(
        "--w8a8",
        nargs="?",
        const="int8",
        metavar="FMT",
        help="also measure each model with per-token activations in FMT (default int8)",
    )
    p.add_argument(
        "--act",
        metavar="MODE",
        help="also measure each model with activations as vLLM computes them: int8, "
        "fp8_token, fp8_block (groups of 128), mxfp4, nvfp4 (static input scales from 16 "
        "calibration windows); or llamacpp: GGUF files as llama.cpp's CPU backend computes "
        "them (each layer's input rounded to its weight type's Q8_0/Q8_K blocks or F16/BF16, "
        "keys and values through llama.cpp's default F16 cache, which --kv replaces)",
    )
    p.add_argument(
        "--kv",
        metavar="MODE",
        help="also simulate the KV cache: fp8 (E4M3, scale 1, as vLLM without calibrated "
        "scales), int8 (per token and head) or f16",
    )
    p.add_argument(
        "--methods",
        metavar="LIST",
        default="rtn",
        help="how each scheme is quantized: rtn (round to nearest, default), gptq, awq "
        "(calibrated), hadamard (block Hadamard rotations sized to the scale group, inputs "
        "rotated online), hadamard+gptq (MR-GPTQ: GPTQ in the rotated basis), hadamard-fold, "
        "hadamard-fold+gptq (the rotation folded offline into attention's v -> o "
        "projections, exact, no runtime rotation; then rtn or GPTQ); "
        "'rtn,gptq,awq' gives their rows side by side",
    )
    add_calibration_options(
        p,
        needs="--w8a8 or --act",
        smooth_note="; with gptq in --methods also a 'smoothquant+gptq' row per scheme: "
        "GPTQ of the folded model",
    )
    p.add_argument("--tokens", type=int, default=4096, help="tokens of the text (default 4096)")
    p.add_argument("--window", type=int, default=512, help="tokens per window (default 512)")
    p.add_argument("--stride", type=int, help="tokens between windows (default: the window)")
    p.add_argument("--text", metavar="FILE", help="UTF-8 text (default: pydoc_data.topics)")
    p.add_argument("--sentences", type=int, default=256, help="encoders: sentences (default 256)")
    p.add_argument(
        "--threads",
        type=int,
        help="torch threads (default: the usable cores; only the idle ones if OMP_WAIT_POLICY is "
        "set to other than PASSIVE)",
    )
    p.add_argument(
        "--batch",
        metavar="N",
        default=str(DEFAULT_BATCH),
        help=f"causal LMs: windows of the same length run through a model in one forward, "
        f"at most N (fewer where their float32 logits would pass 1 GiB; default "
        f"{DEFAULT_BATCH}); a batched forward may change the last bits of the numbers",
    )
    _common.add_compute(p, "the models' forward passes (and calibration's)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    _common.add_json(p)
    p.set_defaults(func=run)


def split_paths(paths: list[str]) -> tuple[str | None, list[str]]:
    """(MODEL, QUANTIZED...): a lowbit checkpoint first means its source is the model."""
    if not paths:
        return None, []
    first = paths[0]
    if is_lowbit_checkpoint(first):
        source = LowbitCheckpoint(first).manifest.get("source", {}).get("path")
        if not source or not Path(source).exists():
            raise LowbitError(
                f"{first}: its source model {source!r} is not on this machine; name the "
                f"original first: lowbit eval MODEL {' '.join(paths)}"
            )
        return source, list(paths)
    return first, list(paths[1:])


def run(args: argparse.Namespace) -> int:
    for opt in ("tokens", "window", "sentences", "threads"):
        v = getattr(args, opt)
        if v is not None and v < 1:
            raise LowbitError(f"--{opt} must be a positive integer, got {v}")
    batch = _positive_int("--batch", args.batch)
    compute = _common.compute_option(args.compute)
    model, quantized = split_paths(args.paths)
    for q in quantized:
        if not Path(q).exists():
            raise LowbitError(f"{q}: no such file or folder")
    if args.schemes is None:
        schemes = None
    elif args.schemes.strip().lower() in ("", "none"):
        schemes = []
    else:
        schemes = _common.parse_list(args.schemes)
    methods = _common.parse_list(args.methods)
    calibration = gptq = awq = smooth = None
    wanted = {m.strip().lower() for m in methods}
    if args.smooth is not None:
        if args.w8a8 is None and args.act is None:
            raise LowbitError(
                "--smooth prepares activations for quantization: add --w8a8 [int8|fp8] or "
                "--act MODE"
            )
        smooth = SmoothQuant(alpha=parse_alpha(args.smooth), activations=args.w8a8 or args.act)
    if wanted & {"gptq", "awq", "hadamard+gptq", "hadamard-fold+gptq"} or smooth is not None:
        calibration = calibration_of(args)
        gptq = GPTQ(act_order=args.act_order, sequential=args.sequential)
        awq = AWQ(clip=not args.no_clip)
    result = evaluate_variants(
        model,
        quantized,
        schemes,
        w8a8=args.w8a8,
        act=args.act,
        kv=args.kv,
        tokens=args.tokens,
        window=args.window,
        stride=args.stride,
        text=args.text,
        sentences=args.sentences,
        threads=args.threads,
        progress=False if args.no_progress or args.json else None,
        methods=methods,
        calibration=calibration,
        gptq=gptq,
        awq=awq,
        smooth=smooth,
        batch=batch,
        compute=compute,
    )
    if args.json:
        _common.print_json(result)
        return 0
    print_result(result)
    return 0


def _positive_int(option: str, text: str) -> int:
    """An option's value as an integer >= 1 (parsed here so a bad value is one error line)."""
    try:
        value = int(text.strip())
    except ValueError:
        value = 0
    if value < 1:
        raise LowbitError(f"{option} must be a positive integer, got {text!r}")
    return value


def _size(row: dict[str, Any]) -> str:
    n = row.get("bytes")
    if n is None:
        return "-"
    return f"{n / 1e6:,.1f} MB" + ("*" if row.get("size_source") == "memory" else "")


def _bits(row: dict[str, Any]) -> str:
    b = row.get("bits_per_weight")
    return "-" if b is None else f"{b:.3f}"


def print_result(result: dict[str, Any]) -> None:
    """The final table and the line saying what was measured."""
    m = result["measured"]
    rows = result["rows"]
    if result["kind"] == "causal-lm":
        table = [
            [
                r["name"],
                r["format"],
                _bits(r),
                _size(r),
                f"{r['perplexity']:.4f}",
                "-" if i == 0 else f"{r['change'] * 100:+.2f}%",
                f"{r['kl_mean']:.5f}",
                f"{r['top1_agreement'] * 100:.2f}%",
            ]
            for i, r in enumerate(rows)
        ]
        headers = ["name", "format", "bits/w", "size", "perplexity", "change", "KL", "top-1"]
        _common.print_table(table, headers, align="llrrrrrr")
        print(
            f"\nmeasured: perplexity on {m['text']}, first {m['tokens']:,} of {m['text_tokens']:,} "
            f"tokens in {m['windows']} windows of {m['window']} (stride {m['stride']}), "
            f"{m['scored']:,} tokens scored, no BOS, {m['dtype']}"
            f"{', bf16 matrix products' if m.get('compute') == 'bf16' else ''}, {m['threads']} threads, "
            f"{m['batch']} {'window' if m['batch'] == 1 else 'windows'} per forward; KL = "
            f"mean KL(original || variant) of next-token distributions in nats, top-1 = same "
            f"most likely token; {m['seconds']:.0f} s."
        )
    else:
        table = [
            [
                r["name"],
                r["format"],
                _bits(r),
                _size(r),
                f"{r['mean_cosine']:.6f}",
                f"{r['min_cosine']:.6f}",
                f"{r['nn_agreement'] * 100:.1f}%",
            ]
            for r in rows
        ]
        headers = ["name", "format", "bits/w", "size", "mean cos", "min cos", "NN agree"]
        _common.print_table(table, headers, align="llrrrrr")
        print(
            f"\nmeasured: sentence embeddings of {m['sentences']} sentences drawn (seed "
            f"{m['seed']}) from {m['text']}, {m['pooling']}; cosine against the original's "
            f"embedding of the same sentence; NN agree = same nearest other sentence; "
            f"{m['seconds']:.0f} s."
        )
    for r in rows:
        if isinstance(r.get("calibration"), dict):
            print(_method_line(r))
    print(
        "bits/w: stored bits per weight of the quantized tensors (the original: as stored), "
        "scales and zero points included; size: tensor data (* computed for a variant "
        "quantized in memory)."
    )


def _method_line(r: dict[str, Any]) -> str:
    """One line on how a calibrated row was made."""
    c, t, m = r["calibration"], r["phase_seconds"], r["method"]
    data = f"on {c['described']} ({c['tokens']:,} tokens)"
    if m["method"] == "gptq":
        rot = "block-Hadamard-rotated " if m.get("rotation") else ""
        return (
            f"{r['name']}: {rot}GPTQ ({m['act_order']} act-order, damp {m['damp']:g}, "
            f"{m.get('sequential', 'blocks')}-sequential) {data}; "
            f"{r['gptq_tensors']} tensors; {t['total']:.0f} s (collect {t['collect']:.0f} s, "
            f"solve {t['solve']:.0f} s); mean layer-output error {r['layer_error_gptq']:.4g} "
            f"vs {r['layer_error_rtn']:.4g} rounding to nearest."
        )
    how = "AWQ" if m["method"] == "awq" else f"SmoothQuant ({m['activations']} activations)"
    skipped = f", skipped: {'; '.join(r['folds_skipped'])}" if r["folds_skipped"] else ""
    return (
        f"{r['name']}: {how} {data}; {r['method_tensors']} tensors, {r['folds']} folds"
        f"{skipped}; {t['total']:.0f} s (collect {t['collect']:.0f} s, search "
        f"{t['search']:.0f} s); mean layer-output error {r['layer_error_method']:.4g} vs "
        f"{r['layer_error_rtn']:.4g} rounding to nearest."
    )
