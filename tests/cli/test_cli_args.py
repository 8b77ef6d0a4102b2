"""Bad option values and range edges on the command line: one line on stderr, exit 2, never a
traceback or a silent default (issue 11, case 9)."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import numpy as np
import pytest

from lowbit.cli import main


def _one_line_error(capsys: pytest.CaptureFixture[str], argv: list[str], *needles: str) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"lowbit {argv[0]}: error: "), err
    for n in needles:
        assert n in err, err


@pytest.fixture
def npy(tmp_path: Path) -> Path:
    path = tmp_path / "w.npy"
    np.save(path, np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32))
    return path


@pytest.mark.parametrize(
    "argv",
    [
        ["compare", "--seed", "-1"],
        ["compare", "--seed", str(2**64)],
        ["show", "1.5", "--rounding", "stochastic", "--seed", "-1"],
        ["show", "1.5", "--seed", "-1"],  # refused even where no rounding would use it
        ["quantize-tensor", "{npy}", "--to", "int4", "--rounding", "stochastic", "--seed", "-1"],
        ["train-lab", "--seed", "-1"],
    ],
)
def test_negative_seed(capsys: pytest.CaptureFixture[str], npy: Path, argv: list[str]) -> None:
    """--seed -1 (numpy's ValueError traceback before) and seeds past 2**63-1: exit 2."""
    argv = [a.format(npy=npy) for a in argv]
    _one_line_error(capsys, argv, "--seed must be an integer from 0 to 2**63-1", argv[-1])


def test_seed_zero_and_largest_accepted(capsys: pytest.CaptureFixture[str], npy: Path) -> None:
    """0 and 2**63-1 are seeds (train-lab used to refuse 0 as 'not positive')."""
    from lowbit.cli import cmd_train_lab

    for seed in ("0", str(2**63 - 1)):
        argv = ["quantize-tensor", str(npy), "--to", "int4", "--rounding", "stochastic"]
        assert main([*argv, "--seed", seed]) == 0
    capsys.readouterr()
    ns = argparse.Namespace(d_model=None, layers=None, ctx=None, steps=2, batch_size=None,
                            lr=None, seed=0, threads=None)  # fmt: skip
    assert cmd_train_lab._config(ns).seed == 0


@pytest.mark.parametrize("command", [["quantize-tensor", "{f}", "--to", "int4"],
                                     ["compare", "--data", "{f}"]])  # fmt: skip
def test_empty_npy_file(capsys: pytest.CaptureFixture[str], tmp_path: Path, command) -> None:
    """A 0-byte .npy (EOFError traceback before): exit 2 naming the file."""
    f = tmp_path / "empty.npy"
    f.write_bytes(b"")
    _one_line_error(capsys, [a.format(f=f) for a in command], "cannot read", str(f))


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["show", "1.5", "--formats", ""], "--formats"),
        (["show", "1.5", "--formats", " , "], "--formats"),
        (["overflow-demo", "--formats", ""], "--formats"),
        (["compare", "--formats", ""], "--formats"),
        (["plan", "--params", "7B", "--precisions", ""], "--precisions"),
        (["plan", "--params", "7B", "--precisions", ","], "--precisions"),
        (["plan", "--params", "7B", "--devices", ""], "--devices"),
        (["train-lab", "--recipes", ""], "--recipes"),
    ],
)
def test_empty_lists_are_errors(
    capsys: pytest.CaptureFixture[str], argv: list[str], flag: str
) -> None:
    """An empty list option is an error naming it, not a silent fall-back to the default."""
    _one_line_error(capsys, argv, f"{flag} is empty")


def test_mx_overflow_is_an_error(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """quantize-tensor of float64 1e300 to mxfp4: exit 2 (it saturated to 1.02e39 before)."""
    f = tmp_path / "huge.npy"
    np.save(f, np.array([1e300] + [1.0] * 31))
    _one_line_error(capsys, ["quantize-tensor", str(f), "--to", "mxfp4"],
                    "a scale overflows float8_e8m0fnu")  # fmt: skip


def test_underflow_warns_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """quantize-tensor and compare of float64 1e-300: each format that turned the tensor
    into zeros says so on one stderr line; the command still succeeds."""
    f = tmp_path / "tiny.npy"
    np.save(f, np.array([[1e-300, -2e-300, 0.0, 4e-300]]))
    assert main(["quantize-tensor", str(f), "--to", "int4", "--json"]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "lowbit quantize-tensor: warning: int4:ch:fp32: all 4 values quantized to zero though 3 are "
        "nonzero (largest |x| 4e-300): the float32 scales underflowed to their smallest value; "
        "scale the input up first (underflow='ignore' silences this, 'raise' makes it an error)"
    ]
    assert main(["compare", "--data", str(f), "--formats", "int4,mxfp4,int8"]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert [re.match(r"lowbit compare: warning: (\S+): all 4 values", e)[1] for e in err] == [
        "int4:ch:fp32",
        "mxfp4",
        "int8:ch:fp32",
    ]
