"""Tests of the PostgreSQL ledger and release store.

The ledger contract tests of ``test_ledger.py`` run again here with a ``ledger`` fixture
parametrised over both backends (SQLite and PostgreSQL), so both must behave the same; the
rest is PostgreSQL-specific: schema and migrations, URLs, append-only triggers, tampering
found by ``verify``, atomic check-and-append across processes, connection loss, lock
timeouts, and the release store.

Each test gets its own randomly named PostgreSQL schema (dropped afterwards) in the database
of ``DPGATE_TEST_POSTGRES_URL`` (default ``postgresql://postgres@127.0.0.1:5432/test``); the
tests are skipped when no server answers there.
"""

from __future__ import annotations

import math
import multiprocessing as mp
import os
import queue
import secrets
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from urllib.parse import urlsplit

import pytest

psycopg = pytest.importorskip("psycopg")
from psycopg import sql  # noqa: E402

import test_ledger  # noqa: E402  (the contract tests reused below)
from test_ledger import (  # noqa: E402,F401  (collected here again, with this module's fixtures)
    test_allocations_hold_consumers_to_their_share,
    test_bad_caps_and_allocations_cost_nothing,
    test_bad_charges_cost_nothing,
    test_budget_exhausted_details,
    test_a_gaussian_shaped_curve_may_use_all_of_rho_cap_at_alpha_cap,
    test_cap_fixed_into_rho_cap_at_alpha_cap,
    test_ensure_population_creates_once_and_never_changes_what_the_ledger_owns,
    test_entries_limit_and_population_filter,
    test_exactly_fitting_charges_and_exact_spend,
    test_half_cap_charges,
    test_hash_chain_links_every_entry,
    test_open_population_accepts_any_consumer,
    test_population_holds_the_total_after_reallocation,
    test_rdp_curve_charge_rho_bound,
    test_reading_changes_nothing,
    test_receipt_fields,
    test_release_key_single_flight,
    test_release_key_single_flight_across_threads,
    test_reported_conversion_follows_what_was_composed,
    test_reported_epsilon_for_52_gaussian_releases,
    test_rho_cap_stated_directly_records_its_epsilon,
    test_set_cap_is_an_event_and_lowering_below_spend_refuses_everything,
    test_spend_report_is_json_ready,
    test_unknown_population_and_consumer,
)
from test_ledger_concurrency import _LOOP, _charge_worker, threads_asking_half_the_cap  # noqa: E402

from dpgate.accounting import Cost  # noqa: E402
from dpgate.errors import BudgetExhausted, InvalidRequest, LedgerError, NotFound  # noqa: E402
from dpgate.ledger import Ledger, open_ledger  # noqa: E402
from dpgate.ledger.base import GENESIS_HASH, BudgetCurve, CapSpec, Totals, entry_hash  # noqa: E402
from dpgate.ledger.postgres import MIGRATIONS, TRIGGERS, PostgresLedger, open_postgres_ledger  # noqa: E402
from dpgate.ledger.sqlite import SqliteLedger  # noqa: E402
from dpgate.releases import PostgresReleaseStore, Release, cache_key  # noqa: E402

pytestmark = pytest.mark.postgres

DELTA = 1e-6
DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/test"


# --------------------------------------------------------------------------------------
# fixtures: a server, a fresh schema per test, a ledger per backend
# --------------------------------------------------------------------------------------


def _server_url() -> str:
    return os.environ.get("DPGATE_TEST_POSTGRES_URL", DEFAULT_URL)


@pytest.fixture(scope="session")
def pg_server() -> str:
    """The test server's URL; skips every PostgreSQL test if it does not answer."""
    url = _server_url()
    try:
        psycopg.connect(url, connect_timeout=3, autocommit=True).close()
    except psycopg.Error as exc:
        parts = urlsplit(url)  # the message names host, port and database, never a password
        target = f"postgresql://{parts.hostname or 'localhost'}:{parts.port or 5432}{parts.path}"
        pytest.skip(f"no PostgreSQL server at {target} (set DPGATE_TEST_POSTGRES_URL): "
                    f"{str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__}")
    return url


def _with_options(url: str, **options: str) -> str:
    sep = "&" if urlsplit(url).query else "?"
    return url + sep + "&".join(f"{k}={v}" for k, v in options.items())


@pytest.fixture
def pg_url(pg_server):
    """A ledger URL naming a fresh random schema (dropped with everything in it afterwards)."""
    schema = "dpgate_test_" + secrets.token_hex(6)
    yield _with_options(pg_server, schema=schema)
    with psycopg.connect(pg_server, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


@pytest.fixture
def admin(pg_server):
    """A plain connection to the test database (to play the operator or the attacker)."""
    with psycopg.connect(pg_server, autocommit=True) as conn:
        yield conn


@pytest.fixture
def pg_ledger(pg_url):
    led = open_ledger(pg_url)
    yield led
    led.close()


@pytest.fixture(params=["sqlite", pytest.param("postgres")])
def ledger(request, tmp_path):
    """The same contract, both backends."""
    if request.param == "sqlite":
        led = open_ledger(f"sqlite:///{tmp_path / 'ledger.sqlite'}")
    else:
        led = open_ledger(request.getfixturevalue("pg_url"))
    yield led
    led.close()


def pg_dump(led: PostgresLedger) -> list:
    """Every row of every table of the ledger's schema (a fresh connection)."""
    with psycopg.connect(led.conninfo, autocommit=True) as conn:
        tables = [r[0] for r in conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = %s ORDER BY tablename", (led.schema,))]
        return [(t, sorted(repr(r) for r in conn.execute(
            sql.SQL("SELECT * FROM {}.{}").format(sql.Identifier(led.schema), sql.Identifier(t)))))
            for t in tables]


def dump(led) -> list:
    """``test_ledger.dump`` for either backend."""
    if isinstance(led, SqliteLedger):
        conn = sqlite3.connect(str(led.path))
        try:
            return list(conn.iterdump())
        finally:
            conn.close()
    return pg_dump(led)


@pytest.fixture(autouse=True)
def _dump_for_both_backends(monkeypatch):
    # the reused contract tests call test_ledger.dump to prove that refusals write nothing
    monkeypatch.setattr(test_ledger, "dump", dump)


def _populate(led):
    led.ensure_population("p", rho_cap=1.0, delta=DELTA, allocations={"a": 0.5, "b": 0.5})
    for i in range(6):
        led.charge("p", "ab"[i % 2], Cost.zcdp(0.01 * (i + 1)), purpose=f"q{i}")
    led.charge("p", "a", Cost.pure(0.1), purpose="laplace")


def _schema_conn(led: PostgresLedger):
    """An operator connection whose search_path is the ledger's schema."""
    conn = psycopg.connect(led.conninfo, autocommit=True)
    conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(led.schema)))
    return conn


# --------------------------------------------------------------------------------------
# both backends: a few more contract checks
# --------------------------------------------------------------------------------------


def test_is_a_ledger_and_empty_ledger_verifies(ledger):
    assert isinstance(ledger, Ledger)
    assert ledger.populations() == [] and ledger.entries() == [] and ledger.events() == []
    rep = ledger.verify()
    assert rep.ok and rep.entries == 0 and rep.head == GENESIS_HASH


def test_state_survives_reopening(ledger):
    _populate(ledger)
    before = (ledger.spend("p").to_dict(), ledger.chain())
    url = (f"sqlite:///{ledger.path}" if isinstance(ledger, SqliteLedger)
           else _with_options(ledger.conninfo, schema=ledger.schema))
    again = open_ledger(url)
    try:
        assert (again.spend("p").to_dict(), again.chain()) == before
        dup = again.charge("p", "a", Cost.zcdp(0.001), purpose="q", release_key="k")
        assert again.charge("p", "b", Cost.zcdp(0.5), purpose="q", release_key="k").charge_id == dup.charge_id
        assert again.verify().ok
    finally:
        again.close()
    assert ledger.entries(limit=1)[0]["charge_id"] == dup.charge_id  # the other handle sees it


def test_nul_and_lone_surrogates_refused_and_cost_nothing(ledger):
    ledger.ensure_population("p", epsilon=1.0, delta=DELTA, allocations={})
    before = dump(ledger)
    for kwargs in ({"purpose": "a\x00b"}, {"purpose": "\ud800"}, {"purpose": "q", "release_key": "k\x00"},
                   {"purpose": "q", "metadata": {"x": "\udfff"}}):
        with pytest.raises(InvalidRequest):
            ledger.charge("p", "a", Cost.zcdp(0.001), **kwargs)
    with pytest.raises(InvalidRequest):
        ledger.set_cap("p", epsilon=2.0, delta=DELTA, actor="a\x00", reason="r")
    assert dump(ledger) == before
    r = ledger.charge("p", "a", Cost.zcdp(0.001), purpose="ünïcode ✓", metadata={"k": "\\x00 é"})
    (e,) = ledger.entries()
    assert e["purpose"] == "ünïcode ✓" and e["metadata"] == {"k": "\\x00 é"} and e["charge_id"] == r.charge_id
    assert ledger.verify().ok


def test_extreme_values_round_trip_exactly(ledger):
    # a pure ε-DP charge stores an RDP curve with "inf" at α = ∞, and a tiny ρ must come back
    # as the same double: otherwise the re-computed hashes would not match.
    ledger.ensure_population("p", epsilon=1000.0, delta=DELTA, allocations={})
    ledger.charge("p", "a", Cost.pure(3.0), purpose="q")
    ledger.charge("p", "a", Cost.zcdp(1e-300), purpose="tiny")
    chain = ledger.chain()
    assert all(entry_hash(e) == e["hash"] for e in chain)
    assert ledger.entries()[1]["rho"] == 1e-300
    assert ledger.verify().ok


# --------------------------------------------------------------------------------------
# PostgreSQL: opening, schema, migrations, URLs
# --------------------------------------------------------------------------------------


def test_open_creates_the_schema_and_tables(pg_ledger, admin):
    assert isinstance(pg_ledger, PostgresLedger)
    tables = {r[0] for r in admin.execute("SELECT tablename FROM pg_tables WHERE schemaname = %s",
                                          (pg_ledger.schema,))}
    assert tables == {"schema_migrations", "ledger_meta", "populations", "events", "charges",
                      "spend_totals", "chain_head", "population_cohorts", "cohort_totals"}
    conn = pg_ledger.connect()
    try:
        assert conn.autocommit
        assert conn.execute("SELECT current_schema()").fetchone()[0] == pg_ledger.schema
        assert conn.execute("SHOW lock_timeout").fetchone()[0] == "30s"
        assert conn.execute("SHOW application_name").fetchone()[0] == "dpgate"
    finally:
        conn.close()
    assert "password" not in repr(pg_ledger) and pg_ledger.schema in repr(pg_ledger)


def test_migrations_recorded_once_and_idempotent(pg_url, pg_ledger):
    conn = _schema_conn(pg_ledger)
    first = conn.execute("SELECT version, name, applied_at FROM schema_migrations").fetchall()
    assert [r[0] for r in first] == [v for v, _, _ in MIGRATIONS] == [1, 2, 3, 5, 6]
    open_ledger(pg_url).close()
    open_ledger(pg_url).close()
    assert conn.execute("SELECT version, name, applied_at FROM schema_migrations").fetchall() == first
    conn.close()


def _collect(procs, results, timeout: float = 120.0) -> list:
    """One result per process; fails at once (not after the timeout) if a process dies."""
    out: list = []
    deadline = time.monotonic() + timeout
    while len(out) < len(procs):
        try:
            out.append(results.get(timeout=0.5))
        except queue.Empty:
            dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
            assert not dead, f"a worker process failed (exit codes {dead})"
            assert time.monotonic() < deadline, "the worker processes did not finish"
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    return out


def _open_and_close(url: str, barrier, results) -> None:
    barrier.wait()
    try:
        open_ledger(url).close()
        results.put("ok")
    except Exception as exc:  # noqa: BLE001 - reported to the parent
        results.put(repr(exc))


def test_replicas_starting_together_migrate_once(pg_url, admin):
    ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
    barrier = ctx.Barrier(6)
    results = ctx.Queue()
    procs = [ctx.Process(target=_open_and_close, args=(pg_url, barrier, results)) for _ in range(6)]
    for p in procs:
        p.start()
    out = _collect(procs, results)
    assert out == ["ok"] * 6
    schema = dict(p.split("=") for p in urlsplit(pg_url).query.split("&"))["schema"]
    admin.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
    assert admin.execute("SELECT count(*) FROM schema_migrations").fetchone()[0] == len(MIGRATIONS) == 5
    assert admin.execute("SELECT seq FROM chain_head").fetchone()[0] == 0


def test_newer_schema_or_other_order_grid_refused(pg_url, pg_ledger):
    conn = _schema_conn(pg_ledger)
    conn.execute("INSERT INTO schema_migrations VALUES (99, 'future', '2099-01-01T00:00:00Z')")
    with pytest.raises(LedgerError, match="newer"):
        open_ledger(pg_url)
    conn.execute("DELETE FROM schema_migrations WHERE version = 99")
    conn.execute("UPDATE ledger_meta SET value = '[2.0]' WHERE key = 'orders'")
    with pytest.raises(LedgerError, match="order grid"):
        open_ledger(pg_url)
    conn.close()


def test_urls(pg_server, pg_url, admin):
    schema = pg_url.rsplit("schema=", 1)[1]
    for scheme in ("postgres", "postgresql+psycopg"):
        url = scheme + pg_url[len("postgresql"):] + "&lock_timeout_ms=1500&application_name=replica-7"
        led = open_ledger(url)
        assert isinstance(led, PostgresLedger) and led.schema == schema
        conn = led.connect()
        assert conn.execute("SHOW lock_timeout").fetchone()[0] == "1500ms"
        assert conn.execute("SHOW application_name").fetchone()[0] == "replica-7"
        conn.close()
        led.close()
    for bad in (_with_options(pg_url, lock_timeout_ms="soon"), _with_options(pg_url, lock_timeout_ms="-1"),
                _with_options(pg_url, pool_size="0"), _with_options(pg_url, pool_timeout_ms="x"),
                _with_options(pg_server, schema="x" * 64), _with_options(pg_url, bogus_libpq_option="1"),
                "mysql://x/y"):
        with pytest.raises(LedgerError):
            open_postgres_ledger(bad)
    secret = "s3cr3t-pw"
    with pytest.raises(LedgerError) as info:
        open_ledger(f"postgresql://nobody:{secret}@127.0.0.1:1/nothing?connect_timeout=2")
    assert secret not in info.value.message and secret not in str(info.value.to_dict())
    assert "127.0.0.1:1" in info.value.message


def test_closed_ledger_refuses(pg_url):
    led = open_ledger(pg_url)
    led.close()
    led.close()
    with pytest.raises(LedgerError, match="closed"):
        led.populations()


# --------------------------------------------------------------------------------------
# PostgreSQL: append-only and tampering
# --------------------------------------------------------------------------------------


def test_append_only_triggers(pg_ledger):
    _populate(pg_ledger)
    conn = _schema_conn(pg_ledger)
    for stmt in ("UPDATE charges SET rho = 0 WHERE seq = 2", "DELETE FROM charges WHERE seq = 2",
                 "TRUNCATE charges CASCADE", "UPDATE events SET reason = 'x'", "DELETE FROM events",
                 "TRUNCATE events"):
        with pytest.raises(psycopg.errors.RestrictViolation, match="append-only"):
            conn.execute(stmt)
    conn.close()
    assert pg_ledger.verify().ok


def test_tampering_with_a_charge_is_reported(pg_ledger):
    _populate(pg_ledger)
    conn = _schema_conn(pg_ledger)
    conn.execute("ALTER TABLE charges DISABLE TRIGGER charges_no_update")
    conn.execute("UPDATE charges SET rho = 0.0001 WHERE seq = 3")
    conn.close()
    rep = pg_ledger.verify()
    assert not rep.ok
    text = "\n".join(rep.problems)
    assert "seq=3: hash mismatch" in text
    assert "rho column" in text
    assert "'charges_no_update' is missing" in text  # disabled counts as missing


def test_tampering_by_deleting_or_editing_derived_state_is_reported(pg_ledger):
    _populate(pg_ledger)
    conn = _schema_conn(pg_ledger)
    conn.execute("DROP TRIGGER charges_no_delete ON charges")
    conn.execute("DELETE FROM charges WHERE seq = (SELECT max(seq) FROM charges)")
    conn.execute("UPDATE spend_totals SET charges = 0 WHERE consumer = 'b'")
    conn.execute("UPDATE populations SET rho_cap = 100")
    conn.close()
    text = "\n".join(pg_ledger.verify().problems)
    assert "chain head" in text
    assert "consumer 'b': the stored spend totals differ" in text
    assert "cap in force differs" in text
    assert "'charges_no_delete' is missing" in text


def test_tampering_in_the_middle_breaks_the_links(pg_ledger):
    _populate(pg_ledger)
    conn = _schema_conn(pg_ledger)
    conn.execute("ALTER TABLE charges DISABLE TRIGGER USER")
    conn.execute("DELETE FROM charges WHERE seq = 4")
    conn.execute("ALTER TABLE charges ENABLE TRIGGER USER")
    conn.close()
    text = "\n".join(pg_ledger.verify().problems)
    assert "expected seq 4" in text and "prev_hash" in text
    assert "trigger" not in text  # re-enabled: only the chain is broken


def test_a_new_ledger_has_every_append_only_trigger(pg_ledger, admin):
    names = {r[0] for r in admin.execute(
        "SELECT t.tgname FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid"
        " JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s AND NOT t.tgisinternal",
        (pg_ledger.schema,))}
    assert set(TRIGGERS) <= names
    assert len(TRIGGERS) == 6


# --------------------------------------------------------------------------------------
# PostgreSQL: concurrency across processes and replicas
# --------------------------------------------------------------------------------------


def test_processes_charge_exactly_the_budget(pg_url):
    led = open_ledger(pg_url)
    led.ensure_population("p", rho_cap=0.1, delta=DELTA, allocations={"a": 1.0})  # admits exactly 100
    led.close()
    ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
    barrier = ctx.Barrier(8)
    results = ctx.Queue()
    procs = [ctx.Process(target=_charge_worker, args=(pg_url, 50, barrier, results)) for _ in range(8)]
    for p in procs:
        p.start()
    out = _collect(procs, results)
    assert sum(a for a, _ in out) == 100
    assert sum(r for _, r in out) == 300
    led = open_ledger(pg_url)
    rep = led.spend("p")
    # 100 × 0.001 summed exactly rounds to the double 0.1 (math.fsum agrees)
    assert rep.spent_rho == 0.1 == math.fsum([0.001] * 100)
    assert rep.charges == 100 and rep.remaining_rho == 0.0
    assert len(led.entries()) == 100
    assert led.verify().ok
    led.close()


def _single_flight_worker(url: str, barrier, results) -> None:
    led = open_ledger(url)
    barrier.wait()
    r = led.charge("p", "a", Cost.zcdp(0.01), purpose="q", release_key="the-same-release")
    led.close()
    results.put((r.charge_id, r.duplicate))


def test_release_key_single_flight_across_processes(pg_url):
    led = open_ledger(pg_url)
    led.ensure_population("p", rho_cap=1.0, delta=DELTA, allocations={})
    ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
    barrier = ctx.Barrier(6)
    results = ctx.Queue()
    procs = [ctx.Process(target=_single_flight_worker, args=(pg_url, barrier, results)) for _ in range(6)]
    for p in procs:
        p.start()
    out = _collect(procs, results)
    assert len({cid for cid, _ in out}) == 1
    assert sorted(d for _, d in out) == [False] + [True] * 5
    assert led.spend("p").charges == 1
    led.close()


def _charge_with_inherited(led, results) -> None:
    try:
        r = led.charge("p", "a", Cost.zcdp(0.01), purpose="in a forked child")
        led.close()  # closes the child's pool only
        results.put(r.charge_id)
    except Exception as exc:  # noqa: BLE001 - reported to the parent
        results.put(repr(exc))


@pytest.mark.skipif("fork" not in mp.get_all_start_methods(), reason="needs fork")
def test_a_forked_child_never_uses_the_parents_connections(pg_ledger, admin):
    pg_ledger.ensure_population("p", rho_cap=1.0, delta=DELTA, allocations={})
    pg_ledger.charge("p", "a", Cost.zcdp(0.01), purpose="parent, before the fork")
    with pg_ledger.connection() as conn:
        parent_pid = conn.info.backend_pid
    ctx = mp.get_context("fork")
    results = ctx.Queue()
    procs = [ctx.Process(target=_charge_with_inherited, args=(pg_ledger, results)) for _ in range(3)]
    for p in procs:
        p.start()
    out = _collect(procs, results, timeout=60)
    assert all(x.startswith("chg_") for x in out), out
    # the parent's pooled connection survived the children: a child closing an inherited
    # connection would have sent the server a Terminate message on the parent's socket
    assert admin.execute("SELECT state FROM pg_stat_activity WHERE pid = %s", (parent_pid,)).fetchone() == ("idle",)
    pg_ledger.charge("p", "a", Cost.zcdp(0.01), purpose="parent, after the fork")
    assert pg_ledger.spend("p").charges == 5 and pg_ledger.verify().ok


def test_two_replicas_interleaving_share_one_budget_and_chain(pg_url):
    a, b = open_ledger(pg_url), open_ledger(pg_url)
    a.ensure_population("p", rho_cap=0.01, delta=DELTA, allocations={"x": 0.5, "y": 0.5})
    b.ensure_population("p", rho_cap=0.01, delta=DELTA, allocations={"x": 0.5, "y": 0.5})  # no-op
    for i in range(5):
        (a if i % 2 else b).charge("p", "x", Cost.zcdp(0.001), purpose="q")
        (b if i % 2 else a).charge("p", "y", Cost.zcdp(0.001), purpose="q")
    with pytest.raises(BudgetExhausted):
        a.charge("p", "x", Cost.zcdp(0.001), purpose="q")
    with pytest.raises(BudgetExhausted):
        b.charge("p", "y", Cost.zcdp(0.001), purpose="q")
    assert a.spend("p").to_dict() == b.spend("p").to_dict()
    assert a.spend("p").charges == 10 and [e["kind"] for e in b.events()] == ["population_created"]
    chain = b.chain()
    assert [e["seq"] for e in chain] == list(range(1, 12))
    assert a.verify().ok
    a.close()
    b.close()


def test_threads_asking_half_the_cap(pg_ledger):
    threads_asking_half_the_cap(pg_ledger)


def test_lock_timeout_is_a_ledger_error_and_writes_nothing(pg_url):
    led = open_ledger(_with_options(pg_url, lock_timeout_ms="200"))
    led.ensure_population("p", rho_cap=1.0, delta=DELTA, allocations={})
    before = pg_dump(led)
    holder = _schema_conn(led)
    holder.execute("BEGIN")
    holder.execute("SELECT * FROM chain_head FOR UPDATE")  # another writer holds the chain
    t0 = time.monotonic()
    with pytest.raises(LedgerError, match="busy"):
        led.charge("p", "a", Cost.zcdp(0.01), purpose="q")
    assert time.monotonic() - t0 < 10
    holder.execute("ROLLBACK")
    holder.close()
    assert pg_dump(led) == before
    led.charge("p", "a", Cost.zcdp(0.01), purpose="q")  # and it works once the lock is gone
    led.close()


def test_reconnects_after_the_server_drops_the_connection(pg_url, admin):
    led = open_ledger(_with_options(pg_url, pool_size="1"))
    led.ensure_population("p", rho_cap=1.0, delta=DELTA, allocations={})
    with led.connection() as conn:
        pid = conn.info.backend_pid
    admin.execute("SELECT pg_terminate_backend(%s)", (pid,))  # e.g. a failover or an idle timeout
    for _ in range(100):
        if not admin.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone():
            break
        time.sleep(0.02)
    r = led.charge("p", "a", Cost.zcdp(0.01), purpose="after a failover")
    assert not r.duplicate
    with led.connection() as conn:
        assert conn.info.backend_pid != pid
    assert led.spend("p").charges == 1 and led.verify().ok
    led.close()


def test_connections_are_pooled_and_bounded(pg_url, admin):
    app = "dpgate-test-" + secrets.token_hex(4)
    led = open_ledger(_with_options(pg_url, pool_size="3", application_name=app))
    led.ensure_population("p", rho_cap=10.0, delta=DELTA, allocations={})
    store = led.release_store()
    barrier = threading.Barrier(12)
    seen: list[int] = []
    errors: list[BaseException] = []

    def go(i: int) -> None:
        barrier.wait()
        try:
            for j in range(5):
                led.charge("p", f"t{i}", Cost.zcdp(0.001), purpose="pool")
                store.find(f"key-{i}-{j}")
                with led.connection() as conn:
                    seen.append(conn.info.backend_pid)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=go, args=(i,)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert led.spend("p").charges == 60
    assert 1 <= len(set(seen)) <= 3
    open_now = admin.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
                             (app,)).fetchone()[0]
    assert open_now <= 3
    store.close()
    led.close()
    for _ in range(100):  # closing the ledger closes its pool
        if admin.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
                         (app,)).fetchone()[0] == 0:
            break
        time.sleep(0.02)
    else:
        pytest.fail("the ledger's connections stayed open after close()")


def test_pool_timeout_is_a_ledger_error(pg_url):
    led = open_ledger(_with_options(pg_url, pool_size="1", pool_timeout_ms="200"))
    with led.connection():  # the only connection is lent out
        with pytest.raises(LedgerError, match="no connection"):
            led.populations()
    assert led.populations() == []
    led.close()


def test_sigkill_mid_charge_loop_leaves_a_consistent_ledger(pg_url):
    led = open_ledger(pg_url)
    led.ensure_population("p", epsilon=50.0, delta=DELTA, allocations={"a": 1.0})
    led.close()
    last = 0
    for _ in range(2):
        procs = [subprocess.Popen([sys.executable, "-c", _LOOP, pg_url]) for _ in range(2)]
        try:
            reader = open_ledger(pg_url)
            deadline = time.monotonic() + 60
            while len(reader.entries(limit=10_000)) < last + 40:
                assert time.monotonic() < deadline, "the charging subprocesses made no progress"
                assert all(p.poll() is None for p in procs), "a charging subprocess died"
                time.sleep(0.05)
            reader.close()
        finally:
            for p in procs:
                os.kill(p.pid, signal.SIGKILL)
                p.wait(timeout=30)
        led = open_ledger(pg_url)
        report = led.verify()
        assert report.ok, report.problems
        entries = led.entries()
        assert len(entries) > last
        last = len(entries)
        rep = led.spend("p")
        assert rep.charges == len(entries) == report.charges
        totals = Totals()
        for e in entries:
            totals = totals.add(Cost.from_dict(e["cost"]))
        cap = led.events("p")[0]["new"]["cap"]
        assert rep.spent_rho == totals.rho_equivalent(BudgetCurve.of(CapSpec.from_dict(cap)))
        led.close()


# --------------------------------------------------------------------------------------
# PostgreSQL: the release store
# --------------------------------------------------------------------------------------


def _release(n: int, dataset: str = "usage", body: dict | None = None) -> Release:
    key = cache_key(f"plan{n}", "v1", "gaussian", {"rho": 0.001})
    return Release(f"rel_{secrets.token_hex(12)}", key, dataset, f"plan{n}", f"2026-01-01T00:00:0{n}.000000Z",
                   body if body is not None else {"columns": ["n"], "rows": [[n]], "charge": None})


def test_release_store_round_trip_and_cache(pg_ledger, admin):
    from dpgate.service import open_release_store

    store = open_release_store(pg_ledger)
    assert isinstance(store, PostgresReleaseStore)
    body = {"zeta": 1, "columns": ["region", "n"], "rows": [["eu", 3], ["us", -1]],
            "accuracy": {"n": {"mechanism": "discrete_gaussian", "sigma": 2.5, "ci95": 4.9}}, "alpha": 0.1}
    r1 = _release(1, body=body)
    assert store.put(r1) == r1
    assert list(store.get(r1.release_id).body) == list(body)  # json keeps the key order
    assert store.get(r1.release_id).to_dict(cached=True)["cached"] is True
    assert store.find(r1.cache_key) == r1 and store.find("nope") is None
    # same cache key from another replica: the first stored release wins
    r1b = Release("rel_" + "0" * 24, r1.cache_key, "usage", "plan1", "2026-01-02T00:00:00.000000Z", {"x": 1})
    assert store.put(r1b) == r1
    r2, r3 = _release(2), _release(3, dataset="other")
    store.put(r2)
    store.put(r3)
    assert [r.release_id for r in store.list()] == [r3.release_id, r2.release_id, r1.release_id]
    assert [r.release_id for r in store.list("usage", limit=1)] == [r2.release_id]
    with pytest.raises(NotFound):
        store.get("rel_missing")
    with pytest.raises(InvalidRequest):
        store.list(limit=0)
    # the table lives in the ledger's schema, with the same shape as the SQLite one
    cols = admin.execute("SELECT column_name, data_type FROM information_schema.columns"
                         " WHERE table_schema = %s AND table_name = 'releases' ORDER BY ordinal_position",
                         (pg_ledger.schema,)).fetchall()
    assert cols == [("release_id", "text"), ("cache_key", "text"), ("dataset", "text"),
                    ("plan_hash", "text"), ("created_at", "text"), ("body", "json")]
    store.close()
    again = pg_ledger.release_store()  # reopening finds the table and triggers in place
    assert again.get(r2.release_id) == r2
    again.close()
    assert pg_ledger.verify().ok


def test_releases_are_immutable(pg_ledger):
    store = pg_ledger.release_store()
    store.put(_release(1))
    conn = _schema_conn(pg_ledger)
    for stmt in ("UPDATE releases SET dataset = 'x'", "DELETE FROM releases", "TRUNCATE releases"):
        with pytest.raises(psycopg.errors.RestrictViolation, match="immutable"):
            conn.execute(stmt)
    conn.close()
    assert len(store.list()) == 1
    store.close()


def test_release_store_concurrent_puts_of_one_cache_key(pg_ledger):
    stores = [pg_ledger.release_store() for _ in range(2)]  # two replicas
    base = _release(1)
    barrier = threading.Barrier(8)
    got: list[Release] = []

    def go(i: int) -> None:
        mine = Release(f"rel_{secrets.token_hex(12)}", base.cache_key, "usage", "plan1", base.created_at,
                       {"who": i})
        barrier.wait()
        got.append(stores[i % 2].put(mine))

    threads = [threading.Thread(target=go, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({r.release_id for r in got}) == 1 and len(stores[0].list()) == 1
    for s in stores:
        s.close()


def test_release_store_refuses_non_json_bodies(pg_ledger):
    store = pg_ledger.release_store()
    with pytest.raises(ValueError):
        store.put(_release(1, body={"x": float("nan")}))
    assert store.list() == []
    store.close()
