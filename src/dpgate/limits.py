"""Numeric limits that make every admitted query's outcome independent of the data.

Once a query is charged, its outcome (release, error, error code) must depend on the data only
through the noisy values (DESIGN.md, "What never happens"; issue 9 item 1). An overflow that
happens for some data and not for other data would publish, without noise, on which side of a
threshold an exact aggregate lies. These limits are checked *before* the charge, from the policy
and the plan only, so that no admitted query can overflow anywhere on any data:

* **Policy load** (:mod:`dpgate.policy`): ``|lower|, |upper| ≤`` :data:`MAX_ABS_BOUND` and
  :data:`MIN_RESOLUTION` ≤ ``resolution`` ≤ :data:`MAX_RESOLUTION`; the bounds are exact
  multiples of the resolution; ``|bound| / resolution`` ≤ :data:`MAX_STEPS` and one unit's
  per-group sum ``m·max(|lo|, |hi|)`` ≤ :data:`MAX_STEPS` (fixed-point units).
* **Before the charge** (:func:`dpgate.representable.check_representable`): every column of
  the table a plan reads satisfies :func:`range_problem` — declared columns do by the load
  above, columns the planner *derives* (a per-unit subquery's aggregates, whose range
  ``k·m·[lo, hi]`` of an inner SUM grows with k·m; :mod:`dpgate.sql.per_unit`) are checked
  here, so an inner ``CAST(SUM(x) AS BIGINT)`` can never overflow; every primitive's
  per-group bound ``linf`` (:func:`dpgate.sensitivity.primitive_linf`) is ≤ :data:`MAX_STEPS`
  (this covers the sum of squares, ``m·max(lo², hi²)``, of VAR/STDDEV); every noise scale is
  ≤ :data:`MAX_SCALE` (:func:`dpgate.mechanisms.calibrate`).
* **Before the noise** (:func:`dpgate.mechanisms.sample`): each exact per-group aggregate is
  clamped to ``[−MAX_ABS_AGGREGATE, MAX_ABS_AGGREGATE]``.

Why each number:

* ``MAX_STEPS = 2^62``: per row, a clamped fixed-point value fits a BIGINT; per unit and group,
  a partial (sum, sum of squares, or its ``total·m // count`` rescaling) is at most
  ``count·linf ≤ 2^64·2^62 = 2^126`` in magnitude before the clip, inside DuckDB's 128-bit
  HUGEINT (no table holds 2^64 rows); per group, the sum of at most 2^64 clipped partials of
  magnitude ≤ 2^62 is < 2^127. So the bounded query's integer arithmetic never overflows.
* ``MAX_ABS_AGGREGATE = 2^62``: OpenDP's integer samplers work on i64; an input of magnitude
  ≤ 2^62 with noise scale ≤ 2^52 saturates i64 only if the noise exceeds 2^62 = 2^10·σ
  (probability < e^{-2^19} for the discrete Gaussian, < e^{-2^10} for the discrete Laplace),
  and even then the outcome is a function of the noisy value (post-processing), not of the data.
  The clamp is a contraction (below), so it does not raise the sensitivity.
* ``MAX_SCALE = 2^52``: the noise itself stays far inside i64 (see above).
* ``MAX_INT = 2^63 − 1``: an int column's values are BIGINTs (the load casts them, a derived
  per-unit aggregate is cast to BIGINT); its range must lie inside, or the cast of a value in
  range would fail on some data.
* ``MAX_ABS_BOUND = 1e100``, resolution in ``[1e-100, 1e100]``: post-processing multiplies a
  noisy integer (|N| < 2^63) by the resolution or its square and divides by noisy counts; AVG,
  VAR and STDDEV square the bounds. With these limits every such double is finite:
  2^63·(1e100)² ≈ 9.2e218, (2·1e100)² = 4e200, (1e-100)² = 1e-200 (a normal double, so dividing
  a ci95 target by a squared resolution cannot overflow to inf either) — all far from the double
  range (≈ 1.8e308, smallest normal ≈ 2.2e-308).

The clamp is a contraction: for c(v) = min(max(v, −M), M) applied coordinatewise,
|c(a) − c(b)| ≤ |a − b| for all reals a, b (c is the projection onto the interval [−M, M], and
projections onto closed convex sets are non-expansive: Bauschke & Combettes, *Convex Analysis
and Monotone Operator Theory in Hilbert Spaces*, 2nd ed. 2017, Prop. 4.16). Hence for vectors
‖c(x) − c(y)‖_p ≤ ‖x − y‖_p for every p, so the L1 and L2 sensitivities of the clamped query
are at most those of the exact one (the same argument as clamping in Wilson et al. 2020, §3).
"""

from __future__ import annotations

__all__ = [
    "MAX_ABS_AGGREGATE",
    "MAX_ABS_BOUND",
    "MAX_INT",
    "MAX_CAP_EPSILON",
    "MAX_POLICY_EPSILON",
    "MAX_PROTECTED_OCCURRENCES",
    "MAX_QUERY_RHO",
    "MAX_RESOLUTION",
    "MAX_SCALE",
    "MAX_STEPS",
    "MIN_RESOLUTION",
    "range_problem",
]

#: Largest |value| of an exact per-group aggregate given to the noise (integer units);
#: larger ones are clamped to it (a contraction, so the sensitivity is unchanged).
MAX_ABS_AGGREGATE: int = 2**62
#: Most protected table occurrences one join may read (:class:`dpgate.sql.sources.UnitGraph`): the
#: caps apply after the join, and a unit with r rows in each of c occurrences has r^c joined rows, so a
#: join of many copies could only time out after the charge. Five covers the corpus (TPC-H's deepest
#: chain reads three: lineitem, orders, customer; a test chains five) and keeps r^c at 10^5 for r = 10.
MAX_PROTECTED_OCCURRENCES: int = 5
#: Largest fixed-point magnitude (resolution steps) of a bound, and largest per-unit,
#: per-group contribution ``linf`` of any primitive (integer units).
MAX_STEPS: int = 2**62
#: Largest noise scale (σ or b, integer units) the mechanisms accept.
MAX_SCALE: float = 2.0**52
#: Largest |lower|, |upper| of a numeric column (column units).
MAX_ABS_BOUND: float = 1e100
#: Smallest and largest ``resolution`` of a numeric column (column units).
MIN_RESOLUTION: float = 1e-100
MAX_RESOLUTION: float = 1e100
#: Largest |value| of an int column's range: its values are BIGINTs.
MAX_INT: int = 2**63 - 1
#: Largest zCDP ρ one query may spend (a request's ``budget.rho`` and a policy's
#: ``[budget] default_query_rho``); equals :attr:`dpgate.pipeline.budget.QueryBudget.MAX_RHO`.
MAX_QUERY_RHO: float = 1e4
#: Largest ε of an admin's cap change (``POST /v1/admin/populations/{p}/cap`` and its preview).
MAX_CAP_EPSILON: float = 1e3
#: Largest ε of a policy's ``[budget] epsilon``. Test and benchmark policies use caps up to 1e9
#: (a cap that never binds); beyond 1e12 the accounting's conversions overflow (ε = 1e308 gave
#: ρ_cap ≈ 1e308 and numpy overflow warnings in ``dpgate budget``).
MAX_POLICY_EPSILON: float = 1e12


def range_problem(ctype: str, lower, upper, steps: int) -> str | None:
    """Why a numeric column's range ``[lower, upper]`` breaks these limits, or None.

    Args:
        ctype: ``"int"`` or ``"float"``.
        lower, upper: the range in column units (exact ints, or doubles).
        steps: ``max(|lower|, |upper|) / resolution`` (exact, fixed-point steps).

    Returns:
        None when ``|lower|, |upper| ≤`` :data:`MAX_ABS_BOUND`, ``steps ≤`` :data:`MAX_STEPS`
        and, for an int column, ``|lower|, |upper| ≤`` :data:`MAX_INT`; else a short reason
        (``"more than 2^62 resolution steps"``, …) for a message.
    """
    magnitude = max(abs(lower), abs(upper))
    if ctype == "int" and magnitude > MAX_INT:
        return "beyond the 64-bit integers (2^63 − 1) its values are computed in"
    if magnitude > MAX_ABS_BOUND:
        return f"beyond {MAX_ABS_BOUND:g} in magnitude"
    if steps > MAX_STEPS:
        return "over more than 2^62 steps of its resolution"
    return None
