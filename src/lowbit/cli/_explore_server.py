"""``lowbit explore``'s server: the format explorer page and its JSON endpoints, on 127.0.0.1.

Standard library only (``http.server.ThreadingHTTPServer``). Every endpoint answers with the
document the matching command prints with ``--json``, built by the same function
(:mod:`lowbit.cli._payloads`):

- ``GET /api/show?value=V[&formats=A,B][&rounding=M][&saturate=1]``: ``lowbit show V --json``
- ``GET /api/decode?format=F&code=C``: ``lowbit decode F C --json``
- ``GET /api/values?format=F``: ``lowbit values F --json``
- ``GET /api/compare?formats=A,B[&data=normal][&size=N][&group=G]``: ``lowbit compare --json``
- ``GET /api/range?formats=A,B&lo=L&hi=H[&n=N]``: ``show_payload`` at ``N`` evenly spaced
  values from L to H (the rounding error of each format over a range)

Bad input answers 400 with ``{"error": "lowbit CMD: error: MESSAGE"}``, the line the command
prints. The page (:func:`lowbit.view._explore_page.page`) needs no network.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from lowbit.cli import _common, _payloads, build_parser
from lowbit.cli._payloads import show_payload
from lowbit.errors import LowbitError
from lowbit.formats.explain import parse_value
from lowbit.view._explore_page import page

__all__ = ["HOST", "api", "make_server", "serve_in_thread"]

#: The only address the explorer listens on.
HOST = "127.0.0.1"
_MAX_RANGE_POINTS = 2001


def _one(q: dict[str, list[str]], key: str, default: str | None = None) -> str:
    v = q.get(key)
    if not v:
        if default is None:
            raise LowbitError(f"missing field {key!r}")
        return default
    return v[0]


def _names(q: dict[str, list[str]]) -> list[str] | None:

    text = q.get("formats", [None])[0]
    return _common.parse_names(text, "--formats") if text is not None else None


def api(path: str, query: str) -> tuple[str, Any]:
    """Answer one API request.

    Args:
        path: ``/api/show``, ``/api/decode``, ``/api/values``, ``/api/compare``, ``/api/range``.
        query: the URL query string.

    Returns:
        ``(command name, JSON-able document)``.

    Raises:
        LowbitError: bad input (the caller answers 400 with the CLI's line), or an unknown path.
    """

    q = parse_qs(query, keep_blank_values=True)
    cmd = path.removeprefix("/api/")
    if cmd == "show":
        return cmd, _payloads.show_payload(
            _one(q, "value"),
            _names(q),
            rounding=_one(q, "rounding", "nearest_even"),
            saturate=_one(q, "saturate", "0") in ("1", "true", "on"),
        )
    if cmd == "decode":
        return cmd, _payloads.decode_payload(_one(q, "format"), _one(q, "code"))
    if cmd == "values":
        return cmd, _payloads.values_payload(_one(q, "format"))
    if cmd == "compare":
        argv = ["compare", "--formats", _one(q, "formats"), "--data", _one(q, "data", "normal")]
        argv += ["--size", _one(q, "size", "65536")]
        if q.get("group") and q["group"][0]:
            argv += ["--group", q["group"][0]]
        try:
            args = build_parser().parse_args(argv)
        except SystemExit:
            raise LowbitError(f"bad compare options: {' '.join(argv[1:])}") from None
        if args.size > 1 << 20:
            raise LowbitError(f"--size {args.size} is more than the explorer computes (1048576)")
        payload, _, _ = _payloads.compare_payload(args)
        return cmd, payload
    if cmd == "range":
        return "show", _range(q)
    raise LowbitError(f"no such endpoint {path}")


def _range(q: dict[str, list[str]]) -> dict[str, Any]:

    names = _names(q)
    lo, hi = parse_value(_one(q, "lo")), parse_value(_one(q, "hi"))
    try:
        n = int(_one(q, "n", "201"))
    except ValueError:
        raise LowbitError(f"n must be an integer, got {_one(q, 'n')!r}") from None
    if not 2 <= n <= _MAX_RANGE_POINTS:
        raise LowbitError(f"n must be from 2 to {_MAX_RANGE_POINTS}, got {n}")
    if not lo < hi:
        raise LowbitError(f"the range must have lo < hi, got {lo} .. {hi}")

    xs = [lo + (hi - lo) * k / (n - 1) for k in range(n)]
    points = [show_payload(repr(x), names) for x in xs]
    return {
        "formats": [r["format"] for r in points[0]["results"]],
        "x": xs,
        "results": [p["results"] for p in points],
    }


class _Handler(BaseHTTPRequestHandler):
    server_version = "lowbit-explore"

    def do_GET(self) -> None:

        url = urlsplit(self.path)
        if url.path in ("/", "/index.html"):
            self._send(200, "text/html; charset=utf-8", page().encode("utf-8"))
            return
        if url.path == "/favicon.ico":
            self._send(204, "image/x-icon", b"")
            return
        if not url.path.startswith("/api/"):
            self._send(404, "text/plain; charset=utf-8", b"not found")
            return
        cmd = url.path.removeprefix("/api/")
        try:
            cmd, doc = api(url.path, url.query)
            status = 200
        except LowbitError as exc:
            doc, status = {"error": f"lowbit {cmd}: error: {exc}"}, 400
        body = json.dumps(_common.to_jsonable(doc)).encode("utf-8")
        self._send(status, "application/json", body)

    def _send(self, status: int, ctype: str, body: bytes) -> None:
        try:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the page was closed or reloaded before the answer came

    def log_message(self, format: str, *args: Any) -> None:
        pass  # the library never prints; the CLI says where the page is


def make_server(port: int = 0) -> ThreadingHTTPServer:
    """A server on 127.0.0.1 (``port`` 0: a free port; read it from ``server_address``).

    Raises:
        LowbitError: the port is out of range or taken.
    """
    if not 0 <= port <= 65535:
        raise LowbitError(f"--port must be from 0 to 65535, got {port}")
    try:
        server = ThreadingHTTPServer((HOST, port), _Handler)
    except OSError as exc:
        raise LowbitError(f"cannot listen on {HOST}:{port}: {exc.strerror or exc}") from None
    server.daemon_threads = True
    return server


def serve_in_thread(port: int = 0) -> tuple[ThreadingHTTPServer, str]:
    """Start a server in a daemon thread; returns it and its URL (stop with ``shutdown()``)."""
    server = make_server(port)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    host, real_port = server.server_address[:2]
    return server, f"http://{host}:{real_port}/"
