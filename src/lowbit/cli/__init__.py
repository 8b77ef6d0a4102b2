"""The ``lowbit`` command: a thin layer over the public functions.

Every module ``lowbit/cli/cmd_*.py`` is a subcommand: it defines ``register(sub)`` which
adds its parser to the argparse sub-parsers and sets ``func=run`` with
``run(args) -> int``. Modules import heavy dependencies inside ``run`` only.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import importlib
import os
import pkgutil
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from typing import Any

from lowbit._optional import install_hint
from lowbit._version import __version__
from lowbit.cli import _common
from lowbit.errors import LowbitError

_DESCRIPTION = """\
lowbit makes the number formats of deep learning exact and visible: what a format
looks like in bits, what range and precision it has, what it costs per value, and
what happens to your numbers when you convert them -- from one value to a whole
checkpoint.

Start with:
  lowbit formats                 every format, with range, precision and cost
  lowbit show 0.3952             one value in every format, bit by bit
  lowbit decode e4m3 0x7e        what a bit pattern means
  lowbit values fp4              every value of a small format

Then your tensors, models and hardware:
  lowbit compare --group 64                        4- and 8-bit choices side by side
  lowbit plan --params 7B                          memory and speed at each precision
  lowbit quantize smollm2 --to int4 --group 128 --out smol-int4
  lowbit eval smollm2 smol-int4                    perplexity, KL, size: one table
  lowbit train-lab --steps 100                     FP16/BF16/FP8/QAT training, emulated

Every command has --help with examples and --json for scripts.
"""


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The ``lowbit`` parser with every subcommand, or with ``command``'s alone.

    Args:
        command: a subcommand name (``quantize-tensor``); when it names one, only its
            module is imported and registered, so ``lowbit show`` does not pay for
            importing what ``lowbit eval`` needs. Anything else: every subcommand.

    Returns:
        The parser.
    """
    parser = argparse.ArgumentParser(
        prog="lowbit",
        description=_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"lowbit {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    names = sorted(m.name for m in pkgutil.iter_modules(__path__) if m.name.startswith("cmd_"))
    only = "cmd_" + command.replace("-", "_") if command else None
    for name in [only] if only in names else names:
        importlib.import_module(f"lowbit.cli.{name}").register(sub)
    return parser


def _command(argv: Sequence[str]) -> str | None:
    """The subcommand ``argv`` names: its first word that is not an option (the top-level
    options, ``-h`` and ``--version``, take no value)."""
    return next((a for a in argv if not a.startswith("-")), None)


#: OSErrors that are one line: the path, not lowbit, is at fault (the safety net; readers and
#: writers turn these into LowbitErrors themselves where they can).
_PATH_ERRNOS = {
    errno.ENAMETOOLONG, errno.ELOOP, errno.ENOTDIR, errno.ENOSPC, errno.EROFS, errno.EFBIG,
    errno.EXDEV, errno.EINVAL, getattr(errno, "EDQUOT", errno.ENOSPC),
}  # fmt: skip
_VALUE_MESSAGES = ("embedded null", "surrogates not allowed", "integer string conversion")


class _Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread: what the run was writing is cleaned up as after
    Ctrl-C (its temporary output and lock removed, a calibration's resume records kept)."""


@contextlib.contextmanager
def _sigterm_cleans_up() -> Iterator[None]:
    """While a command runs, SIGTERM raises :class:`_Terminated` instead of ending the process
    at once (which, like kill -9, left ``OUT.tmp-*`` and the lock for the next run to clear).
    Only where the handler is still the default and this is the main thread: a program that
    calls :func:`main` and handles SIGTERM itself keeps its handler."""
    if threading.current_thread() is not threading.main_thread() or (
        signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
    ):
        yield
        return

    def terminate(_signum: int, _frame: Any) -> None:
        raise _Terminated

    signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit status (2 for bad input, with a one-line message)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    # OpenMP threads (torch's) that finish a loop first sleep instead of spinning: on cores
    # other work holds, spinning threads took the time the one still working needed (two
    # threads ran lowbit eval 6x slower than one there; passive, as fast as one). Read when
    # torch loads its OpenMP runtime, which no command does before this line.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    parser = build_parser(_command(argv))
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    try:
        _common.check_args(args)
        with _sigterm_cleans_up(), _common.warnings_as_lines(args.command):
            return int(args.func(args) or 0)
    except LowbitError as exc:
        print(f"lowbit {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except (FileNotFoundError, IsADirectoryError, PermissionError) as exc:
        print(f"lowbit {args.command}: error: {exc.strerror}: {exc.filename}", file=sys.stderr)
        return 2
    except OSError as exc:  # a path the system refuses: too long, a symlink loop, a full disk
        if exc.errno not in _PATH_ERRNOS:
            raise
        name = str(exc.filename or "")
        shown = name if len(name) <= 80 else name[:60] + f"... ({len(name)} characters)"
        print(f"lowbit {args.command}: error: {exc.strerror}: {shown}", file=sys.stderr)
        return 2
    except ValueError as exc:  # a path with a NUL or lone surrogate; a 4,300-digit number
        if not any(m in str(exc) for m in _VALUE_MESSAGES):
            raise
        why = "a path or name lowbit cannot use" if "digits" not in str(exc) else "a number"
        print(f"lowbit {args.command}: error: {why}: {str(exc)[:120]}", file=sys.stderr)
        return 2
    except ImportError as exc:
        if "pip install" in str(exc):
            print(f"lowbit {args.command}: error: {exc}", file=sys.stderr)
            return 2
        hint = install_hint(getattr(exc, "name", None) or "")
        if hint is None:
            raise
        # an optional dependency imported where no require() names it: still one line
        name = str(exc.name).split(".", 1)[0]
        print(f"lowbit {args.command}: error: this needs {name}: {hint}", file=sys.stderr)
        return 2
    except _Terminated:
        print(f"lowbit {args.command}: terminated (SIGTERM)", file=sys.stderr)
        return 128 + signal.SIGTERM
    except KeyboardInterrupt:
        print(f"lowbit {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
