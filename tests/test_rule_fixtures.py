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
