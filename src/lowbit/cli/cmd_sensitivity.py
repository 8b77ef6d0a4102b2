"""``lowbit sensitivity``: what each tensor costs the model when it alone is quantized."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from lowbit.checkpoints.io.outputs import check_output
from lowbit.checkpoints.streaming import open_model
from lowbit.cli import _common
from lowbit.cli._mixed_plots import plot_sensitivity
from lowbit.cli._scan import add_scan_options, check_json_output, scan, write_json
from lowbit.evaluation.sensitivity import spearman
from lowbit.plans.presets import tensor_group

_EPILOG = """\
MODEL is a checkpoint (.safetensors, Hugging Face folder, .gguf) or a shipped model: smollm2
(the default) or minilm. For every tensor lowbit quantize would quantize and every scheme of
--schemes, one trial quantizes that tensor alone and measures the model against the original:
  exact  causal LMs: mean KL(original || trial) of next-token distributions on the
         calibration tokens; encoders: 1 - mean cosine of the sentence embeddings;
  proxy  sum_j E[x_j^2] ||W_j - Q(W)_j||^2: the weight error weighted by the mean square of
         each input feature (one forward pass for all tensors; also given with exact).
  fisher sum_ij E[g_i^2] E[x_j^2] (W - Q(W))_ij^2, g the gradient of the model's loss on its
         own sampled next tokens w.r.t. the layer's output (a diagonal-Fisher, second-order
         estimate; one forward+backward pass; causal LMs). With exact, --proxy fisher gives it
         as the proxy beside the damage.
--exact-schemes runs the model for some schemes only; the budget scores the others by their
proxy times the tensor's measured damage/proxy ratio.
Calibration data never overlaps what lowbit eval measures: windows of the default text from
token 32,768 on (eval scores the first 4,096), or sentences other than eval's 256.

The result (--out FILE or --json) feeds lowbit quantize --budget / --size --sensitivity FILE.

examples:
  lowbit sensitivity smollm2 --schemes int4:g128,int8:ch --measure proxy     seconds
  lowbit sensitivity smollm2 --schemes int4:g128,int8:ch --measure fisher    a minute or two
  lowbit sensitivity smollm2 --schemes int3:g128,int4:g128,int6:g128 --out sens.json
  lowbit sensitivity smollm2 --schemes int4:g64:fp16:asym,int4:g32:fp16:asym,int8:ch \
      --exact-schemes int4:g64:fp16:asym --workers 2 --out sens.json
  lowbit sensitivity minilm --schemes int4:g128,nf4,int8:ch --plot sens.png
  lowbit sensitivity big-model/ --schemes int4:g128,int8:ch --ray ray://head:10001 --workers 64
"""


def register(sub: Any) -> None:
    p = sub.add_parser(
        "sensitivity",
        help="damage of quantizing each tensor alone, per scheme (input to --budget)",
        description="Measure, for every quantizable tensor and candidate scheme, the damage "
        "of quantizing that tensor alone; report it with the cheap proxy and their rank "
        "correlation.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("model", nargs="?", metavar="MODEL", help="checkpoint or shipped model")
    add_scan_options(p)
    p.add_argument("--out", metavar="FILE.json", help="write the result (for --sensitivity)")
    p.add_argument("--plot", metavar="OUT.png", help="damage per tensor by layer and kind")
    p.add_argument(
        "--overwrite", action="store_true", help="replace an --out/--plot file lowbit wrote"
    )
    _common.add_compute(p, "the scan's model passes")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    _common.add_json(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    progress = False if args.no_progress or args.json else None
    ckpt = open_model(args.model)
    if args.out:  # before minutes of trials
        check_json_output(Path(args.out), args.overwrite, "scan")
    if args.plot:
        check_output(Path(args.plot), overwrite=args.overwrite)
    result = scan(args, ckpt, progress)
    doc = result.to_dict()
    if args.out:
        write_json(Path(args.out), doc, args.overwrite, "scan")
    if args.plot:
        plot_sensitivity(result, Path(args.plot), args.overwrite)
    if args.json:
        _common.print_json(doc)
        return 0
    print_result(result)
    for what, path in (("result", args.out), ("plot", args.plot)):
        if path:
            print(f"{what} written to {path}")
    return 0


def print_result(result: Any) -> None:
    """One row per tensor: layer, kind, damage (and proxy) per scheme; then the summary."""
    table = result.table()
    schemes = list(result.schemes)
    exact = result.measure in ("exact", "block")  # a damage per trial
    rows = []
    for name, row in table.items():
        layer, kind = tensor_group(name)
        cells: list[Any] = ["-" if layer is None else str(layer), kind]
        if exact:
            cells += [_sci(row[s].damage) for s in schemes]
        cells += [_sci(row[s].proxy) for s in schemes]
        rows.append(cells)
    short = [s.removesuffix(":fp32") for s in schemes]
    headers = ["layer", "kind"]
    if exact:
        headers += [f"damage {s}" for s in short]
    headers += [f"proxy {s}" for s in short]
    _common.print_table(rows, headers, align="rl" + "r" * (len(headers) - 2))
    print(f"\n{result.model}: {len(table)} tensors x {len(schemes)} schemes, {result.kind}")
    if exact:
        print(f"  damage: {result.metric}; proxy ({result.proxy}): {result.proxy_formula}")
    else:
        print(f"  proxy ({result.proxy}): {result.proxy_formula} (no trial run)")
    print(f"  calibration: {result.calibration}")
    rho = result.rank_correlation()
    if rho is not None:
        print(f"  Spearman rank correlation, proxy vs {result.measure} over all trials: {rho:.3f}")
        for s in schemes:
            per = _per_scheme_rho(result, s)
            if per is not None:
                print(f"    {s}: {per:.3f}")
    top = sorted(result.entries, key=result.score, reverse=True)[:5]
    print("  most sensitive: " + ", ".join(f"{e.tensor} ({e.scheme}: {result.score(e):.3g})"
                                           for e in top))  # fmt: skip
    secs = ", ".join(f"{k} {v:.1f} s" for k, v in result.seconds.items() if k != "workers")
    print(f"  time: {secs}")


def _per_scheme_rho(result: Any, scheme: str) -> float | None:
    pairs = [(e.proxy, e.damage) for e in result.entries
             if e.scheme == scheme and e.damage is not None]  # fmt: skip
    if len(pairs) < 3:
        return None
    a, b = zip(*pairs, strict=True)
    return spearman(a, b)


def _sci(v: float | None) -> str:
    return "-" if v is None else f"{v:.3e}"
