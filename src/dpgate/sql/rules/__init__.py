"""Rewrite rules on the analyst's parsed statement: small pure functions, tree → tree, one a
module (as sqlglot's optimizer), applied in the order of :data:`RULES`.

Each rule takes a sqlglot SELECT and returns a new one (the input is never modified),
refusing what it cannot rewrite soundly with an :class:`~dpgate.errors.UnsupportedQuery`
that quotes the construct. They run before the planner's allow-list
(:mod:`dpgate.sql.allow_list`, from :func:`dpgate.sql.compile.compile_statement`), so a query
that a rule turns into the flat form gets the flat query's plan, plan hash and release-cache
entry. Every rewrite has a fixture file, ``tests/fixtures/rules/<rule>.sql`` (sqlglot's
optimizer fixture format: an input statement, then the expected output; run by
``tests/test_rule_fixtures.py``).

:data:`RULES`, in order:

* :func:`~dpgate.sql.rules.column_lists.column_lists` — ``WITH t (a, b) AS (SELECT x, y …)`` and
  ``(SELECT x, y …) AS t (a, b)`` → ``SELECT x AS a, y AS b`` (issue 21 item 7);
* :func:`~dpgate.sql.rules.group_by_all.group_by_all` — ``GROUP BY ALL`` → the SELECT items
  without aggregates;
* :func:`~dpgate.sql.rules.left_to_substring.left_to_substring` — ``LEFT(s, n)`` →
  ``SUBSTRING(s, 1, n)`` (``n`` a non-negative integer literal);
* :func:`~dpgate.sql.rules.or_equalities_to_in.or_equalities_to_in` — ``x = 1 OR x = 2`` →
  ``x IN (1, 2)`` (before the nesting check: a long OR chain is one IN list);
* :func:`check_nesting` — refuse expressions nested deeper than the planner processes
  (:mod:`dpgate.sql.rules.nesting`; a check, the tree is unchanged);
* :func:`~dpgate.sql.rules.inline_ctes.inline_ctes` — ``WITH r AS (SELECT …) SELECT … FROM r`` →
  the CTE's query as a derived table in FROM;
* :func:`~dpgate.sql.rules.unwrap_select_star.unwrap_select_star` — ``SELECT * FROM (query)``
  with no other clause → the query;
* :func:`~dpgate.sql.rules.merge_derived_tables.merge_derived_tables` — a derived table that
  filters and projects one table merged into the query;
* :func:`~dpgate.sql.rules.factor_or_equalities.factor_or_equalities` — ``(a.k = b.k AND x) OR
  (a.k = b.k AND y)`` → ``a.k = b.k AND (x OR y)`` (an equality in every branch of an OR in WHERE,
  factored out so that the next rule sees a comma join's condition; TPC-H Q19);
* :func:`~dpgate.sql.rules.comma_joins.comma_joins` — ``FROM a, b WHERE a.k = b.k`` →
  ``FROM a JOIN b ON a.k = b.k`` (issue 21 item 3; the join rewrite then checks the ON);
* :func:`check_merged_nesting` — the nesting check again, parentheses the merge added not
  counted (merging substitutes projected expressions: nesting can grow).

The compiler runs the syntactic rules :data:`SYNTAX_RULES` (column lists, GROUP BY ALL, LEFT,
CTE inlining, SELECT * unwrapping) once before the per-unit and join hooks too (they read the
normalised tree); each is idempotent, so :data:`RULES` applies them again at no change.
"""

from __future__ import annotations

from typing import Callable

from sqlglot import exp

from dpgate.sql.rules.base import MAX_DEPTH
from dpgate.sql.rules.column_lists import column_lists
from dpgate.sql.rules.comma_joins import comma_joins
from dpgate.sql.rules.factor_or_equalities import factor_or_equalities
from dpgate.sql.rules.group_by_all import group_by_all
from dpgate.sql.rules.inline_ctes import inline_ctes
from dpgate.sql.rules.left_to_substring import left_to_substring
from dpgate.sql.rules.merge_derived_tables import merge_derived_tables
from dpgate.sql.rules.nesting import (
    MAX_NESTING,
    MAX_TREE_DEPTH,
    check_nesting,
    expression_depth,
    nesting_refusal,
    parser_nesting_refusal,
    tree_depth,
)
from dpgate.sql.rules.or_equalities_to_in import or_equalities_to_in
from dpgate.sql.rules.unwrap_select_star import unwrap_select_star

__all__ = [
    "MAX_DEPTH", "MAX_NESTING", "MAX_TREE_DEPTH", "RULES", "SYNTAX_RULES", "apply_statement_rules",
    "apply_syntax_rules", "check_merged_nesting", "check_nesting", "column_lists", "comma_joins", "expression_depth",
    "factor_or_equalities", "group_by_all", "inline_ctes", "left_to_substring", "merge_derived_tables", "nesting_refusal",
    "or_equalities_to_in", "parser_nesting_refusal", "tree_depth", "unwrap_select_star",
]

Rule = Callable[[exp.Select], exp.Select]


def nesting(stmt: exp.Select) -> exp.Select:
    """:func:`check_nesting` as a rule (the statement unchanged, or a refusal)."""
    check_nesting(stmt)
    return stmt


def check_merged_nesting(stmt: exp.Select) -> exp.Select:
    """:func:`check_nesting` after merging: the parentheses the merge added are not counted (the
    canonical SQL drops them; the parser never reads them)."""
    check_nesting(stmt, parentheses=False)
    return stmt


#: The statement rules, in the order :func:`apply_statement_rules` applies them.
RULES: tuple[Rule, ...] = (column_lists, group_by_all, left_to_substring, or_equalities_to_in, nesting,
                          inline_ctes, unwrap_select_star, merge_derived_tables, factor_or_equalities, comma_joins,
                          check_merged_nesting)

#: The syntactic rules the compiler applies before the per-unit and join hooks (a subsequence
#: of :data:`RULES`, in its order).
SYNTAX_RULES: tuple[Rule, ...] = (column_lists, group_by_all, left_to_substring, inline_ctes, unwrap_select_star)


def apply_syntax_rules(stmt: exp.Select) -> exp.Select:
    """Every rule of :data:`SYNTAX_RULES`, in order."""
    for rule in SYNTAX_RULES:
        stmt = rule(stmt)
    return stmt


def apply_statement_rules(stmt: exp.Select) -> exp.Select:
    """Every rule of :data:`RULES`, in order."""
    for rule in RULES:
        stmt = rule(stmt)
    return stmt
