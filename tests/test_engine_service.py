"""Data versions and reloads through the gateway, the HTTP API and the CLI (issue 14, item 3).

* A file-backed dataset reloads without a restart: new data version, old releases still
  served as old releases, the same query on the new data charged afresh.
* A live source without ``data_version`` or ``version_sql`` has no release cache (the
  dataset view says so); with ``version_sql`` the cache follows the data.
"""

from __future__ import annotations

import psycopg
import pyarrow as pa
import pytest

from _api_server import LiveServer, assert_error
from _engines import PG_URL, pg_load, pg_schema, pg_unavailable, write_policy
from dpgate.api import create_app
from dpgate.auth import KeyStore
from dpgate.cli import main as cli
from dpgate.service import Gateway, QueryBudget
from dpgate.settings import Settings

TABLES = """
[tables.t]
source = "{source}"
privacy_unit = "uid"
max_rows_per_unit = 2

[tables.t.columns]
x = {{ type = "int", lower = 0, upper = 10 }}
k = {{ type = "int", public_keys = [0, 1] }}
"""
Q = "SELECT k, COUNT(*), SUM(x) FROM t GROUP BY k"


def _csv(path, rows: int) -> None:
    path.write_text("uid,x,k\n" + "".join(f"{i},{i % 11},{i % 2}\n" for i in range(rows)))


@pytest.fixture()
def file_project(tmp_path):
    (tmp_path / "data").mkdir()
    _csv(tmp_path / "data" / "t.csv", 100)
    policies = write_policy(tmp_path, "ds", "", TABLES.format(source="data/t.csv"))
    return Settings(policies=policies, home=tmp_path / "home")


def test_reload_gives_a_new_version_and_keeps_old_releases(file_project, tmp_path):
    with Gateway.open(file_project) as gw:
        v1 = gw.dataset("ds")["data_version"]
        assert v1.startswith("fp-") and gw.dataset("ds")["release_cache"] == "enabled"
        r1 = gw.query("ds", Q, consumer="analysts", budget=QueryBudget(rho=0.02))
        assert gw.query("ds", Q, consumer="analysts", budget=QueryBudget(rho=0.02))["cached"] is True
        _csv(tmp_path / "data" / "t.csv", 300)
        # memory mode: the old copy serves until the reload
        assert gw.query("ds", Q, consumer="analysts", budget=QueryBudget(rho=0.02))["cached"] is True
        view = gw.reload("ds")
        assert view["data_version"] != v1 and view["data_version"].startswith("fp-")
        r2 = gw.query("ds", Q, consumer="analysts", budget=QueryBudget(rho=0.02))
        assert r2["cached"] is False and r2["data_version"] == view["data_version"]
        old = gw.release(r1["release_id"])
        assert old["data_version"] == v1 and old["rows"] == r1["rows"]
        assert len(gw.ledger_entries()) == 2


def test_reload_over_http_needs_an_admin(file_project, tmp_path):
    store = KeyStore(file_project.resolved_keys_file())
    admin = store.add("root", role="admin")[0]
    analyst = store.add("alice", role="analyst", consumer="analysts")[0]
    with LiveServer(create_app(file_project)) as live:
        with live.client(analyst) as c:
            assert_error(c.post("/v1/admin/datasets/ds/reload"), 403, "forbidden")
            before = c.get("/v1/datasets/ds").json()
            assert before["engine"] == "duckdb" and before["release_cache"] == "enabled"
            assert before["load"] == {"t": "memory"}
        _csv(tmp_path / "data" / "t.csv", 50)
        with live.client(admin) as c:
            r = c.post("/v1/admin/datasets/ds/reload")
            assert r.status_code == 200, r.text
            assert r.json()["data_version"] != before["data_version"]
            assert_error(c.post("/v1/admin/datasets/nope/reload"), 404, "unknown_dataset")
        # the CLI asks the running server
        assert cli(["datasets", "reload", "ds", "--url", live.url, "--key", admin, "--json"]) == 0
        assert cli(["datasets", "reload", "ds", "--url", live.url, "--key", analyst]) == 3  # not allowed


def test_cli_datasets_check(file_project, capsys):
    args = ["--policies", str(file_project.policies), "--home", str(file_project.home)]
    assert cli(["datasets", "check", "ds", *args]) == 0
    out = capsys.readouterr().out
    assert "engine duckdb" in out and "memory" in out and "release cache enabled" in out
    assert cli(["datasets", "check", "nope", *args]) == 4  # not found


@pytest.fixture()
def pg_table():
    reason = pg_unavailable()
    if reason:
        pytest.skip(reason)
    with pg_schema() as schema:
        pg_load(schema, "t", pa.table({"uid": list(range(50)), "x": [i % 11 for i in range(50)],
                                       "k": [i % 2 for i in range(50)]}))
        yield schema


@pytest.mark.postgres
def test_live_source_without_a_version_has_no_release_cache(tmp_path, pg_table):
    policies = write_policy(tmp_path, "ds", f'engine = "postgres"\nconnection = "{PG_URL}"\n',
                            TABLES.format(source=f"{pg_table}.t"))
    with Gateway.open(Settings(policies=policies, home=tmp_path / "home")) as gw:
        view = gw.dataset("ds")
        assert view["engine"] == "postgres" and view["data_version"] is None
        assert view["release_cache"].startswith("disabled")
        a = gw.query("ds", Q, consumer="analysts", budget=QueryBudget(rho=0.02))
        b = gw.query("ds", Q, consumer="analysts", budget=QueryBudget(rho=0.02))
        assert a["cached"] is False and b["cached"] is False  # both computed and charged
        assert a["data_version"].startswith("unversioned:") and a["data_version"] != b["data_version"]
        assert len(gw.ledger_entries()) == 2


@pytest.mark.postgres
def test_version_sql_keys_the_cache_to_the_data(tmp_path, pg_table):
    sql = f'SELECT count(*), sum(x) FROM "{pg_table}"."t"'
    policies = write_policy(tmp_path, "ds", f"engine = \"postgres\"\nconnection = \"{PG_URL}\"\nversion_sql = '{sql}'\n",
                            TABLES.format(source=f"{pg_table}.t"))
    with Gateway.open(Settings(policies=policies, home=tmp_path / "home")) as gw:
        view = gw.dataset("ds")
        assert view["versioned_by"] == "version_sql" and view["release_cache"] == "enabled"
        a = gw.query("ds", Q, consumer="analysts", budget=QueryBudget(rho=0.02))
        b = gw.query("ds", Q, consumer="analysts", budget=QueryBudget(rho=0.02))
        assert b["cached"] is True and a["data_version"] == b["data_version"]
        assert a["data_version"].startswith("fp-")  # published keyed, never the raw result
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f'INSERT INTO "{pg_table}"."t" VALUES (1000, 3, 1)')
        c = gw.query("ds", Q, consumer="analysts", budget=QueryBudget(rho=0.02))
        assert c["cached"] is False and c["data_version"] != a["data_version"]
