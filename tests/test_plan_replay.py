"""Replay stored plan documents (issue 20 step 1): plan hashes persisted by today's code in a
release store and in ledger metadata are what re-planning the same SQL gives, and the store
serves those releases again (a cache hit: no charge, no new ledger entry).

The stored fixture, ``tests/fixtures/compile/replay/``:

* ``policies/usage.toml``: the repository's ``policies/usage.toml`` with a declared
  ``data_version`` (so the cache key does not depend on the bytes of the generated Parquet files);
* ``ledger.sql``: the SQLite ledger and release store (one database) as
  ``sqlite3``'s ``iterdump``, written by the gateway for :data:`QUERIES`;
* ``queries.json``: each query's SQL, consumer, ρ and the ``release_id``/``plan_hash`` the gateway
  returned when the store was written.

The test restores the database under a fresh home folder, writes the sample data
(:func:`dpgate.sample_data.usage_tables`, a few hundred users: the gateway loads it, but a cache
hit reads none of it), opens the gateway on the stored ledger and asks every query again.

**Regenerate** (only when a change is meant to invalidate stored releases, which issue 20 must
not do)::

    DPGATE_REGEN_GOLDEN=1 python -m pytest -p no:cacheprovider tests/test_plan_replay.py
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
from pathlib import Path

import pytest

from dpgate.policy import load_policy
from dpgate.sample_data import usage_tables, write_parquet
from dpgate.service import Gateway, QueryBudget
from dpgate.settings import Settings
from dpgate.sql.parse import parse_query

HERE = Path(__file__).resolve().parent
FIXTURE = HERE / "fixtures" / "compile" / "replay"
REGEN = os.environ.get("DPGATE_REGEN_GOLDEN") == "1"
DATA_VERSION = "replay-v1"
RHO = 0.01

#: The replayed queries: name → (consumer, SQL). A fast COUNT(*), public keys, partition
#: selection, a quantile, a per-unit subquery and a top-k.
QUERIES: dict[str, tuple[str, str]] = {
    "count_star": ("analysts", "SELECT COUNT(*) FROM prompts"),
    "group_public_keys": ("analysts", "SELECT region, week, COUNT(*) AS n FROM sessions GROUP BY region, week"),
    "partition_selection": ("analysts", "SELECT model, COUNT(*) AS n FROM prompts GROUP BY model"),
    "median": ("dashboard", "SELECT region, MEDIAN(tokens) AS m FROM prompts GROUP BY region"),
    "per_unit": ("analysts", "SELECT LEAST(n, 20) AS sessions_per_user, COUNT(*) AS users FROM "
                             "(SELECT user_id, COUNT(*) AS n FROM sessions GROUP BY user_id) AS u "
                             "GROUP BY sessions_per_user"),
    "top_k": ("dashboard", "SELECT region, SUM(tokens) AS s FROM prompts GROUP BY region ORDER BY s DESC LIMIT 3"),
}


def _project(root: Path) -> Path:
    """The fixture project under ``root`` with freshly generated sample data; returns the policies folder."""
    policies = root / "policies"
    policies.mkdir(parents=True)
    if REGEN:
        text = (HERE.parent / "policies" / "usage.toml").read_text()
        marker = 'population = "product-users"'
        assert marker in text
        text = text.replace(marker, f'{marker}\ndata_version = "{DATA_VERSION}"   # replay fixture', 1)
        (FIXTURE / "policies").mkdir(parents=True, exist_ok=True)
        (FIXTURE / "policies" / "usage.toml").write_text(text)
    shutil.copy(FIXTURE / "policies" / "usage.toml", policies / "usage.toml")
    data = root / "sample_data" / "usage"
    data.mkdir(parents=True)
    for name, table in usage_tables(users=300).items():
        write_parquet(table, data / f"{name}.parquet")
    return policies


def _gateway(root: Path) -> Gateway:
    return Gateway.open(Settings(policies=root / "policies", home=root / "home"))


def _regenerate(root: Path) -> None:
    (root / "home").mkdir()
    stored = {}
    with _gateway(root) as gw:
        for name, (consumer, sql) in QUERIES.items():
            rel = gw.query("usage", sql, consumer=consumer, budget=QueryBudget(rho=RHO))
            assert rel["cached"] is False
            stored[name] = {"consumer": consumer, "sql": sql, "rho": RHO,
                            "release_id": rel["release_id"], "plan_hash": rel["plan_hash"]}
    con = sqlite3.connect(root / "home" / "ledger.sqlite")
    dump = "\n".join(con.iterdump()) + "\n"
    con.close()
    (FIXTURE / "ledger.sql").write_text(dump)
    (FIXTURE / "queries.json").write_text(json.dumps(stored, indent=2, sort_keys=True) + "\n")


@pytest.fixture
def replayed(tmp_path) -> Path:
    """A project whose home holds the stored ledger and release store."""
    _project(tmp_path)
    if REGEN:
        _regenerate(tmp_path)
        shutil.rmtree(tmp_path / "home")
    (tmp_path / "home").mkdir()
    con = sqlite3.connect(tmp_path / "home" / "ledger.sqlite")
    con.executescript((FIXTURE / "ledger.sql").read_text())
    con.commit()
    con.close()
    return tmp_path


def _stored() -> dict[str, dict]:
    return json.loads((FIXTURE / "queries.json").read_text())


def test_the_fixture_covers_the_queries():
    assert set(_stored()) == set(QUERIES)
    assert all(_stored()[n]["sql"] == sql for n, (_, sql) in QUERIES.items())
    assert (FIXTURE / "ledger.sql").stat().st_size < 200_000  # small: reviewed like code


def test_replanning_gives_the_stored_plan_hashes(replayed):
    """Release documents and ledger metadata name the plan hash today's planner gives."""
    policy = load_policy(replayed / "policies" / "usage.toml")
    stored = _stored()
    con = sqlite3.connect(replayed / "home" / "ledger.sqlite")
    try:
        releases = {rid: (ph, json.loads(body)) for rid, ph, body in
                    con.execute("SELECT release_id, plan_hash, body FROM releases")}
    finally:
        con.close()
    with _gateway(replayed) as gw:
        ledger_hashes = {(e.get("metadata") or {}).get("plan_hash") for e in gw.ledger_entries("product-users")}
    for name, item in stored.items():
        plan = parse_query(item["sql"], policy)
        assert plan.plan_hash == item["plan_hash"], f"{name}: re-planning gives another plan hash"
        row_hash, body = releases[item["release_id"]]
        assert row_hash == plan.plan_hash and body["plan_hash"] == plan.plan_hash, name
        # the canonical form is for humans (a per-unit plan's names its virtual table "PER UNIT …",
        # a join's its prefixed columns: it does not always parse back), but it is stable
        assert body["canonical_sql"] == plan.canonical_sql, f"{name}: the canonical SQL changed"
        assert plan.plan_hash in ledger_hashes, f"{name}: no ledger charge names the plan hash"


def test_the_store_serves_every_stored_release_without_a_charge(replayed):
    stored = _stored()
    with _gateway(replayed) as gw:
        before = gw.ledger_entries("product-users")
        assert len(before) == len(stored)  # one charge per query when the store was written
        for name, item in stored.items():
            rel = gw.query("usage", item["sql"], consumer=item["consumer"], budget=QueryBudget(rho=item["rho"]))
            assert rel["cached"] is True, f"{name}: not served from the store (re-planned to another key?)"
            assert rel["release_id"] == item["release_id"] and rel["plan_hash"] == item["plan_hash"], name
        assert gw.ledger_entries("product-users") == before  # no charge
