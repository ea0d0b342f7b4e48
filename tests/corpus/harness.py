"""Run the analyst-query corpus (queries.toml) through the gateway and check each outcome.

* **answer** items: the release is compared with the exact DuckDB answer of the same SQL on
  the raw data (rows whose privacy unit is NULL dropped and NaN/±inf read as NULL, as the
  gateway does; the fixture bounds do not clip). Rows are matched on their key columns (the
  columns without an accuracy entry); every released aggregate cell must lie within 5 × its
  reported noise scale (σ, b or sd) of the exact value; approximate cells (AVG, VAR, STDDEV,
  derived) within 5 × the widest 95 % half-width of their column (a cell clamped to a bound
  reports a narrow interval even when its parts' noise is wide). A released group absent from the exact answer is a public key without data:
  its exact counts and sums are 0 (as is SQL's NULL SUM of no rows). With ``keys`` (an SQL
  query over the raw tables), the released key combinations must be exactly its rows (columns
  in the release's key order): several columns of one public table release the tuples that
  occur in it, not the product of their keys (issue 19 item 5). LIMIT/TOP is checked against the exact answer without the
  limit (ties may be broken differently). VAR/STDDEV are compared with the population
  estimates (the gateway answers those; docs/DESIGN_NOTES.md).
* **refuse** items: the gateway must raise the expected error code and charge nothing.

``python -m tests.corpus.harness`` prints the answered fraction per issue (docs/CORPUS.md).
"""

from __future__ import annotations

import datetime as dt
import inspect
import math
import shutil
import sys
import tomllib
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import duckdb
import sqlglot
from sqlglot import exp

from dpgate.engine import Engine
from dpgate.errors import DpgateError, PolicyError
from dpgate.ledger import open_ledger
from dpgate.policy import load_policy
from dpgate.service import Gateway, QueryBudget, open_release_store

from tests.corpus.library import write_library
from tests.shared_data import smartnoise_dir

HERE = Path(__file__).resolve().parent
CORPUS_FILE = HERE / "queries.toml"
POLICY_DIR = HERE.parent / "fixtures" / "policies" / "corpus"
#: ρ of every corpus query: large, so that noise does not hide planner errors.
QUERY_RHO = QueryBudget.MAX_RHO  # the largest ρ a request may name
#: Scale factor of the TPC-H corpus data (tests/fixtures/policies/corpus/tpch*.toml are written for it).
TPCH_SF = 0.01
#: Datasets read from ../shared/data/smartnoise.
SHARED_DATASETS = frozenset({"pums", "pums_dup", "pums_null", "reddit", "d1"})
ISSUES = (10, 11, 12, 15, 21, 24)
_FIELDS = {"id", "source", "dataset", "sql", "label", "issue", "code", "dialect", "check", "pending", "note", "keys"}
_DUCKDB_TYPES = {"int": "BIGINT", "float": "DOUBLE", "text": "VARCHAR", "bool": "BOOLEAN", "date": "DATE",
                 "timestamp": "TIMESTAMP"}


@dataclass(frozen=True)
class CorpusQuery:
    """One corpus entry (see the header of queries.toml for the fields)."""

    id: str
    source: str
    dataset: str
    sql: str
    label: str
    issue: int
    code: str | None = None
    dialect: str = "duckdb"
    check: str = "values"
    pending: bool = False
    note: str = ""
    keys: str | None = None


def load_corpus(path: Path = CORPUS_FILE) -> list[CorpusQuery]:
    """The corpus entries, validated (unique ids, known datasets, labels and issues)."""
    raw = tomllib.loads(path.read_text())["query"]
    out, seen = [], set()
    datasets = {p.stem for p in POLICY_DIR.glob("*.toml")}
    for item in raw:
        extra = set(item) - _FIELDS
        assert not extra, f"{item.get('id')}: unknown fields {extra}"
        q = CorpusQuery(**item)
        assert q.id not in seen, f"duplicate id {q.id}"
        seen.add(q.id)
        assert q.dataset in datasets, f"{q.id}: unknown dataset {q.dataset}"
        assert q.label in ("answer", "refuse"), q.id
        assert q.issue in ISSUES, q.id
        assert (q.code is not None) == (q.label == "refuse"), f"{q.id}: code iff refuse"
        assert q.check in ("values", "shape", "keys"), q.id
        assert q.source.strip(), q.id
        assert q.keys is None or q.label == "answer", f"{q.id}: keys only for answer"
        out.append(q)
    return out


def shared_data_dir() -> Path | None:
    """``../shared/data/smartnoise`` (:func:`tests.shared_data.smartnoise_dir`), or None if absent."""
    path = smartnoise_dir()
    return path if (path / "PUMS_pid.csv").exists() else None


# --- outcomes ------------------------------------------------------------------------------------


@dataclass
class Outcome:
    """What happened to one query: ``ok`` (the gateway did what the label says) and why not."""

    query: CorpusQuery
    ok: bool
    detail: str = ""
    skipped: str | None = None
    release: dict[str, Any] | None = field(default=None, repr=False)


class Mismatch(AssertionError):
    """A release that does not match the exact answer."""


# --- the runner ----------------------------------------------------------------------------------


class CorpusRunner:
    """Sets up the corpus data, one gateway over every loadable fixture policy, and the
    exact DuckDB databases; runs queries.

    Args:
        workdir: an empty scratch folder (data, policies, ledger).
        smartnoise: the shared SmartNoise data folder, or None (those datasets are skipped).
    """

    def __init__(self, workdir: Path, smartnoise: Path | None = None) -> None:
        self.workdir = Path(workdir)
        self.smartnoise = smartnoise
        self.paths = {"smartnoise": str(smartnoise) if smartnoise else "/nonexistent",
                      "usage": str(self.workdir / "usage"), "library": str(self.workdir / "library"),
                      "tpch": str(self.workdir / "tpch")}
        self._write_data()
        self.policy_files: dict[str, Path] = {}
        self.specs: dict[str, dict[str, Any]] = {}
        pol_dir = self.workdir / "policies"
        pol_dir.mkdir(parents=True, exist_ok=True)
        for template in sorted(POLICY_DIR.glob("*.toml")):
            name = template.stem
            if name in SHARED_DATASETS and smartnoise is None:
                continue
            text = template.read_text()
            for key, value in self.paths.items():
                text = text.replace("{" + key + "}", value)
            target = pol_dir / template.name
            target.write_text(text)
            self.policy_files[name] = target
            self.specs[name] = tomllib.loads(text)
        self.load_errors: dict[str, str] = {}
        policies = {}
        for name, path in self.policy_files.items():
            try:
                policies[name] = load_policy(path)
            except PolicyError as e:
                self.load_errors[name] = f"the fixture policy does not load: {e.message}"
        engine = Engine(timeout_s=60)
        versions = engine.load(policies)
        ledger = open_ledger(f"sqlite:///{self.workdir / 'ledger.sqlite'}?synchronous=off")
        self.gateway = Gateway(policies, engine, versions, ledger, open_release_store(ledger))
        self._exact: dict[str, duckdb.DuckDBPyConnection] = {}

    def close(self) -> None:
        """Close the gateway and the exact databases."""
        self.gateway.close()
        for con in self._exact.values():
            con.close()

    def _write_data(self) -> None:
        from dpgate.sample_data import usage_tables, write_parquet
        from dpgate.tpch import generate_tpch

        usage = self.workdir / "usage"
        usage.mkdir(parents=True, exist_ok=True)
        for name, table in usage_tables(users=2000).items():
            write_parquet(table, usage / f"{name}.parquet")
        write_library(self.workdir / "library")
        # TPC-H at SF 0.01 (dpgate.tpch): the spec's lineitem and the denormalised one (l_custkey)
        generate_tpch(self.workdir / "tpch", TPCH_SF, denormalised=True)

    # -- exact answers

    def exact_connection(self, dataset: str) -> duckdb.DuckDBPyConnection:
        """A DuckDB database with the dataset's raw tables, typed as the policy declares, as
        ``<table>`` and ``<dataset>.<table>`` (rows with a NULL unit dropped, NaN/±inf → NULL)."""
        if dataset in self._exact:
            return self._exact[dataset]
        spec = self.specs[dataset]
        con = duckdb.connect()
        con.execute(f'CREATE SCHEMA "{dataset}"')
        for tname, table in spec["tables"].items():
            source = table["source"]
            reader = (f"read_parquet('{source}')" if source.endswith(".parquet")
                      else f"read_csv('{source}', header = true, all_varchar = true)")
            cols = []
            for cname, col in table.get("columns", {}).items():
                ctype = _DUCKDB_TYPES[col["type"]]
                expr = f'TRY_CAST("{cname}" AS {ctype})'
                if ctype == "DOUBLE":
                    expr = f"CASE WHEN isfinite({expr}) THEN {expr} END"
                cols.append(f'{expr} AS "{cname}"')
            unit = table.get("privacy_unit")
            if isinstance(unit, dict):  # a unit through foreign keys (issue 21): no column of its own
                unit = None
            if unit and unit not in table.get("columns", {}):
                cols.append(f'"{unit}"')
            where = f' WHERE "{unit}" IS NOT NULL' if unit else ""
            con.execute(f'CREATE TABLE "{tname}" AS SELECT {", ".join(cols)} FROM {reader}{where}')
            con.execute(f'CREATE VIEW "{dataset}"."{tname}" AS SELECT * FROM main."{tname}"')
        self._exact[dataset] = con
        return con

    def exact(self, q: CorpusQuery) -> tuple[list[str], list[tuple], int | None]:
        """(columns, rows, limit) of the exact answer: the query's SQL in DuckDB, LIMIT/TOP
        removed (returned separately), sample variances as population variances. A HAVING is
        removed too (the rows before it; see :meth:`compare`): which rows pass a HAVING on
        noisy values near its threshold is left to chance."""
        tree = sqlglot.parse_one(q.sql, read=q.dialect)
        limit = None
        if isinstance(tree, exp.Select) and tree.args.get("limit") is not None:
            limit_node = tree.args["limit"]
            value = limit_node.expression if isinstance(limit_node, exp.Limit) else limit_node
            limit = int(value.this) if isinstance(value, exp.Literal) else None
            tree.set("limit", None)
        if isinstance(tree, exp.Select) and tree.args.get("offset") is not None:
            # OFFSET (issue 21 item 7): the released rows are some of the exact rows (the
            # noisy order may differ from the exact one), checked like a LIMITed answer
            tree.set("offset", None)
            limit = limit if limit is not None else 2**62
        if isinstance(tree, exp.Select) and tree.args.get("having") is not None:
            # HAVING on noisy values keeps a row near the threshold or not by chance: compare the
            # released rows with the exact rows before HAVING, and do not require every exact
            # row that passes it (the caller treats the answer like a LIMITed one)
            tree.set("having", None)
        tree = tree.transform(_population_estimates)
        group = tree.args.get("group") if isinstance(tree, exp.Select) else None
        if group is not None and (group.args.get("rollup") or group.args.get("cube") or group.args.get("grouping_sets")):
            # MySQL/Spark "GROUP BY a, b WITH ROLLUP" and Spark's "GROUP BY a, b GROUPING SETS (…)":
            # DuckDB reads the standard spelling only (its docs: GROUP BY ROLLUP (a, b))
            items = group.args.get("grouping_sets") or [
                (exp.Rollup if group.args.get("rollup") else exp.Cube)(expressions=list(group.expressions))]
            tree.set("group", exp.Group(expressions=list(items)))
        sql = tree.sql(dialect="duckdb")
        cur = self.exact_connection(q.dataset).execute(sql)
        columns = [d[0] for d in cur.description]
        return columns, [tuple(_norm(v) for v in row) for row in cur.fetchall()], limit

    # -- running

    def run(self, q: CorpusQuery) -> Outcome:
        """Run ``q`` through the gateway and judge the outcome against its label."""
        if q.dataset in SHARED_DATASETS and self.smartnoise is None:
            return Outcome(q, False, skipped="../shared/data/smartnoise is not present")
        if q.dataset in self.load_errors:
            return Outcome(q, False, self.load_errors[q.dataset])
        population = self.gateway.population_of(q.dataset)
        before = self.gateway.ledger.spend(population).charges
        kwargs: dict[str, Any] = {"consumer": "analysts", "budget": QueryBudget(rho=QUERY_RHO)}
        if q.dialect != "duckdb":
            if "dialect" not in inspect.signature(self.gateway.query).parameters:
                return Outcome(q, False, f"the gateway does not read the {q.dialect} dialect yet")
            kwargs["dialect"] = q.dialect
        try:
            release = self.gateway.query(q.dataset, q.sql, **kwargs)
        except DpgateError as e:
            charged = self.gateway.ledger.spend(population).charges - before
            if q.label == "refuse":
                if e.code != q.code:
                    return Outcome(q, False, f"refused with {e.code} instead of {q.code}: {e.message}")
                if charged:
                    return Outcome(q, False, f"refused but charged {charged} time(s)")
                return Outcome(q, True, f"refused: {e.code}")
            return Outcome(q, False, f"refused ({e.code}): {e.message}")
        if q.label == "refuse":
            return Outcome(q, False, "answered a query that must be refused", release=release)
        try:
            detail = self.compare(q, release)
        except Mismatch as e:
            return Outcome(q, False, f"release differs from the exact answer: {e}", release=release)
        return Outcome(q, True, detail, release=release)

    def compare(self, q: CorpusQuery, release: dict[str, Any]) -> str:
        """Raise :class:`Mismatch` unless the release matches the exact answer (module docstring)."""
        columns, exact_rows, limit = self.exact(q)
        rel_cols, rel_rows = list(release["columns"]), [list(r) for r in release["rows"]]
        if len(rel_cols) != len(columns):
            raise Mismatch(f"{len(rel_cols)} columns released, {len(columns)} expected ({rel_cols} vs {columns})")
        accuracy = release.get("accuracy") or {}
        noisy = [i for i, c in enumerate(rel_cols) if c in accuracy]
        keys = [i for i in range(len(rel_cols)) if i not in noisy]
        if limit is not None and len(rel_rows) > limit:
            raise Mismatch(f"{len(rel_rows)} rows released under LIMIT {limit}")
        buckets: dict[tuple, list[tuple]] = {}
        for row in exact_rows:
            buckets.setdefault(tuple(_key(row[i]) for i in keys), []).append(row)
        self._widest = {rel_cols[i]: _widest(accuracy[rel_cols[i]]) for i in noisy}
        checked = 0
        for r, row in enumerate(rel_rows):
            key = tuple(_key(_norm(row[i])) for i in keys)
            candidates = buckets.get(key, [])
            if q.check == "shape":
                if not candidates and noisy:
                    raise Mismatch(f"released key {key} is not in the exact answer")
                if candidates:
                    candidates.pop(0)
                continue
            match = None
            for j, cand in enumerate(candidates):
                if all(self._close(cand[i], row[i], accuracy[rel_cols[i]], r, self._widest[rel_cols[i]]) for i in noisy):
                    match = j
                    break
            if match is not None:
                candidates.pop(match)
                checked += len(noisy)
                continue
            if candidates:
                cand = candidates[0]
                bad = [(rel_cols[i], row[i], cand[i]) for i in noisy
                       if not self._close(cand[i], row[i], accuracy[rel_cols[i]], r, self._widest[rel_cols[i]])]
                raise Mismatch(f"row {key}: released vs exact {bad}")
            # a released group with no data (a public key): counts and sums are exactly 0
            if q.check == "keys":  # issue 24: the WHERE narrows the keys; on dense data each kept key has rows
                raise Mismatch(f"released key {key} that no row reaches through the WHERE")
            for i in noisy:
                acc = accuracy[rel_cols[i]]
                if not acc.get("approximate") and not self._close(0, row[i], acc, r, None):
                    raise Mismatch(f"row {key} is absent from the exact answer but {rel_cols[i]} = {row[i]}")
        if q.keys is not None:  # the released key combinations, exactly (issue 19 item 5)
            expected = {tuple(_key(_norm(v)) for v in row)
                        for row in self.exact_connection(q.dataset).execute(q.keys).fetchall()}
            released = {tuple(_key(_norm(row[i])) for i in keys) for row in rel_rows}
            if released != expected:
                raise Mismatch(f"released keys differ from `{q.keys}`: {len(released - expected)} extra "
                               f"(e.g. {sorted(released - expected)[:3]}), {len(expected - released)} missing")
        left = [k for k, rows in buckets.items() for _ in rows]
        tree = sqlglot.parse_one(q.sql, read=q.dialect)
        having = isinstance(tree, exp.Select) and tree.args.get("having") is not None
        # private partition selection (issue 11) releases only the keys that pass its threshold:
        # the released rows must be exact rows (checked above), not all of them
        selecting = bool(release.get("partition_selection"))
        if left and limit is None and not having and q.check in ("values", "keys") and not selecting:
            missing = [k for k in left if not any(v is None for v in k)]
            if missing and keys:
                raise Mismatch(f"exact rows not released: {missing[:5]}")
            if missing and not keys:
                raise Mismatch(f"{len(missing)} exact row(s) not released")
        return f"{len(rel_rows)} rows, {checked} cells within 5σ"

    @staticmethod
    def _close(exact_value: Any, released: Any, acc: dict[str, Any], row: int, widest: float | None) -> bool:
        exact_value = _norm(exact_value)
        released = _norm(released)
        if exact_value is None and released is not None:
            if acc.get("approximate"):
                return True  # e.g. AVG of no rows: SQL says NULL, the release a clamped estimate
            exact_value = 0  # SUM of no rows: SQL says NULL, a DP release says 0 ± noise
        if exact_value is None or released is None:
            return exact_value is None and released is None
        if not isinstance(exact_value, (int, float)) or not isinstance(released, (int, float)):
            return exact_value == released
        if "rank_error95" in acc:  # a DP quantile (issue 12): queries.toml says what is checked
            grid = acc["grid"]
            return abs(float(released) - float(exact_value)) <= 2 * grid["step"] + 0.02 * (grid["upper"] - grid["lower"])
        scale = None
        if not acc.get("approximate"):
            scale = acc.get("sigma", acc.get("scale", acc.get("sd")))
        if scale is None:
            # approximate cells: the column's widest 95 % half-width (a cell clamped to a bound
            # can report a narrow interval while its parts' noise is wide)
            if widest is None:
                return True  # no honest accuracy to compare with (omitted with a reason)
            scale = widest
        slack = 1e-9 * max(1.0, abs(float(exact_value)))
        return abs(float(released) - float(exact_value)) <= 5.0 * float(scale) + slack


_SAMPLE_VARIANCES = {"VAR": exp.VariancePop, "VARIANCE": exp.VariancePop, "VAR_SAMP": exp.VariancePop,
                     "STDEV": exp.StddevPop, "STD": exp.StddevPop, "STDDEV": exp.StddevPop,
                     "STDDEV_SAMP": exp.StddevPop, "VARP": exp.VariancePop, "STDEVP": exp.StddevPop}


def _widest(acc: dict[str, Any]) -> float | None:
    values = [v for v in (acc.get("ci95_rows") or []) if v is not None]
    if acc.get("ci95") is not None:
        values.append(acc["ci95"])
    return max(values) if values else None


def _population_estimates(node: exp.Expression) -> exp.Expression:
    """VAR/VARIANCE/STDDEV (any spelling) → the population estimates DuckDB calls *_POP."""
    if isinstance(node, exp.Variance):
        return exp.VariancePop(this=node.this)
    if isinstance(node, (exp.Stddev, exp.StddevSamp)):
        return exp.StddevPop(this=node.this)
    if isinstance(node, exp.Anonymous) and str(node.name).upper() in _SAMPLE_VARIANCES and len(node.expressions) == 1:
        return _SAMPLE_VARIANCES[str(node.name).upper()](this=node.expressions[0])
    return node


def _norm(v: Any) -> Any:
    if isinstance(v, Decimal):
        return float(v)
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dt.datetime):
        # dpgate releases date_trunc keys as ISO text: 'YYYY-MM-DD' for a day or coarser,
        # 'YYYY-MM-DD HH:MM:SS' otherwise (README, "dates and timestamps")
        if v.time() == dt.time(0):
            return v.date().isoformat()
        return v.isoformat(sep=" ")
    if isinstance(v, dt.date):
        return v.isoformat()
    return v


def _key(v: Any) -> Any:
    if isinstance(v, bool):
        return v
    if isinstance(v, (int, float)):
        return float(v)
    return v


# --- the report ------------------------------------------------------------------------------------


def report(outcomes: list[Outcome]) -> str:
    """A Markdown table: per issue, how many corpus queries the gateway handles as labelled."""
    lines = ["| issue | queries | answer-labelled handled | refuse-labelled handled | handled |",
             "|---|---|---|---|---|"]
    total_ok = total_n = 0
    for issue in ISSUES:
        mine = [o for o in outcomes if o.query.issue == issue and o.skipped is None]
        ans = [o for o in mine if o.query.label == "answer"]
        ref = [o for o in mine if o.query.label == "refuse"]
        ok = sum(o.ok for o in mine)
        total_ok += ok
        total_n += len(mine)
        lines.append(f"| {issue} | {len(mine)} | {sum(o.ok for o in ans)} / {len(ans)} | "
                     f"{sum(o.ok for o in ref)} / {len(ref)} | {_pct(ok, len(mine))} |")
    lines.append(f"| all | {total_n} | | | {_pct(total_ok, total_n)} |")
    lines += ["", "| source | queries | handled |", "|---|---|---|"]
    for family, prefix in (("SmartNoise SQL", "sn-"), ("Tumult Analytics tutorials", "tu-"),
                           ("BigQuery / ZetaSQL docs", "bq-"), ("PipelineDP examples", "pd-"),
                           ("PostgreSQL documentation", "pg-"), ("TPC-H (issue 21)", "tpch-"),
                           ("SQL dialect docs: syntax (issue 21 item 7)", "dd-"),
                           ("dpgate README and issues 10, 15, 24", "dg-")):
        mine = [o for o in outcomes if o.query.id.startswith(prefix) and o.skipped is None]
        lines.append(f"| {family} | {len(mine)} | {_pct(sum(o.ok for o in mine), len(mine))} |")
    skipped = sum(o.skipped is not None for o in outcomes)
    if skipped:
        lines.append(f"\n{skipped} queries skipped: ../shared/data/smartnoise is not present.")
    return "\n".join(lines)


def _pct(a: int, b: int) -> str:
    return f"{a} / {b} ({100.0 * a / b:.0f} %)" if b else "–"


def main() -> int:
    """Run the whole corpus and print the report (and, with ``-v``, each failure)."""
    import tempfile

    work = Path(tempfile.mkdtemp(prefix="dpgate-corpus-"))
    try:
        runner = CorpusRunner(work, shared_data_dir())
        try:
            outcomes = [runner.run(q) for q in load_corpus()]
        finally:
            runner.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(report(outcomes))
    if "-v" in sys.argv:
        for o in outcomes:
            if not o.ok and o.skipped is None:
                print(f"{o.query.id} (issue {o.query.issue}, {o.query.label}): {o.detail}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
