"""Public tables (``public = true``, issue 12 item 1): the policy format, and queries that read
public tables only — answered exactly (checked against DuckDB on the raw file), charged nothing,
marked ``exact``/``public`` in the release."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest
from _library import write_library

from dpgate.errors import PolicyError
from dpgate.policy import load_policy
from dpgate.service import Gateway
from dpgate.settings import Settings

TABLES = """
[tables.checkouts]
source = "checkouts.csv"
privacy_unit = "member_id"
max_groups_per_unit = 2
max_rows_per_unit = 5

[tables.checkouts.columns]
member_id = {{ type = "int" }}
genre = {{ type = "text" }}
pages = {{ type = "int", lower = 0, upper = 1000 }}

[tables.genres]
source = "genres.csv"
{public}

[tables.genres.columns]
genre = {{ type = "text" }}
category = {{ type = "text" }}
shelves = {{ type = "int" }}
"""

GENRES = ("genre,category,shelves\nfantasy,fiction,12\nmystery,fiction,8\nhistory,nonfiction,5\n"
          "science,nonfiction,\npoetry,fiction,2\nromance,fiction,7\n")


def write(root: Path, public: str = "public = true") -> Path:
    return write_library(root, TABLES.format(public=public), genres_csv=GENRES)


@pytest.fixture
def gw(tmp_path):
    g = Gateway.open(Settings(policies=write(tmp_path / "p"), home=tmp_path / "home"))
    yield g
    g.close()


def exact(tmp_path: Path, sql: str) -> list[tuple]:
    con = duckdb.connect()
    con.execute(f"CREATE TABLE genres AS SELECT * FROM read_csv('{tmp_path / 'p' / 'genres.csv'}')")
    return con.execute(sql).fetchall()


def test_policy_format(tmp_path):
    table = load_policy(write(tmp_path / "a") / "lib.toml").table("genres")
    assert table.public and table.privacy_unit is None and table.to_dict()["public"] is True
    assert not load_policy(tmp_path / "a" / "policies" / "lib.toml").table("checkouts").public
    with pytest.raises(PolicyError, match="public table has no privacy_unit"):
        load_policy(write(tmp_path / "b", 'public = true\nprivacy_unit = "genre"') / "lib.toml")
    with pytest.raises(PolicyError, match="public table has no max_rows_per_unit"):
        load_policy(write(tmp_path / "c", "public = true\nmax_rows_per_unit = 3") / "lib.toml")
    with pytest.raises(PolicyError, match="true or false"):
        load_policy(write(tmp_path / "d", 'public = "yes"') / "lib.toml")


@pytest.mark.parametrize("sql, exact_sql", [
    ("SELECT category, COUNT(*) AS n, SUM(shelves) AS s, AVG(shelves) AS a, MAX(shelves) AS mx "
     "FROM genres GROUP BY category",
     "SELECT category, COUNT(*), SUM(shelves), AVG(shelves), MAX(shelves) FROM genres GROUP BY category "
     "ORDER BY category"),
    ("SELECT COUNT(*) FROM genres WHERE shelves > 4", "SELECT COUNT(*) FROM genres WHERE shelves > 4"),
    ("SELECT category, MEDIAN(shelves) FROM genres GROUP BY category ORDER BY 2 DESC LIMIT 1",
     "SELECT category, MEDIAN(shelves) FROM genres GROUP BY category ORDER BY 2 DESC LIMIT 1"),
    ("SELECT genre, COUNT(shelves) FROM genres GROUP BY genre HAVING COUNT(shelves) = 0",
     "SELECT genre, COUNT(shelves) FROM genres GROUP BY genre HAVING COUNT(shelves) = 0"),
])
def test_public_only_queries_are_exact_and_free(gw, tmp_path, sql, exact_sql):
    before = gw.ledger.spend("members").charges
    r = gw.query("lib", sql, consumer="analysts")
    assert [tuple(row) for row in r["rows"]] == exact(tmp_path, exact_sql)
    assert r["charge"] is None and r["exact"] is True and r["public"] is True and r["accuracy"] == {}
    assert gw.ledger.spend("members").charges == before
    assert gw.release(r["release_id"])["rows"] == r["rows"]
    ex = gw.explain("lib", sql)
    assert ex["public"] is True and ex["cost"]["rho"] == 0.0 and "genres" in ex["exact_sql"]


def test_group_by_without_public_keys_only_on_public_tables(gw):
    gw.query("lib", "SELECT genre, COUNT(*) FROM genres GROUP BY genre", consumer="analysts")
    # a protected table's key-less column: private partition selection (issue 11)
    r = gw.query("lib", "SELECT genre, COUNT(*) FROM checkouts GROUP BY genre", consumer="analysts")
    assert r["partition_selection"]["selected_keys"] == ["genre"]


def test_a_table_not_declared_public_is_protected(tmp_path):
    g = Gateway.open(Settings(policies=write(tmp_path / "p", ""), home=tmp_path / "home"))
    try:
        # not public: its key-less column is selected privately (issue 11), not read as public keys
        sel = g.query("lib", "SELECT genre, COUNT(*) FROM genres GROUP BY genre", consumer="analysts")
        assert sel["partition_selection"]["selected_keys"] == ["genre"]
        r = g.query("lib", "SELECT COUNT(*) FROM genres", consumer="analysts")
        assert r["charge"] is not None and not r.get("public")
    finally:
        g.close()


@pytest.mark.parametrize("sql, words", [
    ("SELECT category, COUNT(*) FROM genres GROUP BY category", "answered exactly and charges nothing"),
    ("SELECT MEDIAN(pages), MAX(pages) FROM checkouts", "exponential mechanism"),
    ("SELECT MEDIAN(pages), COUNT(*) FROM checkouts", "bounded SQL"),
])
def test_explain_of_public_and_quantile_queries_over_http_and_cli(gw, tmp_path, capsys, sql, words):
    # a trial: POST /v1/queries/explain answered 500 (the response model wanted a bounded SQL that
    # such queries do not have) and `dpgate explain` printed a traceback and exited 0
    from dpgate.api.schemas import Explanation
    from dpgate.cli import main

    Explanation.model_validate(gw.explain("lib", sql))  # what the HTTP route answers with
    status = main(["explain", "--policies", str(tmp_path / "p" / "policies"), "--home", str(tmp_path / "home"),
                   "--dataset", "lib", sql])
    out = capsys.readouterr()
    assert status == 0 and "Traceback" not in out.err
    assert words in out.out


def test_public_tables_are_shown_as_public_in_the_api_and_the_ui(tmp_path):
    """GET /v1/datasets, the datasets page and the console's schema say "public table" (no
    privacy unit, no k/m, free and exact), not record-level."""
    from _api_server import LiveServer
    from _ui_support import sign_in

    from dpgate.api import create_app
    from dpgate.auth import KeyStore

    settings = Settings(policies=write(tmp_path / "p"), home=tmp_path / "home")
    key = KeyStore(settings.resolved_keys_file()).add("alice", role="analyst", consumer="analysts")[0]
    with LiveServer(create_app(settings)) as live:
        with live.client(key) as c:
            for doc in (c.get("/v1/datasets").json()["datasets"][0], c.get("/v1/datasets/lib").json()):
                genres, checkouts = doc["tables"]["genres"], doc["tables"]["checkouts"]
                assert (genres["public"], genres["record_level"], genres["privacy_unit"]) == (True, False, None)
                assert genres["max_groups_per_unit"] is None and genres["max_rows_per_unit"] is None
                assert (checkouts["public"], checkouts["record_level"], checkouts["privacy_unit"]) == \
                    (False, False, "member_id")
                assert checkouts["max_groups_per_unit"] == 2
        ui = sign_in(live.url, key)
        try:
            datasets = ui.get("/ui/datasets").text
            console = ui.get("/ui/console?dataset=lib").text
        finally:
            ui.close()
    part = datasets.split("Table genres", 1)[1].split("<table>", 1)[0]
    assert "public table" in part and "record" not in part and "Privacy unit" not in part
    assert "Privacy unit: <strong>member_id</strong>" in datasets.split("Table checkouts", 1)[1]
    head = console.split("<h3>genres", 1)[1].split("</h3>", 1)[0]
    assert "public table" in head and "record" not in head and "k =" not in head


def test_shared_library_fixture_writes_what_the_policy_reads(tmp_path):
    """tests/_library.py (shared with test_joins): the header, the CSV files and the tables given."""
    from _library import checkouts_rows, members_rows

    pol = load_policy(write(tmp_path / "p") / "lib.toml")
    assert (pol.name, pol.population, pol.budget.epsilon, pol.budget.delta) == ("lib", "members", 4.0, 1e-6)
    assert set(pol.tables) == {"checkouts", "genres"} and not (tmp_path / "p" / "members.csv").exists()
    lines = (tmp_path / "p" / "checkouts.csv").read_text().splitlines()
    assert lines[0] == "member_id,genre,pages" and lines[1:] == [f"{u},{g},{p}" for u, g, p in checkouts_rows()]
    assert len(lines) == 301 and lines[1] == "0,fantasy,100" and lines[-1] == "49,history,399"
    assert (tmp_path / "p" / "genres.csv").read_text() == GENRES
    assert members_rows()[:2] == [(0, "hs", 20), (1, "ba", 21)] and len(members_rows()) == 50
