"""The planner's evaluator of table-less queries, passed in from above (issue 20 step 6: the
planner imports no engine).

Two planning steps evaluate SQL on values the *policy* declares, never on data: the domain of a
computed group key (:mod:`dpgate.sql.keys`, every value the expression takes over its inputs'
declared domains) and the narrowing of public keys by a WHERE (:mod:`dpgate.sql.narrow`). Their
semantics must be the executing engine's, so they run a query that reads no table (``range``,
``unnest``, ``VALUES``, literals) through a :data:`TablelessEvaluator` that the layer above the
planner installs: the pipeline (:mod:`dpgate.pipeline.planning`) installs
:func:`dpgate.engines.duckdb.evaluate_tableless` (in memory, no data, external access off);
tests install the same in tests/conftest.py. Planning a query that needs an evaluation with none
installed is a programming error (:class:`NoEvaluator`), never a silent change of the plan.
"""

from __future__ import annotations

from typing import Callable

__all__ = ["NoEvaluator", "TablelessEvaluator", "evaluate_tableless", "install", "installed"]

#: ``sql → (rows, type name of the first result column)``; raises ``ValueError`` when the query
#: fails (the planner turns that into "does not narrow" or a refusal of the key).
TablelessEvaluator = Callable[[str], tuple[list[tuple], str]]

_EVALUATOR: list[TablelessEvaluator] = []


class NoEvaluator(RuntimeError):
    """No :data:`TablelessEvaluator` is installed (call :func:`install`, or import
    :mod:`dpgate.pipeline.planning`, which installs DuckDB's)."""


def install(evaluator: TablelessEvaluator) -> None:
    """Make ``evaluator`` the planner's evaluator of table-less queries (replaces any other)."""
    _EVALUATOR[:] = [evaluator]


def installed() -> TablelessEvaluator | None:
    """The installed evaluator, or None."""
    return _EVALUATOR[0] if _EVALUATOR else None


def evaluate_tableless(sql: str) -> tuple[list[tuple], str]:
    """Run a table-less query through the installed evaluator.

    Raises:
        ValueError: the evaluator refused or failed the query.
        NoEvaluator: none is installed.
    """
    if not _EVALUATOR:
        raise NoEvaluator("the planner needs an evaluator of table-less queries to enumerate a "
                          "computed key or narrow public keys: dpgate.sql.evaluation.install("
                          "dpgate.engines.duckdb.evaluate_tableless) (the pipeline does)")
    return _EVALUATOR[0](sql)
