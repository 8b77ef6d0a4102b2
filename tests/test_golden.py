"""Golden outputs pinned before the package layout changed: the same commands must keep writing
the same tensors and reports.

Each digest covers what a result is made of (a safetensors file's tensor table and data, a GGUF
file's tensor infos, data and non-lowbit metadata, a JSON report), not what may legitimately
grow beside it (``__metadata__`` in safetensors, ``lowbit.*`` keys in GGUF, new manifest fields).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import struct
from pathlib import Path

import pytest

from lowbit.cli import main
from tiny_models import shipped_path

pytestmark = pytest.mark.slow


def _cli(*args: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(list(args)) == 0
    return out.getvalue()


def _safetensors_digest(path: Path) -> str:
    """sha256 of the tensor table (sorted JSON, no ``__metadata__``) and the data bytes."""
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    header.pop("__metadata__", None)
    h = hashlib.sha256(json.dumps(header, sort_keys=True).encode())
    h.update(raw[8 + n :])
    return h.hexdigest()


def _gguf_digest(path: Path) -> str:
    """sha256 of the tensor infos and data and of every metadata value not named ``lowbit.*``."""
    import gguf

    reader = gguf.GGUFReader(path)
    h = hashlib.sha256()
    for field in reader.fields.values():
        if field.name.startswith("lowbit.") or field.name.startswith("GGUF."):
            continue
        h.update(field.name.encode())
        for i in field.data:
            h.update(bytes(field.parts[i]))
    for t in reader.tensors:
        h.update(f"{t.name}:{int(t.tensor_type)}:{list(t.shape)}".encode())
        h.update(bytes(t.data))
    return h.hexdigest()


def _rounded(obj: object) -> object:
    """Floats to 9 significant digits: a sum's last bits may differ between CPU kernels."""
    if isinstance(obj, float):
        return float(f"{obj:.9g}")
    if isinstance(obj, dict):
        return {k: _rounded(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_rounded(v) for v in obj]
    return obj


def _json_digest(obj: object) -> str:
    return hashlib.sha256(json.dumps(_rounded(obj), sort_keys=True).encode()).hexdigest()


@pytest.fixture(scope="module")
def smollm2() -> Path:
    return shipped_path("smollm2")


@pytest.fixture(scope="module")
def minilm() -> Path:
    return shipped_path("minilm")


GOLDEN = {
    "smol-int4/model.safetensors": "a71b43555114751f1ccf1e60e8ebc4f5c2b2cbb821e1c69ccc3d143d193686a9",
    "smol-int4/lowbit.json:tensors": "5c41bca4121da4190b6a5ab3fdd06bca246673a223d8d096cee3d4671e69eb6e",
    "minilm-int4/model.safetensors": "8211d04f95a4fb9fb2368d17d56d2251c24f4b006d8def64d8c5e88c1f0424f1",
    "minilm-w8/model.safetensors": "4eee9ed9928ecddd1fbc86003d3caf988494b7edb2e8640fbe88ab7e51902185",
    "minilm-w8/config.json:quantization_config": "bdfb88d7e5f28e67817c9523dd9b557bb31297fc927ea615f37370ea1a8e9315",
    "smol.Q4_0.gguf": "5da1ab81fa1d883cd57abeff5050689f7fa933ca52c7ec5c64d5b9a29fd440d6",
    # q8_0 row: llama.cpp's rounding (scale_method ggml), labelled q8_0 (issue 14); a "router"
    # component (0 bytes in a dense model) beside the others since mixtures of experts (issue 27)
    "plan --params 1B --json": "f4d2cb2b00dd19a38667371e90945c3d0f09e112a3f5cb6feaa5b715c7f722b4",
    "compare --json": "7041c60113d6eefd799da5a8b30a8968820c8c5b1e11af18d45f150a9e6ed1a1",
}


def test_lowbit_checkpoint_smollm2(smollm2: Path, tmp_path: Path) -> None:
    """SmolLM2 int4 g128 in lowbit's format: same tensors, same manifest entries."""
    out = tmp_path / "smol-int4"
    _cli("quantize", str(smollm2), "--to", "int4", "--group", "128", "--out", str(out),
         "--no-progress")  # fmt: skip
    manifest = json.loads((out / "lowbit.json").read_text())
    assert _safetensors_digest(out / "model.safetensors") == GOLDEN["smol-int4/model.safetensors"]
    assert _json_digest(manifest["tensors"]) == GOLDEN["smol-int4/lowbit.json:tensors"]


def test_lowbit_checkpoint_minilm(minilm: Path, tmp_path: Path) -> None:
    """MiniLM int4 g128 in lowbit's format: same tensors."""
    out = tmp_path / "minilm-int4"
    _cli("quantize", str(minilm), "--to", "int4", "--group", "128", "--out", str(out),
         "--no-progress")  # fmt: skip
    assert _safetensors_digest(out / "model.safetensors") == GOLDEN["minilm-int4/model.safetensors"]


def test_compressed_tensors_minilm(minilm: Path, tmp_path: Path) -> None:
    """MiniLM int8 per channel as compressed-tensors: same tensors, same quantization_config."""
    out = tmp_path / "minilm-w8"
    _cli("quantize", str(minilm), "--to", "int8", "--out-format", "compressed-tensors",
         "--out", str(out), "--no-progress")  # fmt: skip
    config = json.loads((out / "config.json").read_text())
    assert _safetensors_digest(out / "model.safetensors") == GOLDEN["minilm-w8/model.safetensors"]
    assert (
        _json_digest(config["quantization_config"])
        == GOLDEN["minilm-w8/config.json:quantization_config"]
    )


def test_gguf_q4_0_smollm2(smollm2: Path, tmp_path: Path) -> None:
    """SmolLM2 to GGUF Q4_0: same tensors and metadata."""
    out = tmp_path / "smol.Q4_0.gguf"
    _cli("quantize", str(smollm2), "--to", "q4_0", "--out-format", "gguf", "--out", str(out),
         "--no-progress")  # fmt: skip
    assert _gguf_digest(out) == GOLDEN["smol.Q4_0.gguf"]


@pytest.mark.parametrize(
    "args", [("plan", "--params", "1B", "--json"), ("compare", "--json")], ids=" ".join
)
def test_reports(args: tuple[str, ...]) -> None:
    """`lowbit plan --params 1B --json` and `lowbit compare --json`: the same report."""
    key = " ".join(args[:1] + args[1:])
    assert _json_digest(json.loads(_cli(*args))) == GOLDEN[key]
