"""Post-processing: turn noisy primitives into the released table, and evaluate
expressions over released cells.

Everything here reads only noisy values, public keys, constants and the policy,
so by the post-processing property of differential privacy ([DR14] Prop. 2.1;
zCDP is closed under post-processing too, [BS16] Lemma 1.8) it costs no privacy
budget. The parts:

* :mod:`dpgate.postprocess.expressions` — the expression evaluator: a sqlglot
  expression over *cells* (released aggregates, group keys, constants),
  evaluated vectorised with SQL NULL semantics (:func:`evaluate`,
  :func:`evaluate_predicate` for HAVING, :func:`order_by`/:func:`sort_rows`/
  :func:`limit_rows` for ORDER BY and LIMIT), and the planning-time check
  :func:`check_postprocess_expression` (unsupported and non-deterministic
  constructs refused before any charge);
* :mod:`dpgate.postprocess.accuracy` — the 95 % accuracy of derived cells
  (:func:`propagate_accuracy`): exact for linear maps of one primitive, σ²
  adding for several Gaussian ones, union bounds, interval arithmetic, or
  omitted with a reason;
* :mod:`dpgate.postprocess.release` — the released table from noisy primitives
  (:func:`finalize`, :func:`aggregate_cell`, :func:`derived_cell`): scaling,
  AVG/VAR/STDDEV, accuracy, suppression, HAVING, ORDER BY, LIMIT;
* :mod:`dpgate.postprocess.calibration` — the inverse for a ``{"ci95": w}`` budget
  (:func:`scales_for_ci95`): noise scales such that every released cell's reported
  half-width is at most ``w``.

References: [DR14] C. Dwork, A. Roth, The Algorithmic Foundations of Differential
Privacy, 2014. [BS16] M. Bun, T. Steinke, Concentrated Differential Privacy, TCC 2016.
"""

from dpgate.postprocess.accuracy import CellAccuracy, CellNoise, PrimitiveNoise, propagate_accuracy
from dpgate.postprocess.calibration import CellTarget, Ci95Scales, ci95_rules, scales_for_ci95
from dpgate.postprocess.expressions import (
    NONDETERMINISTIC_FUNCTIONS,
    SUPPORTED_NODES,
    VALUE_TYPES,
    ExpressionError,
    Vector,
    check_postprocess_expression,
    evaluate,
    evaluate_predicate,
    limit_rows,
    order_by,
    sort_rows,
)
from dpgate.postprocess.release import (
    ReleasedCell,
    ReleasedTable,
    aggregate_cell,
    derived_cell,
    finalize,
    output_unit,
    primitive_noise,
)

__all__ = [
    "NONDETERMINISTIC_FUNCTIONS",
    "SUPPORTED_NODES",
    "VALUE_TYPES",
    "CellAccuracy",
    "CellNoise",
    "CellTarget",
    "Ci95Scales",
    "ExpressionError",
    "PrimitiveNoise",
    "ReleasedCell",
    "ReleasedTable",
    "Vector",
    "aggregate_cell",
    "check_postprocess_expression",
    "ci95_rules",
    "derived_cell",
    "evaluate",
    "evaluate_predicate",
    "finalize",
    "limit_rows",
    "order_by",
    "output_unit",
    "primitive_noise",
    "propagate_accuracy",
    "scales_for_ci95",
    "sort_rows",
]
