"""The release store shared by every process and replica (issue 9, items 5, 13, 14, 15).

* A charged release that was never stored (its computation failed, its process crashed, its
  PostgreSQL commit had an unknown outcome) is marked failed durably in the shared store, so
  the next identical request in any process is charged afresh (the lost charge stays) instead
  of waiting and answering 409 forever.
* Display settings (``suppress_ci95_above``, ``clamp_counts``) apply at serve time: the
  identical query and a reordered one get one consistent answer, re-derived for free.
* Single-flight locks are dropped when unused; failure markers live in the store, not in memory.
* The data-fingerprint key lives with the shared store: replicas sharing a PostgreSQL ledger
  publish the same data version and share cached releases; concurrent first starts agree.

Every backend test runs on SQLite and on PostgreSQL (skipped without a server).
"""

from __future__ import annotations

import multiprocessing
import os
import secrets
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from _small_project import write_project

from dpgate.errors import ExecutionError, LedgerError
from dpgate.service import Gateway, QueryBudget
from dpgate.settings import Settings

PG_SERVER = os.environ.get("DPGATE_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
SQL = "SELECT region, COUNT(*) AS n FROM orders GROUP BY region"
REORDERED = "SELECT COUNT(*) AS n, region FROM orders GROUP BY region ORDER BY region"


def _pg_schema():
    psycopg = pytest.importorskip("psycopg")
    try:
        conn = psycopg.connect(PG_SERVER, autocommit=True, connect_timeout=3)
    except psycopg.Error:
        pytest.skip("no PostgreSQL server at " + PG_SERVER.split("@")[-1])
    return conn, "dpg_rel_" + secrets.token_hex(6)


@pytest.fixture(params=["sqlite", "postgres"])
def ledger_url(request, tmp_path):
    """A fresh shared ledger: one SQLite file, or a fresh PostgreSQL schema."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'shared' / 'ledger.sqlite'}"
        return
    from psycopg import sql

    conn, schema = _pg_schema()
    yield f"{PG_SERVER}?schema={schema}"
    conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
    conn.close()


def _settings(tmp_path: Path, url: str, home: str, **project) -> Settings:
    (tmp_path / "shared").mkdir(exist_ok=True)
    return Settings(policies=write_project(tmp_path / "project", **project), home=tmp_path / home, ledger_url=url)


def _charges(gw: Gateway) -> int:
    return len(gw.ledger_entries("shoppers"))


# --------------------------------------------------------------------------------------
# item 5: a charged release that was never stored
# --------------------------------------------------------------------------------------


def test_a_failed_release_is_recorded_for_every_process(tmp_path, ledger_url, monkeypatch):
    a = Gateway.open(_settings(tmp_path, ledger_url, "a"))
    b = Gateway.open(_settings(tmp_path, ledger_url, "b"))
    try:
        def boom(sql):
            raise RuntimeError("disk on fire")

        monkeypatch.setattr(a.engine, "execute", boom)
        with pytest.raises(ExecutionError):
            a.query("shop", SQL, consumer="analysts", budget=QueryBudget(rho=0.01))
        assert _charges(a) == 1
        # another process (its own store connection) is charged afresh at once, without waiting
        started = time.monotonic()
        rel = b.query("shop", SQL, consumer="analysts", budget=QueryBudget(rho=0.01))
        assert time.monotonic() - started < 10
        assert rel["cached"] is False and rel["charge"] is not None
        assert _charges(b) == 2  # the lost charge stays; nothing is refunded
        assert b.budget("shop")["spent"]["rho"] == pytest.approx(0.02)
        # and from then on everyone is served the stored release, free
        monkeypatch.undo()
        again = a.query("shop", SQL, consumer="analysts", budget=QueryBudget(rho=0.01))
        assert again["cached"] is True and again["release_id"] == rel["release_id"]
        assert _charges(a) == 2
    finally:
        a.close()
        b.close()


def test_a_commit_with_an_unknown_outcome_does_not_block_the_query(tmp_path, ledger_url, monkeypatch):
    a = Gateway.open(_settings(tmp_path, ledger_url, "a"))
    b = Gateway.open(_settings(tmp_path, ledger_url, "b"))
    try:
        real = a.ledger.charge

        def committed_but_unknown(*args, **kwargs):
            real(*args, **kwargs)  # the charge is written ...
            raise LedgerError("cannot commit to the ledger (the outcome is unknown): connection lost",
                              {"outcome": "unknown"})  # ... but the client never learns it

        monkeypatch.setattr(a.ledger, "charge", committed_but_unknown)
        with pytest.raises(LedgerError):
            a.query("shop", SQL, consumer="analysts", budget=QueryBudget(rho=0.01))
        started = time.monotonic()
        rel = b.query("shop", SQL, consumer="analysts", budget=QueryBudget(rho=0.01))
        assert time.monotonic() - started < 10 and rel["cached"] is False
        assert _charges(b) == 2
    finally:
        a.close()
        b.close()


_CRASHING_CHILD = textwrap.dedent("""
    import os, sys
    from dpgate.service import Gateway, QueryBudget
    from dpgate.settings import Settings
    gw = Gateway.open(Settings(policies=sys.argv[1], home=sys.argv[2], ledger_url=sys.argv[3]))
    gw.engine.execute = lambda sql: os._exit(3)  # the process dies after its charge
    gw.query("shop", sys.argv[4], consumer="analysts", budget=QueryBudget(rho=0.01))
""")


def test_a_process_that_crashed_after_its_charge_blocks_nobody(tmp_path, ledger_url):
    settings = _settings(tmp_path, ledger_url, "parent")
    child = _settings(tmp_path, ledger_url, "child")
    done = subprocess.run([sys.executable, "-c", _CRASHING_CHILD, str(child.policies), str(child.home),
                           ledger_url, SQL], capture_output=True, text=True, timeout=300)
    assert done.returncode == 3, done.stderr
    with Gateway.open(settings) as gw:
        assert _charges(gw) == 1 and gw.releases("shop") == []
        gw.release_cache.lease_s = 2.0  # (default: the query timeout plus a margin)
        started = time.monotonic()
        rel = gw.query("shop", SQL, consumer="analysts", budget=QueryBudget(rho=0.01))
        waited = time.monotonic() - started
        assert waited < 30 and rel["cached"] is False  # not 60 s, and not a 409
        assert _charges(gw) == 2
        store = gw.release_store
        (marked,) = store.failed_attempts(gw.ledger_entries("shoppers")[0]["release_key"])
        assert marked == gw.ledger_entries("shoppers")[0]["release_key"]
    with Gateway.open(settings) as gw:  # a later process is served at once, free
        again = gw.query("shop", SQL, consumer="analysts", budget=QueryBudget(rho=0.01))
        assert again["cached"] is True and again["release_id"] == rel["release_id"] and _charges(gw) == 2


# --------------------------------------------------------------------------------------
# item 14: nothing per question stays in memory
# --------------------------------------------------------------------------------------


def test_single_flight_locks_are_dropped_and_failures_are_not_kept_in_memory(tmp_path, monkeypatch):
    with Gateway.open(_settings(tmp_path, f"sqlite:///{tmp_path / 'shared' / 'l.sqlite'}", "h")) as gw:
        threads = [threading.Thread(target=gw.query, args=("shop", f"SELECT COUNT(*) FROM orders WHERE amount > {i}"),
                                    kwargs={"consumer": "analysts", "budget": QueryBudget(rho=0.001)})
                   for i in range(20) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(gw.release_cache.flights) == 0
        assert _charges(gw) == 20
        monkeypatch.setattr(gw.engine, "execute", lambda sql: (_ for _ in ()).throw(RuntimeError("x")))
        with pytest.raises(ExecutionError):
            gw.query("shop", "SELECT COUNT(*) FROM orders WHERE amount > 99", consumer="analysts",
                     budget=QueryBudget(rho=0.001))
        assert len(gw.release_cache.flights) == 0
        assert not [k for k in vars(gw) if "fail" in k]  # failure markers live in the store


# --------------------------------------------------------------------------------------
# item 13: display settings apply at serve time
# --------------------------------------------------------------------------------------


def test_changed_display_settings_give_one_consistent_answer(tmp_path):
    settings = _settings(tmp_path, f"sqlite:///{tmp_path / 'shared' / 'l.sqlite'}", "h")
    with Gateway.open(settings) as gw:
        first = gw.query("shop", SQL, consumer="analysts", budget=QueryBudget(rho=0.01))
    assert all(isinstance(n, int) for _, n in first["rows"])
    # the policy now suppresses every cell whose 95 % half-width exceeds 1 (all of them here)
    write_project(tmp_path / "project", extra_budget="suppress_ci95_above = 1.0\nclamp_counts = false")
    with Gateway.open(settings) as gw:
        same = gw.query("shop", SQL, consumer="analysts", budget=QueryBudget(rho=0.01))
        reordered = gw.query("shop", REORDERED, consumer="analysts", budget=QueryBudget(rho=0.01))
        assert same["cached"] is True and reordered["cached"] is True  # both free
        assert [n for _, n in same["rows"]] == [None, None, None]
        assert [n for n, _ in reordered["rows"]] == [None, None, None]
        assert same["post_processing"]["suppress_ci95_above"] == 1.0
        assert same["derived_from"] == first["release_id"]
        assert _charges(gw) == 1
        # the release made under the old rules is immutable and still served by id
        assert gw.release(first["release_id"])["rows"] == first["rows"]
    # back to the old settings: the old rows again
    write_project(tmp_path / "project")
    with Gateway.open(settings) as gw:
        back = gw.query("shop", SQL, consumer="analysts", budget=QueryBudget(rho=0.01))
        assert back["rows"] == first["rows"] and _charges(gw) == 1


# --------------------------------------------------------------------------------------
# items 14 and 15: the fingerprint key lives with the shared store
# --------------------------------------------------------------------------------------


def test_replicas_sharing_a_ledger_share_data_versions_and_releases(tmp_path, ledger_url):
    # two replicas: different home folders, one shared ledger; the data version is a keyed
    # fingerprint of the source file (no data_version in the policy, no DPGATE_FINGERPRINT_KEY)
    one = Gateway.open(_settings(tmp_path, ledger_url, "replica1", data_version=None))
    two = Gateway.open(_settings(tmp_path, ledger_url, "replica2", data_version=None))
    try:
        v1, v2 = one.dataset("shop")["data_version"], two.dataset("shop")["data_version"]
        assert v1.startswith("fp-") and v1 == v2
        rel = one.query("shop", SQL, consumer="analysts", budget=QueryBudget(rho=0.01))
        hit = two.query("shop", SQL, consumer="analysts", budget=QueryBudget(rho=0.01))
        assert hit["cached"] is True and hit["release_id"] == rel["release_id"]
        assert _charges(two) == 1
        assert not (tmp_path / "replica1" / "fingerprint.key").exists()
    finally:
        one.close()
        two.close()


def test_a_fingerprint_key_file_of_an_earlier_version_is_adopted(tmp_path):
    home = tmp_path / "h"
    home.mkdir()
    (home / "fingerprint.key").write_text("ab" * 32 + "\n")
    settings = _settings(tmp_path, f"sqlite:///{home / 'ledger.sqlite'}", "h", data_version=None)
    with Gateway.open(settings) as gw:
        from_file = gw.dataset("shop")["data_version"]
    with Gateway.open(Settings(policies=settings.policies, home=tmp_path / "other",
                               fingerprint_key="ab" * 32)) as gw:
        assert gw.dataset("shop")["data_version"] == from_file  # the same key as before


def _first_start(url: str, barrier, results) -> None:
    from dpgate.ledger import open_ledger
    from dpgate.releases import open_release_store
    from dpgate.service import fingerprint_key

    try:
        barrier.wait(timeout=60)
        led = open_ledger(url)
        store = open_release_store(led)
        key = fingerprint_key(Settings(home=Path(url.split("///", 1)[-1]).parent / "nohome"), store)
        store.close()
        led.close()
        results.put(key.decode())
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        results.put(f"error: {exc!r}")


def test_concurrent_first_starts_agree_on_one_fingerprint_key(tmp_path, ledger_url):
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(6), ctx.Queue()
    procs = [ctx.Process(target=_first_start, args=(ledger_url, barrier, results)) for _ in range(6)]
    (tmp_path / "shared").mkdir(exist_ok=True)
    for p in procs:
        p.start()
    keys = [results.get(timeout=180) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    assert not [k for k in keys if k.startswith("error")], keys
    assert len(set(keys)) == 1 and len(keys[0]) == 64
