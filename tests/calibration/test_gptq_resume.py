"""lowbit.calibration._resume: a GPTQ run stopped after any block and started again writes the
same bytes as a run never stopped; a record of another run, or a damaged one, is never used."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import lowbit
from lowbit.calibration import _resume
from lowbit.calibration._resume import Resume, resume_folder
from lowbit.errors import LowbitError

pytestmark = pytest.mark.torch

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "make_big_checkpoints.py"
TINY = ["--layers", "4", "--hidden", "64", "--intermediate", "128", "--heads", "4",
        "--kv-heads", "2", "--head-dim", "16", "--vocab", "600", "--model", "llama-8b",
        "--tokenizer", "random"]  # fmt: skip
CALIB = {"samples": 4, "length": 32}


class _Killed(Exception):
    """Stands for the process dying right after a block's record was written."""


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    spec = importlib.util.spec_from_file_location("make_big_checkpoints", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, module)
    spec.loader.exec_module(module)
    out = tmp_path_factory.mktemp("big")
    assert module.main([str(out), *TINY]) == 0
    return out / "llama-8b"


def _quantize(model: Path, out: Path, **kw: Any) -> dict[str, Any]:
    plan = lowbit.PrecisionPlan.uniform("int4", group_size=32)
    return lowbit.quantize_model(model, plan, out, method="gptq", progress=False, threads=1,
                                 calibration=lowbit.Calibration(**CALIB), **kw)  # fmt: skip


def _files(out: Path) -> dict[str, str]:
    """Every file's SHA-256; of the manifest, what differs between any two runs left out: the
    method's seconds and the manifest's own checksum (over them)."""
    got = {}
    for p in sorted(out.iterdir()):
        data = p.read_bytes()
        if p.name == "lowbit.json":
            doc = json.loads(data)
            doc["method"].pop("seconds")
            doc.pop("manifest_sha256")
            data = json.dumps(doc, sort_keys=True).encode()
        got[p.name] = hashlib.sha256(data).hexdigest()
    return got


@pytest.fixture(scope="module")
def reference(model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    out = tmp_path_factory.mktemp("ref") / "q"
    _quantize(model, out)
    assert not resume_folder(out).exists()  # removed once the output is written
    return _files(out)


def _stop_after(monkeypatch: pytest.MonkeyPatch, block: int) -> None:
    save = Resume.save

    def save_then_die(self: Resume, i: int, *args: Any, **kw: Any) -> None:
        save(self, i, *args, **kw)
        if i == block:
            raise _Killed

    monkeypatch.setattr(Resume, "save", save_then_die)


def _blocks_saved(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The blocks whose records are saved from now on, in order (the ones calibrated)."""
    calibrated: list[int] = []
    save = Resume.save
    monkeypatch.setattr(
        Resume, "save", lambda self, i, *a: (calibrated.append(i), save(self, i, *a))
    )
    return calibrated


@pytest.mark.parametrize("block", [0, 2, 3])
def test_stopped_after_a_block_resumes_to_the_same_bytes(
    model: Path, reference: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    block: int,
) -> None:  # fmt: skip
    """Stopped after block 0, 2 or 3 (the last), the next run continues from the record (its
    blocks before are not calibrated again) and writes the uninterrupted run's bytes."""
    out = tmp_path / "q"
    with monkeypatch.context() as m:
        _stop_after(m, block)
        with pytest.raises(_Killed):
            _quantize(model, out)
    assert not out.exists()
    rec = json.loads((resume_folder(out) / "record.json").read_text())
    assert rec["block"] == block
    calibrated = _blocks_saved(monkeypatch)
    _quantize(model, out, resume=True)
    assert calibrated == list(range(block + 1, 4))
    assert _files(out) == reference
    assert not resume_folder(out).exists()


def test_record_of_another_run_is_not_used(
    model: Path, reference: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Other options (the calibration length): --resume refuses in one line; the default run
    warns in one line and starts over, with the right bytes."""
    out = tmp_path / "q"
    plan = lowbit.PrecisionPlan.uniform("int4", group_size=32)
    with monkeypatch.context() as m:
        _stop_after(m, 1)
        with pytest.raises(_Killed):
            lowbit.quantize_model(model, plan, out, method="gptq", progress=False, threads=1,
                                  calibration=lowbit.Calibration(samples=4, length=24))  # fmt: skip
    with pytest.raises(LowbitError, match=r"cannot resume .*different calibration, tokens"):
        _quantize(model, out, resume=True)
    with pytest.warns(UserWarning, match="not resuming from .*different calibration") as got:
        _quantize(model, out)
    assert len(got) == 1 and "\n" not in str(got[0].message)
    assert _files(out) == reference


@pytest.mark.parametrize("damage", ["states", "tensor", "record", "truncated"])
def test_damaged_record_is_not_trusted(
    model: Path, reference: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    damage: str,
) -> None:  # fmt: skip
    """A changed byte in the saved hidden states or a tensor file, a cut record: never used."""
    out = tmp_path / "q"
    with monkeypatch.context() as m:
        _stop_after(m, 1)
        with pytest.raises(_Killed):
            _quantize(model, out)
    folder = resume_folder(out)
    rec = json.loads((folder / "record.json").read_text())
    if damage == "states":
        p = folder / rec["states"]["file"]
        data = bytearray(p.read_bytes())
        data[100] ^= 1
        p.write_bytes(bytes(data))
    elif damage == "truncated":
        p = folder / rec["states"]["file"]
        p.write_bytes(p.read_bytes()[:-4])
    elif damage == "tensor":
        file = next(iter(rec["tensors"].values()))[0]
        p = folder / "tensors" / file
        data = bytearray(p.read_bytes())
        data[len(data) // 2] ^= 1
        p.write_bytes(bytes(data))
    else:
        p = folder / "record.json"
        p.write_text(p.read_text()[:-10])
    with pytest.raises(LowbitError, match="cannot resume"):
        _quantize(model, out, resume=True)
    with pytest.warns(UserWarning, match="not resuming"):
        _quantize(model, out)
    assert _files(out) == reference


def test_unmarked_folder_is_never_touched(model: Path, tmp_path: Path) -> None:
    """A folder by the record's name that lowbit did not mark: refused, left as it was."""
    out = tmp_path / "q"
    folder = resume_folder(out)
    folder.mkdir()
    (folder / "mine.txt").write_text("keep")
    with pytest.raises(LowbitError, match="not a lowbit resume record"):
        _quantize(model, out)
    assert (folder / "mine.txt").read_text() == "keep"


def test_nothing_to_resume_with_resume_flag(model: Path, tmp_path: Path) -> None:
    with pytest.raises(LowbitError, match=r"cannot resume .*no record yet"):
        _quantize(model, tmp_path / "q", resume=True)
    assert not resume_folder(tmp_path / "q").exists()  # nothing left behind


def test_second_run_while_one_holds_the_record(tmp_path: Path) -> None:
    """The record's lock: a second run into the same output fails at once."""
    first = Resume(tmp_path / ".q.lowbit-resume")
    assert first.open({"a": 1}) == 0
    try:
        with pytest.raises(LowbitError, match="another run"):
            Resume(tmp_path / ".q.lowbit-resume").open({"a": 1})
    finally:
        first.close()


@pytest.mark.slow
def test_kill_9_and_the_same_command_again(model: Path, reference: dict[str, str],
                                           tmp_path: Path) -> None:  # fmt: skip
    """A real ``kill -9`` of ``lowbit quantize`` once a block's record exists (and before the
    output does), then the same command: the uninterrupted run's bytes."""
    out = tmp_path / "q"
    cmd = [sys.executable, "-m", "lowbit.cli", "quantize", str(model), "--to", "int4", "--group",
           "32", "--method", "gptq", "--calib-samples", str(CALIB["samples"]), "--calib-len",
           str(CALIB["length"]), "--threads", "1", "--no-progress", "--out", str(out)]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get(
        "PYTHONPATH", "")])}  # fmt: skip
    record = resume_folder(out) / "record.json"
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while not record.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    _, err = proc.communicate()
    assert proc.returncode == -signal.SIGKILL or out.exists(), err.decode()[-2000:]
    if out.exists():  # pragma: no cover - the run outran the poll: nothing was interrupted
        pytest.skip("the run finished before it could be killed")
    assert record.exists()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert _files(out) == reference
    assert not resume_folder(out).exists()


def test_resume_folder_is_beside_the_output(tmp_path: Path) -> None:
    assert resume_folder(tmp_path / "out.gguf") == tmp_path / ".out.gguf.lowbit-resume"
    assert _resume.MARK == ".lowbit-resume"


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["--method", "rtn"], "--resume continues a GPTQ run"),
        (["--method", "gptq", "--workers", "2"], "--resume continues a one-process GPTQ run"),
        (["--method", "gptq"], "cannot resume .*no record yet"),
    ],
)
def test_cli_resume_refusals(
    model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], says: str
) -> None:
    """``--resume`` where there is nothing to resume: one error line, exit 2, no output."""
    from lowbit.cli import main

    out = tmp_path / "q"
    argv = ["quantize", str(model), "--to", "int4", "--group", "32", "--calib-samples", "4",
            "--calib-len", "32", "--threads", "1", "--no-progress", "--resume", "--out",
            str(out), *extra]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and re.search(says, err), err
    assert not out.exists() and not resume_folder(out).exists()


def test_compressed_tensors_and_bf16_compute_resume_to_the_same_bytes(
    model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """compressed-tensors NVFP4 under ``compute='bf16'`` (bf16 forward passes): stopped after
    block 1 and resumed, the uninterrupted run's files."""
    plan = lowbit.PrecisionPlan.uniform("nvfp4")

    def run(out: Path) -> None:
        lowbit.quantize_model(model, plan, out, method="gptq", progress=False, threads=1,
                              out_format="compressed-tensors", compute="bf16",
                              calibration=lowbit.Calibration(**CALIB))  # fmt: skip

    run(tmp_path / "ref")
    out = tmp_path / "q"
    with monkeypatch.context() as m:
        _stop_after(m, 1)
        with pytest.raises(_Killed):
            run(out)
    assert json.loads((resume_folder(out) / "record.json").read_text())["block"] == 1
    run(out)
    want = {p.name: p.read_bytes() for p in (tmp_path / "ref").iterdir() if p.suffix != ".json"}
    got = {p.name: p.read_bytes() for p in out.iterdir() if p.suffix != ".json"}
    assert want and got == want
    assert not resume_folder(out).exists()


@pytest.fixture(scope="module")
def hf_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-block Llama folder with SmolLM2's tokenizer (llama.cpp's conversion fixture), which
    the direct route reads as its converted GGUF."""
    pytest.importorskip("gguf")
    from tiny_models import llamacpp_tiny_models

    return llamacpp_tiny_models(tmp_path_factory.mktemp("hf")) / "tiny-llama"


def _gguf(model: Path, out: Path, **kw: Any) -> None:
    """GPTQ onto llama.cpp's Q4_K_M mix, from the Hugging Face folder (the direct route)."""
    lowbit.quantize_model(model, "q4_k_m", out, out_format="gguf", method="gptq", progress=False,
                          threads=1, calibration=lowbit.Calibration(**CALIB), **kw)  # fmt: skip


@pytest.mark.parametrize("block", [0, 1])
def test_gguf_mix_stopped_after_a_block_resumes_to_the_same_bytes(
    hf_llama: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, block: int
) -> None:
    """GPTQ into a GGUF mix keeps the record too: stopped after block 0 or 1 (the last, before
    the file is written) and run again, only the blocks after it are calibrated, and the file
    is the uninterrupted run's, byte for byte; the record is gone once it is written."""
    model = hf_llama
    _gguf(model, tmp_path / "ref.gguf")
    out = tmp_path / "q.gguf"
    with monkeypatch.context() as m:
        _stop_after(m, block)
        with pytest.raises(_Killed):
            _gguf(model, out)
    assert not out.exists()
    assert json.loads((resume_folder(out) / "record.json").read_text())["block"] == block
    calibrated = _blocks_saved(monkeypatch)
    _gguf(model, out, resume=True)
    assert calibrated == list(range(block + 1, 2))
    assert out.read_bytes() == (tmp_path / "ref.gguf").read_bytes()
    assert not resume_folder(out).exists()


def test_gguf_record_of_another_importance_matrix_is_not_used(
    hf_llama: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The importance vectors GPTQ rounds with are part of the record's fingerprint: a record
    made with another importance matrix is refused with --resume, replaced without it."""
    import numpy as np

    from lowbit.checkpoints import open_checkpoint
    from lowbit.checkpoints.gguf.hf_view import ConvertedView

    model = hf_llama
    with open_checkpoint(model) as hf:
        view = ConvertedView(hf)
        names = [n for n in view.names() if len(view.info(n).shape) == 2 and "blk." in n]
        cols = {n: view.info(n).shape[-1] for n in names}
    ones = {n: np.ones(c, np.float32) for n, c in cols.items()}
    twos = {n: np.linspace(0.5, 2.0, c, dtype=np.float32) for n, c in cols.items()}
    out = tmp_path / "q.gguf"
    with monkeypatch.context() as m:
        _stop_after(m, 0)
        with pytest.raises(_Killed):
            _gguf(model, out, imatrix=ones)
    with pytest.raises(LowbitError, match=r"cannot resume .*plan"):
        _gguf(model, out, imatrix=twos, resume=True)
    with pytest.warns(UserWarning, match="not resuming"):
        _gguf(model, out, imatrix=twos)
    _gguf(model, tmp_path / "ref.gguf", imatrix=twos)
    assert out.read_bytes() == (tmp_path / "ref.gguf").read_bytes()


def test_gguf_resume_without_gptq_is_refused(hf_llama: Path, tmp_path: Path) -> None:
    with pytest.raises(LowbitError, match="--resume continues a GPTQ run"):
        lowbit.quantize_model(hf_llama, "q4_k_m", tmp_path / "q.gguf", out_format="gguf",
                              resume=True, progress=False)  # fmt: skip
    assert not (tmp_path / "q.gguf").exists()


def test_cli_gguf_resume_with_no_record(
    hf_llama: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--resume`` into a GGUF mix with nothing to resume: one line, exit 2, nothing written."""
    from lowbit.cli import main

    out = tmp_path / "q.gguf"
    argv = ["quantize", str(hf_llama), "--to", "q4_k_m", "--out-format", "gguf", "--method",
            "gptq", "--calib-samples", "4", "--calib-len", "32", "--threads", "1",
            "--no-progress", "--resume", "--out", str(out)]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and re.search("cannot resume .*no record yet", err), err
    assert not out.exists() and not resume_folder(out).exists()
