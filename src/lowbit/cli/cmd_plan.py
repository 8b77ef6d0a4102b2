"""``lowbit plan``: what a model needs at each precision, where it fits, how fast it could go."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from lowbit.checkpoints.io.outputs import save_figure
from lowbit.checkpoints.streaming import open_model
from lowbit.cli import _budget, _common
from lowbit.errors import LowbitError
from lowbit.planning.archs import parse_params
from lowbit.planning.estimate import plan
from lowbit.planning.hardware import load_hardware, select_devices
from lowbit.plans.rules import action_label

_EPILOG = """\
examples:
  lowbit plan --params 1B                      the per-billion table, with scales beside it
  lowbit plan smollm2 --context 8192 --batch 8 the shipped SmolLM2 GGUF: KV cache, fit, speed
  lowbit plan --config config.json --context 8192 --batch 8 --kv fp8 --train
  lowbit plan model.safetensors --keep-embeddings bf16 --precisions int4:g128:fp16
  lowbit plan --params 70B --precisions bf16,fp8,int4:g128:fp16 --devices h100,mi300x
  lowbit plan smollm2 --budget 4.5 --schemes int3:g128,int4:g128,int8:ch   (proxy scan)
  lowbit plan smollm2 --budget 4.5 --sensitivity sens.json       the choice, nothing written

schemes: FORMAT[:gN|:ch|:t][:SCALEFMT][:asym][:dq], as every lowbit command reads them: with
no granularity a format gets the weight layout lowbit quantize gives it (int8 = int8:ch, one
FP32 scale per output channel; nf4 = nf4:g64; MX formats blocks of 32); bf16, fp16, fp32 alone
are plain casts. E.g. int4:g128:fp16 (4.125 bits/weight), nf4:dq (~4.127), int8:ch:fp16; MX:
mxfp8, mxfp6, mxfp4, mxint8 (E8M0 rule: mxfp4:ct, :carry, :ceil); nvfp4 (fp4:g16:e4m3:ts,
4.5 bits); presets: q8_0, q4_0, q5_0 (q4_1, q5_1: not supported).
A plan file (--plan-file, the format lowbit quantize --plan reads) is priced tensor by tensor
as lowbit quantize decides it: its rules, its default (or each --precisions row) for the 2-D
linear weights, the rest kept as stored.
Speeds are upper bounds: decode = bandwidth / bytes read per token; prefill = dense peak at
the compute precision / (2 x parameters used per token). Formulas: docs/planning.md.
"""

DEFAULT_COLUMNS = ("rtx4090", "a100-80gb", "h100-sxm", "h200", "b200", "mi300x", "m2-ultra")


def register(sub: Any) -> None:
    p = sub.add_parser(
        "plan",
        help="memory, fit and speed of a model at each precision",
        description="What a model needs at each precision (weights with their scales, KV "
        "cache, activations, training states), which devices fit it, and upper bounds on "
        "its speed.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "model",
        nargs="?",
        help="config.json, safetensors file/folder, .gguf, a count (7B), or a shipped "
        "model: smollm2, minilm",
    )
    p.add_argument("--params", help="parameter count: 7B, 1.5B, 135M, 7e9")
    p.add_argument("--config", help="a Hugging Face config.json")
    p.add_argument(
        "--precisions", help="comma-separated schemes (default: every plain format + scaled forms)"
    )
    p.add_argument("--context", type=int, help="tokens in the KV cache / prefill length")
    p.add_argument("--batch", type=int, default=1, help="sequences at once (default 1)")
    p.add_argument("--kv", default="bf16", help="KV-cache precision: bf16, fp8, int8, int4, ...")
    p.add_argument("--train", action="store_true", help="add the training memory breakdown")
    p.add_argument(
        "--train-context",
        type=int,
        help="sequence length for training (default: --context or 2048)",
    )
    p.add_argument(
        "--keep-embeddings", metavar="FMT", help="keep embeddings and lm_head in FMT (e.g. bf16)"
    )
    p.add_argument("--keep-norms", metavar="FMT", help="keep 1-D tensors (norms, biases) in FMT")
    p.add_argument(
        "--plan-file",
        metavar="FILE",
        help="JSON/YAML plan file, as lowbit quantize --plan reads it (rules, default)",
    )
    p.add_argument(
        "--devices", help="device ids/names to show, or 'all' (default: a representative set)"
    )
    p.add_argument("--hardware-file", metavar="FILE", help="extra device rows (JSON/YAML)")
    p.add_argument(
        "--memory-fraction", type=float, default=0.9, help="usable share of device memory (0.9)"
    )
    p.add_argument("--plot", metavar="OUT.png", help="bar chart of memory by component")
    p.add_argument(
        "--overwrite", action="store_true", help="replace an existing --plot file lowbit drew"
    )
    _budget.add_options(p, measure="proxy", presets=False)
    _common.add_json(p)
    p.set_defaults(func=run)


def _model_arg(args: argparse.Namespace) -> Any:
    given = [x for x in (args.model, args.params, args.config) if x]
    if len(given) != 1:
        raise LowbitError("give exactly one model: MODEL, --params N or --config FILE")
    if args.params:
        return parse_params(args.params)
    return args.config or args.model


def run(args: argparse.Namespace) -> int:
    if _budget.wanted(args):
        return _mixed(args)

    names = _common.parse_names(args.devices, "--devices")
    devices = None if not names or names == ["all"] else names
    result = plan(
        _model_arg(args),
        precisions=_common.parse_names(args.precisions, "--precisions"),
        context=args.context,
        batch=args.batch,
        kv=args.kv,
        train=args.train,
        train_context=args.train_context,
        keep_embeddings=args.keep_embeddings,
        keep_norms=args.keep_norms,
        rules=args.plan_file,
        devices=devices,
        hardware_file=args.hardware_file,
        memory_fraction=args.memory_fraction,
    )
    if devices is None and names != ["all"]:
        catalog = load_hardware(args.hardware_file)
        ids = {d.id for d in catalog}
        columns = [d.id for d in select_devices([c for c in DEFAULT_COLUMNS if c in ids], catalog)]
    else:
        columns = [d.id for d in result.devices]
    if args.plot is not None:
        shown = {d.id: d for d in result.devices}
        _plot(result, Path(args.plot), [shown[c] for c in columns], args.overwrite)
    if args.json:
        _common.print_json(result.to_dict())
        return 0
    _print(result, columns)
    if args.plot:
        print(f"\nplot written to {args.plot}")
    return 0


def _mixed(args: argparse.Namespace) -> int:
    """``--budget`` / ``--size``: the mixed plan a scan gives, without quantizing."""
    _budget.check(args)
    if args.params or args.config:
        raise LowbitError("--budget/--size choose per tensor: give a checkpoint as MODEL")
    ckpt = open_model(args.model)
    mixed, scan = _budget.solve(args, ckpt, False if args.json else None)
    return _budget.print_dry_run(args, ckpt, mixed, scan)


# ---------------------------------------------------------------------------------------
# Text output
# ---------------------------------------------------------------------------------------

GB = 1e9
GIB = 2**30


def _gb(b: float | None) -> str:
    return "-" if b is None else f"{b / GB:,.3f}"


def _gib(b: float | None) -> str:
    return "-" if b is None else f"{b / GIB:,.3f}"


def _rate(v: float | None) -> str:
    """Compact tokens/s: 3 significant digits with k/M suffixes."""
    if v is None:
        return "-"
    for unit, scale in (("M", 1e6), ("k", 1e3)):
        if v >= scale:
            return f"{v / scale:.3g}{unit}"
    return f"{v:.3g}"


def _bits(v: float) -> str:
    return f"{v:.6g}"


def _print(p: Any, columns: list[str]) -> None:
    m = p.model
    print(f"Model: {m.name}  ({m.source}{', ' + m.architecture if m.architecture else ''})")
    print(f"  parameters: {m.params:,}")
    comps = {k: v for k, v in m.components.items() if v}
    if m.source != "params":
        print(
            "  by component: "
            + ", ".join(f"{k} {v:,} ({100 * v / m.params:.1f}%)" for k, v in comps.items())
        )
        dims = [
            ("layers", m.n_layers), ("hidden", m.hidden_size), ("heads", m.n_heads),
            ("kv heads", m.n_kv_heads), ("head dim", m.head_dim),
            ("intermediate", m.intermediate_size), ("vocab", m.vocab_size),
        ]  # fmt: skip
        known = [f"{k} {v}" for k, v in dims if v is not None]
        if known:
            extra = []
            if m.tied_embeddings is not None:
                extra.append("tied lm_head" if m.tied_embeddings else "separate lm_head")
            if m.n_experts:
                extra.append(f"{m.n_active_experts} of {m.n_experts} experts per token")
            if not m.is_decoder:
                extra.append("encoder")
            print("  " + ", ".join(known + extra))
    if m.stored_bytes is not None:
        print(
            f"  as stored: {m.stored_bytes:,} bytes = {_gb(m.stored_bytes)} GB, "
            f"{m.stored_bytes * 8 / m.params:.4g} bits/parameter"
        )
    for note in m.notes:
        print(f"  note: {note}")
    if p.rules:
        desc = "; ".join(f"{r.selector() or 'all'} -> {action_label(r.action)}" for r in p.rules)
        rest = (
            "2-D linear weights per row, the rest kept"
            if p.plan_file is not None
            else "everything else per row"
        )
        print(f"  mixed plan (first match wins): {desc}; {rest}")
    print()
    _print_weights(p)
    _print_fit(p, columns)
    _print_speed(p, columns)
    if p.training:
        _print_training(p, columns)


def _print_weights(p: Any) -> None:
    print("Weights  (GB = 10^9 bytes, GiB = 2^30; bits/w include scales and zero points)")
    groups: list[tuple[Any, list[Any]]] = []
    index = {}
    for r in p.rows:
        if r.base is not None and r.base in index:
            groups[index[r.base]][1].append(r)
        else:
            index[r.label] = len(groups)
            groups.append((r, []))
    rows = []
    for base, variants in groups:
        left = [
            base.label,
            _bits(base.bits_per_weight),
            _gb(base.weight_bytes),
            _gib(base.weight_bytes),
        ]
        if not variants:
            rows.append([*left, "", "", "", ""])
        for i, v in enumerate(variants):
            right = [v.label, _bits(v.bits_per_weight), _gb(v.weight_bytes), _gib(v.weight_bytes)]
            rows.append([*(left if i == 0 else ["", "", "", ""]), *right])
    headers = ["format", "bits/w", "GB", "GiB", "with scales", "bits/w", "GB", "GiB"]
    if all(not v for _, v in groups):
        rows = [r[:4] for r in rows]
        headers = headers[:4]
    _common.print_table(rows, headers, align="lrrrlrrr"[: len(headers)])
    print()


def _print_fit(p: Any, columns: list[str]) -> None:
    names = {d.id: d for d in p.devices}
    if p.context:
        kv = ", ".join(f"{k} {_gb(v)}" for k, v in p.kv_options.items())
        m = p.model
        print(
            f"Inference at context {p.context:,}, batch {p.batch}, KV cache in {p.kv_scheme.label}"
        )
        if p.kv_options:
            print(
                f"  KV cache GB by precision: {kv}  ({m.n_kv_heads} KV heads x {m.head_dim} "
                f"of {m.n_heads} query heads, {m.n_layers} layers)"
            )
        elif p.rows and p.rows[0].kv_bytes is None:
            print("  KV cache: unknown (needs layers, KV heads and head dim: give a config)")
    else:
        print("Fit  (weights only; add --context N --batch B for the KV cache and activations)")
    print(
        f"  devices needed with {p.memory_fraction:.0%} of each device's memory usable "
        "(memory counts as GiB)"
    )
    rows = []
    for r in p.rows:
        rows.append(
            [r.label, _gb(r.weight_bytes), _gb(r.kv_bytes), _gb(r.activation_bytes),
             _gb(r.total_bytes), *[str(r.devices_needed[c]) for c in columns]]
        )  # fmt: skip
    headers = ["format", "weights GB", "KV GB", "act GB", "total GB", *columns]
    _common.print_table(rows, headers, align="l" + "r" * (len(headers) - 1))
    mem = ", ".join(f"{c} {names[c].memory_gb:g}" for c in columns)
    print(f"  memory GB: {mem}")
    print()


def _print_speed(p: Any, columns: list[str]) -> None:
    if p.model.is_decoder:
        kv = " + KV cache" if p.context and p.rows and p.rows[0].kv_bytes else ""
        print(
            f"Decode tokens/s per sequence, UPPER BOUND = bandwidth x devices / (weight bytes "
            f"read per token{kv})"
        )
        rows = [[r.label, *[_rate(r.decode_tokens_per_s[c]) for c in columns]] for r in p.rows]
        _common.print_table(rows, ["format", *columns], align="l" + "r" * len(columns))
        if p.batch > 1:
            print(f"  the batch of {p.batch} decodes {p.batch}x this many tokens/s in total")
        print()
    print(
        "Prefill tokens/s, UPPER BOUND = dense peak at the compute precision x devices / "
        "(2 x params used per token)"
    )
    rows = [
        [r.label, *[f"{_rate(r.prefill_tokens_per_s[c])} {r.compute_precision[c] or ''}".strip()
                    for c in columns]]
        for r in p.rows
    ]  # fmt: skip
    _common.print_table(rows, ["format", *columns], align="l" + "r" * len(columns))
    print(
        f"  params used per token: {p.model.params_per_token:,.0f} (embedding lookups and "
        "unused experts left out); the precision each device computes in is shown"
    )
    print()


def _print_training(p: Any, columns: list[str]) -> None:
    print(
        f"Training with Adam at sequence length {p.train_context:,}, batch {p.batch} "
        "(devices needed if all states shard evenly, FSDP/ZeRO-3 style)"
    )
    rows = []
    for t in p.training:
        rows.append(
            [t.regime.name, "yes" if t.checkpointing else "no", f"{t.regime.state_bytes:.4g}",
             _gb(t.weights), _gb(t.grads), _gb(t.master), _gb(t.optimizer), _gb(t.activations),
             _gb(t.total_bytes), *[str(t.devices_needed[c]) for c in columns]]
        )  # fmt: skip
    headers = ["regime", "ckpt", "B/param", "weights", "grads", "master", "optim", "act",
               "total GB", *columns]  # fmt: skip
    _common.print_table(rows, headers, align="ll" + "r" * (len(headers) - 2))
    for r in p.training[::2]:
        print(f"  {r.regime.name}: {r.regime.description}")
    if p.training and p.training[0].activations is None:
        print("  activations: unknown for a bare parameter count (give a config)")
    print()


# ---------------------------------------------------------------------------------------
# Plot
# ---------------------------------------------------------------------------------------


def _plot(p: Any, out: Path, devices: list[Any], overwrite: bool) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ImportError("--plot needs matplotlib: pip install 'lowbit[plot]'") from None
    labels = [r.label for r in p.rows]
    weights = [r.weight_bytes / GB for r in p.rows]
    kv = [(r.kv_bytes or 0) / GB for r in p.rows]
    act = [(r.activation_bytes or 0) / GB for r in p.rows]
    fig, ax = plt.subplots(figsize=(max(7.5, 0.55 * len(labels) + 3.5), 4.8))
    x = range(len(labels))
    ax.bar(x, weights, label="weights", color="#4c72b0")
    if any(kv):
        ax.bar(x, kv, bottom=weights, label=f"KV cache ({p.kv_scheme.label})", color="#dd8452")
    if any(act):
        bottom = [a + b for a, b in zip(weights, kv, strict=True)]
        ax.bar(x, act, bottom=bottom, label="activations", color="#55a868")
    top = max(a + b + c for a, b, c in zip(weights, kv, act, strict=True))
    by_cap: dict[float, list[str]] = {}
    for d in devices:
        by_cap.setdefault(d.memory_gb, []).append(d.id)
    for cap_gb in sorted(by_cap)[:8]:
        cap = cap_gb * GIB / GB
        if cap > top * 1.6:
            break
        ax.axhline(cap, linestyle="--", linewidth=0.8, color="grey")
        ax.text(len(labels) - 0.5, cap, f"{' / '.join(by_cap[cap_gb])} ({cap_gb:g} GiB)",
                va="bottom", ha="right", fontsize=7, color="dimgrey")  # fmt: skip
    ax.set_xticks(list(x))
    ax.set_xticklabels(labels, rotation=45, ha="right", fontsize=8)
    ax.set_ylabel("GB (10^9 bytes)")
    ctx = f", context {p.context}, batch {p.batch}" if p.context else ""
    ax.set_title(f"{p.model.name}: memory by precision{ctx}", fontsize=10)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        save_figure(fig, out, overwrite=overwrite, dpi=120)
    finally:
        plt.close(fig)
