"""HTTP hardening inside the application (issue 19, item 10): nosniff on every answer, the API key
checked before the body is read, a locked or unreachable ledger answered 503 ``ledger_unavailable``
with ``Retry-After`` after a short bounded wait, and ``GET /readyz``.

The slow-client limits of the server itself (header and body read timeouts, keep-alive, the
connection cap) are tested against a real ``dpgate serve`` in tests/test_api_serve_limits.py.
PostgreSQL cases use the server at ``DPGATE_TEST_POSTGRES_URL`` (default
``postgresql://postgres@127.0.0.1:5432/test``) through a TCP relay the test owns: "the server is
down" is the relay closing, never the shared server stopping.
"""

from __future__ import annotations

import os
import secrets
import socket
import sqlite3
import threading
import time

import httpx

from dpgate.api import errors as api_errors
import pytest
from _api_server import LiveServer, assert_error, free_port, make_project

from dpgate.api import create_app
from dpgate.auth import KeyStore
from dpgate.errors import LedgerUnavailable
from dpgate.settings import Settings

QUERY = {"dataset": "usage", "sql": "SELECT region, COUNT(*) AS n FROM prompts GROUP BY region"}
PG_URL = os.environ.get("DPGATE_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
WAIT_S = 0.5  # the ledger wait of these tests (default 2 s)


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    return make_project(tmp_path_factory.mktemp("project"))


def _keys(settings: Settings) -> dict[str, str]:
    store = KeyStore(settings.resolved_keys_file())
    return {"analyst": store.add("alice", role="analyst", consumer="analysts")[0],
            "admin": store.add("root", role="admin")[0]}


# --- nosniff and the key gate ---------------------------------------------------------------


def test_every_answer_carries_nosniff_errors_included(project, tmp_path):
    settings = Settings(policies=project / "policies", home=tmp_path / "state", max_body_bytes=2000)
    keys = _keys(settings)
    app = create_app(settings)
    with LiveServer(app) as live, live.client(keys["analyst"]) as c, live.client() as anon:
        answers = {
            "healthz": c.get("/healthz"), "readyz": c.get("/readyz"), "datasets": c.get("/v1/datasets"),
            "query": c.post("/v1/queries", json=QUERY), "401": anon.get("/v1/datasets"),
            "403": c.get("/v1/admin/ledger"), "404": c.get("/v1/releases/rel_missing"),
            "404-route": c.get("/nowhere"), "400": c.post("/v1/queries", json={"dataset": "usage"}),
            "405": c.delete("/v1/datasets"), "413": c.post("/v1/queries", content=b"{" * 5000,
                                                           headers={"Content-Type": "application/json"}),
            "openapi": c.get("/openapi.json"), "ui": c.get("/ui/login"),
        }
        # an unexpected failure (500) is answered by Starlette outside the middleware: still nosniff
        app.state.gateway.datasets = lambda: 1 / 0
        answers["500"] = c.get("/v1/datasets")
    statuses = {name: r.status_code for name, r in answers.items()}
    assert statuses == {"healthz": 200, "readyz": 200, "datasets": 200, "query": 200, "401": 401, "403": 403,
                        "404": 404, "404-route": 404, "400": 400, "405": 405, "413": 413, "openapi": 200,
                        "ui": 200, "500": 500}
    for name, r in answers.items():
        assert r.headers.get("x-content-type-options") == "nosniff", name
    assert_error(answers["500"], 500, "internal")


class _NoBody:
    """An ASGI receive that records whether the application asked for the body."""

    def __init__(self) -> None:
        self.called = False

    async def __call__(self):
        self.called = True
        return {"type": "http.request", "body": b'{"dataset": "usage", "sql": "SELECT 1"}', "more_body": False}


async def _asgi(app, path: str, headers: list[tuple[bytes, bytes]], receive) -> tuple[int, dict, bytes]:
    sent: list[dict] = []

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
             "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
             "headers": headers, "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80), "state": {}}
    await app(scope, receive, send)
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], {k.decode(): v.decode() for k, v in start["headers"]}, body


@pytest.mark.parametrize("auth", [
    [],  # no key
    [(b"authorization", b"Bearer dpg_000000000000_wrong")],  # unknown key
    [(b"x-api-key", b"not-a-key")],  # malformed key
    [(b"authorization", b"Basic dXNlcjpwYXNz")],  # another scheme
], ids=["none", "unknown", "malformed", "basic"])
def test_an_unauthenticated_request_is_refused_before_its_body_is_read(project, tmp_path, auth):
    import anyio

    settings = Settings(policies=project / "policies", home=tmp_path / "state")
    _keys(settings)
    app = create_app(settings)
    # a body larger than the drain limit is never read: 401 and the connection closes
    receive = _NoBody()
    big = str(api_errors.DRAIN_LIMIT_BYTES + 1).encode()
    headers = [(b"host", b"x"), (b"content-type", b"application/json"), (b"content-length", big), *auth]
    status, response_headers, body = anyio.run(_asgi, app, "/v1/queries", headers, receive)
    assert status == 401 and receive.called is False
    assert response_headers["connection"] == "close" and response_headers["www-authenticate"] == "Bearer"
    assert response_headers["x-content-type-options"] == "nosniff"
    assert b'"code":"unauthenticated"' in body
    # a small body is read and discarded first (closing on unread data would make TCP reset the
    # connection before a client still sending reads its 401); the connection may stay open
    receive = _NoBody()
    headers = [(b"host", b"x"), (b"content-type", b"application/json"), (b"content-length", b"40"), *auth]
    status, response_headers, body = anyio.run(_asgi, app, "/v1/queries", headers, receive)
    assert status == 401 and receive.called is True and "connection" not in response_headers
    assert b'"code":"unauthenticated"' in body


def test_a_valid_key_passes_the_gate_and_public_paths_need_none(project, tmp_path):
    import anyio

    settings = Settings(policies=project / "policies", home=tmp_path / "state")
    keys = _keys(settings)
    app = create_app(settings)  # no lifespan: the route then fails on the missing gateway (500)
    receive = _NoBody()
    headers = [(b"host", b"x"), (b"content-type", b"application/json"), (b"content-length", b"40"),
               (b"authorization", f"Bearer {keys['analyst']}".encode())]
    status, _, _ = anyio.run(_asgi, app, "/v1/queries", headers, receive)
    assert receive.called is True and status == 500  # past the gate, the body was read
    for path in ("/healthz", "/ui/login"):  # not behind the gate
        receive = _NoBody()
        status, _, _ = anyio.run(_asgi, app, path, [(b"host", b"x")], receive)
        assert status != 401, path


# --- a locked or unreachable ledger -------------------------------------------------------------


def _ledger_file(settings: Settings):
    return settings.home / "ledger.sqlite"


def test_a_locked_sqlite_ledger_answers_503_quickly_and_charges_nothing(project, tmp_path):
    settings = Settings(policies=project / "policies", home=tmp_path / "state", ledger_wait_s=WAIT_S)
    keys = _keys(settings)
    with LiveServer(create_app(settings)) as live, live.client(keys["analyst"]) as c, \
            live.client(keys["admin"]) as admin:
        assert c.get("/readyz").status_code == 200
        locker = sqlite3.connect(_ledger_file(settings), isolation_level=None)
        locker.execute("BEGIN IMMEDIATE")  # another writer holds the ledger's write lock
        try:
            time.sleep(1.1)  # past the readiness cache
            start = time.monotonic()
            r = c.post("/v1/queries", json=QUERY)
            elapsed = time.monotonic() - start
            details = assert_error(r, 503, "ledger_unavailable")
            assert r.headers["retry-after"] == "1"  # ceil(0.5 s)
            assert r.headers["x-content-type-options"] == "nosniff"
            assert elapsed < WAIT_S + 3.0, elapsed  # the bounded wait, not the old 30 s
            assert "path" in details
            ready = c.get("/readyz")
            assert_error(ready, 503, "ledger_unavailable")
            assert ready.json()["error"]["details"]["checks"] == {"ledger": "unavailable", "release_store": "ok"}
            assert ready.headers["retry-after"] == "1"
            assert str(settings.home) not in ready.text  # an unauthenticated probe names no path
            assert c.get("/healthz").status_code == 200  # liveness stays cheap and green
        finally:
            locker.execute("ROLLBACK")
            locker.close()
        time.sleep(1.1)
        assert c.get("/readyz").json()["checks"] == {"ledger": "ok", "release_store": "ok"}
        r = c.post("/v1/queries", json=QUERY)
        assert r.status_code == 200, r.text
        entries = admin.get("/v1/admin/ledger").json()["entries"]
        assert len(entries) == 1  # the refused attempt wrote nothing; the retry charged once


def test_a_missing_sqlite_ledger_file_is_not_ready(project, tmp_path):
    settings = Settings(policies=project / "policies", home=tmp_path / "state", ledger_wait_s=WAIT_S)
    _keys(settings)
    with LiveServer(create_app(settings)) as live, live.client() as c:
        assert c.get("/readyz").status_code == 200
        moved = tmp_path / "elsewhere.sqlite"
        _ledger_file(settings).rename(moved)  # open connections would write to a file nobody sees
        try:
            time.sleep(1.1)
            r = c.get("/readyz")
            assert_error(r, 503, "ledger_unavailable")
            assert r.json()["error"]["details"]["checks"]["ledger"] == "unavailable"
            assert not _ledger_file(settings).exists()  # the probe never creates an empty ledger
        finally:
            moved.rename(_ledger_file(settings))


def test_the_in_process_write_queue_is_bounded_by_the_same_wait(tmp_path):
    """Threads of one process queue on a lock before SQLite's: that wait is bounded too."""
    from dpgate.ledger.sqlite import SqliteLedger

    led = SqliteLedger(tmp_path / "l.sqlite", busy_timeout_ms=300)
    outcome: list[BaseException | None] = []

    def write() -> None:
        try:
            with led._write():
                pass
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 - recorded for the assertion
            outcome.append(exc)

    try:
        led._wlock.acquire()  # another thread of this process is inside a write
        try:
            waiter = threading.Thread(target=write, daemon=True)
            waiter.start()
            waiter.join(timeout=5.0)
            assert not waiter.is_alive(), "the write waited for the in-process lock without a bound"
        finally:
            led._wlock.release()
        assert isinstance(outcome[0], LedgerUnavailable), outcome
        assert outcome[0].http_status == 503 and outcome[0].code == "ledger_unavailable"
        with led._write():  # free again
            pass
    finally:
        led.close()


def test_the_ledger_wait_goes_into_the_ledger_url_unless_the_url_sets_it(tmp_path):
    s = Settings(home=tmp_path, ledger_wait_s=0.25)
    assert s.ledger_url_with_wait().endswith("ledger.sqlite?busy_timeout_ms=250")
    s = Settings(home=tmp_path, ledger_url="sqlite:////x/l.sqlite?busy_timeout_ms=9")
    assert s.ledger_url_with_wait() == "sqlite:////x/l.sqlite?busy_timeout_ms=9"
    s = Settings(home=tmp_path, ledger_url="postgresql://u@h:5432/db?schema=s&lock_timeout_ms=7")
    assert s.ledger_url_with_wait() == "postgresql://u@h:5432/db?schema=s&lock_timeout_ms=7&pool_timeout_ms=2000"


# --- PostgreSQL: server down (a relay the test owns closes; the shared server keeps running) ----


def _pg_or_skip() -> str:
    psycopg = pytest.importorskip("psycopg")
    try:
        psycopg.connect(PG_URL, connect_timeout=3, autocommit=True).close()
    except psycopg.Error as exc:
        pytest.skip(f"no PostgreSQL server for the ledger outage tests: {type(exc).__name__}")
    return PG_URL


class Relay:
    """A TCP relay 127.0.0.1:port → the PostgreSQL server; :meth:`down` closes the port and every
    relayed connection (as a server that went away), :meth:`up` listens again on the same port."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.port = free_port()
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()
        self._listener: socket.socket | None = None

    def up(self) -> None:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", self.port))
        s.listen(64)
        self._listener = s
        threading.Thread(target=self._accept, args=(s,), daemon=True).start()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            if self._listener is not listener:  # closed meanwhile: a server that is down accepts nothing
                client.close()
                return
            try:
                server = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._conns += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def down(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            try:
                listener.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread (Linux)
            except OSError:
                pass
            listener.close()
        with self._lock:
            conns, self._conns = self._conns, []
        for s in conns:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()


@pytest.fixture()
def pg_relay():
    from psycopg.conninfo import conninfo_to_dict

    url = _pg_or_skip()
    info = conninfo_to_dict(url)
    relay = Relay((info.get("host") or "127.0.0.1", int(info.get("port") or 5432)))
    relay.up()
    schema = "dpgate_outage_" + secrets.token_hex(6)
    user = info.get("user") or "postgres"
    relayed = f"postgresql://{user}@127.0.0.1:{relay.port}/{info.get('dbname') or 'test'}?schema={schema}"
    yield relay, relayed
    relay.down()
    import psycopg
    from psycopg import sql

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


@pytest.mark.postgres
def test_a_postgres_ledger_that_goes_down_answers_503_and_recovers(project, tmp_path, pg_relay):
    relay, url = pg_relay
    settings = Settings(policies=project / "policies", home=tmp_path / "state", ledger_url=url, ledger_wait_s=WAIT_S)
    keys = _keys(settings)
    with LiveServer(create_app(settings)) as live, live.client(keys["analyst"]) as c:
        assert c.get("/readyz").status_code == 200
        relay.down()  # the server is gone: its port is closed, its connections dropped
        time.sleep(1.1)
        start = time.monotonic()
        r = c.post("/v1/queries", json=QUERY)
        elapsed = time.monotonic() - start
        assert_error(r, 503, "ledger_unavailable")
        assert r.headers["retry-after"] == "1"
        assert elapsed < 2 * WAIT_S + 3.0, elapsed  # a bounded wait (a lost connection is retried once)
        ready = c.get("/readyz")
        assert_error(ready, 503, "ledger_unavailable")
        assert ready.json()["error"]["details"]["checks"]["ledger"] == "unavailable"
        assert c.get("/healthz").status_code == 200
        relay.up()  # back on the same port: the pool reconnects
        deadline = time.monotonic() + 30
        while (r := c.post("/v1/queries", json=QUERY)).status_code == 503 and time.monotonic() < deadline:
            time.sleep(0.5)
        assert r.status_code == 200, r.text
        assert r.json()["charge"] is not None


@pytest.mark.postgres
def test_a_postgres_ledger_on_a_closed_port_is_unavailable_at_once():
    _pg_or_skip()
    from dpgate.ledger import open_ledger

    start = time.monotonic()
    with pytest.raises(LedgerUnavailable) as err:
        open_ledger(f"postgresql://postgres@127.0.0.1:{free_port()}/test?connect_timeout=3")
    assert time.monotonic() - start < 5.0
    assert "password" not in err.value.message and err.value.http_status == 503


def test_httpx_sees_the_same_answers_as_curl_would(project, tmp_path):
    """The 401 over a real connection: a small body is drained first, so the client reads the answer."""
    settings = Settings(policies=project / "policies", home=tmp_path / "state")
    _keys(settings)
    with LiveServer(create_app(settings)) as live:
        r = httpx.post(f"{live.url}/v1/queries", json=QUERY, timeout=10)
        assert_error(r, 401, "unauthenticated")
        assert r.headers.get("connection") != "close"


# --- bodies FastAPI cannot parse ------------------------------------------------------------


@pytest.mark.parametrize("body, problem", [
    (b'{"dataset": "usage", "sql": "SELECT \\xff\\xfe"}'.replace(b"\\xff\\xfe", bytes([0xFF, 0xFE])),
     "not UTF-8 text"),
    (b"[" * 5000 + b"]" * 5000, "nested too deeply"),
    (b'{"dataset": ', None),  # plain invalid JSON: the message the two above share
])
def test_an_unparsable_body_is_invalid_json_in_the_error_shape(project, tmp_path, body, problem):
    from fastapi.testclient import TestClient

    settings = Settings(policies=project / "policies", home=tmp_path / "state")
    keys = _keys(settings)
    client = TestClient(create_app(settings), raise_server_exceptions=False)  # no lifespan: parsing comes first
    r = client.post("/v1/queries", content=body,
                    headers={"Content-Type": "application/json", "Authorization": f"Bearer {keys['analyst']}"})
    assert_error(r, 400, "invalid_request")
    message = r.json()["error"]["message"]
    assert message.startswith("the request body is not valid JSON")
    assert "There was an error parsing the body" not in r.text
    if problem is not None:
        assert problem in message


# --- duplicate JSON keys (a trial: the last of two equal keys silently won) ------------------


def test_a_body_repeating_a_key_is_refused_before_any_route_reads_it(project, tmp_path):
    settings = Settings(policies=project / "policies", home=tmp_path / "state")
    keys = _keys(settings)
    app = create_app(settings)
    with LiveServer(app) as live, live.client(keys["analyst"]) as c, live.client(keys["admin"]) as admin:
        json_headers = {"Content-Type": "application/json"}
        twice = [
            (c, "/v1/queries", b'{"dataset": "usage", "sql": "SELECT COUNT(*) FROM prompts", '
                               b'"budget": {"rho": 0.0005}, "budget": {"rho": 5}}', "budget"),
            (c, "/v1/queries", b'{"dataset": "usage", "dataset": "usage", "sql": "SELECT 1"}', "dataset"),
            (c, "/v1/queries", b'{"dataset": "usage", "sql": "SELECT COUNT(*) FROM prompts", '
                               b'"budget": {"rho": 0.001, "rho": 0.002}}', "rho"),  # nested object too
            (admin, "/v1/admin/populations/product-users/cap", b'{"epsilon": 3.9, "delta": 1e-6, "epsilon": 1000}',
             "epsilon"),
        ]
        before = admin.get("/v1/admin/ledger").json()
        for client, path, body, key in twice:
            r = client.post(path, content=body, headers=json_headers)
            assert_error(r, 400, "invalid_request")
            assert f"the key '{key}' twice" in r.json()["error"]["message"]
        assert admin.get("/v1/admin/ledger").json() == before  # nothing charged, no cap changed
        ok = c.post("/v1/queries", json={**QUERY, "budget": {"rho": 0.001}})  # one key each: answered
        assert ok.status_code == 200, ok.text


def test_an_unknown_query_parameter_is_refused_as_an_unknown_body_field_is(project, tmp_path):
    """``GET /v1/releases?datset=usage`` (a typo) listed every dataset's releases (trial finding):
    now 400 invalid_request naming the parameter and the route's own; known ones still work."""
    settings = Settings(policies=project / "policies", home=tmp_path / "state")
    keys = _keys(settings)
    with LiveServer(create_app(settings)) as live, live.client(keys["analyst"]) as c:
        bad = c.get("/v1/releases", params={"datset": "usage"})
        assert bad.status_code == 400
        err = bad.json()["error"]
        assert err["code"] == "invalid_request" and "'datset'" in err["message"]
        assert "dataset" in err["details"]["known"]
        assert c.get("/v1/releases", params={"dataset": "usage", "limit": 5}).status_code == 200
        assert c.get("/v1/datasets", params={"x": "1"}).status_code == 400
        assert c.get("/v1/datasets").status_code == 200
