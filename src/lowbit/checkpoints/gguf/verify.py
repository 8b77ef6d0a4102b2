"""``lowbit verify`` for a GGUF file: the header parses and every tensor has a known type and lies
inside the file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lowbit.checkpoints.io import gguf_file as _gguf


def verify_gguf(p: Path) -> dict[str, Any]:
    header = _gguf.parse(p)
    types: dict[str, int] = {}
    for t in header.tensors.values():
        types[t.type_name] = types.get(t.type_name, 0) + 1
    arch = header.metadata.get("general.architecture")
    return {
        "path": str(p),
        "kind": "gguf",
        "tensors": len(header.tensors),
        "checks": ["GGUF header", "tensor types known", "every tensor inside the file"],
        "files": [{"file": p.name, "bytes": header.file_size, "sha256": "not recorded"}],
        "summary": {
            "gguf_version": header.version,
            "architecture": arch if isinstance(arch, str) else None,
            "metadata keys": len(header.metadata),
            **{f"{k} tensors": n for k, n in sorted(types.items())},
        },
    }
