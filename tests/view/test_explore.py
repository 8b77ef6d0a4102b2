"""``lowbit explore``'s server answers with exactly the documents of the CLI's --json, on
127.0.0.1 only, and bad input with the CLI's one line."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from lowbit.cli import main
from lowbit.cli._explore_server import HOST, api, make_server, serve_in_thread
from lowbit.errors import LowbitError


@pytest.fixture(scope="module")
def url():
    server, address = serve_in_thread(0)
    try:
        yield address
    finally:
        server.shutdown()
        server.server_close()


def _get(url: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def _cli(capsys: pytest.CaptureFixture, *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err.strip()


@pytest.mark.parametrize(
    ("path", "argv"),
    [
        ("show?value=0.3952", ["show", "0.3952", "--json"]),
        ("show?value=1000&formats=e4m3,e5m2&saturate=1",
         ["show", "1000", "--formats", "e4m3,e5m2", "--saturate", "--json"]),
        ("decode?format=e4m3&code=0x7e", ["decode", "e4m3", "0x7e", "--json"]),
        ("values?format=fp4", ["values", "fp4", "--json"]),
        ("compare?formats=int8:t,fp4:t&size=4096",
         ["compare", "--formats", "int8:t,fp4:t", "--size", "4096", "--json"]),
    ],
)  # fmt: skip
def test_endpoint_equals_cli_json(url: str, capsys, path: str, argv: list[str]) -> None:
    """Each endpoint's document is the command's --json output (compare: less its plot key)."""
    status, doc = _get(url + "api/" + path)
    rc, out, _ = _cli(capsys, *argv)
    assert status == 200 and rc == 0
    want = json.loads(out)
    want.pop("plot", None)
    assert doc == want


@pytest.mark.parametrize(
    ("path", "argv"),
    [
        ("show?value=abc", ["show", "abc"]),
        ("show?value=1&formats=e9m9", ["show", "1", "--formats", "e9m9"]),
        ("decode?format=e4m3&code=0x1ff", ["decode", "e4m3", "0x1ff"]),
        ("values?format=bf16", ["values", "bf16"]),
    ],
)
def test_bad_input_gives_the_cli_line(url: str, capsys, path: str, argv: list[str]) -> None:
    """A bad field answers 400 with exactly the line the command prints on stderr."""
    status, doc = _get(url + "api/" + path)
    rc, _, err = _cli(capsys, *argv)
    assert status == 400 and rc == 2
    assert doc == {"error": err}


def test_range_is_show_at_each_point() -> None:
    """/api/range gives show's result at n evenly spaced values (fp4 rounds 2.5 to 2)."""
    cmd, doc = api("/api/range", "formats=fp4,e4m3&lo=0&hi=5&n=3")
    assert cmd == "show" and doc["x"] == [0.0, 2.5, 5.0]
    assert doc["formats"] == ["float4_e2m1fn", "float8_e4m3fn"]
    assert [r[0]["value"] for r in doc["results"]] == [0.0, 2.0, 4.0]
    for bad in ("formats=fp4&lo=1&hi=0", "formats=fp4&lo=0&hi=1&n=1", "formats=fp4&lo=x&hi=1"):
        with pytest.raises(LowbitError):
            api("/api/range", bad)


def test_binds_loopback_only_and_page_is_offline(url: str) -> None:
    """The server listens on 127.0.0.1; the page loads no external resource."""
    assert url.startswith(f"http://{HOST}:")
    with urllib.request.urlopen(url, timeout=30) as r:
        page = r.read().decode()
    assert "<script>" in page and "float4_e2m1fn" in page
    for external in ("http://", "https://", "<link", "src="):
        assert external not in page
    with pytest.raises(LowbitError, match="port"):
        make_server(70000)


def test_cli_explore_prints_its_url_and_serves() -> None:
    """`lowbit explore --port 0 --no-browser` prints a 127.0.0.1 URL with the free port it got,
    and that URL serves the page."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "lowbit.cli", "explore", "--port", "0", "--no-browser"],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        line = proc.stdout.readline()  # type: ignore[union-attr]
        assert line.startswith("lowbit explore: serving http://127.0.0.1:")
        url = line.split()[3]
        port = int(url.rstrip("/").rsplit(":", 1)[1])
        assert port > 0
        with urllib.request.urlopen(url, timeout=30) as r:
            assert b"lowbit explore" in r.read()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        proc.stdout.close()  # type: ignore[union-attr]


def test_cli_explore_bad_port(capsys) -> None:
    """A port out of range is the usual one-line error, exit 2."""
    assert main(["explore", "--port", "99999", "--no-browser"]) == 2
    assert capsys.readouterr().err.strip() == (
        "lowbit explore: error: --port must be from 0 to 65535, got 99999"
    )
