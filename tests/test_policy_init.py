"""``dpgate policy init`` (a draft from a source's schema), ``dpgate datasets check`` (what a draft
still leaves undecided) and ``dpgate policy import-smartnoise`` (SmartNoise metadata → policy).

The drafts are checked for what matters: no data value reaches the file (bounds and keys must not
come from the data), every undecided value is a TODO that the gateway refuses and the check lists,
and once filled in (as a person would, by hand) the policy serves queries.
"""

from __future__ import annotations

import re
import shutil
import tomllib
from pathlib import Path

import pytest
from _engines import PG_URL, pg_schema, pg_unavailable, shared_data

from dpgate.cli import main
from dpgate.errors import PolicyError
from dpgate.policy import draft_todos, load_policy
from dpgate.policy_draft import column_type, suggest_unit
from dpgate.service import Gateway, QueryBudget
from dpgate.settings import Settings

# values that appear only in the data: none of them may appear in a draft
PEOPLE_CSV = """pid,age,income,region,active,joined
1,34,52345.5,zqxregion,true,2024-01-03
2,97,61000,us,false,2023-05-01
3,21,18,eu,true,2025-02-28
"""
DATA_ONLY = ("52345.5", "zqxregion", "97", "61000", "2024-01-03", "2025-02-28")


def _cli(capsys, *argv: str) -> tuple[int, str, str]:
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def _project(tmp_path: Path) -> Path:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "people.csv").write_text(PEOPLE_CSV)
    return tmp_path


def _fill(text: str, values: dict[str, str]) -> str:
    """Replace each `key = "TODO"` by the value a policy author chose (by key name)."""
    for key, value in values.items():
        text = re.sub(rf'\b{key} = "TODO"', f"{key} = {value}", text)
    return text


def test_init_drafts_from_the_schema_with_todos_that_the_check_lists(tmp_path, capsys, monkeypatch):
    root = _project(tmp_path)
    monkeypatch.chdir(root)
    status, out, _ = _cli(capsys, "policy", "init", "data/people.csv", "--policies", "policies")
    assert status == 0 and "TODO" in out
    path = root / "policies" / "people.toml"
    text = path.read_text()
    for value in DATA_ONLY:  # schema only: no value of the data is in the draft
        assert value not in text, value
    assert "would be published with every release" in text  # why bounds must not come from the data
    raw = tomllib.loads(text)
    cols = raw["tables"]["people"]["columns"]
    assert {c: v["type"] for c, v in cols.items()} == {
        "pid": "int", "age": "int", "income": "float", "region": "text", "active": "bool", "joined": "date"}
    assert cols["age"]["lower"] == cols["age"]["upper"] == cols["region"]["public_keys"] == "TODO"
    assert cols["active"]["public_keys"] == [True, False]  # the type's domain, not the data's
    assert raw["tables"]["people"]["source"] == "data/people.csv"  # relative to the project root
    # not a TTY: the unit is a TODO, with the column whose name suggests it
    assert raw["tables"]["people"]["privacy_unit"] == "TODO"
    assert re.search(r'privacy_unit = "TODO"\s+# suggested: "pid"', text)
    todos = {".".join(t) for t in draft_todos(raw)}
    assert {"budget.epsilon", "budget.delta", "tables.people.privacy_unit", "tables.people.max_rows_per_unit",
            "tables.people.columns.income.lower", "tables.people.columns.joined.upper",
            "tables.people.columns.region.public_keys"} <= todos

    # the gateway refuses the draft, naming what is left
    with pytest.raises(PolicyError, match="draft") as info:
        load_policy(path)
    assert set(info.value.details["todo"]) == todos
    # datasets check lists every TODO per table and column and exits 1
    status, out, _ = _cli(capsys, "datasets", "check", "people", "--policies", "policies")
    assert status == 1
    assert "table people, column income:" in out and "lower: the lower bound" in out
    assert "table people:" in out and "privacy_unit" in out and "[budget]:" in out
    status, out, _ = _cli(capsys, "datasets", "check", "people", "--policies", "policies", "--json")
    assert status == 1 and '"ready": false' in out

    # refuses to overwrite; --unit sets the unit (and leaves its column out of the columns)
    status, _, err = _cli(capsys, "policy", "init", "data/people.csv", "--policies", "policies")
    assert status == 2 and "--force" in err
    status, _, err = _cli(capsys, "policy", "init", "data/people.csv", "--policies", "policies", "--unit", "nope")
    assert status == 2 and "pid, age" in err
    status, _, _ = _cli(capsys, "policy", "init", "data/people.csv", "--policies", "policies", "--unit", "pid",
                        "--force", "--epsilon", "1", "--delta", "1e-6")
    assert status == 0
    text = path.read_text()
    raw = tomllib.loads(text)
    assert raw["tables"]["people"]["privacy_unit"] == "pid" and "pid" not in raw["tables"]["people"]["columns"]
    assert raw["budget"]["epsilon"] == 1.0

    # the author decides every TODO by hand; then the check passes and the gateway answers
    text = _fill(text, {"max_groups_per_unit": "1", "max_rows_per_unit": "1"})
    text = text.replace('age = { type = "int", lower = "TODO", upper = "TODO", public_keys = "TODO" }',
                        'age = { type = "int", lower = 0, upper = 120 }')
    text = text.replace('income = { type = "float", lower = "TODO", upper = "TODO" }',
                        'income = { type = "float", lower = 0, upper = 1000000 }')
    text = text.replace('public_keys = "TODO"', 'public_keys = ["eu", "us"]')
    text = text.replace('lower = "TODO", upper = "TODO"', 'lower = "2000-01-01", upper = "2030-12-31"')
    path.write_text(text)
    assert draft_todos(tomllib.loads(text)) == []
    status, out, _ = _cli(capsys, "datasets", "check", "people", "--policies", "policies")
    assert status == 0 and "engine duckdb" in out
    gw = Gateway.open(Settings(policies=root / "policies", home=root / ".dpgate"))
    try:
        r = gw.query("people", "SELECT region, COUNT(*) AS n FROM people GROUP BY region", consumer="analysts",
                     budget=QueryBudget(rho=0.01))
        assert [row[0] for row in r["rows"]] == ["eu", "us"]
    finally:
        gw.close()


def test_init_reads_parquet_and_duckdb_tables(tmp_path, capsys, monkeypatch):
    from dpgate.sample_data import ensure_sample_data

    ensure_sample_data(tmp_path)
    monkeypatch.chdir(tmp_path)
    parquet = "sample_data/usage/prompts.parquet"
    status, _, _ = _cli(capsys, "policy", "init", parquet, "--policies", "policies", "--unit", "user_id",
                        "--name", "prompts_draft")
    assert status == 0
    raw = tomllib.loads((tmp_path / "policies" / "prompts_draft.toml").read_text())
    table = raw["tables"]["prompts"]
    assert table["source"] == parquet and table["privacy_unit"] == "user_id"
    assert table["columns"]["tokens"]["type"] in ("int", "float") and table["columns"]["region"]["type"] == "text"

    import duckdb

    db = tmp_path / "store.duckdb"
    con = duckdb.connect(str(db))
    con.execute("CREATE TABLE visits (visit_id BIGINT, member_id VARCHAR, cost DECIMAL(10, 2), seen_at TIMESTAMP, "
                "tags VARCHAR[])")
    con.close()
    status, out, _ = _cli(capsys, "policy", "init", "store.duckdb:visits", "--policies", "policies", "--stdout")
    assert status == 0
    raw = tomllib.loads(out)
    assert raw["tables"]["visits"]["source"] == "duckdb:store.duckdb:visits"
    cols = raw["tables"]["visits"]["columns"]
    assert cols["cost"]["type"] == "float" and cols["seen_at"]["type"] == "timestamp"
    assert "tags" not in cols and "# tags: the source type VARCHAR[] has no policy type" in out
    assert re.search(r'# suggested: "member_id"', out)


@pytest.mark.postgres
def test_init_reads_a_postgresql_tables_catalog(tmp_path, capsys, monkeypatch):
    if reason := pg_unavailable():
        pytest.skip(reason)
    import psycopg

    monkeypatch.chdir(tmp_path)
    with pg_schema() as schema:
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f'CREATE TABLE "{schema}".visits (patient_id bigint, ward varchar(20), cost numeric(8,2), '
                         f"day date, seen timestamptz, urgent boolean)")
            conn.execute(f"INSERT INTO \"{schema}\".visits VALUES (1, 'zqxward', 12345.67, '2024-02-03', now(), true)")
        status, _, _ = _cli(capsys, "policy", "init", f"{PG_URL}#{schema}.visits", "--policies", "policies")
        assert status == 0
        text = (tmp_path / "policies" / "visits.toml").read_text()
        assert "zqxward" not in text and "12345" not in text
        raw = tomllib.loads(text)
        assert raw["dataset"]["engine"] == "postgres" and raw["dataset"]["connection"] == PG_URL
        table = raw["tables"]["visits"]
        assert table["source"] == f"{schema}.visits"
        assert {c: v["type"] for c, v in table["columns"].items()} == {
            "patient_id": "int", "ward": "text", "cost": "float", "day": "date", "seen": "timestamp",
            "urgent": "bool"}
        assert re.search(r'# suggested: "patient_id"', text)
        status, out, _ = _cli(capsys, "datasets", "check", "visits", "--policies", "policies")
        assert status == 1 and "table visits, column cost:" in out
    status, _, err = _cli(capsys, "policy", "init", f"{PG_URL}#public.no_such_table_here", "--policies", "policies",
                          "--name", "x")
    assert status == 2 and "no table or view" in err


def test_a_postgresql_password_is_not_written_into_the_draft(monkeypatch):
    from dpgate.cli.policy import _without_password

    assert _without_password("postgresql://alice:s3cret@db:5433/app") == ("postgresql://alice@db:5433/app", True)
    assert _without_password("postgresql://alice@db/app") == ("postgresql://alice@db/app", False)


def test_native_types_and_unit_names():
    assert [column_type(t) for t in ("BIGINT", "INTEGER", "DOUBLE", "DECIMAL(18,3)", "VARCHAR", "BOOLEAN",
                                     "DATE", "TIMESTAMP WITH TIME ZONE", "BLOB", "INTEGER[]")] == [
        "int", "int", "float", "float", "text", "bool", "date", "timestamp", None, None]
    assert [column_type(t, "postgres") for t in ("integer", "double precision", "numeric(10,2)",
                                                 "character varying(20)", "timestamp without time zone",
                                                 "jsonb")] == ["int", "float", "float", "text", "timestamp", None]
    assert suggest_unit(["age", "user_id", "region"]) == "user_id"
    assert suggest_unit(["DeviceID", "Crashes"]) == "DeviceID"
    assert suggest_unit(["x", "order_id"]) == "order_id"
    assert suggest_unit(["age", "region"]) is None


# --- SmartNoise metadata -------------------------------------------------------------------------

SN = shared_data()
needs_sn = pytest.mark.skipif(SN is None, reason="../shared/data/smartnoise not present")


def _import(capsys, meta: Path, folder: Path, *extra: str) -> tuple[int, str, str]:
    return _cli(capsys, "policy", "import-smartnoise", str(meta), "--policies", str(folder), "--epsilon", "1",
                "--delta", "1e-6", *extra)


def _ask(folder: Path, tmp_path: Path, dataset: str, sql: str) -> dict:
    gw = Gateway.open(Settings(policies=folder, home=tmp_path / f"home-{dataset}"))
    try:
        return gw.query(dataset, sql, consumer="analysts", budget=QueryBudget(rho=0.002))
    finally:
        gw.close()


@needs_sn
@pytest.mark.shared_data
def test_smartnoise_import_maps_unit_max_ids_bounds_and_answers_on_the_csv(tmp_path, capsys):
    folder = tmp_path / "pums_dup" / "policies"
    status, out, _ = _import(capsys, SN / "PUMS_dup.yaml", folder)
    assert status == 0
    path = folder / "PUMS_dup.toml"
    policy = load_policy(path)
    t = policy.tables["PUMS"]
    assert t.privacy_unit == "pid" and (t.max_groups_per_unit, t.max_rows_per_unit) == (1, 1)
    assert (t.columns["income"].lower, t.columns["income"].upper) == (0, 500000)
    assert t.columns["sex"].type == "text" and t.columns["sex"].public_keys is None  # censor_dims: private selection
    assert Path(t.source) == SN / "PUMS_dup.csv"
    r = _ask(folder, tmp_path, "PUMS_dup", "SELECT COUNT(*) AS n, AVG(age) AS a FROM PUMS")
    assert r["charge"] is not None and 0 <= r["rows"][0][1] <= 100

    # reddit: max_ids = 500 → k = 1, m = 500, with the difference stated in the file and printed
    folder = tmp_path / "reddit" / "policies"
    status, out, _ = _import(capsys, SN / "reddit.yaml", folder)
    assert status == 0 and "max_ids = 500" in out and "k = 1 group" in out
    text = (folder / "reddit.toml").read_text()
    assert "# max_ids = 500 (SmartNoise: rows per person in the table)" in text
    t = load_policy(folder / "reddit.toml").tables["reddit"]
    assert t.privacy_unit == "author" and (t.max_groups_per_unit, t.max_rows_per_unit) == (1, 500)
    assert load_policy(folder / "reddit.toml").budget.clamp_counts is False  # clamp_counts: False carried over
    assert "cardinality 10000 is a count, not a key list" in text

    # PUMS: row_privacy → record-level; iris (no private_id) → record-level, float bounds, spaced names
    folder = tmp_path / "pums" / "policies"
    assert _import(capsys, SN / "PUMS.yaml", folder)[0] == 0
    assert load_policy(folder / "PUMS.toml").tables["PUMS"].record_level
    r = _ask(folder, tmp_path, "PUMS", "SELECT COUNT(*) AS n FROM PUMS")
    assert r["charge"] is not None
    folder = tmp_path / "iris" / "policies"
    assert _import(capsys, SN / "iris.yaml", folder)[0] == 0
    t = load_policy(folder / "iris.toml").tables["iris"]
    assert t.record_level and (t.columns["sepal length (cm)"].lower, t.columns["sepal length (cm)"].upper) == (4, 8)
    r = _ask(folder, tmp_path, "iris", 'SELECT AVG("petal width (cm)") AS w FROM iris')
    assert 0 <= r["rows"][0][0] <= 3


@needs_sn
@pytest.mark.shared_data
def test_every_smartnoise_metadata_file_converts_or_is_refused_clearly(tmp_path, capsys):
    """Each YAML of the folder: converted (a file whose data is next to it loads and answers a
    COUNT on every table; one without data lists its source as TODO), or refused with a message
    naming the file (the template with ``{0}`` placeholders is not YAML)."""
    metas = sorted([*SN.glob("*.yaml"), *SN.glob("*.yml"), *SN.glob("sql_tests/*.yaml")])
    assert len(metas) >= 10
    answered = 0
    for meta in metas:
        folder = tmp_path / meta.stem / "policies"
        status, out, err = _import(capsys, meta, folder)
        if status != 0:
            assert "template" in meta.name and str(meta) in err, (meta, err)
            continue
        (path,) = folder.glob("*.toml")
        raw = tomllib.loads(path.read_text())
        todos = draft_todos(raw)
        assert all(t[-1] == "source" for t in todos), (meta, todos)  # only the data's location can be missing
        if todos:
            with pytest.raises(PolicyError, match="draft"):
                load_policy(path)
            continue
        policy = load_policy(path)
        for table in policy.tables:
            r = _ask(folder, tmp_path, policy.name, f'SELECT COUNT(*) AS n FROM "{table}"')
            assert r["charge"] is not None and len(r["rows"]) == 1
        answered += 1
    assert answered >= 7


@needs_sn
def test_smartnoise_source_option_and_errors(tmp_path, capsys):
    meta = tmp_path / "meta.yaml"
    shutil.copy(SN / "PUMS_dup_twotable.yaml", meta)
    folder = tmp_path / "policies"
    status, _, err = _import(capsys, meta, folder, "--source", str(SN / "PUMS_dup.csv"))
    assert status == 2 and "TABLE=PATH" in err
    status, _, err = _import(capsys, meta, folder, "--source", f"NOPE={SN / 'PUMS_dup.csv'}")
    assert status == 2 and "PUMS, PUMS2" in err
    status, _, _ = _import(capsys, meta, folder, "--source", f"PUMS={SN / 'PUMS_dup.csv'}",
                           "--source", f"PUMS2={SN / 'PUMS_dup.csv'}")
    assert status == 0
    policy = load_policy(folder / "meta.toml")
    assert policy.tables["PUMS2"].max_rows_per_unit == 3
    (tmp_path / "bad.yaml").write_text("just: a string\n")
    status, _, err = _cli(capsys, "policy", "import-smartnoise", str(tmp_path / "bad.yaml"), "--policies",
                          str(folder))
    assert status == 2 and "bad.yaml" in err


def test_the_suggested_unit_column_is_asked_for_no_bounds_or_keys():
    from dpgate.policy_draft import DraftColumn, DraftPolicy, DraftTable, draft_policy

    for todo in (True, False):
        cols = [DraftColumn("customer_id", "int", todo=todo), DraftColumn("amount", "int", todo=todo)]
        text = draft_policy(DraftPolicy("shop", [DraftTable("orders", "orders.csv", cols, unit_hint="customer_id")]))
        line = next(raw for raw in text.splitlines() if raw.startswith("customer_id ="))
        assert "SUM/AVG" not in line and "lower" not in line and "public_keys" not in line, line
        assert "if this is the privacy unit, delete this line" in line
        amount = next(raw for raw in text.splitlines() if raw.startswith("amount ="))
        assert ("lower" in amount) if todo else ("SUM/AVG" in amount), amount  # other columns unchanged
