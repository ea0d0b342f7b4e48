"""Every rewrite rule of :data:`dpgate.sql.rules.RULES` against its fixture file,
``tests/fixtures/rules/<rule>.sql``, in sqlglot's optimizer fixture format (tests/fixtures/
optimizer/*.sql there): statements end with ``;`` and come in pairs, the input then the expected
output (DuckDB SQL); ``--`` lines are comments; ``# key: value`` lines before an input are its
metadata (``title``; ``dialect``, the input's dialect, default duckdb).

Each rule alone: its output is the expected text, its input is not modified, and the output is
a fixed point of the rule (applying it again changes nothing).
"""

from __future__ import annotations

from functools import reduce
from pathlib import Path

import pytest
import sqlglot

from dpgate.sql.rules import RULES, apply_statement_rules

FIXTURES = Path(__file__).parent / "fixtures" / "rules"
RULE_OF = {rule.__name__: rule for rule in RULES}


def load_pairs(text: str) -> list[tuple[dict[str, str], str, str]]:
    """(metadata, input, expected) of a fixture file's text, in order."""
    lines = [line for line in text.splitlines() if line.strip() and not line.startswith("--")]
    statements = [s.strip() for s in "\n".join(lines).split(";")]
    pairs = []
    for i in range(0, len(statements) - 1, 2):
        meta, body = {}, []
        for line in statements[i].splitlines():
            if line.startswith("#") and not body:
                key, _, value = line.lstrip("#").partition(":")
                meta[key.strip()] = value.strip()
            else:
                body.append(line)
        pairs.append((meta, "\n".join(body).strip(), statements[i + 1]))
    return pairs


def _cases():
    for path in sorted(FIXTURES.glob("*.sql")):
        for n, (meta, sql, expected) in enumerate(load_pairs(path.read_text())):
            yield pytest.param(path.stem, meta, sql, expected, id=f"{path.stem}-{meta.get('title', n)}")


CASES = list(_cases())


def test_every_rule_has_a_fixture_file_and_every_file_a_rule():
    assert {p.stem for p in FIXTURES.glob("*.sql")} == set(RULE_OF)
    assert all(load_pairs((FIXTURES / f"{name}.sql").read_text()) for name in RULE_OF)


def test_the_loader_reads_sqlglot_fixture_pairs():
    text = "-- a comment; with a semicolon\n# title: one\nSELECT 1\n;\nSELECT 2;\n\n# title: two\nSELECT 3;\nSELECT 4;\n"
    assert load_pairs(text) == [({"title": "one"}, "SELECT 1", "SELECT 2"), ({"title": "two"}, "SELECT 3", "SELECT 4")]


@pytest.mark.parametrize("rule, meta, sql, expected", CASES)
def test_rule_fixture(rule, meta, sql, expected):
    stmt = sqlglot.parse_one(sql, read=meta.get("dialect", "duckdb"))
    before = stmt.sql()
    out = RULE_OF[rule](stmt)
    assert stmt.sql() == before, "a rule must not modify its input"
    assert out.sql(dialect="duckdb") == expected
    again = RULE_OF[rule](sqlglot.parse_one(expected, read="duckdb"))
    assert again.sql(dialect="duckdb") == expected, "the output is a fixed point of the rule"


@pytest.mark.parametrize("rule, meta, sql, expected", CASES)
def test_apply_statement_rules_is_the_rules_in_order(rule, meta, sql, expected):
    read = lambda: sqlglot.parse_one(sql, read=meta.get("dialect", "duckdb"))  # noqa: E731
    by_hand = reduce(lambda stmt, r: r(stmt), RULES, read())
    assert apply_statement_rules(read()).sql(dialect="duckdb") == by_hand.sql(dialect="duckdb")


def test_sqlglot_merge_subqueries_would_keep_hashes_but_retitle_outputs():
    """Why the rules are ours and not sqlglot's optimizer (issue 20 step 8; docs/COMPILE_PROGRESS.md):
    ``qualify_columns`` (which ``merge_subqueries`` needs) with a schema from the policy, then
    ``merge_subqueries`` and ``eliminate_ctes``, give the same plan hash, but every released column
    is retitled (``_col_0`` for ``COUNT(*)``, ``SUM(t)`` lost) and an unknown column is sqlglot's
    ``OptimizeError``, not :class:`~dpgate.errors.UnknownColumn`. When this test fails, sqlglot's
    behaviour changed: look again."""
    from sqlglot.errors import OptimizeError
    from sqlglot.optimizer.eliminate_ctes import eliminate_ctes
    from sqlglot.optimizer.merge_subqueries import merge_subqueries
    from sqlglot.optimizer.qualify import qualify

    from dpgate.errors import UnknownColumn
    from dpgate.policy import load_policy
    from dpgate.sql.parse import parse_query

    policy = load_policy(Path(__file__).parent / "fixtures" / "policies" / "planner.toml")
    types = {"int": "BIGINT", "float": "DOUBLE", "text": "VARCHAR", "bool": "BOOLEAN", "date": "DATE"}
    schema = {policy.name: {t.name: {c.name: types.get(c.type, "VARCHAR") for c in t.columns.values()}
                            for t in policy.tables.values()}}

    def sqlglot_rules(sql: str) -> str:
        stmt = qualify(sqlglot.parse_one(sql, read="duckdb"), schema=schema, db=policy.name, dialect="duckdb",
                       quote_identifiers=False)
        return eliminate_ctes(merge_subqueries(stmt)).sql(dialect="duckdb")

    sql = "SELECT r, SUM(t) FROM (SELECT region AS r, tokens AS t FROM prompts p WHERE p.age > 3) s GROUP BY r"
    ours, theirs = parse_query(sql, policy), parse_query(sqlglot_rules(sql), policy)
    assert ours.plan_hash == theirs.plan_hash
    assert [o.label for o in ours.visible_outputs] == ["r", "SUM(t)"]
    assert [o.label for o in theirs.visible_outputs] != ["r", "SUM(t)"]
    bad = "SELECT COUNT(*) FROM (SELECT age FROM prompts) s WHERE s.nope > 1"
    with pytest.raises(UnknownColumn):
        parse_query(bad, policy)
    with pytest.raises(OptimizeError):
        sqlglot_rules(bad)
