"""``lowbit verify``: what it reports for good lowbit, compressed-tensors and GGUF checkpoints
written by ``lowbit quantize``, and one line with exit status 2 for tampered ones."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from lowbit.checkpoints.io import safetensors as _safetensors
from lowbit.cli import main

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("gguf")
pytestmark = pytest.mark.torch

from tiny_models import save_gguf, save_hf_folder, tiny_llama  # noqa: E402


@pytest.fixture(scope="module")
def outputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A tiny llama as a HF folder and a GGUF, quantized to each output format."""
    root = tmp_path_factory.mktemp("verify-cli")
    model = tiny_llama()
    hf = save_hf_folder(model, root / "tiny")
    gguf = save_gguf(model, root / "tiny.gguf")
    out = {"hf": hf, "gguf-src": gguf}
    runs = {
        "lowbit": [str(hf), "--to", "int4", "--group", "32"],
        "lowbit-gguf": [str(gguf), "--to", "nf4"],
        "ct": [str(hf), "--to", "int4", "--group", "32", "--out-format", "compressed-tensors"],
        "gguf": [str(gguf), "--to", "q4_0", "--out-format", "gguf"],
    }
    for key, args in runs.items():
        out[key] = root / (f"{key}.gguf" if key == "gguf" else key)
        assert main(["quantize", *args, "--out", str(out[key]), "--no-progress"]) == 0
    return out


@pytest.fixture
def copy_of(outputs: dict[str, Path], tmp_path: Path) -> Any:
    def make(key: str) -> Path:
        src = outputs[key]
        dest = tmp_path / src.name
        if src.is_dir():
            shutil.copytree(src, dest)
        else:
            shutil.copyfile(src, dest)
        return dest

    return make


def _refused(capsys: pytest.CaptureFixture[str], path: Path, *extra: str) -> str:
    """Run verify expecting exit 2 and one error line; return that line."""
    capsys.readouterr()
    assert main(["verify", str(path), *extra]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("lowbit verify: error: "), captured.err
    assert captured.out == ""
    return lines[0]


def _report(capsys: pytest.CaptureFixture[str], path: Path, *extra: str) -> dict[str, Any]:
    capsys.readouterr()
    assert main(["verify", str(path), "--json", *extra]) == 0
    return json.loads(capsys.readouterr().out)


# ------------------------------------------------------------------------------- good ones


@pytest.mark.parametrize("key", ["lowbit", "lowbit-gguf"])
def test_good_lowbit_folder(
    outputs: dict[str, Path], key: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every recorded file's sha256 matches, every tensor decodes; the table lists the files."""
    doc = _report(capsys, outputs[key])
    assert doc["ok"] and doc["kind"] == "lowbit" and doc["tensors"] == 21
    assert doc["summary"]["quantized tensors"] == 14 and doc["summary"]["unrecorded files"] == 0
    names = {f["file"] for f in doc["files"]}
    assert "model.safetensors" in names
    assert ("source_metadata.gguf" in names) == (key == "lowbit-gguf")
    assert ("tokenizer.json" in names) == (key == "lowbit")
    assert {f["sha256"] for f in doc["files"]} == {"matches"}
    assert "every tensor decodes" in doc["checks"] and "file sha256" in doc["checks"]
    assert main(["verify", str(outputs[key])]) == 0
    text = capsys.readouterr().out
    assert text.startswith(f"lowbit checkpoint {outputs[key]}: OK (21 tensors)")
    assert "model.safetensors" in text and "matches" in text
    quick = _report(capsys, outputs[key], "--no-hash")
    assert {f["sha256"] for f in quick["files"]} == {"not checked"}
    assert "file sha256" not in quick["checks"]


def test_good_compressed_tensors_folder(
    outputs: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """quantization_config parses and all 14 packed weights fit their group's scheme."""
    doc = _report(capsys, outputs["ct"])
    assert doc["kind"] == "compressed-tensors" and doc["summary"]["quantized weights"] == 14
    assert doc["summary"]["pack-quantized weights"] == 14
    assert main(["verify", str(outputs["ct"])]) == 0
    assert "compressed-tensors checkpoint" in capsys.readouterr().out


def test_good_gguf_and_plain_files(
    outputs: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """A GGUF's header and tensor types; a plain Hugging Face folder's headers."""
    doc = _report(capsys, outputs["gguf"])
    assert doc["kind"] == "gguf" and doc["tensors"] == 21
    assert doc["summary"]["Q4_0 tensors"] == 14 and doc["summary"]["architecture"] == "llama"
    doc = _report(capsys, outputs["hf"])
    assert doc["kind"] == "huggingface" and doc["tensors"] == 21


def test_unrecorded_file_is_listed(copy_of: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """A file added to a lowbit folder is not an error (lowbit does not read it) but is listed
    as not recorded, so its presence is visible."""
    out = copy_of("lowbit")
    (out / "notes.txt").write_text("added later")
    doc = _report(capsys, out)
    assert doc["summary"]["unrecorded files"] == 1
    assert {"file": "notes.txt", "bytes": 11, "sha256": "not recorded"} in doc["files"]


# ---------------------------------------------------------------------------- tampered ones


def test_lowbit_flipped_byte(copy_of: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """A flipped code byte fails the sha256 (exit 2, one line); --no-hash passes it."""
    out = copy_of("lowbit")
    shard = out / "model.safetensors"
    key = next(k for k in _safetensors.parse(shard).tensors if k.endswith(":codes"))
    offset = _safetensors.parse(shard).tensors[key].offset
    raw = bytearray(shard.read_bytes())
    raw[offset] ^= 0x01
    shard.write_bytes(bytes(raw))
    assert "model.safetensors: its sha256" in _refused(capsys, out)
    assert main(["verify", str(out), "--no-hash"]) == 0


def test_lowbit_tampered_manifest(copy_of: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """int4 -> nf4 in the manifest, then the manifest removed."""
    out = copy_of("lowbit")
    doc = json.loads((out / "lowbit.json").read_text())
    entry = next(e for e in doc["tensors"].values() if e["kind"] == "quantized")
    entry["tensor"]["scheme"]["format"] = "nf4"
    (out / "lowbit.json").write_text(json.dumps(doc))
    assert "manifest_sha256 does not match" in _refused(capsys, out)
    (out / "lowbit.json").unlink()
    assert "no lowbit.json" in _refused(capsys, out)


def test_compressed_tensors_tampered(copy_of: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """A config whose bits or strategy disagree with the stored arrays, or that is not JSON."""
    out = copy_of("ct")
    cfg_path = out / "config.json"
    cfg = json.loads(cfg_path.read_text())
    weights = cfg["quantization_config"]["config_groups"]["group_0"]["weights"]
    weights["num_bits"] = 8
    cfg_path.write_text(json.dumps(cfg))
    assert "weight_packed is I32" in _refused(capsys, out)
    weights.update(num_bits=4, strategy="channel", group_size=None)
    cfg_path.write_text(json.dumps(cfg))
    assert "weight_scale has shape" in _refused(capsys, out)
    cfg_path.write_text("{")
    assert "not valid JSON" in _refused(capsys, out)


def test_gguf_truncated(copy_of: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """A GGUF cut short: a tensor runs past the end of the file."""
    out = copy_of("gguf")
    out.write_bytes(out.read_bytes()[:-100])
    line = _refused(capsys, out)
    assert "truncated" in line and "gguf.gguf" in line


def test_missing_path(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert "no such file or folder" in _refused(capsys, tmp_path / "absent")
