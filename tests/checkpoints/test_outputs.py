"""lowbit.checkpoints.io.outputs and _model_files: outputs never destroy what lowbit did not make,
are swapped in complete, and carry only the files that belong to a model (issue 11)."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from lowbit.checkpoints.compressed_tensors.writer import write_compressed_tensors
from lowbit.checkpoints.gguf.writer import write_gguf
from lowbit.checkpoints.io import outputs as _outputs
from lowbit.checkpoints.lowbit_format.checkpoint import LowbitCheckpoint
from lowbit.checkpoints.streaming import quantize_model
from lowbit.errors import LowbitError
from lowbit.plans.plan import PrecisionPlan
from tiny_models import save_gguf, save_hf_folder, tiny_llama

INT8 = PrecisionPlan.uniform("int8")
INT4 = PrecisionPlan.uniform("int4:g32")
SRC = Path(__file__).resolve().parents[2] / "src"


@pytest.fixture(scope="module")
def llama() -> Any:
    return tiny_llama()


@pytest.fixture
def hf(tmp_path: Path, llama: Any) -> Path:
    return save_hf_folder(llama, tmp_path / "hf")


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {
        p.relative_to(folder).as_posix(): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def _plan_of(folder: Path) -> str:
    return str(json.loads((folder / "lowbit.json").read_text())["plan"]["default"])


# ---------------------------------------------------------------- 1. never over an input


@pytest.mark.parametrize("where", ["same", "inside", "parent"])
def test_out_equal_to_inside_or_containing_the_input_is_refused(hf: Path, where: str) -> None:
    """Issue 11 case 1: --out the HF input folder (even with overwrite), a folder inside it, or
    its parent is refused, and the input is untouched."""
    before = _snapshot(hf)
    out = {"same": hf, "inside": hf / "q", "parent": hf.parent}[where]
    with pytest.raises(LowbitError, match="the input"):
        quantize_model(hf, INT8, out, overwrite=True, progress=False)
    assert _snapshot(hf) == before
    assert sorted(p.name for p in hf.parent.iterdir()) == ["hf"]


def test_out_through_a_symlink_to_the_input_is_refused(hf: Path, tmp_path: Path) -> None:
    """Real paths are compared: a link to the input folder is the input."""
    link = tmp_path / "link"
    link.symlink_to(hf)
    with pytest.raises(LowbitError, match="is the input"):
        quantize_model(hf, INT8, link, overwrite=True, progress=False)
    assert link.is_symlink()


def test_gguf_onto_itself_is_refused(tmp_path: Path, llama: Any) -> None:
    """Issue 11 case 1: ``self.gguf --out-format gguf --out self.gguf --overwrite`` is refused."""
    src = save_gguf(llama, tmp_path / "self.gguf")
    before = src.read_bytes()
    plan = PrecisionPlan.uniform("q8_0")
    with pytest.raises(LowbitError, match="is the input"):
        quantize_model(src, plan, src, out_format="gguf", overwrite=True, progress=False)
    assert src.read_bytes() == before


def test_check_not_input_relations(tmp_path: Path) -> None:
    """is / contains / lies inside, and unrelated siblings pass."""
    (tmp_path / "a" / "b").mkdir(parents=True)
    f = tmp_path / "a" / "w.npy"
    f.write_bytes(b"x")
    _outputs.check_not_input(tmp_path / "a2", [tmp_path / "a", f])
    for out, why in [
        (f, "is"),
        (tmp_path, "contains"),
        (tmp_path / "a" / "b" / "o", "lies inside"),
    ]:
        with pytest.raises(LowbitError, match=why):
            _outputs.check_not_input(out, [tmp_path / "a", f])


# ----------------------------------------------------- 2. overwrite only what lowbit wrote


def test_overwrite_refuses_an_unrelated_folder(hf: Path, tmp_path: Path) -> None:
    """Issue 11 case 2: --overwrite on someone's non-empty folder is refused; it is untouched."""
    thesis = tmp_path / "thesis"
    thesis.mkdir()
    (thesis / "thesis.txt").write_text("five years of work")
    with pytest.raises(LowbitError, match="not a checkpoint lowbit wrote"):
        quantize_model(hf, INT8, thesis, overwrite=True, progress=False)
    assert _snapshot(thesis) == {"thesis.txt": b"five years of work"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf", "thesis"]


def test_overwrite_refuses_a_lowbit_folder_holding_other_files(hf: Path, tmp_path: Path) -> None:
    """A lowbit checkpoint to which the user added a file is not lowbit's alone any more."""
    out = tmp_path / "q"
    quantize_model(hf, INT8, out, progress=False)
    (out / "thesis.txt").write_text("mine")
    with pytest.raises(LowbitError, match=r"files lowbit did not write there \(thesis.txt\)"):
        quantize_model(hf, INT4, out, overwrite=True, progress=False)
    assert (out / "thesis.txt").read_text() == "mine"


@pytest.mark.parametrize("out_format", ["lowbit", "compressed-tensors"])
def test_overwrite_replaces_what_lowbit_wrote(hf: Path, tmp_path: Path, out_format: str) -> None:
    """lowbit and compressed-tensors folders lowbit wrote are replaced whole with overwrite."""
    out = tmp_path / "q"
    quantize_model(hf, INT8, out, out_format=out_format, progress=False)
    with pytest.raises(LowbitError, match="already exists; pass --overwrite"):
        quantize_model(hf, INT8, out, out_format=out_format, progress=False)
    quantize_model(hf, INT4, out, out_format=out_format, overwrite=True, progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf", "q"]


def test_gguf_overwrite_needs_the_lowbit_mark(tmp_path: Path, llama: Any) -> None:
    """A GGUF lowbit wrote carries ``lowbit.writer`` and may be replaced; another is refused."""
    import gguf

    src = save_gguf(llama, tmp_path / "src.gguf")
    out = tmp_path / "o.gguf"
    plan = PrecisionPlan.uniform("q8_0")
    quantize_model(src, plan, out, out_format="gguf", progress=False)
    assert _outputs.lowbit_made(out) is None
    quantize_model(src, plan, out, out_format="gguf", overwrite=True, progress=False)
    other = tmp_path / "other.gguf"  # a GGUF lowbit did not write: no mark
    w = gguf.GGUFWriter(str(other), "llama")
    w.add_tensor("x", np.ones(4, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    before = other.read_bytes()
    with pytest.raises(LowbitError, match=r"no lowbit\.writer mark"):
        quantize_model(src, plan, other, out_format="gguf", overwrite=True, progress=False)
    assert other.read_bytes() == before


def test_overwrite_refuses_a_symlink_and_a_kind_mismatch(tmp_path: Path) -> None:
    """A link is never replaced; a folder is not replaced by a file nor the other way."""
    write_gguf(tmp_path / "a.gguf", {"x": np.ones(4, np.float32)}, arch="llama", progress=False)
    (tmp_path / "l.gguf").symlink_to(tmp_path / "a.gguf")
    with pytest.raises(LowbitError, match="symbolic link"):
        write_gguf(tmp_path / "l.gguf", {"x": np.ones(4, np.float32)}, arch="llama",
                   overwrite=True, progress=False)  # fmt: skip
    write_compressed_tensors(tmp_path / "ct", {"x": np.ones(3, np.float32)}, progress=False)
    with pytest.raises(LowbitError, match="is a folder"):
        write_gguf(tmp_path / "ct", {"x": np.ones(4, np.float32)}, arch="llama",
                   overwrite=True, progress=False)  # fmt: skip


# --------------------------------------------------------- 3. only a model's own files


def test_only_model_files_are_copied(hf: Path, tmp_path: Path) -> None:
    """Issue 11 case 3: notes.txt, sub/id_rsa, x.py and links leading out of the folder are not
    copied (even under an allowlisted name); what is left out is listed in the manifest."""
    secret = tmp_path / "secret.txt"
    secret.write_text("root:x:0:0")
    (hf / "notes.txt").write_text("private")
    (hf / "sub").mkdir()
    (hf / "sub" / "id_rsa").write_text("-----BEGIN KEY-----")
    (hf / "x.py").write_text("import os")
    (hf / "vocab.txt").symlink_to(secret)  # allowlisted name, target outside the folder
    (hf / "passwd").symlink_to("/etc/passwd")
    (hf / "README.md").write_text("# tiny")
    (hf / "LICENSE").write_text("MIT")
    (hf / "merges.txt").symlink_to(hf / "README.md")  # a link that stays inside: fine
    (hf / "1_Pooling").mkdir()
    (hf / "1_Pooling" / "config.json").write_text("{}")
    out = tmp_path / "q"
    result = quantize_model(hf, INT8, out, progress=False)
    want = ["1_Pooling/config.json", "LICENSE", "README.md", "config.json", "merges.txt",
            "tokenizer.json", "tokenizer_config.json"]  # fmt: skip
    assert result["copied_files"] == want
    written = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert written == sorted([*want, "lowbit.json", "model.safetensors"])
    assert not any(p.is_symlink() for p in out.rglob("*"))
    assert (out / "merges.txt").read_text() == "# tiny"
    manifest = json.loads((out / "lowbit.json").read_text())
    assert manifest["copied_files"] == want
    why = {e["file"]: e["why"] for e in manifest["left_out"]}
    assert set(why) == {"notes.txt", "sub/id_rsa", "x.py", "vocab.txt", "passwd"}
    assert "outside the model folder" in why["vocab.txt"]
    assert "--copy-code" in why["x.py"]
    assert "root:x" not in "".join(p.read_text(errors="replace") for p in out.rglob("*.txt"))


def test_a_safetensors_file_input_copies_from_its_folder(hf: Path, tmp_path: Path) -> None:
    """A .safetensors input with config.json beside it: the same allowlist applies to the
    folder it lies in."""
    (hf / "notes.txt").write_text("private")
    result = quantize_model(hf / "model.safetensors", INT8, tmp_path / "q", progress=False)
    assert result["copied_files"] == ["config.json", "tokenizer.json", "tokenizer_config.json"]
    assert [e["file"] for e in result["left_out"]] == ["notes.txt"]


def test_hugging_face_cache_links_into_blobs_are_followed(hf: Path, tmp_path: Path) -> None:
    """A cache snapshot's files are links into the repository's blobs/: they are copied."""
    repo = tmp_path / "models--tiny"
    (repo / "blobs").mkdir(parents=True)
    snap = repo / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    for f in sorted(hf.iterdir()):
        blob = repo / "blobs" / f"sha-{f.name}"
        blob.write_bytes(f.read_bytes())
        (snap / f.name).symlink_to(Path("../../blobs") / blob.name)
    out = tmp_path / "q"
    result = quantize_model(snap, INT8, out, progress=False)
    assert result["copied_files"] == ["config.json", "tokenizer.json", "tokenizer_config.json"]
    assert not (out / "config.json").is_symlink()
    assert (out / "config.json").read_bytes() == (hf / "config.json").read_bytes()


def test_copy_code_copies_python_files(hf: Path, tmp_path: Path) -> None:
    """copy_code=True (``--copy-code``) adds the folder's top-level .py files, nothing else."""
    (hf / "modeling_tiny.py").write_text("class Tiny: ...")
    (hf / "notes.txt").write_text("private")
    out = tmp_path / "q"
    result = quantize_model(hf, INT8, out, copy_code=True, progress=False)
    assert "modeling_tiny.py" in result["copied_files"]
    assert (out / "modeling_tiny.py").read_text() == "class Tiny: ..."
    assert not (out / "notes.txt").exists()


def test_compressed_tensors_copies_the_allowlist_too(hf: Path, tmp_path: Path) -> None:
    """compressed-tensors output: same allowlist, top-level files only, listed in the result."""
    (hf / "notes.txt").write_text("private")
    (hf / "x.py").write_text("import os")
    out = tmp_path / "ct"
    result = quantize_model(hf, INT8, out, out_format="compressed-tensors", progress=False)
    assert sorted(p.name for p in out.iterdir()) == [
        "config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"
    ]  # fmt: skip
    assert {e["file"] for e in result["left_out"]} == {"notes.txt", "x.py"}


# ------------------------------------------------------ 7. atomic, locked, no debris


def test_a_held_lock_makes_a_second_run_fail(hf: Path, tmp_path: Path) -> None:
    """Issue 11 case 7: while one run writes OUT, another run to OUT fails at once."""
    out = tmp_path / "q"
    entered, release = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def first() -> None:
        try:
            with _outputs.output_dir(out) as tmp:
                (tmp / "lowbit.json").write_text('{"format": "lowbit-checkpoint"}')
                entered.set()
                release.wait(30)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)
            entered.set()

    t = threading.Thread(target=first)
    t.start()
    try:
        assert entered.wait(30)
        with pytest.raises(LowbitError, match="another lowbit run is writing"):
            quantize_model(hf, INT8, out, overwrite=True, progress=False)
    finally:
        release.set()
        t.join()
    assert not errors
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf", "q"]  # lock file removed


_KILLED = textwrap.dedent(
    """
    import os, signal, sys
    from pathlib import Path
    from lowbit.checkpoints.io import outputs as _outputs
    stage, out, exchange = sys.argv[1], Path(sys.argv[2]), sys.argv[3] == "1"
    if not exchange:
        _outputs._libc_renameat2 = lambda: None
    die = lambda: os.kill(os.getpid(), signal.SIGKILL)
    if stage == "between-renames":
        real = os.rename
        def rename(a, b):
            real(a, b)
            if str(b).endswith("/old"):
                die()
        _outputs.os.rename = rename
    if stage == "before-cleanup":
        _outputs._remove_work = lambda work: die()
    with _outputs.output_dir(out, overwrite=True) as tmp:
        (tmp / "lowbit.json").write_text('{"format": "lowbit-checkpoint", "v": "new"}')
        if stage == "writing":
            (tmp / "model.safetensors").write_bytes(b"partial")
            die()
    """
)


@pytest.mark.parametrize(
    ("stage", "exchange", "after"),
    [
        ("writing", True, "old"),
        ("before-cleanup", True, "new"),
        ("before-cleanup", False, "new"),
        ("between-renames", False, "new"),
    ],
)
def test_the_next_run_cleans_up_a_killed_run(
    tmp_path: Path, stage: str, exchange: bool, after: str
) -> None:
    """Issue 11 case 7: a run killed while writing, between the two renames of the fallback
    replacement, or before removing its temporary, leaves OUT old or new and complete; the next
    run says what it found and leaves no debris."""
    out = tmp_path / "o"
    with _outputs.output_dir(out) as tmp:
        (tmp / "lowbit.json").write_text('{"format": "lowbit-checkpoint", "v": "old"}')
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    proc = subprocess.run(
        [sys.executable, "-c", _KILLED, stage, str(out), "1" if exchange else "0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == -9, proc.stderr
    debris = sorted(p.name for p in tmp_path.iterdir() if p.name != "o")
    assert any(".tmp-" in d for d in debris)
    if stage != "between-renames":
        assert json.loads((out / "lowbit.json").read_text())["v"] == after
    else:
        assert not out.exists()  # the one window of the fallback: completed by the next run
    with pytest.warns(UserWarning, match="left by an interrupted lowbit run") as caught:
        with _outputs.output_dir(out, overwrite=True) as tmp:
            (tmp / "lowbit.json").write_text('{"format": "lowbit-checkpoint", "v": "third"}')
    assert any(str(out) in str(w.message) for w in caught)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o"]
    assert json.loads((out / "lowbit.json").read_text())["v"] == "third"


def test_recover_completes_an_interrupted_two_step_replacement(tmp_path: Path) -> None:
    """With OUT missing, a marked temporary holding a complete new output is moved in."""
    out = tmp_path / "o"
    with _outputs.output_dir(out) as tmp:
        (tmp / "lowbit.json").write_text('{"format": "lowbit-checkpoint", "v": "old"}')
    work = tmp_path / "o.tmp-abcdefgh"
    work.mkdir()
    (work / _outputs.MARKER).write_text(json.dumps({"target": "o"}))
    (work / "new").mkdir()
    (work / "new" / "lowbit.json").write_text('{"format": "lowbit-checkpoint", "v": "new"}')
    (work / _outputs.COMPLETE).touch()
    os.rename(out, work / "old")
    messages = _outputs.recover(out)
    assert len(messages) == 1 and "moved its complete new output" in messages[0]
    assert json.loads((out / "lowbit.json").read_text())["v"] == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o"]


def test_debris_of_lowbit_0_1_is_recovered(hf: Path, tmp_path: Path) -> None:
    """The writers before this module left OUT.old-X/OUT (OUT missing after a kill between
    their two renames) and partial OUT.tmp-X folders: the previous output is restored, the
    partial one removed."""
    out = tmp_path / "q"
    quantize_model(hf, INT8, out, progress=False)
    old = tmp_path / "q.old-abcd1234"
    old.mkdir()
    os.rename(out, old / "q")
    partial = tmp_path / "q.tmp-wxyz9876"
    partial.mkdir()
    (partial / "model.safetensors").write_bytes((old / "q" / "model.safetensors").read_bytes())
    with pytest.warns(UserWarning) as caught:
        quantize_model(hf, INT4, out, overwrite=True, progress=False)
    said = " ".join(str(w.message) for w in caught)
    assert f"restored {out} from {old}" in said and f"removed {partial}" in said
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf", "q"]
    assert "int4" in _plan_of(out)


def test_unmarked_lookalikes_are_left_alone(tmp_path: Path) -> None:
    """A folder named like debris but without lowbit's mark is never deleted, only named."""
    mine = tmp_path / "o.tmp-12345678"
    mine.mkdir()
    (mine / "data.txt").write_text("keep")
    with pytest.warns(UserWarning, match="no lowbit mark; left alone"):
        with _outputs.output_dir(tmp_path / "o") as tmp:
            (tmp / "f").write_text("x")
    assert (mine / "data.txt").read_text() == "keep"


def test_fallback_two_step_replacement(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without renameat2 a folder is still replaced whole, and a failure keeps the old one."""
    monkeypatch.setattr(_outputs, "_libc_renameat2", lambda: None)
    out = tmp_path / "o"
    for v in ("a", "b"):
        with _outputs.output_dir(out, overwrite=True) as tmp:
            (tmp / "lowbit.json").write_text(json.dumps({"format": "lowbit-checkpoint", "v": v}))
    assert json.loads((out / "lowbit.json").read_text())["v"] == "b"
    with pytest.raises(RuntimeError), _outputs.output_dir(out, overwrite=True):
        raise RuntimeError
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o"]
    assert json.loads((out / "lowbit.json").read_text())["v"] == "b"


def test_outputs_follow_the_umask(hf: Path, tmp_path: Path) -> None:
    """Files and folders get 0o666 / 0o777 minus the umask (no 0o600 from mkstemp)."""
    old = os.umask(0o027)
    try:
        quantize_model(hf, INT8, tmp_path / "q", progress=False)
        write_gguf(tmp_path / "g.gguf", {"x": np.ones(4, np.float32)}, arch="llama",
                   progress=False)  # fmt: skip
    finally:
        os.umask(old)
    assert (tmp_path / "q").stat().st_mode & 0o777 == 0o750
    assert (tmp_path / "q" / "model.safetensors").stat().st_mode & 0o777 == 0o640
    assert (tmp_path / "g.gguf").stat().st_mode & 0o777 == 0o640


@pytest.mark.parametrize(
    ("code", "text"),
    [(errno.ENOSPC, "No space left on device"), (errno.EROFS, "Read-only file system")],
)
def test_write_errors_name_the_output(
    hf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int, text: str
) -> None:
    """Disk full / read-only while writing: one LowbitError naming OUT (not the temporary),
    nothing left behind."""
    from lowbit.checkpoints.io import safetensors_write as _safetensors_write

    def full(path: Any, *args: Any, **kwargs: Any) -> None:
        Path(path).write_bytes(b"partial")
        raise OSError(code, os.strerror(code), str(path))

    monkeypatch.setattr(_safetensors_write, "write_file", full)
    out = tmp_path / "q"
    with pytest.raises(LowbitError) as info:
        quantize_model(hf, INT8, out, progress=False)
    msg = str(info.value)
    assert msg.startswith(f"cannot write {out}: {text}")
    assert ".tmp-" not in msg and "\n" not in msg
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]


def test_loaded_after_overwrite(hf: Path, tmp_path: Path) -> None:
    """The swapped-in checkpoint reads back completely with its new plan."""
    out = tmp_path / "q"
    quantize_model(hf, INT8, out, progress=False)
    quantize_model(hf, INT4, out, overwrite=True, progress=False)
    ck = LowbitCheckpoint(out)
    assert all(np.isfinite(ck.get(n)).all() for n in ck.names() if ck.get(n).dtype.kind == "f")
    assert "int4" in _plan_of(out)


def test_write_gguf_never_writes_over_its_source(tmp_path: Path) -> None:
    """write_gguf(path, source=path, overwrite=True) is refused even for a lowbit-made file."""
    path = write_gguf(tmp_path / "m.gguf", {"x": np.ones(4, np.float32)}, arch="llama",
                      progress=False)  # fmt: skip
    before = path.read_bytes()
    with pytest.raises(LowbitError, match="is the input"):
        write_gguf(path, {"y": np.ones(4, np.float32)}, source=path, overwrite=True,
                   progress=False)  # fmt: skip
    assert path.read_bytes() == before
