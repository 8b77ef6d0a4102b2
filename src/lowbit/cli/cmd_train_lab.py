"""``lowbit train-lab``: train one small transformer under several precision recipes."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from lowbit._optional import require
from lowbit.checkpoints.io.outputs import check_output
from lowbit.cli import _common
from lowbit.errors import LowbitError

_EPILOG = """\
recipes (--list shows all with one line each):
  fp32                  the reference
  fp16, fp16-scaled     FP16 matmuls + FP32 master weights, without / with loss scaling
  bf16                  BF16 matmuls + FP32 master weights
  bf16-pure[-sr]        BF16 weights too (updates rounded to nearest / stochastically)
  fp8-hybrid[-current]  E4M3 forward, E5M2 backward, delayed / current scaling
  fp8-e4m3, fp8-e5m2    one FP8 format both ways; fp8-mx: MX blocks of 32
  qat-int8, qat-int4, qat-int4-channel, qat-nf4, qat-fp4, qat-w4a8
                        quantization-aware training; with fp32 in the run, each also
                        gets a ptq-* row: the FP32 model quantized after training

This is emulation on the CPU: every rounding is exact, the arithmetic is float32, so
the losses are what the formats give and the wall times are not hardware speeds.

examples:
  lowbit train-lab                                   the default six recipes
  lowbit train-lab --steps 120 --plot curves.png     a short run (about 2 minutes)
  lowbit train-lab --recipes all --json > lab.json
"""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "train-lab",
        help="train a small transformer in FP32/FP16/BF16/FP8/QAT and compare the losses",
        description="Train one small decoder-only transformer on CPython's documentation\n"
        "(byte level, held-out validation split) under several precision recipes: the same\n"
        "initial weights, the same batches, only the numerics differ. Prints the final\n"
        "training and validation losses, skipped steps, overflows, gradient underflow and\n"
        "wall time per recipe, and checks the textbook claims against them.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--recipes",
        help="comma-separated recipe names, or 'all' (default: fp32,fp16,fp16-scaled,bf16,fp8-hybrid,qat-int4)",
    )
    p.add_argument("--steps", type=int, help="optimizer steps per recipe (default 400)")
    p.add_argument("--batch-size", type=int, help="sequences per batch (default 16)")
    p.add_argument("--lr", type=float, help="peak learning rate (default 2e-3)")
    p.add_argument("--seed", type=int, help="seed of the weights and batch order (default 0)")
    p.add_argument("--d-model", type=int, help="model width (default 128)")
    p.add_argument("--layers", type=int, help="transformer blocks (default 4)")
    p.add_argument("--ctx", type=int, help="context length in bytes (default 64)")
    p.add_argument(
        "--threads", type=int, help="torch CPU threads (default 1; results depend on it)"
    )
    p.add_argument(
        "--plot", metavar="PNG", help="write the loss curves of every recipe to this PNG"
    )
    p.add_argument(
        "--save-dir", metavar="DIR", help="write each QAT model as a quantized checkpoint"
    )
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace --plot / --save-dir files that lowbit wrote before (others are refused)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    p.add_argument("--list", action="store_true", help="list the recipes and exit")
    _common.add_json(p)
    p.set_defaults(func=run)


def _config(args: argparse.Namespace) -> Any:
    from lowbit.training.lab import LabConfig
    from lowbit.training.model import ModelConfig

    mk = {k: v for k, v in (("d_model", args.d_model), ("n_layers", args.layers),
                            ("ctx", args.ctx)) if v is not None}  # fmt: skip
    ck = {k: v for k, v in (("steps", args.steps), ("batch_size", args.batch_size),
                            ("lr", args.lr), ("seed", args.seed),
                            ("threads", args.threads)) if v is not None}  # fmt: skip
    for k, v in {**mk, **ck}.items():  # --seed 0 is fine (lowbit.cli checks --seed)
        if k != "seed" and isinstance(v, int) and v < 1:
            raise LowbitError(f"--{k.replace('_', '-')} must be positive, got {v}")
    return LabConfig(model=ModelConfig(**mk), **ck)


def _progress(total_steps: int, enabled: bool) -> Any:
    state = {"name": None, "t0": 0.0}

    def cb(name: str, step: int, loss: float) -> None:
        if not enabled:
            return
        if name != state["name"]:
            state["name"], state["t0"] = name, time.perf_counter()
        if step % max(1, total_steps // 10) == 0 or step == total_steps - 1:
            el = time.perf_counter() - state["t0"]
            print(f"  {name:<20} step {step + 1:>5}/{total_steps}  loss {loss:7.4f}  {el:6.1f} s",
                  file=sys.stderr, flush=True)  # fmt: skip

    return cb


def _check_outputs(args: argparse.Namespace, names: list[str]) -> None:
    """Refuse a --plot or --save-dir file that may not be written, before training."""
    from pathlib import Path

    from lowbit.training.recipes import get_recipe

    if args.plot is not None:
        check_output(args.plot, overwrite=args.overwrite)
    if args.save_dir is not None and Path(args.save_dir).is_dir():
        for n in names:
            if get_recipe(n).qat is not None:
                check_output(Path(args.save_dir) / f"{n}.safetensors", overwrite=args.overwrite)


def run(args: argparse.Namespace) -> int:
    require("torch", what="lowbit train-lab")
    from lowbit.training.recipes import DEFAULT_RECIPES, RECIPES

    if args.list:
        if args.json:
            _common.print_json({n: r.to_dict() for n, r in RECIPES.items()})
        else:
            _common.print_table([[n, r.summary] for n, r in RECIPES.items()], ["recipe", "what"])
        return 0
    names = _common.parse_names(args.recipes, "--recipes") or list(DEFAULT_RECIPES)
    if names == ["all"]:
        names = list(RECIPES)
    from lowbit.training.lab import EMULATION_NOTE, plot, train_lab
    from lowbit.training.recipes import get_recipe

    for n in names:
        get_recipe(n)  # fail fast on a typo
    cfg = _config(args)
    quiet = args.quiet or args.json
    if not quiet:
        m = cfg.model
        print(f"lowbit train-lab: {len(names)} recipes x {cfg.steps} steps, {m.n_layers}-layer "
              f"d={m.d_model} decoder, ctx {m.ctx}, batch {cfg.batch_size}, seed {cfg.seed}",
              file=sys.stderr)  # fmt: skip
        print(EMULATION_NOTE, file=sys.stderr)
    _check_outputs(args, names)  # before minutes of training, not after
    lab = train_lab(names, cfg, callback=_progress(cfg.steps, not quiet), save_dir=args.save_dir,
                    overwrite=args.overwrite)  # fmt: skip
    if args.plot is not None:
        plot(lab, args.plot, overwrite=args.overwrite)
    if args.json:
        out = lab.to_dict()
        out["claims"] = lab.claims()
        if args.plot:
            out["plot"] = args.plot
        _common.print_json(out)
        return 0
    print(EMULATION_NOTE)
    print()
    headers, rows = lab.table()
    _common.print_table(rows, headers, align="lrrrrrrrl")
    said = lab.claims()
    if said:
        print()
        for line in said:
            print(f"* {line}")
    if args.plot:
        print(f"\nloss curves: {args.plot}")
    return 0
