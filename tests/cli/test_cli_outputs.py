"""`lowbit quantize` / `lowbit quantize-tensor` outputs: never over an input or over what lowbit
did not write, one run at a time, a clean error for a write that fails, and kill -9 at any
moment leaves the output complete (issue 11, cases 1, 2, 3 and 7)."""

from __future__ import annotations

import contextlib
import errno
import io
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from lowbit.checkpoints.io import outputs as _outputs
from lowbit.checkpoints.lowbit_format.checkpoint import LowbitCheckpoint
from lowbit.cli import main
from tiny_models import save_hf_folder, tiny_llama

SRC = Path(__file__).resolve().parents[2] / "src"


def _run(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(args))
    return code, out.getvalue(), err.getvalue()


def _lowbit(*args: str, **kwargs: Any) -> Any:
    """``python -m lowbit.cli ARGS`` as a child process (this worktree's sources)."""
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    return subprocess.Popen(
        [sys.executable, "-m", "lowbit.cli", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kwargs,
    )


@pytest.fixture(scope="module")
def llama() -> Any:
    return tiny_llama()


@pytest.fixture
def hf(tmp_path: Path, llama: Any) -> Path:
    return save_hf_folder(llama, tmp_path / "hf")


@pytest.fixture
def npy(tmp_path: Path) -> Path:
    path = tmp_path / "src.npy"
    np.save(path, np.random.default_rng(0).standard_normal((32, 64)).astype(np.float32))
    return path


def _one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


# ------------------------------------------------------------------- case 1: inputs


def test_quantize_tensor_out_onto_its_npy_input_is_refused(npy: Path) -> None:
    """`quantize-tensor src.npy --out src.npy` exits 2 and src.npy is unchanged."""
    before = npy.read_bytes()
    code, _, err = _run("quantize-tensor", str(npy), "--to", "int4", "--out", str(npy))
    assert code == 2
    assert "is the input" in _one_error_line(err)
    assert npy.read_bytes() == before


def test_quantize_tensor_out_onto_its_safetensors_input_is_refused(tmp_path: Path) -> None:
    """The same for a tensor inside a .safetensors file, even with --overwrite."""
    from safetensors.numpy import save_file

    src = tmp_path / "w.safetensors"
    save_file({"w": np.ones((8, 32), np.float32)}, str(src))
    before = src.read_bytes()
    code, _, err = _run("quantize-tensor", f"{src}:w", "--to", "int8", "--out", str(src),
                        "--overwrite")  # fmt: skip
    assert code == 2 and "is the input" in _one_error_line(err)
    assert src.read_bytes() == before


def test_quantize_tensor_needs_overwrite_and_replaces_only_its_own(
    npy: Path, tmp_path: Path
) -> None:
    """An existing --out needs --overwrite, which replaces only a file lowbit wrote."""
    out = tmp_path / "q.safetensors"
    assert _run("quantize-tensor", str(npy), "--to", "int4", "--out", str(out))[0] == 0
    code, _, err = _run("quantize-tensor", str(npy), "--to", "int8", "--out", str(out))
    assert code == 2 and "already exists" in _one_error_line(err)
    args = ("quantize-tensor", str(npy), "--to", "int8", "--out", str(out), "--overwrite")
    assert _run(*args)[0] == 0
    other = tmp_path / "other.safetensors"
    other.write_bytes(b"not lowbit's")
    code, _, err = _run("quantize-tensor", str(npy), "--to", "int8", "--out", str(other),
                        "--overwrite")  # fmt: skip
    assert code == 2 and "refusing to replace" in _one_error_line(err)
    assert other.read_bytes() == b"not lowbit's"


def test_quantize_out_is_the_hf_input_folder(hf: Path) -> None:
    """`lowbit quantize hfdir --out hfdir --overwrite` exits 2; the source model is intact."""
    before = sorted((p.name, p.stat().st_size) for p in hf.iterdir())
    code, _, err = _run("quantize", str(hf), "--to", "int8", "--out", str(hf), "--overwrite",
                        "--no-progress")  # fmt: skip
    assert code == 2 and "is the input" in _one_error_line(err)
    assert sorted((p.name, p.stat().st_size) for p in hf.iterdir()) == before


@pytest.mark.parametrize("command", ["quantize", "quantize-tensor"])
def test_empty_out_is_an_error(hf: Path, npy: Path, command: str) -> None:
    """`--out ''` is refused instead of silently falling back to a default name."""
    source = str(hf) if command == "quantize" else str(npy)
    code, _, err = _run(command, source, "--to", "int8", "--out", "")
    assert code == 2 and "--out is empty" in _one_error_line(err)


# ------------------------------------------------------------ case 2: only lowbit's


def test_overwrite_an_unrelated_folder_is_refused(hf: Path, tmp_path: Path) -> None:
    """`--overwrite` on someone's folder holding thesis.txt: exit 2, nothing deleted."""
    thesis = tmp_path / "work"
    thesis.mkdir()
    (thesis / "thesis.txt").write_text("chapter 1")
    code, _, err = _run("quantize", str(hf), "--to", "int8", "--out", str(thesis), "--overwrite",
                        "--no-progress")  # fmt: skip
    assert code == 2
    assert "refusing to replace" in _one_error_line(err)
    assert (thesis / "thesis.txt").read_text() == "chapter 1"
    assert sorted(p.name for p in thesis.iterdir()) == ["thesis.txt"]


# ------------------------------------------------------------ case 3: copied files


def test_only_model_files_are_copied_and_listed(hf: Path, tmp_path: Path) -> None:
    """notes.txt, sub/id_rsa, x.py and a link to a file outside the folder stay out; --json
    lists what was copied and what was left out."""
    outside = tmp_path / "passwd"
    outside.write_text("root:x:0:0:root:/root:/bin/bash")
    (hf / "notes.txt").write_text("private notes")
    (hf / "sub").mkdir()
    (hf / "sub" / "id_rsa").write_text("-----BEGIN OPENSSH PRIVATE KEY-----")
    (hf / "x.py").write_text("import os; os.system('echo hi')")
    (hf / "special_tokens_map.json").symlink_to(outside)
    out = tmp_path / "q"
    code, stdout, _ = _run("quantize", str(hf), "--to", "int8", "--out", str(out), "--json")
    assert code == 0
    result = json.loads(stdout)
    assert result["copied_files"] == ["config.json", "tokenizer.json", "tokenizer_config.json"]
    left = {e["file"] for e in result["left_out"]}
    assert left == {"notes.txt", "sub/id_rsa", "x.py", "special_tokens_map.json"}
    names = sorted(p.relative_to(out).as_posix() for p in out.rglob("*"))
    assert names == ["config.json", "lowbit.json", "model.safetensors", "tokenizer.json",
                     "tokenizer_config.json"]  # fmt: skip
    manifest = json.loads((out / "lowbit.json").read_text())
    assert {e["file"] for e in manifest["left_out"]} == left


# ------------------------------------------------------- case 7: one run, atomic, clean


def test_a_second_run_while_the_first_writes_fails(hf: Path, tmp_path: Path) -> None:
    """While another run holds OUT's lock, `lowbit quantize --out OUT` exits 2 at once."""
    out = tmp_path / "q"
    held = _outputs._lock(out)
    try:
        code, _, err = _run("quantize", str(hf), "--to", "int8", "--out", str(out),
                            "--no-progress")  # fmt: skip
    finally:
        _outputs._unlock(held)
    assert code == 2 and "another lowbit run is writing" in _one_error_line(err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]


def test_two_concurrent_runs_do_not_both_succeed(hf: Path, tmp_path: Path) -> None:
    """Two runs to the same OUT started together: exactly one writes it, the other exits 2
    saying why (another run holds it, or it already exists)."""
    out = tmp_path / "q"
    args = ("quantize", str(hf), "--to", "int8", "--out", str(out), "--no-progress")
    procs = [_lowbit(*args), _lowbit(*args)]
    results = [(p.wait(timeout=300), p.stderr.read()) for p in procs]  # type: ignore[union-attr]
    for p in procs:
        p.stdout.close()  # type: ignore[union-attr]
        p.stderr.close()  # type: ignore[union-attr]
    codes = sorted(code for code, _ in results)
    assert codes == [0, 2], results
    loser = next(err for code, err in results if code == 2)
    assert "another lowbit run is writing" in loser or "already exists" in loser
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf", "q"]


def test_read_only_destination_is_one_line(
    hf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read-only destination: one line naming --out, exit 2, no traceback (as root a
    read-only mode does not stop writes, so the file system's EROFS is injected there)."""
    dest = tmp_path / "ro"
    dest.mkdir()
    if os.geteuid() == 0:

        def erofs(target: Path) -> Any:
            path = _outputs.lock_path(target)
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))

        monkeypatch.setattr(_outputs, "_lock", erofs)
    else:
        dest.chmod(0o555)
    try:
        code, _, err = _run("quantize", str(hf), "--to", "int8", "--out", str(dest / "q"),
                            "--no-progress")  # fmt: skip
    finally:
        dest.chmod(0o755)
    line = _one_error_line(err)
    assert code == 2
    assert line.startswith(f"lowbit quantize: error: cannot write {dest / 'q'}: ")
    assert ".lowbit-lock" not in line and ".tmp-" not in line
    assert list(dest.iterdir()) == []


def test_quantize_tensor_output_follows_the_umask(npy: Path, tmp_path: Path) -> None:
    """The .safetensors file gets 0o666 minus the umask (it was 0o600 whatever the umask)."""
    out = tmp_path / "q.safetensors"
    old = os.umask(0o002)
    try:
        assert _run("quantize-tensor", str(npy), "--to", "int4", "--out", str(out))[0] == 0
    finally:
        os.umask(old)
    assert out.stat().st_mode & 0o777 == 0o664


def _complete(out: Path) -> str:
    """The plan of a checkpoint that loads completely (every tensor read back)."""
    ck = LowbitCheckpoint(out)
    try:
        for name in ck.names():
            ck.get(name)
        return str(ck.manifest["plan"]["default"])
    finally:
        ck.close()


def test_kill_9_at_random_moments_never_loses_the_output(hf: Path, tmp_path: Path) -> None:
    """kill -9 at 20 seeded random moments of `lowbit quantize TINY --out X --overwrite`
    always leaves X a complete old or new checkpoint; the next run leaves no debris.

    The plans alternate between bf16 and fp16 casts: the checkpoint goes through the same
    writer as a quantized one, and a run costs about a third of an int8 one (no kernels to
    load), which keeps 20 kills within a minute on a loaded machine."""
    out = tmp_path / "X"
    schemes = ["bf16", "fp16"]

    def start(scheme: str) -> Any:
        return _lowbit("quantize", str(hf), "--to", scheme, "--out", str(out), "--overwrite",
                       "--no-progress")  # fmt: skip

    t0 = time.monotonic()
    first = start(schemes[0])
    assert first.wait(timeout=300) == 0, first.stderr.read()  # type: ignore[union-attr]
    full = time.monotonic() - t0
    for f in (first.stdout, first.stderr):
        f.close()  # type: ignore[union-attr]
    plans = {_complete(out)}
    rng = random.Random(11)
    for i in range(20):
        new = schemes[(i + 1) % 2]
        proc = start(new)
        time.sleep(rng.uniform(0.25, 1.05) * full)  # mostly while writing, a few after the end
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
        for f in (proc.stdout, proc.stderr):
            f.close()  # type: ignore[union-attr]
        plans.add(_complete(out))  # loads completely: never missing, never partial
        debris = [p.name for p in tmp_path.iterdir() if p.name not in ("hf", "X")]
        assert all(".tmp-" in d or d == ".X.lowbit-lock" for d in debris), debris
    assert plans <= {"bf16", "fp16"}
    last = start("bf16")
    assert last.wait(timeout=300) == 0
    for f in (last.stdout, last.stderr):
        f.close()  # type: ignore[union-attr]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["X", "hf"]
    assert _complete(out) == "bf16"


def test_sigterm_while_writing_cleans_up(hf: Path, tmp_path: Path) -> None:
    """SIGTERM while `lowbit quantize` writes: exit 143 with one line, and neither the
    temporary output nor the lock is left behind (kill -9 leaves them for the next run)."""
    out = tmp_path / "q"
    code, err = None, ""
    for _ in range(10):
        proc = _lowbit("quantize", str(hf), "--to", "int8", "--out", str(out), "--no-progress")
        deadline = time.monotonic() + 120
        while proc.poll() is None and time.monotonic() < deadline:
            if any(".tmp-" in p.name for p in tmp_path.iterdir()):
                break  # the run is writing its temporary output
            time.sleep(0.002)
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=60)
        err = proc.stderr.read()  # type: ignore[union-attr]
        for f in (proc.stdout, proc.stderr):
            f.close()  # type: ignore[union-attr]
        if code != 0:
            break
        shutil.rmtree(out)  # it finished before the signal: try again
    assert code == 128 + signal.SIGTERM, err
    assert err.strip().splitlines() == ["lowbit quantize: terminated (SIGTERM)"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]


def test_sigterm_handler_is_the_callers_again_after_main(monkeypatch: pytest.MonkeyPatch) -> None:
    """main() puts SIGTERM's handler back when it returns, and leaves a caller's own alone."""
    from lowbit.cli import cmd_formats

    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    seen: list[Any] = []
    real = cmd_formats.run

    def run(args: Any) -> int:
        seen.append(signal.getsignal(signal.SIGTERM))
        return real(args)

    monkeypatch.setattr(cmd_formats, "run", run)
    assert _run("formats")[0] == 0
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    assert seen and seen[0] is not signal.SIG_DFL  # lowbit's, while the command ran

    def own(*_: Any) -> None:
        pass

    previous = signal.signal(signal.SIGTERM, own)
    try:
        seen.clear()
        assert _run("formats")[0] == 0
        assert seen == [own] and signal.getsignal(signal.SIGTERM) is own
    finally:
        signal.signal(signal.SIGTERM, previous)


# ------------------------------------------------------------------------ plots


@pytest.mark.parametrize(
    "command",
    [
        ("compare", "--size", "1024", "--formats", "int4,int8", "--group", "64"),
        ("plan", "--params", "1B", "--precisions", "bf16,int4"),
    ],
    ids=lambda c: c[0],
)
def test_plot_outputs_take_overwrite(tmp_path: Path, command: tuple[str, ...]) -> None:
    """--plot refuses an existing file without --overwrite, replaces a plot lowbit drew with
    it, and never replaces an image lowbit did not draw."""
    pytest.importorskip("matplotlib")
    png = tmp_path / "p.png"
    assert _run(*command, "--plot", str(png))[0] == 0
    code, _, err = _run(*command, "--plot", str(png))
    assert code == 2 and "already exists" in _one_error_line(err)
    assert _run(*command, "--plot", str(png), "--overwrite")[0] == 0
    photo = tmp_path / "holiday.png"
    photo.write_bytes(b"\x89PNG\r\n\x1a\n my holiday")
    code, _, err = _run(*command, "--plot", str(photo), "--overwrite")
    assert code == 2 and "not a plot lowbit drew" in _one_error_line(err)
    assert photo.read_bytes() == b"\x89PNG\r\n\x1a\n my holiday"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["holiday.png", "p.png"]


def test_train_lab_refuses_its_plot_before_training(tmp_path: Path) -> None:
    """train-lab checks --plot before minutes of training, not after."""
    png = tmp_path / "curves.png"
    png.write_bytes(b"mine")
    start = time.monotonic()
    code, _, err = _run("train-lab", "--recipes", "fp32", "--steps", "400", "--quiet",
                        "--plot", str(png))  # fmt: skip
    assert code == 2 and "already exists" in _one_error_line(err)
    assert time.monotonic() - start < 20
    assert png.read_bytes() == b"mine"
