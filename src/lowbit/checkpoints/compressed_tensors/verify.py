"""``lowbit verify`` for a compressed-tensors folder: its config parses, every quantized weight has
the arrays its group's scheme gives, its transforms can be applied.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lowbit.checkpoints.compressed_tensors.fp4 import fused_scales_differ
from lowbit.checkpoints.compressed_tensors.layout import (
    ct_candidates,
    ct_check_weight,
    ct_groups,
)
from lowbit.checkpoints.compressed_tensors.transforms import input_transforms, transform_matrix
from lowbit.checkpoints.readers import HuggingFaceFolder, read_config
from lowbit.errors import LowbitError


def ct_config(folder: Path) -> dict[str, Any] | None:
    """``config.json``'s quantization_config if it names compressed-tensors, else None."""
    cfg = read_config(folder / "config.json")
    qc = (cfg or {}).get("quantization_config")
    if isinstance(qc, dict) and qc.get("quant_method") == "compressed-tensors":
        return qc
    return None


def verify_compressed_tensors(p: Path) -> dict[str, Any]:
    where = str(p / "config.json")
    qc = ct_config(p)
    assert qc is not None
    if qc.get("quantization_status", "compressed") != "compressed":
        raise LowbitError(
            f"{where}: quantization_status {qc.get('quantization_status')!r}: only compressed "
            f"checkpoints hold packed weights"
        )
    groups = ct_groups(qc, where)
    ckpt = HuggingFaceFolder(p)
    names = ckpt.names()
    suffixes = (".weight_scale", ".weight_packed", ".weight_zero_point", ".weight_shape",
                ".weight_global_scale")  # fmt: skip
    modules = sorted({n.rsplit(".", 1)[0] for n in names if n.endswith(suffixes)})
    all_modules = {n.rsplit(".", 1)[0] for n in names}
    per_format: dict[str, int] = {}
    for m in modules:
        cands = ct_candidates(m, groups, all_modules)
        if not cands:
            raise LowbitError(f"{p}: {m} is stored quantized but no config group targets it")
        problems = [(n, ct_check_weight(ckpt, m, g)) for n, g in cands]
        fits = [(n, g) for (n, g), (_, why) in zip(cands, problems, strict=True) if why is None]
        if not fits:
            gname, why = problems[0]
            raise LowbitError(f"{p}: {m} ({gname}): {why}")
        fmt = fits[0][1]["format"]
        per_format[fmt] = per_format.get(fmt, 0) + 1
    if not modules:
        raise LowbitError(
            f"{p}: quantization_config names compressed-tensors but no weight is quantized"
        )
    why = fused_scales_differ(ckpt.get, set(names))
    if why:
        raise LowbitError(f"{p}: {why}")
    rotated = _ct_transforms(ckpt, qc, where)
    files = [
        {"file": f.name, "bytes": f.stat().st_size, "sha256": "not recorded"}
        for f in sorted({ckpt.info(n).file for n in names})
    ]
    return {
        "path": str(p),
        "kind": "compressed-tensors",
        "tensors": len(names),
        "checks": [
            "quantization_config",
            "safetensors headers",
            "weights, scales and zero points match their group's scheme",
            "fused layers (q/k/v, gate/up) share one NVFP4 global scale",
            *(
                ["transform_config: online input rotations lowbit applies, their matrices"]
                if rotated
                else []
            ),
        ],
        "files": files,
        "summary": {
            "config groups": len(groups),
            "quantized weights": len(modules),
            **{f"{k} weights": n for k, n in sorted(per_format.items())},
            **({"online input transforms": rotated} if rotated else {}),
            "version": qc.get("version"),
        },
    }


def _ct_transforms(ckpt: Any, qc: dict[str, Any], where: str) -> int:
    """Check a folder's ``transform_config`` as ``lowbit.load_model`` reads it (its online
    input transforms, each stored matrix's shape and, for ``hadamard``, Sylvester's values);
    the number of online transforms.

    Raises:
        LowbitError: a transform lowbit cannot apply, a stored matrix that is wrong, or a
            ``random-hadamard`` transform without one.
    """
    transforms = input_transforms(qc, where)
    for t in transforms:
        suffix = f".{t.tensor_suffix}.weight"
        stored = [n for n in ckpt.names() if n.endswith(suffix)]
        for n in stored:
            size = t.head_dim or int(ckpt.info(n).shape[0])
            transform_matrix(t, n[: -len(suffix)], size, lambda _layer, n=n: ckpt.get(n))
        if not stored and t.type != "hadamard":
            raise LowbitError(f"{where}: the {t.type} transform {t.group!r} stores no matrix")
    return len(transforms)
