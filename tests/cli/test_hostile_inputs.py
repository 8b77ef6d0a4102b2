"""Hostile inputs from the second reliability round (issue 24): each is one ``LowbitError`` line
and exit 2 from the CLI (and a LowbitError from the API), never a traceback or a hang."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from lowbit.cli import main
from lowbit.errors import LowbitError

HUGE = "9" * 5000  # past Python's 4,300-digit limit for int(str)


def _one_line(capsys: pytest.CaptureFixture[str], argv: list[str], match: str = "") -> str:
    rc = main(argv)
    err = capsys.readouterr().err.strip()
    assert rc == 2, err
    assert "\n" not in err and "Traceback" not in err and err.startswith("lowbit "), err
    assert match in err, err
    return err


# ---- special files and lying headers --------------------------------------------------


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
@pytest.mark.parametrize("name", ["t.npy", "t.safetensors"])
def test_fifo_tensor_files_are_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, name: str
) -> None:
    """A FIFO named .npy/.safetensors is refused by compare and quantize-tensor (it hung)."""
    fifo = tmp_path / name
    os.mkfifo(fifo)
    _one_line(capsys, ["compare", "--data", str(fifo), "--formats", "int8:t"], "FIFO")
    out = str(tmp_path / "o.safetensors")
    _one_line(capsys, ["quantize-tensor", str(fifo), "--to", "int8:t", "--out", out], "FIFO")


def test_npy_header_claiming_37_gib(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """A 192-byte .npy whose header claims 37 GiB is refused before anything is allocated."""
    p = tmp_path / "lie.npy"
    with open(p, "wb") as fh:
        np.lib.format.write_array_header_1_0(
            fh, {"descr": "<f4", "fortran_order": False, "shape": (100_000, 100_000)}
        )
        fh.write(b"\0" * 64)
    assert p.stat().st_size == 192
    _one_line(capsys, ["compare", "--data", str(p), "--formats", "int8:t"], "header says")
    out = str(tmp_path / "o.safetensors")
    _one_line(capsys, ["quantize-tensor", str(p), "--to", "int8:t", "--out", out], "header says")


def test_honest_npy_still_reads(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """A plain .npy (and a Fortran-ordered one) reads as before."""
    for order in ("C", "F"):
        p = tmp_path / f"ok{order}.npy"
        np.save(p, np.asarray(np.arange(64, dtype=np.float32).reshape(8, 8), order=order))
        assert main(["compare", "--data", str(p), "--formats", "int8:t", "--json"]) == 0
        capsys.readouterr()


# ---- numbers past Python's 4,300-digit limit -----------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["decode", "e4m3", HUGE],
        ["decode", "e4m3", "0x" + "f" * 5000],
        ["show", "1e999999999/3"],
        ["show", HUGE + "/3"],
    ],
)
def test_huge_numbers_are_one_line(capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    """Codes and values with thousands of digits (or a billion-digit exponent) are refused."""
    _one_line(capsys, argv)


def test_huge_codes_from_the_api() -> None:
    """The Python API refuses the same codes with a LowbitError."""
    from lowbit.formats import explain

    for code in (HUGE, 10**5000, "0b" + "1" * 100):
        with pytest.raises(LowbitError):
            explain.decode("e4m3", code)
    with pytest.raises(LowbitError):
        explain.parse_value(10**5000)


@pytest.mark.parametrize(
    "argv",
    [
        ["show", "1", "--formats", "p3109_k" + HUGE + "p3"],
        ["values", "p3109_k3p" + HUGE],
        ["compare", "--formats", "int4:g" + HUGE, "--size", "64"],
        ["compare", "--formats", "int4:g\u00b2", "--size", "64"],  # isdigit() but not int()
        ["compare", "--formats", "int4:ax" + HUGE, "--size", "64"],
    ],
)
def test_huge_numbers_in_names_and_schemes(
    capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    """Format names and scheme strings with numbers past the digit limit are one line."""
    err = _one_line(capsys, argv)
    assert len(err) < 600


# ---- paths the system refuses ---------------------------------------------------------


def _bad_paths(tmp_path: Path) -> list[str]:
    loop = tmp_path / "loop"
    os.symlink(tmp_path / "loop2", loop)
    os.symlink(loop, tmp_path / "loop2")
    return ["a\x00b", "\ud800x", str(tmp_path / ("a" * 300)), str(loop)]


def test_bad_paths_through_the_api(tmp_path: Path) -> None:
    """NUL, lone-surrogate, over-long and looping-symlink paths are one LowbitError from every
    public reader."""
    import lowbit
    from lowbit.checkpoints import open_checkpoint
    from lowbit.checkpoints.verify import verify_checkpoint
    from lowbit.plans.plan import PrecisionPlan

    readers = [open_checkpoint, verify_checkpoint, PrecisionPlan.from_file, lowbit.load]
    for p in _bad_paths(tmp_path):
        for read in readers:
            with pytest.raises(LowbitError):
                read(p)


def test_bad_paths_through_the_cli(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """The same paths given to commands that read files are one line, exit 2."""
    for p in _bad_paths(tmp_path):
        if "\x00" in p:
            continue  # no command line can hold a NUL
        _one_line(capsys, ["verify", p])
        _one_line(capsys, ["quantize-tensor", p, "--to", "int8:t", "--out", str(tmp_path / "o")])
        _one_line(capsys, ["compare", "--data", p + ".npy", "--formats", "int8:t"])


@pytest.mark.parametrize("length", [243, 250, 255, 256])
def test_out_names_too_long_for_the_lock_file(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, length: int
) -> None:
    """An --out name of 243-255 bytes is a file name the system takes, but its lock file
    (.NAME.lowbit-lock) is not: refused at once, one line, nothing written."""
    src = tmp_path / "t.npy"
    np.save(src, np.arange(64, dtype=np.float32))
    out = tmp_path / ("o" * (length - len(".safetensors")) + ".safetensors")
    _one_line(capsys, ["quantize-tensor", str(src), "--to", "int8:t", "--out", str(out)], "bytes")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.npy"]


def test_out_names_that_cannot_be_paths(tmp_path: Path) -> None:
    """quantize_model refuses an output with a NUL or a lone surrogate as a LowbitError."""
    from lowbit.checkpoints.streaming import quantize_model
    from lowbit.plans.plan import PrecisionPlan

    safetensors = pytest.importorskip("safetensors.numpy")
    src = tmp_path / "m.safetensors"
    safetensors.save_file({"w.weight": np.ones((8, 32), np.float32)}, str(src))
    for out in (str(tmp_path / "a\x00b"), str(tmp_path / "\ud800"), str(tmp_path / ("e" * 250))):
        with pytest.raises(LowbitError, match=r"NUL|characters|bytes"):
            quantize_model(src, PrecisionPlan.uniform("int8"), out, progress=False)


# ---- --eval / --sensitivity files ------------------------------------------------------

_SENS = {"model": "m", "kind": "k", "measure": "proxy", "metric": "m", "calibration": "c",
         "schemes": ["int4"]}  # fmt: skip
_ENTRY = {"tensor": "w.weight", "scheme": "int4", "numel": 256, "bits": 1024, "proxy": 1.0,
          "damage": None}  # fmt: skip


@pytest.mark.parametrize(
    "doc",
    [
        [1],
        "x",
        {**_SENS, "entries": "abc"},
        {**_SENS, "entries": [{**_ENTRY, "numel": 0, "bits": 0}]},  # ZeroDivisionError before
        {**_SENS, "entries": [{**_ENTRY, "numel": 1e300}]},  # a float count: 0 before
        {**_SENS, "entries": [{**_ENTRY, "numel": float("inf")}]},  # OverflowError before
        {**_SENS, "entries": [{**_ENTRY, "bits": 2.5}]},
        {**_SENS, "entries": [], "seconds": [1]},  # AttributeError before
        {**_SENS, "entries": [{**_ENTRY, "proxy": "x"}]},
        {**_SENS, "entries": [5]},
        {**_SENS, "schemes": [1], "entries": []},
    ],
)
def test_malformed_sensitivity_documents(doc: object) -> None:
    """SensitivityResult.from_dict names the bad field in one LowbitError."""
    from lowbit.evaluation.sensitivity_result import SensitivityResult

    with pytest.raises(LowbitError, match="not a lowbit sensitivity result"):
        SensitivityResult.from_dict(doc)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def small_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    safetensors = pytest.importorskip("safetensors.numpy")
    from lowbit.checkpoints.streaming import quantize_model
    from lowbit.plans.plan import PrecisionPlan

    tmp = tmp_path_factory.mktemp("ck")
    src = tmp / "m.safetensors"
    rng = np.random.default_rng(0)
    safetensors.save_file({"w.weight": rng.normal(size=(8, 32)).astype(np.float32)}, str(src))
    quantize_model(src, PrecisionPlan.uniform("int8"), tmp / "q", progress=False)
    return tmp / "q"


@pytest.mark.parametrize("flag", ["--eval", "--sensitivity"])
def test_eval_and_sensitivity_files(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, small_checkpoint: Path, flag: str
) -> None:
    """A FIFO (it hung), 100,000 nested brackets (RecursionError) and a bad document are
    one line from lowbit report."""
    import json

    out = str(tmp_path / "r.html")
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    files = [deep]
    if hasattr(os, "mkfifo"):
        os.mkfifo(tmp_path / "fifo.json")
        files.append(tmp_path / "fifo.json")
    if flag == "--sensitivity":
        bad = tmp_path / "bad.json"
        bad.write_text(json.dumps({**_SENS, "entries": [{**_ENTRY, "numel": 0, "bits": 0}]}))
        files.append(bad)
    for f in files:
        _one_line(capsys, ["report", str(small_checkpoint), flag, str(f), "--out", out])


def test_eval_table_is_bounded(tmp_path: Path, small_checkpoint: Path) -> None:
    """--eval rows that each bring their own keys (rows x keys cells) render in bounded size."""
    import json
    import time

    doc = {"rows": [{f"k{i}": i} for i in range(20_000)]}
    f = tmp_path / "e.json"
    f.write_text(json.dumps(doc))
    t0 = time.perf_counter()
    assert main(["report", str(small_checkpoint), "--eval", str(f), "--out",
                 str(tmp_path / "r.html")]) == 0  # fmt: skip
    assert time.perf_counter() - t0 < 20
    assert (tmp_path / "r.html").stat().st_size < 2_000_000
