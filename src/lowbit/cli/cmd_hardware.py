"""``lowbit hardware``: the accelerator catalog the planner uses."""

from __future__ import annotations

import argparse
from typing import Any

from lowbit.cli import _common
from lowbit.planning.hardware import PRECISION_KEYS, load_hardware, select_devices


def register(sub: Any) -> None:
    p = sub.add_parser(
        "hardware",
        help="the hardware catalog: memory, bandwidth, dense peak per precision",
        description="List the devices `lowbit plan` fits models to: memory, memory bandwidth "
        "and dense peak throughput per precision (TFLOPS; TOPS for int8), each row with its "
        "source. Add or override rows with --hardware-file (JSON, or YAML with PyYAML).",
    )
    p.add_argument("devices", nargs="*", help="device ids or names to show (default: all)")
    p.add_argument("--hardware-file", metavar="FILE", help="extra device rows (JSON/YAML)")
    p.add_argument("--sources", action="store_true", help="print each row's source and notes")
    _common.add_json(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    devices = select_devices(args.devices or None, load_hardware(args.hardware_file))
    if args.json:
        _common.print_json([d.to_dict() for d in devices])
        return 0
    keys = [k for k in PRECISION_KEYS if any(d.peak(k) for d in devices)]
    rows = [
        [d.id, d.name, f"{d.memory_gb:g}", f"{d.bandwidth_gbs:g}",
         *[f"{d.peak(k):g}" if d.peak(k) else "-" for k in keys]]
        for d in devices
    ]  # fmt: skip
    headers = ["id", "name", "memory GB", "GB/s", *keys]
    _common.print_table(rows, headers, align="ll" + "r" * (len(headers) - 2))
    print(
        "\nDense peak TFLOPS (TOPS for int8), no 2:4 sparsity; memory GB as the vendor states "
        "it (counted as GiB); bandwidth in 10^9 bytes/s."
    )
    if args.sources:
        print()
        for d in devices:
            print(f"{d.id}: {d.source}")
            if d.notes:
                print(f"  note: {d.notes}")
    else:
        print("Each row's source: lowbit hardware --sources (or --json).")
    return 0
