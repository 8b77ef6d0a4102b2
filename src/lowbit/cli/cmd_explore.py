"""``lowbit explore``: the format explorer in the browser, served on 127.0.0.1."""

from __future__ import annotations

import argparse
from typing import Any

from lowbit.cli._explore_server import make_server

_EPILOG = """\
A local page: type a value and see it in every format with coloured sign, exponent and
mantissa bits; click a bit to flip it; every value of a format of 8 bits or fewer on a
number line (linear or log); two formats' grids and rounding errors over a range. The
numbers come from the same functions as `lowbit show/decode/values/compare --json`.
The server listens on 127.0.0.1 only and needs no network; stop it with Ctrl-C.

examples:
  lowbit explore                    a free port, opens the browser
  lowbit explore --port 8765 --no-browser
"""


def register(sub: Any) -> None:
    p = sub.add_parser(
        "explore",
        help="the format explorer in your browser (local server on 127.0.0.1)",
        description="Serve the format explorer on 127.0.0.1 and open it in the browser.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--port", type=int, default=0, help="port (default 0: a free one)")
    p.add_argument("--no-browser", action="store_true", help="print the URL, open nothing")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:

    server = make_server(args.port)
    host, port = server.server_address[:2]
    url = f"http://{host}:{port}/"
    print(f"lowbit explore: serving {url} (Ctrl-C stops it)", flush=True)
    if not args.no_browser:
        import webbrowser

        webbrowser.open(url)
    try:
        server.serve_forever()
    finally:
        server.server_close()
    return 0
