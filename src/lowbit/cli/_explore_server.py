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
prints; anything unexpected answers 500 with one such line, never a traceback. The page
(:func:`lowbit.view._explore_page.page`) needs no network.

What a web page in the same browser can and cannot get (docs/security.md): the server reads no
file named in a request (``data`` is one of the synthetic distributions), answers only requests
whose ``Host`` is the address it serves (``127.0.0.1:PORT`` or ``localhost:PORT``: a DNS
rebinding page sends its own name) and whose ``Origin``, when sent, is that address too (403
otherwise), refuses query strings over :data:`MAX_QUERY` bytes, and bounds each request's work
(at most :data:`MAX_FORMATS` formats, :data:`_MAX_RANGE_WORK` range evaluations, 2^20 compare
values).
"""

from __future__ import annotations

import contextlib
import io
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from lowbit.cli import _common, _payloads, build_parser
from lowbit.cli._payloads import DISTRIBUTIONS, show_payload
from lowbit.errors import LowbitError
from lowbit.formats.explain import parse_value
from lowbit.view._explore_page import page

__all__ = ["HOST", "api", "make_server", "serve_in_thread"]

#: The only address the explorer listens on.
HOST = "127.0.0.1"
_MAX_RANGE_POINTS = 2001
#: The longest query string the explorer reads (the page's own are under 200 bytes).
MAX_QUERY = 4096
#: The most formats one request may name (the catalog's ``all`` counts as its size).
MAX_FORMATS = 64
#: Range points times formats per request: two formats at the most points (about 2.3 s on a
#: 2-core AMD EPYC).
_MAX_RANGE_WORK = 2 * _MAX_RANGE_POINTS
#: Compare formats times values per request.
_MAX_COMPARE_WORK = 8 << 20
#: Seconds a connection may take to send its request before the server drops it.
_REQUEST_TIMEOUT = 30


def _one(q: dict[str, list[str]], key: str, default: str | None = None) -> str:
    v = q.get(key)
    if not v:
        if default is None:
            raise LowbitError(f"missing field {key!r}")
        return default
    return v[0]


def _names(q: dict[str, list[str]]) -> list[str] | None:

    text = q.get("formats", [None])[0]
    if text is None:
        return None
    names = _common.parse_names(text, "--formats")
    if len(names) > MAX_FORMATS:
        raise LowbitError(f"{len(names)} formats; the explorer takes at most {MAX_FORMATS}")
    return names


def _small_int(q: dict[str, list[str]], key: str, default: str) -> int:
    text = _one(q, key, default)
    if not (text.isascii() and text.isdigit() and len(text) <= 9):
        raise LowbitError(f"{key} must be a non-negative integer below 10^9, got {text[:40]!r}")
    return int(text)


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

    if len(query) > MAX_QUERY:
        raise LowbitError(
            f"the query is {len(query):,} bytes; the explorer reads at most {MAX_QUERY}"
        )
    q = parse_qs(query, keep_blank_values=True, max_num_fields=64)
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
        data = _one(q, "data", "normal")
        if data not in DISTRIBUTIONS:  # never a path: a web page must not name the user's files
            raise LowbitError(
                f"data {data[:40]!r}: the explorer draws {', '.join(DISTRIBUTIONS)} "
                f"(it reads no files)"
            )
        size = _small_int(q, "size", "65536")
        if size > 1 << 20:
            raise LowbitError(f"--size {size} is more than the explorer computes (1048576)")
        names = _names(q) or []
        if len(names) * size > _MAX_COMPARE_WORK:
            raise LowbitError(
                f"{len(names)} formats of {size} values is more than the explorer computes"
            )
        argv = ["compare", "--formats", _one(q, "formats"), "--data", data, "--size", str(size)]
        if q.get("group") and q["group"][0]:
            argv += ["--group", str(_small_int(q, "group", "0"))]
        try:
            with contextlib.redirect_stderr(io.StringIO()):  # argparse's usage text
                args = build_parser().parse_args(argv)
        except SystemExit:
            raise LowbitError(f"bad compare options: {' '.join(argv[1:])}") from None
        payload, _, _ = _payloads.compare_payload(args)
        return cmd, payload
    if cmd == "range":
        return "show", _range(q)
    raise LowbitError(f"no such endpoint {path}")


def _range(q: dict[str, list[str]]) -> dict[str, Any]:

    names = _names(q)
    lo, hi = parse_value(_one(q, "lo")), parse_value(_one(q, "hi"))
    n = _small_int(q, "n", "201")
    if not 2 <= n <= _MAX_RANGE_POINTS:
        raise LowbitError(f"n must be from 2 to {_MAX_RANGE_POINTS}, got {n}")
    count = len(show_payload("0", names)["results"])  # "all": the catalog's size
    if n * count > _MAX_RANGE_WORK:
        raise LowbitError(
            f"{n} points of {count} formats is more than the explorer computes "
            f"({_MAX_RANGE_WORK:,} conversions); ask for fewer points or formats"
        )
    if not lo < hi:
        raise LowbitError(f"the range must have lo < hi, got {lo} .. {hi}")

    xs = [lo + (hi - lo) * k / (n - 1) for k in range(n)]
    points = [show_payload(repr(x), names) for x in xs]
    return {
        "formats": [r["format"] for r in points[0]["results"]],
        "x": xs,
        "results": [p["results"] for p in points],
    }


def _allowed(headers: Any, port: int) -> str | None:
    """Why a request may not be answered (None: it may): its ``Host`` is not the served
    address (a DNS-rebinding page's own name), or its ``Origin`` is another site."""
    own = {f"{HOST}:{port}", f"localhost:{port}"}
    host = headers.get("Host")
    if host is None or host.strip().lower() not in own:
        return f"Host {str(host)[:80]!r} is not this server's address ({HOST}:{port})"
    origin = headers.get("Origin")
    if origin is not None and origin.strip().lower() not in {f"http://{h}" for h in own}:
        return f"Origin {origin[:80]!r} is another site; the explorer answers only its own page"
    return None


class _Handler(BaseHTTPRequestHandler):
    server_version = "lowbit-explore"
    timeout = _REQUEST_TIMEOUT

    def do_GET(self) -> None:

        why = _allowed(self.headers, self.server.server_address[1])
        if why is not None:
            body = json.dumps({"error": f"lowbit explore: error: {why}"}).encode("utf-8")
            self._send(403, "application/json", body)
            return
        url = urlsplit(self.path)
        if url.path in ("/", "/index.html"):
            self._send(200, "text/html; charset=utf-8", page().encode("utf-8"))
            return
        if url.path == "/favicon.ico":
            self._send(204, "image/x-icon", b"")
            return
        if not url.path.startswith("/api/"):
            self.send_error(404, f"no page {url.path[:80]}")
            return
        cmd = url.path.removeprefix("/api/")
        try:
            cmd, doc = api(url.path, url.query)
            status = 200
        except LowbitError as exc:
            doc, status = {"error": f"lowbit {cmd[:40]}: error: {_line(exc)}"}, 400
        except Exception as exc:  # a bug answers one line, never a traceback
            doc = {"error": f"lowbit {cmd[:40]}: internal error: {type(exc).__name__}"}
            status = 500
        body = json.dumps(_common.to_jsonable(doc)).encode("utf-8")
        self._send(status, "application/json", body)

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """Every refusal (a malformed request line, another method, a missing page) as one
        JSON error line, like the API's."""
        text = message or self.responses.get(code, ("error",))[0]
        body = json.dumps({"error": f"lowbit explore: error: {_line(Exception(text))}"})
        self.close_connection = True
        self._send(code, "application/json", body.encode("utf-8"))

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


def _line(exc: Exception) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= 500 else text[:497] + "..."


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
