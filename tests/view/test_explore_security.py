"""What ``lowbit explore`` tells other web pages: nothing. No file named in a request is read,
a request whose Host or Origin is not the served address is refused (DNS rebinding), each
request's work is bounded, and every failure is one JSON error line."""

from __future__ import annotations

import http.client
import json
import socket
import time
from pathlib import Path

import numpy as np
import pytest

from lowbit.cli import _explore_server
from lowbit.cli._explore_server import MAX_QUERY, api, serve_in_thread
from lowbit.errors import LowbitError


@pytest.fixture(scope="module")
def server():
    srv, _ = serve_in_thread(0)
    try:
        yield srv.server_address[1]
    finally:
        srv.shutdown()
        srv.server_close()


def _request(port: int, path: str, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("GET", path, headers=headers or {})
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


def _error_line(body: bytes) -> str:
    doc = json.loads(body)
    assert list(doc) == ["error"] and "\n" not in doc["error"] and "Traceback" not in doc["error"]
    return doc["error"]


def test_no_file_from_the_query(server: int, tmp_path: Path) -> None:
    """data=PATH is refused without reading it: the answer holds no fact of the file."""
    secret = tmp_path / "secret_weights.npy"
    np.save(secret, np.arange(12, dtype=np.float32).reshape(3, 4))
    for data in (str(secret), "secret_weights.npy", "file://" + str(secret), "/dev/zero"):
        with pytest.raises(LowbitError, match="reads no files"):
            api("/api/compare", f"formats=int8:t&data={data}")
        status, body = _request(server, f"/api/compare?formats=int8:t&data={data}")
        line = _error_line(body)
        assert status == 400 and "(3, 4)" not in line and "secret_weights (" not in line


@pytest.mark.parametrize(
    "headers",
    [
        {"Host": "evil.example:80"},
        {"Host": "attacker.test"},
        {"Host": "127.0.0.1:1"},
        {"Origin": "http://evil.example"},
        {"Origin": "null"},
    ],
)
def test_other_hosts_and_origins_are_refused(server: int, headers: dict[str, str]) -> None:
    """A DNS-rebinding page (its own name in Host) or another site's fetch (its Origin) gets
    403 and one JSON line, for the page and every endpoint."""
    for path in ("/", "/api/show?value=1", "/api/values?format=fp4"):
        status, body = _request(server, path, headers)
        assert status == 403, (path, headers)
        assert "address" in _error_line(body) or "another site" in _error_line(body)


def test_own_address_is_served(server: int) -> None:
    """127.0.0.1:PORT and localhost:PORT, with or without the page's own Origin, are answered."""
    for host in (f"127.0.0.1:{server}", f"localhost:{server}"):
        for origin in ({}, {"Origin": f"http://{host}"}):
            status, _ = _request(server, "/api/show?value=1", {"Host": host, **origin})
            assert status == 200


def test_missing_host_is_refused(server: int) -> None:
    """An HTTP/1.0 request without Host (nothing to check it against) is refused."""
    with socket.create_connection(("127.0.0.1", server), timeout=30) as s:
        s.sendall(b"GET /api/show?value=1 HTTP/1.0\r\n\r\n")
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    assert b" 403 " in head.split(b"\r\n")[0]
    _error_line(body)


@pytest.mark.parametrize(
    "query",
    [
        "formats=all&lo=0&hi=1&n=2001",  # 96,048 conversions: 46 s before
        "formats=" + ",".join(["fp8"] * 65) + "&lo=0&hi=1&n=2",
        "formats=" + ",".join(["int4:t"] * 20) + "&size=1048576",
        "value=1&formats=" + ",".join(["fp8"] * 65),
        "value=" + "1" * (MAX_QUERY + 1),
        "formats=fp4&lo=0&hi=1&n=" + "9" * 5000,
        "format=e4m3&code=" + "9" * 4000,  # past Python's 4,300-digit limit once printed
        "formats=int8:t&group=" + "9" * 4000,
        "formats=int8:t&size=" + "9" * 50,
    ],
)
def test_work_per_request_is_bounded(query: str) -> None:
    """Requests asking for too much work or too large numbers are one LowbitError, fast."""
    t0 = time.perf_counter()
    path = "/api/range" if "lo=" in query else "/api/decode" if "code=" in query else "/api/show"
    if "size=" in query or "group=" in query:
        path = "/api/compare"
    with pytest.raises(LowbitError):
        api(path, query)
    assert time.perf_counter() - t0 < 1.0


def test_every_failure_is_one_json_line(server: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """A malformed request line, another method, a missing page and a bug inside an endpoint
    each answer one JSON error line (no HTML page, no traceback)."""
    status, body = _request(server, "/nowhere")
    assert status == 404 and _error_line(body)
    conn = http.client.HTTPConnection("127.0.0.1", server, timeout=30)
    conn.request("POST", "/api/show?value=1")
    r = conn.getresponse()
    assert r.status == 501 and _error_line(r.read())
    conn.close()
    with socket.create_connection(("127.0.0.1", server), timeout=30) as s:
        s.sendall(b"GARBAGE\r\n\r\n")
        data = s.recv(65536)
    # a request line with no version is HTTP/0.9's: the answer is the body alone
    assert "Bad request syntax" in _error_line(data.rpartition(b"\r\n\r\n")[2])

    def boom(path: str, query: str) -> None:
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(_explore_server, "api", boom)
    status, body = _request(server, "/api/show?value=1")
    assert status == 500 and _error_line(body) == "lowbit show: internal error: ZeroDivisionError"
