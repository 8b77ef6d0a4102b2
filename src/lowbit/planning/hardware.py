"""The hardware catalog: accelerators with memory, bandwidth and dense peak throughput.

The rows live in a data file (``lowbit/data/hardware.json``), each with its source. Users add
or override rows with their own file of the same shape (JSON; YAML if PyYAML is installed):
``{"devices": [{"id": ..., "name": ..., "memory_gb": ..., "bandwidth_gbs": ...,
"tflops": {"bf16": ...}, "source": ...}]}`` or just the list. A row whose ``id`` matches a
catalog row replaces it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from lowbit._files import read_data_file
from lowbit.errors import LowbitError

#: The precision keys a row's ``tflops`` may hold.
PRECISION_KEYS = ("fp64", "fp32", "tf32", "fp16", "bf16", "fp8", "fp6", "int8", "fp4")
GIB = 2**30


@dataclass(frozen=True, eq=False)
class Device:
    """One catalog row. ``memory_gb`` counts as GiB; bandwidth in 1e9 B/s; tflops dense."""

    id: str
    name: str
    memory_gb: float
    bandwidth_gbs: float
    tflops: Mapping[str, float]
    source: str
    vendor: str = ""
    kind: str = "gpu"
    notes: str = ""
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def memory_bytes(self) -> int:
        """Capacity in bytes (the vendor's GB read as GiB)."""
        return int(self.memory_gb * GIB)

    def peak(self, key: str) -> float | None:
        """Dense peak in TFLOPS (TOPS for int8) at a precision key, or None if not listed."""
        return self.tflops.get(key)

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "name": self.name,
            "vendor": self.vendor,
            "kind": self.kind,
            "memory_gb": self.memory_gb,
            "bandwidth_gbs": self.bandwidth_gbs,
            "tflops": dict(self.tflops),
            "source": self.source,
            "notes": self.notes,
        }


def _device(row: Any, where: str) -> Device:
    if not isinstance(row, Mapping):
        raise LowbitError(f"{where}: each device must be an object, got {row!r}")
    label = row.get("id") or row.get("name") or "?"
    missing = [k for k in ("name", "memory_gb", "bandwidth_gbs", "tflops") if k not in row]
    if missing:
        raise LowbitError(f"{where}: device {label!r} lacks {', '.join(missing)}")

    def positive(key: str, value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise LowbitError(f"{where}: device {label!r}: {key} must be a number, got {value!r}")
        if not math.isfinite(value) or value <= 0:
            raise LowbitError(f"{where}: device {label!r}: {key} must be positive, got {value!r}")
        return float(value)

    tflops = row["tflops"]
    if not isinstance(tflops, Mapping):
        raise LowbitError(
            f"{where}: device {label!r}: tflops must be an object of precision: TFLOPS"
        )
    peaks = {}
    for key, value in tflops.items():
        if key not in PRECISION_KEYS:
            raise LowbitError(
                f"{where}: device {label!r}: unknown precision {key!r} in tflops "
                f"(allowed: {', '.join(PRECISION_KEYS)})"
            )
        if value is not None:
            peaks[key] = positive(f"tflops.{key}", value)
    known = {
        "id",
        "name",
        "vendor",
        "kind",
        "memory_gb",
        "bandwidth_gbs",
        "tflops",
        "source",
        "notes",
    }
    return Device(
        id=str(row.get("id") or _slug(str(row["name"]))),
        name=str(row["name"]),
        memory_gb=positive("memory_gb", row["memory_gb"]),
        bandwidth_gbs=positive("bandwidth_gbs", row["bandwidth_gbs"]),
        tflops=peaks,
        source=str(row.get("source") or "user file"),
        vendor=str(row.get("vendor") or ""),
        kind=str(row.get("kind") or "gpu"),
        notes=str(row.get("notes") or ""),
        extra={k: v for k, v in row.items() if k not in known},
    )


def _slug(name: str) -> str:
    return "-".join("".join(c if c.isalnum() else " " for c in name.lower()).split())


def _rows(data: Any, where: str) -> list[Device]:
    rows = data.get("devices") if isinstance(data, Mapping) else data
    if not isinstance(rows, list):
        raise LowbitError(f'{where}: expected a list of devices or {{"devices": [...]}}')
    return [_device(r, where) for r in rows]


def load_hardware(extra: Iterable[str | Path] | str | Path | None = None) -> tuple[Device, ...]:
    """The catalog rows, plus (or overridden by, matching ``id``) rows from user files.

    Raises:
        LowbitError: a malformed file or row (the message names the row and field).
    """
    text = resources.files("lowbit").joinpath("data/hardware.json").read_text(encoding="utf-8")
    devices = {d.id: d for d in _rows(json.loads(text), "hardware catalog")}
    files = [extra] if isinstance(extra, (str, Path)) else list(extra or [])
    for f in files:
        for d in _rows(read_data_file(f), str(f)):
            devices[d.id] = d
    return tuple(devices.values())


def select_devices(names: Sequence[str] | None, catalog: Sequence[Device]) -> tuple[Device, ...]:
    """Pick devices by id or name (case-insensitive, unique prefix allowed); None: all.

    Raises:
        LowbitError: a name that matches no device, or several.
    """
    if not names:
        return tuple(catalog)
    out = []
    for name in names:
        key = name.strip().lower()
        exact = [d for d in catalog if key in (d.id.lower(), d.name.lower())]
        hits = exact or [
            d for d in catalog if d.id.lower().startswith(key) or key in d.name.lower()
        ]
        if len(hits) != 1:
            ids = ", ".join(d.id for d in (hits or catalog))
            what = "matches several devices" if hits else "matches no device"
            raise LowbitError(f"{name!r} {what}; choose from {ids}")
        out.append(hits[0])
    return tuple(out)
