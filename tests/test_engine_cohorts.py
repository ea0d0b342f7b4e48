"""The cohort rule is checked when data loads on every engine (issue 23): DuckDB files and a live
PostgreSQL table. A unit in two cohorts, or with an undeclared cohort, refuses the dataset with
the counts only."""

from __future__ import annotations

import textwrap

import pyarrow as pa
import pytest
from _engines import PG_URL, pg_load, pg_schema, pg_unavailable

from dpgate.engines import EngineOptions, EngineSet
from dpgate.errors import PolicyError
from dpgate.policy import load_policies

TABLE = """
[population]
cohort_column = "c"

[budget]
epsilon = 4.0
delta = 1e-6
default_query_rho = 0.01

[tables.t]
source = "{source}"
privacy_unit = "uid"
max_rows_per_unit = 2

[tables.t.columns]
c = {{ type = "int", public_keys = [202601, 202602] }}
x = {{ type = "float", lower = 0, upper = 10 }}
"""


def _policies(tmp_path, header: str, source: str):
    folder = tmp_path / "policies"
    folder.mkdir(exist_ok=True)
    (folder / "ds.toml").write_text(textwrap.dedent(header) + TABLE.format(source=source))
    return load_policies(folder)


def _rows(bad_units: int = 0, undeclared: int = 0) -> pa.Table:
    uid, c, x = [], [], []
    for u in range(10):
        for j in range(2):
            uid.append(u)
            c.append(202601 + u % 2 if not (j == 1 and u < bad_units) else 202601 + (u + 1) % 2)
            x.append(float(j))
    for u in range(undeclared):
        uid.append(100 + u)
        c.append(209912)
        x.append(1.0)
    uid.append(None)  # a row without a unit is no unit: never counted
    c.append(None)
    x.append(0.0)
    return pa.table({"uid": pa.array(uid, pa.int64()), "c": pa.array(c, pa.int64()), "x": pa.array(x)})


@pytest.mark.parametrize("bad,undeclared", [(0, 0), (3, 0), (0, 2)])
def test_duckdb(tmp_path, bad, undeclared):
    import pyarrow.csv as pacsv

    path = tmp_path / "t.csv"
    pacsv.write_csv(_rows(bad, undeclared), str(path))
    policies = _policies(tmp_path, '[dataset]\nname = "ds"\npopulation = "p"\ndata_version = "v"\n', path.as_posix())
    engines = EngineSet(options=EngineOptions(timeout_s=10))
    if bad or undeclared:
        with pytest.raises(PolicyError) as err:
            engines.load(policies)
        assert (err.value.details["several"], err.value.details["outside"]) == (bad, undeclared)
        return
    engines.load(policies)
    engines.close()


@pytest.mark.postgres
@pytest.mark.skipif(bool(pg_unavailable()), reason=pg_unavailable() or "")
@pytest.mark.parametrize("bad,undeclared", [(0, 0), (2, 1)])
def test_postgres(tmp_path, bad, undeclared):
    with pg_schema() as schema:
        pg_load(schema, "t", _rows(bad, undeclared))
        header = (f'[dataset]\nname = "ds"\npopulation = "p"\ndata_version = "v"\nengine = "postgres"\n'
                  f'connection = "{PG_URL}"\n')
        policies = _policies(tmp_path, header, f"{schema}.t")
        engines = EngineSet(options=EngineOptions(timeout_s=10))
        if bad or undeclared:
            with pytest.raises(PolicyError) as err:
                engines.load(policies)
            assert err.value.details["offending"] == bad + undeclared
            assert str(100) not in err.value.message  # counts, never ids
            return
        engines.load(policies)
        engines.close()
