"""Which tests take a kernel branch (``lowbit.codecs._numba.taken``): `make test`'s record.

`make test` runs the suite with the compiled kernels, then again with ``LOWBIT_NUMBA=0`` on the
tests whose results can depend on the switch: those during which some process took a branch
it would not take with the kernels off. In the pytest process the plugin of
``tests/_kernel_switch.py`` replaces ``_numba.consulted`` with its own recorder; a process the
tests start (the CLI through ``subprocess``, spawned worker pools, Ray workers) inherits
``LOWBIT_SWITCH_LOG`` and ``PYTEST_CURRENT_TEST`` from the test and appends that test's id to
the log, once per process and test. Recording never changes a result.
"""

from __future__ import annotations

import os
from collections.abc import Callable

#: The log file a test process appends to (set by the recording pytest run only).
ENV = "LOWBIT_SWITCH_LOG"

#: Written for a branch taken outside any test: the recording run then cannot vouch for its
#: list, and `make test` runs the whole suite without the kernels.
UNKNOWN = "?"


def current_test() -> str:
    """The node id of the test pytest is running in this process or its parent, or ``?``."""
    name = os.environ.get("PYTEST_CURRENT_TEST")
    if not name:
        return UNKNOWN
    return name.rsplit(" (", 1)[0]  # "tests/x.py::test_y[p] (call)"


def recorder() -> Callable[[], None] | None:
    """The recorder for a process started under a recording run (``LOWBIT_SWITCH_LOG`` set),
    or None."""
    path = os.environ.get(ENV)
    if not path:
        return None
    seen: set[str] = set()

    def note() -> None:
        test = current_test()
        if test in seen:
            return
        seen.add(test)
        # one short line per write, appended: lines from concurrent processes do not mix
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (test + "\n").encode())
        finally:
            os.close(fd)

    return note
