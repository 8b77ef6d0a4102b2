"""``lowbit verify`` for a lowbit checkpoint: the manifest's schema and digest, every file's size
and sha256, every tensor decoded.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from lowbit.checkpoints.lowbit_format.checkpoint import LowbitCheckpoint
from lowbit.checkpoints.lowbit_format.manifest import CHECKSUMS_KEY, MANIFEST
from lowbit.errors import LowbitError


def verify_lowbit(p: Path, hashes: bool) -> dict[str, Any]:
    with LowbitCheckpoint(p, verify=hashes) as ckpt:
        kinds: dict[str, int] = {}
        for name in ckpt.names():
            kinds[ckpt.entry(name)["kind"]] = kinds.get(ckpt.entry(name)["kind"], 0) + 1
            ckpt.close()  # one tensor's pages mapped at a time
            try:
                ckpt.get(name)
            except LowbitError as exc:
                raise LowbitError(f"{p}: tensor {name!r} does not decode: {exc}") from None
        doc = ckpt.manifest
    records = doc.get(CHECKSUMS_KEY) or {}
    files = [
        {"file": rel, "bytes": rec["size"], "sha256": "matches" if hashes else "not checked"}
        for rel, rec in records.items()
    ]
    unrecorded = sorted(
        rel
        for root, _, names in os.walk(p)  # symlinked folders are not followed
        for name in names
        if (rel := (Path(root) / name).relative_to(p).as_posix()) not in records and rel != MANIFEST
    )
    files += [{"file": rel, "bytes": (p / rel).stat().st_size, "sha256": "not recorded"}
              for rel in unrecorded]  # fmt: skip
    checks = ["manifest schema", "files inside the folder", "file sizes"]
    if hashes:
        checks[1:1] = ["manifest digest"]
        checks.append("file sha256")
    checks += ["array dtypes and shapes", "every tensor decodes"]
    return {
        "path": str(p),
        "kind": "lowbit",
        "tensors": sum(kinds.values()),
        "checks": checks,
        "files": files,
        "summary": {
            "lowbit_version": doc["lowbit_version"],
            "source_format": doc["source"]["format"],
            **{f"{k} tensors": n for k, n in sorted(kinds.items())},
            "unrecorded files": len(unrecorded),
        },
    }
