"""Slow and greedy clients against a real ``dpgate serve`` (issue 19, item 10): raw sockets, short
limits (header 1 s, body 2 s, keep-alive 1 s, 20 connections, 2,000-byte bodies) so that every case
takes seconds.

Before: uvicorn ran with no header or body read timeout and no connection cap (1,500 half-sent
requests stayed open for over a minute), and the body was read before the key was checked.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time

import httpx
import pytest
from _api_server import ServeProcess, free_port, make_project, wait_healthy

from dpgate.auth import KeyStore

HEADER_S, BODY_S, KEEP_ALIVE_S, MAX_CONNECTIONS, MAX_BODY = 1.0, 2.0, 1.0, 20, 2000
SLACK_S = 2.5  # scheduling slack on a loaded machine


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = make_project(tmp_path_factory.mktemp("limits"))
    home = root / ".dpgate"
    key = KeyStore(home / "keys.json").add("alice", role="analyst", consumer="analysts")[0]
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("DPGATE_")}
    env.update({"DPGATE_HTTP_HEADER_TIMEOUT_S": str(HEADER_S), "DPGATE_HTTP_BODY_TIMEOUT_S": str(BODY_S),
                "DPGATE_HTTP_KEEP_ALIVE_S": str(KEEP_ALIVE_S), "DPGATE_HTTP_MAX_CONNECTIONS": str(MAX_CONNECTIONS),
                "DPGATE_MAX_BODY_BYTES": str(MAX_BODY)})
    proc = ServeProcess([sys.executable, "-m", "dpgate", "serve", "--port", str(port), "--home", str(home),
                         "--policies", str(root / "policies"), "--log-level", "warning"], cwd=root, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, timeout_s=120, proc=proc)
        yield url, port, key
    finally:
        proc.stop()


def _connect(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def _read_until_closed(s: socket.socket, timeout_s: float) -> tuple[bytes, float]:
    """Everything the server sends until it closes the connection, and when it closed (monotonic)."""
    s.settimeout(timeout_s)
    data = b""
    try:
        while chunk := s.recv(65536):
            data += chunk
    except ConnectionResetError:
        pass
    except socket.timeout:
        raise AssertionError(f"the server kept the connection open for {timeout_s} s; got {data[:200]!r}")
    return data, time.monotonic()


def _response(raw: bytes) -> tuple[int, dict[str, str], dict]:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
    return status, headers, json.loads(body) if body else {}


def _error_shape(body: dict, code: str) -> None:
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message", "details"}, body
    assert body["error"]["code"] == code, body


def test_half_sent_headers_and_silent_connections_are_closed_after_the_header_timeout(server):
    url, port, _ = server
    start = time.monotonic()
    partial = [_connect(port) for _ in range(150)]
    silent = [_connect(port) for _ in range(50)]
    for s in partial:
        s.sendall(b"POST /v1/queries HTTP/1.1\r\nHost: x\r\nContent-Type: appl")  # and then nothing
    for s in partial:
        raw, closed = _read_until_closed(s, HEADER_S + SLACK_S + 5)
        status, headers, body = _response(raw)
        assert status == 408 and headers["connection"] == "close"
        assert headers["x-content-type-options"] == "nosniff"
        _error_shape(body, "request_timeout")
        assert body["error"]["details"] == {"header_timeout_s": HEADER_S}
    for s in silent:  # nothing sent: closed without an answer
        raw, closed = _read_until_closed(s, HEADER_S + SLACK_S + 5)
        assert raw == b""
    assert closed - start < HEADER_S + SLACK_S + 3, closed - start  # seconds, not the minute before
    for s in partial + silent:
        s.close()
    assert httpx.get(f"{url}/healthz", timeout=10).status_code == 200


def test_a_trickled_request_head_is_cut_at_the_header_timeout(server):
    _, port, _ = server
    s = _connect(port)
    start = time.monotonic()
    request = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 100
    s.settimeout(0.2)
    closed_at = None
    for byte in request:  # one byte every 0.1 s: each byte used to restart nothing, the head never ended
        try:
            s.sendall(bytes([byte]))
        except OSError:
            closed_at = time.monotonic()
            break
        try:
            if s.recv(65536, socket.MSG_PEEK):
                break
        except socket.timeout:
            pass
        except OSError:
            break
        time.sleep(0.1)
    raw, closed = _read_until_closed(s, SLACK_S + 5)
    assert _response(raw)[0] == 408
    assert (closed_at or closed) - start < HEADER_S + SLACK_S
    s.close()


def test_a_slow_body_gets_408_after_the_body_timeout(server):
    _, port, key = server
    s = _connect(port)
    start = time.monotonic()
    s.sendall(f"POST /v1/queries HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n"
              "Content-Type: application/json\r\nContent-Length: 500\r\n\r\n".encode() + b'{"dataset": ')
    raw, closed = _read_until_closed(s, BODY_S + SLACK_S + 5)
    status, headers, body = _response(raw)
    assert status == 408 and headers["connection"] == "close"
    _error_shape(body, "request_timeout")
    assert BODY_S - 0.2 < closed - start < BODY_S + SLACK_S, closed - start
    s.close()


def test_an_unauthenticated_request_is_answered_before_its_body(server):
    _, port, _ = server
    s = _connect(port)
    start = time.monotonic()
    s.sendall(b"POST /v1/queries HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: 1500\r\n\r\n")  # the body never comes
    raw, closed = _read_until_closed(s, SLACK_S + 5)
    status, headers, body = _response(raw)
    assert status == 401 and headers["connection"] == "close" and headers["www-authenticate"] == "Bearer"
    _error_shape(body, "unauthenticated")
    assert closed - start < BODY_S - 0.5, closed - start  # not after waiting for the body
    s.close()


def test_a_body_over_the_cap_is_refused_while_it_streams(server):
    _, port, key = server
    # announced too large: refused before a byte of it is sent
    s = _connect(port)
    s.sendall(f"POST /v1/queries HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n"
              f"Content-Type: application/json\r\nContent-Length: {MAX_BODY * 100}\r\n\r\n".encode())
    raw, _ = _read_until_closed(s, SLACK_S + 5)
    status, headers, body = _response(raw)
    assert status == 413 and headers["connection"] == "close"
    _error_shape(body, "payload_too_large")
    s.close()
    # chunked, no length: refused as soon as it passes the cap, before the client is done sending
    s = _connect(port)
    s.sendall(f"POST /v1/queries HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n"
              "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n".encode())
    chunk = b"x" * 500
    answered = None
    for i in range(200):  # up to 100 kB, far over the 2 kB cap
        try:
            s.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        except OSError:
            answered = i
            break
        s.settimeout(0.05)
        try:
            if s.recv(65536, socket.MSG_PEEK):
                answered = i
                break
        except socket.timeout:
            pass
    assert answered is not None and answered < 20, answered  # ~5 chunks of 500 bytes, not 200
    raw, _ = _read_until_closed(s, SLACK_S + 5)
    assert _response(raw)[0] == 413
    s.close()


def test_an_idle_keep_alive_connection_is_closed_after_the_keep_alive_timeout(server):
    _, port, _ = server
    s = _connect(port)
    s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    start = time.monotonic()
    raw, closed = _read_until_closed(s, KEEP_ALIVE_S + SLACK_S + 5)
    status, headers, _ = _response(raw)
    assert status == 200 and headers["x-content-type-options"] == "nosniff"
    assert KEEP_ALIVE_S - 0.2 < closed - start < KEEP_ALIVE_S + SLACK_S, closed - start
    s.close()


def test_requests_over_the_connection_cap_get_503_in_the_error_shape(server):
    url, port, key = server
    held = []
    for _ in range(MAX_CONNECTIONS):  # requests in flight: headers in, body pending (until BODY_S)
        s = _connect(port)
        s.sendall(f"POST /v1/queries HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n"
                  "Content-Type: application/json\r\nContent-Length: 100\r\n\r\n".encode())
        held.append(s)
    time.sleep(0.2)
    r = httpx.get(f"{url}/healthz", timeout=10)
    assert r.status_code == 503, r.text
    assert r.headers["retry-after"] == "1" and r.headers["x-content-type-options"] == "nosniff"
    _error_shape(r.json(), "server_busy")
    assert r.json()["error"]["details"] == {"max_connections": MAX_CONNECTIONS}
    for s in held:  # each is cut at the body timeout: the cap frees itself
        raw, _ = _read_until_closed(s, BODY_S + SLACK_S + 5)
        assert _response(raw)[0] == 408
        s.close()
    deadline = time.monotonic() + 10
    while (r := httpx.get(f"{url}/healthz", timeout=10)).status_code != 200 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert r.status_code == 200
