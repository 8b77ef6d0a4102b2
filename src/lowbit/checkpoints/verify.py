"""Check a checkpoint on disk without building a model: ``lowbit verify``'s library side.

:func:`verify_checkpoint` recognises what it is given and checks:

- a **lowbit** checkpoint folder: everything :class:`~lowbit.checkpoints.lowbit_format.
  LowbitCheckpoint` checks on open (the manifest's schema and digest, every recorded file inside
  the folder with its size and sha256, every array's dtype and shape in the shard headers), then
  decodes every tensor;
- a **compressed-tensors** folder: ``config.json``'s ``quantization_config`` parses (method,
  groups, weight arguments), every safetensors header is valid, and every quantized weight has
  its packed/int8/fp8 values, scale and (asymmetric) zero point with the dtypes and shapes its
  group's scheme gives;
- an **MLX** folder (mlx-lm's): ``lowbit.checkpoints.mlx.reader.verify_mlx``;
- a **GGUF** file: the header parses and every tensor has a known type and lies inside the
  file (:func:`lowbit.checkpoints._gguf.parse`);
- any other **safetensors** file or Hugging Face folder: its headers are valid.

The first problem found is raised as one :class:`~lowbit.errors.LowbitError`; a checkpoint that
passes gives a report of what was found.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from lowbit._json import path_exists
from lowbit.checkpoints import _gguf
from lowbit.checkpoints._ct_fp4 import fused_scales_differ
from lowbit.checkpoints._ct_layout import _ct_candidates, _ct_check_weight, _ct_groups
from lowbit.checkpoints._ct_transforms import input_transforms, transform_matrix
from lowbit.checkpoints._manifest import CHECKSUMS_KEY, MANIFEST
from lowbit.checkpoints.lowbit_format import LowbitCheckpoint, is_lowbit_checkpoint
from lowbit.checkpoints.mlx.reader import is_mlx_folder, verify_mlx
from lowbit.checkpoints.opener import open_checkpoint
from lowbit.checkpoints.readers import HuggingFaceFolder, _read_config
from lowbit.errors import LowbitError

__all__ = ["verify_checkpoint"]


def verify_checkpoint(path: str | os.PathLike[str], *, hashes: bool = True) -> dict[str, Any]:
    """Check a checkpoint and say what it holds.

    Args:
        path: a lowbit or compressed-tensors folder, a Hugging Face folder, a ``.gguf`` or
            ``.safetensors`` file.
        hashes: for a lowbit checkpoint, check the manifest's digest and every file's sha256
            (False: sizes only).

    Returns:
        ``{"path", "kind", "tensors", "checks": [what was checked], "files": [{"file",
        "bytes", "sha256"}], "summary": {...}}``; ``kind`` is ``lowbit``,
        ``compressed-tensors``, ``gguf``, ``safetensors`` or ``huggingface``.

    Raises:
        LowbitError: the first problem found, naming the file and what is wrong.
    """
    p = Path(path)
    if not path_exists(p):
        raise LowbitError(f"{p}: no such file or folder")
    if is_lowbit_checkpoint(p):
        return _lowbit(p, hashes)
    if p.is_dir() and _ct_config(p) is not None:
        return _compressed_tensors(p)
    if is_mlx_folder(p):
        return verify_mlx(p)
    if p.is_file():
        with open(p, "rb") as fh:
            magic = fh.read(4)
        if magic == b"GGUF" or p.suffix == ".gguf":
            return _gguf_file(p)
    return _plain(p)


# ------------------------------------------------------------------------------- lowbit


def _lowbit(p: Path, hashes: bool) -> dict[str, Any]:
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


# --------------------------------------------------------------------- compressed-tensors


def _ct_config(folder: Path) -> dict[str, Any] | None:
    """``config.json``'s quantization_config if it names compressed-tensors, else None."""
    cfg = _read_config(folder / "config.json")
    qc = (cfg or {}).get("quantization_config")
    if isinstance(qc, dict) and qc.get("quant_method") == "compressed-tensors":
        return qc
    return None


def _compressed_tensors(p: Path) -> dict[str, Any]:
    where = str(p / "config.json")
    qc = _ct_config(p)
    assert qc is not None
    if qc.get("quantization_status", "compressed") != "compressed":
        raise LowbitError(
            f"{where}: quantization_status {qc.get('quantization_status')!r}: only compressed "
            f"checkpoints hold packed weights"
        )
    groups = _ct_groups(qc, where)
    ckpt = HuggingFaceFolder(p)
    names = ckpt.names()
    suffixes = (".weight_scale", ".weight_packed", ".weight_zero_point", ".weight_shape",
                ".weight_global_scale")  # fmt: skip
    modules = sorted({n.rsplit(".", 1)[0] for n in names if n.endswith(suffixes)})
    all_modules = {n.rsplit(".", 1)[0] for n in names}
    per_format: dict[str, int] = {}
    for m in modules:
        cands = _ct_candidates(m, groups, all_modules)
        if not cands:
            raise LowbitError(f"{p}: {m} is stored quantized but no config group targets it")
        problems = [(n, _ct_check_weight(ckpt, m, g)) for n, g in cands]
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


# ---------------------------------------------------------------------------------- GGUF


def _gguf_file(p: Path) -> dict[str, Any]:
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


# ----------------------------------------------------------------------------- the rest


def _plain(p: Path) -> dict[str, Any]:
    ckpt = open_checkpoint(p)
    if ckpt.format == "gguf":  # a folder holding one .gguf
        return _gguf_file(ckpt.path)
    names = ckpt.names()
    shard_files = sorted({ckpt.info(n).file for n in names})
    return {
        "path": str(p),
        "kind": ckpt.format,
        "tensors": len(names),
        "checks": ["safetensors headers"],
        "files": [
            {"file": f.name, "bytes": f.stat().st_size, "sha256": "not recorded"}
            for f in shard_files
        ],
        "summary": {"bytes of tensor data": sum(ckpt.info(n).nbytes for n in names)},
    }
