"""Policy files: load and validate ``policies/*.toml`` into frozen dataclasses.

One TOML file per dataset (see DESIGN.md, "Policy files")::

    [dataset]
    name = "usage"
    population = "product-users"
    data_version = "2026-11"            # optional

    [budget]
    epsilon = 4.0                       # the published cap (ε, δ) of the population
    delta = 1e-6
    default_query_rho = 0.001           # ρ (zCDP) of one query that names no budget
    mechanism = "gaussian"              # or "laplace"; default "gaussian"
    suppress_ci95_above = 1000.0        # optional
    clamp_counts = true                 # default true
    selection_delta = 5e-7              # part of δ reserved for private partition selection
                                        # (default δ/2 if a key column lacks public keys, else 0;
                                        # an explicit 0 turns selection off)
    default_selection_delta = 1e-9      # δ one selecting query spends (default selection_delta/100)
    composition = "renyi"               # or "gdp": the population's filter (Gaussian DP, fixed
                                        # before its first charge; no partition selection)

    [allocations]                       # shares of the cap's ρ, summing to ≤ 1
    dashboard = 0.6

    [tables.prompts]
    source = "sample_data/usage/prompts.parquet"   # CSV, Parquet, or "duckdb:<file>:<table>"
    privacy_unit = "user_id"            # omit the key for record-level privacy
    max_groups_per_unit = 1             # k
    max_rows_per_unit = 5               # m

    [tables.prompts.columns]
    region = { type = "text", public_keys = ["eu", "us"] }
    week   = { type = "int", public_keys = "range(0, 52)" }
    tokens = { type = "float", lower = 0, upper = 8000, resolution = 1 }
    prompt_id = { type = "int", unique = true }    # a key: no two rows share a value

Decisions (where the design is silent):

* **Record-level privacy** is declared by *omitting* ``privacy_unit``; then every
  row is its own privacy unit and k = m = 1 (setting either to anything but 1 is
  an error). ``privacy_unit = ""`` is refused, so that a typo cannot silently
  switch a table to record-level privacy.
* ``max_groups_per_unit`` and ``max_rows_per_unit`` default to 1 (the safest
  choice, as BigQuery's ``max_groups_contributed`` default) and must be integers
  ≥ 1 (at most 1,000,000).
* Numeric columns may declare a clamp ``[lower, upper]`` (both or neither,
  finite, lower ≤ upper, |bound| ≤ 1e100). Sums are computed exactly as
  fixed-point integers in units of ``resolution`` (1e-100 ≤ resolution ≤ 1e100):
  ``int`` columns default to resolution 1 (a positive integer is required);
  ``float`` columns default to the coarsest power of ten that is at most
  10**(floor(log10(max(|lower|, |upper|))) − 6) (about six significant digits of
  the largest bound) and divides both bounds (10**-6 when both bounds are 0).
* **The published bounds are the applied bounds**: both bounds must be exact
  multiples of the resolution (compared in decimal, as written in the file:
  ``upper = 1`` with ``resolution = 0.3`` is refused, naming 0.9 and 1.2), so the
  clamp the bounding rewrite applies, ``[lo·resolution, hi·resolution]``, is the
  declared one. ``int`` bounds are kept as exact integers.
* The clamp must lie within ±2**62 resolution steps, and one unit's contribution
  to a group's sum, m·max(|lower|, |upper|)/resolution, within 2**62 as well
  (see :mod:`dpgate.limits`: no admitted query can overflow on any data). VAR/STDDEV
  further need m·max(lower², upper²)/resolution² ≤ 2**62 (checked per query).
* ``public_keys`` is a non-empty list of values of the column's type without
  duplicates, or for ``int`` columns the string ``"range(a, b)"`` (a ≤ key < b,
  a < b, like Python's ``range``).
* Unknown keys anywhere are errors (a misspelt bound must not silently become a
  default).
* **A privacy unit through foreign keys** (issue 21; :class:`UnitPath`): a protected
  table without the unit column declares how its rows reach it::

      [tables.lineitem]
      privacy_unit = { path = ["l_orderkey -> orders.o_orderkey", "o_custkey"] }

  Each hop ``"<column> -> <table>.<key>"`` leaves the table the previous hop reached (the
  first leaves the declaring table); the last element is the privacy unit column of the
  last table reached, which must be a protected table carrying its unit as a column (spell
  the whole chain; chains of any length). Checked at load, one line per problem: every
  table and column named is declared, every ``<key>`` is declared ``unique = true`` on its
  column (a key that repeats would attribute one row to several units), a foreign key and
  its key are both int or both text, no table is visited twice (cycles are refused).
  ``unique = true`` is verified on the data by the engine at load. Such a table has
  ``privacy_unit`` None and is not record-level; the planner refuses queries that read it
  (``unsupported_query``, before any charge) until it joins along the path.

Every problem raises :class:`~dpgate.errors.PolicyError` whose message names the
file, the table and the column, and whose ``details`` carry them as fields.

The package, by concept (each name is importable from ``dpgate.policy`` as before):
:mod:`~dpgate.policy.fixed_point` (resolutions and fixed-point bounds),
:mod:`~dpgate.policy.fields` (reading TOML fields), :mod:`~dpgate.policy.columns`,
:mod:`~dpgate.policy.public_keys`, :mod:`~dpgate.policy.tables` (and privacy unit paths),
:mod:`~dpgate.policy.cohorts`, :mod:`~dpgate.policy.dataset` (budget, engine, proxy, the
dataset), :mod:`~dpgate.policy.load` (files and folders).
"""

from __future__ import annotations

from dpgate.errors import PolicyError
from dpgate.policy.cohorts import (
    COHORT_TYPES,
    MAX_COHORTS,
    CohortPolicy,
)
from dpgate.policy.columns import (
    COLUMN_TYPES,
    DUCKDB_TYPES,
    NUMERIC_TYPES,
    TEMPORAL_MAX,
    TEMPORAL_MIN,
    TEMPORAL_TYPES,
    ColumnPolicy,
    ColumnType,
    parse_temporal,
)
from dpgate.policy.dataset import (
    COMPOSITIONS,
    ENGINES,
    LOAD_MODES,
    MECHANISMS,
    TODO,
    BudgetPolicy,
    DatasetPolicy,
    draft_todos,
)
from dpgate.policy.fixed_point import (
    MAX_FIXED_POINT_STEPS,
    MAX_SQUARED_STEPS,
)
from dpgate.policy.load import (
    load_policies,
    load_policy,
    parse_policy,
)
from dpgate.policy.public_keys import (
    KeyTuples,
    key_blocks,
    key_domain,
)
from dpgate.policy.tables import (
    MAX_CONTRIBUTION,
    UNIT_PATH_KEY_TYPES,
    ForeignKeyHop,
    TablePolicy,
    UnitPath,
    quote_identifier,
)

__all__ = [
    "BudgetPolicy",
    "COHORT_TYPES",
    "COLUMN_TYPES",
    "COMPOSITIONS",
    "CohortPolicy",
    "ColumnPolicy",
    "ColumnType",
    "DUCKDB_TYPES",
    "DatasetPolicy",
    "ENGINES",
    "ForeignKeyHop",
    "KeyTuples",
    "LOAD_MODES",
    "MAX_COHORTS",
    "MAX_CONTRIBUTION",
    "MAX_FIXED_POINT_STEPS",
    "MAX_SQUARED_STEPS",
    "MECHANISMS",
    "NUMERIC_TYPES",
    "TEMPORAL_MAX",
    "TEMPORAL_MIN",
    "TEMPORAL_TYPES",
    "TODO",
    "TablePolicy",
    "UNIT_PATH_KEY_TYPES",
    "UnitPath",
    "draft_todos",
    "key_blocks",
    "key_domain",
    "load_policies",
    "load_policy",
    "parse_policy",
    "parse_temporal",
    "quote_identifier",
    "PolicyError",
]
