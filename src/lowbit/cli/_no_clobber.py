"""Checks of the parsed arguments every command gets before it does any work: outputs are
never inputs, and numbers are in range for any use (:func:`check_numbers`).

Every option that names something the command writes (``--out``, ``--plot``, ``--png``,
``--save-dir``) is compared with every other argument that names an existing file or folder
(the model, ``--calib``, ``--imatrix``, ``--plan``, ``--eval``, ``--data``, ...), by real path
(symbolic links resolved) and by device and inode (hard links), through
:func:`lowbit.checkpoints.io.outputs.check_not_input`. ``--overwrite`` changes nothing here:
an input is never replaced, even one lowbit wrote (a GGUF it quantized, an imatrix file).
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Iterator

from lowbit.checkpoints.io.outputs import check_not_input, same_file
from lowbit.errors import LowbitError

#: Options whose value is a file or folder the command writes (argparse dests).
FILE_OUTPUTS = ("out", "plot")
#: Options naming a folder the command writes files into: it must not be an input itself.
FOLDER_OUTPUTS = ("png", "save_dir")


def _paths(value: object) -> Iterator[str]:
    if isinstance(value, (str, os.PathLike)):
        yield os.fspath(value)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _paths(v)


def _inputs(args: argparse.Namespace) -> list[str]:
    """Every argument that is not an output and names an existing file or folder."""
    found = []
    for dest, value in vars(args).items():
        if dest in FILE_OUTPUTS or dest in FOLDER_OUTPUTS or dest in ("command", "func"):
            continue
        for p in _paths(value):
            try:
                if p and "\0" not in p and os.path.lexists(p):
                    found.append(p)
            except (OSError, ValueError):
                continue  # a name the system cannot hold: the command's own checks say so
    return found


def check_outputs_are_not_inputs(args: argparse.Namespace) -> None:
    """Refuse an output option that is, contains or lies inside an input argument.

    Raises:
        LowbitError: naming the option, the output and the input.
    """
    inputs = _inputs(args)
    if not inputs:
        return
    for dest in FILE_OUTPUTS:
        value = getattr(args, dest, None)
        if isinstance(value, (str, os.PathLike)) and os.fspath(value):
            check_not_input(value, inputs, flag=dest.replace("_", "-"))
    for dest in FOLDER_OUTPUTS:
        value = getattr(args, dest, None)
        if isinstance(value, (str, os.PathLike)) and os.fspath(value):
            for given in inputs:
                if same_file(value, given):
                    check_not_input(value, [given], flag=dest.replace("_", "-"))


#: The magnitude past which no integer option means anything (and numpy, struct and torch
#: raise OverflowError): every count, size and seed lowbit takes fits in 63 bits.
INT_LIMIT = 2**63


def check_numbers(args: argparse.Namespace) -> None:
    """Every number option in range for any use: integers within +-2**63, floats finite.

    Each command checks its own ranges after this (``--threads >= 1``, ...); this bounds
    what reaches them, so ``--steps 10**30`` or ``--lr nan`` is one line, not an
    OverflowError or a silent NaN deep inside.

    Raises:
        LowbitError: naming the option.
    """
    for dest, value in vars(args).items():
        flag = "--" + dest.replace("_", "-")
        if isinstance(value, bool):
            continue
        if isinstance(value, int) and not -INT_LIMIT <= value < INT_LIMIT:
            digits = len(str(abs(value)))
            raise LowbitError(f"{flag}: a {digits}-digit number is past any value it takes")
        if isinstance(value, float) and not math.isfinite(value):
            raise LowbitError(f"{flag} must be a finite number, got {value}")
