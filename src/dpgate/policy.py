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
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import math
import re
import tomllib
from dataclasses import dataclass, field
from decimal import Decimal
from fractions import Fraction
from functools import lru_cache
from pathlib import Path
from types import MappingProxyType
from typing import Any, Iterable, Literal, Mapping, get_args

from dpgate import limits
from dpgate.errors import PolicyError, UnknownColumn, UnknownTable
from dpgate.errors import policy_error as _policy_error
from dpgate.policy_checks import check_population_cohorts, check_proxies
from dpgate.selection_reserve import default_selection_deltas, population_selection_defaults, selection_key_columns

ColumnType = Literal["int", "float", "text", "bool", "date", "timestamp"]
#: The declared column types (one definition: the values of :data:`ColumnType`).
COLUMN_TYPES: tuple[str, ...] = get_args(ColumnType)
#: The column types that may carry bounds and a resolution (SUM/AVG/VAR).
NUMERIC_TYPES: tuple[str, ...] = ("int", "float")
#: The column types whose bounds are ISO date / timestamp strings (no SUM/AVG; date parts,
#: comparisons and computed keys such as ``date_trunc`` use the bounds).
TEMPORAL_TYPES: tuple[str, ...] = ("date", "timestamp")
#: DuckDB type the engine casts each declared column type to (with TRY_CAST).
DUCKDB_TYPES: Mapping[str, str] = MappingProxyType(
    {"int": "BIGINT", "float": "DOUBLE", "text": "VARCHAR", "bool": "BOOLEAN", "date": "DATE",
     "timestamp": "TIMESTAMP"}
)
#: The mechanisms a policy (``[budget] mechanism``) or a request may name, each mapped to the
#: OpenDP measurement it means (:mod:`dpgate.mechanisms`). The one definition of the list.
MECHANISMS: Mapping[str, str] = MappingProxyType(
    {"gaussian": "discrete_gaussian", "laplace": "discrete_laplace"}
)
#: Largest |bound| / resolution (:data:`dpgate.limits.MAX_STEPS`, 2**62).
MAX_FIXED_POINT_STEPS = limits.MAX_STEPS
#: Largest |bound| / resolution of a column whose sum of squares (VAR/STDDEV) is computed:
#: squares fit in a BIGINT (√(2**62) = 2**31).
MAX_SQUARED_STEPS = math.isqrt(limits.MAX_STEPS)
#: Largest k and m accepted.
MAX_CONTRIBUTION = 1_000_000
_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_RANGE_RE = re.compile(r"^\s*range\(\s*(-?\d+)\s*,\s*(-?\d+)\s*\)\s*$")


@dataclass(frozen=True)
class ColumnPolicy:
    """One declared column of a table.

    Attributes:
        name: column name as in the data (matched case-insensitively by the SQL parser,
            as DuckDB does).
        type: ``"int"`` | ``"float"`` | ``"text"`` | ``"bool"``.
        lower, upper: clamp bounds (in the column's units), or None when unbounded;
            both or neither; exact multiples of ``resolution`` (ints for int columns).
        resolution: fixed-point step of sums (column units), or None for text/bool
            columns. Defaults: 1 for int, ~6 significant digits of the largest bound
            for float (see the module docstring).
        public_keys: the released group keys in release order: a tuple of values of
            the column's type, or a :class:`range` when declared as ``"range(a, b)"``;
            None when the keys are not declared (a GROUP BY on the column then selects its keys
            privately, :mod:`dpgate.sql.partition_selection`).
        time_lower, time_upper: for ``date`` / ``timestamp`` columns, the declared range
            as :class:`datetime.date` / :class:`datetime.datetime` (naive, UTC), both or
            neither (``lower``/``upper`` stay None: a date is not summed).
        unique: ``unique = true``: the data owner declares that no two rows share a
            non-NULL value (a key). Required of every key a privacy unit path references
            (:class:`UnitPath`); verified on the data when an engine loads it (DuckDB and Spark
            count values against distinct values; PostgreSQL requires a UNIQUE or PRIMARY KEY
            index), the dataset refused otherwise.
    """

    name: str
    type: ColumnType
    lower: float | None = None
    upper: float | None = None
    resolution: float | None = None
    public_keys: tuple | range | None = None
    time_lower: _dt.date | None = None
    time_upper: _dt.date | None = None
    unique: bool = False

    @property
    def time_bounded(self) -> bool:
        """True for a date/timestamp column with a declared ``[lower, upper]``."""
        return self.time_lower is not None and self.time_upper is not None

    @property
    def bounded(self) -> bool:
        """True when the column has a clamp ``[lower, upper]`` (SUM/AVG/VAR allowed)."""
        return self.lower is not None and self.upper is not None

    @property
    def duckdb_type(self) -> str:
        """DuckDB type of the loaded column: BIGINT, DOUBLE, VARCHAR or BOOLEAN."""
        return DUCKDB_TYPES[self.type]

    @property
    def fixed_point_bounds(self) -> tuple[int, int]:
        """The clamp in integer units of ``resolution``: ``(lo, hi)`` with lo ≤ hi.

        ``lo = lower / resolution`` and ``hi = upper / resolution`` exactly: the loader
        refuses bounds that are not multiples of the resolution (compared in decimal, as
        written), so ``[lo·resolution, hi·resolution]`` is the published clamp. The
        bounding rewrite clamps every value to this range after rounding it to the
        nearest step, and the sensitivity is derived from it.

        Raises:
            ValueError: the column has no bounds.
        """
        if not self.bounded or self.resolution is None:
            raise ValueError(f"column {self.name!r} has no bounds")
        return _fixed_point_bounds(self.lower, self.upper, self.resolution)

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable form (public keys as a list, or ``"range(a, b)"``; ``unique`` only
        when declared, so that the policy digests of plans over other columns do not change)."""
        keys: Any = None
        if isinstance(self.public_keys, range):
            keys = f"range({self.public_keys.start}, {self.public_keys.stop})"
        elif self.public_keys is not None:
            keys = list(self.public_keys)
        out = {
            "name": self.name,
            "type": self.type,
            "lower": self.time_lower.isoformat() if self.time_lower is not None else self.lower,
            "upper": self.time_upper.isoformat() if self.time_upper is not None else self.upper,
            "resolution": self.resolution,
            "public_keys": keys,
        }
        if self.unique:
            out["unique"] = True
        return out


@dataclass(frozen=True, eq=False)
class KeyTuples:
    """The distinct rows of the key columns of one public table, as they occur together there.

    A public table holds nothing to protect, so which combinations of its columns' values exist
    is public. Group keys taken from several columns of one public table release those
    combinations — never the product of the columns' key lists, whose other pairs no row of the
    table (hence no joined row) can have (issue 19 item 5). Read from the data source by the
    gateway (:meth:`dpgate.service.Gateway._with_public_table_keys`) and carried by the public
    table, and by a joined table for each occurrence of it (column names renamed).

    Attributes:
        columns: the key columns (names in the table that carries this).
        rows: one tuple per distinct row of those columns in the public table (NULLs kept), or
            None when the table has more distinct rows than the gateway reads (grouping by
            several of these columns is then refused).
    """

    columns: tuple[str, ...]
    rows: tuple[tuple, ...] | None
    _projected: dict = field(default_factory=dict, repr=False, compare=False)

    def renamed(self, names: Mapping[str, str]) -> "KeyTuples":
        """The same rows under other column names (``names``: old → new)."""
        return KeyTuples(tuple(names[c] for c in self.columns), self.rows)

    def project(self, columns: "tuple[ColumnPolicy, ...]") -> tuple[tuple, ...]:
        """The distinct combinations of ``columns`` (some of :attr:`columns`, each with public
        keys) in the rows: a row with a NULL or a value outside a column's public keys is left
        out (no joined row can have it as a key: the bounding drops such rows). In public-key
        order, the first column slowest: the order in which the product of the keys lists them.

        Raises:
            UnsupportedQuery: the rows are unknown (more than the gateway reads).
        """
        from dpgate.errors import UnsupportedQuery

        key = tuple(c.name for c in columns)
        cache_key = tuple((c.name, c.public_keys) for c in columns)  # narrowed keys project differently
        if cache_key in self._projected:
            return self._projected[cache_key]
        if self.rows is None:
            raise UnsupportedQuery(
                f"the group keys {', '.join(key)} come from one public table with more distinct rows "
                "than the gateway reads to enumerate their combinations: group by fewer of its columns",
                {"columns": list(key)})
        positions = [self.columns.index(n) for n in key]
        ordinals = []
        for c in columns:
            keys = c.public_keys
            if isinstance(keys, range):
                ordinals.append(lambda v, r=keys: v - r.start if isinstance(v, int) and not isinstance(v, bool)
                                and v in r else None)
            else:
                index = {(type(v), v): i for i, v in enumerate(keys) if v is not None}
                ordinals.append(lambda v, ix=index: ix.get((type(v), v)))
        found: dict[tuple, tuple] = {}
        for row in self.rows:
            values = tuple(row[i] for i in positions)
            order = tuple(f(v) for f, v in zip(ordinals, values))
            if None not in order:
                found[order] = values
        out = tuple(found[o] for o in sorted(found))
        self._projected[cache_key] = out
        return out


def key_blocks(table: "TablePolicy", names: Iterable[str]) -> list[tuple[int, ...]]:
    """The positions of group keys ``names`` enumerated together, in order of first position.

    Two or more of ``names`` that are columns of one :class:`KeyTuples` of ``table`` form one
    block (their combinations are the public table's tuples); every other name is a block of
    its own (its public keys, or a computed key's domain).
    """
    names = list(names)
    blocks: list[list[int]] = []
    owner: dict[int, int] = {}
    for kt in table.key_tuples:
        members = [i for i, n in enumerate(names) if n in kt.columns]
        if len(members) > 1:
            for i in members:
                owner[i] = len(blocks)
            blocks.append(members)
    out: list[tuple[int, ...]] = []
    done: set[int] = set()
    for i in range(len(names)):
        if i in owner:
            if owner[i] not in done:
                done.add(owner[i])
                out.append(tuple(blocks[owner[i]]))
        else:
            out.append((i,))
    return out


def key_domain(table: "TablePolicy", names: Iterable[str], columns: Iterable["ColumnPolicy"]
               ) -> list[tuple[tuple[int, ...], Any]]:
    """The released key combinations of group keys ``names`` (their columns ``columns``, each
    with public keys), one ``(positions, values)`` per block of :func:`key_blocks`: a block of
    one key lists its public keys (a tuple or a range); a block of several columns of one
    public table lists their tuples (:meth:`KeyTuples.project`). The released rows are the
    product of the blocks, in order, the first slowest.

    Raises:
        ValueError: a key has no public keys. UnsupportedQuery: see :meth:`KeyTuples.project`.
    """
    names, columns = list(names), list(columns)
    for n, c in zip(names, columns):
        if c.public_keys is None:
            raise ValueError(f"group key {n!r} has no public keys")
    out = []
    for block in key_blocks(table, names):
        if len(block) == 1:
            out.append((block, columns[block[0]].public_keys))
            continue
        kt = next(k for k in table.key_tuples if names[block[0]] in k.columns)
        out.append((block, kt.project(tuple(columns[i] for i in block))))
    return out


#: Column types a foreign key of a privacy unit path may have (exact ids; no float, bool or date keys).
UNIT_PATH_KEY_TYPES: tuple[str, ...] = ("int", "text")
_HOP_RE = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*->\s*([A-Za-z_][A-Za-z0-9_]*)\s*\.\s*([A-Za-z_][A-Za-z0-9_]*)\s*$")


@dataclass(frozen=True)
class ForeignKeyHop:
    """One step of a privacy unit path: from ``column`` of the table the step leaves, to the one
    row of ``table`` whose ``key`` equals it (written ``"column -> table.key"``).

    ``key`` is declared ``unique = true`` in ``table`` (checked when the policy loads, verified on
    the data when it loads): each row then reaches at most one row, hence one unit. A NULL (or
    dangling) ``column`` reaches no row: such a row has no unit and is dropped, as a row whose
    unit column is NULL.
    """

    column: str
    table: str
    key: str

    def __str__(self) -> str:
        return f"{self.column} -> {self.table}.{self.key}"


@dataclass(frozen=True)
class UnitPath:
    """A privacy unit reached through foreign keys (issue 21; DESIGN.md "Policy additions").

    Declared as ``privacy_unit = { path = ["l_orderkey -> orders.o_orderkey", "o_custkey"] }``:
    one or more hops ``"<column> -> <table>.<unique key>"``, each leaving the table the previous
    hop reached (the first leaves the declaring table), then the privacy unit column of the last
    table reached. That table must carry its unit as a column (the path is spelt to the end, so
    every chain is explicit); a path never visits a table twice (cycles are refused).

    Attributes:
        hops: the steps, in order (at least one).
        unit: the privacy unit column of the last table reached (its ``privacy_unit``).
    """

    hops: tuple[ForeignKeyHop, ...]
    unit: str

    @property
    def unit_table(self) -> str:
        """The table whose unit column the path ends at."""
        return self.hops[-1].table

    @property
    def tables(self) -> tuple[str, ...]:
        """The tables the hops reach, in order."""
        return tuple(h.table for h in self.hops)

    def to_list(self) -> list[str]:
        """The policy file's spelling: ``["l_orderkey -> orders.o_orderkey", "o_custkey"]``."""
        return [str(h) for h in self.hops] + [self.unit]

    def __str__(self) -> str:
        """``l_orderkey -> orders.o_orderkey -> o_custkey``."""
        return " -> ".join(self.to_list())


@dataclass(frozen=True)
class TablePolicy:
    """One declared table: where its rows come from and how each unit's contribution is bounded.

    Attributes:
        name: table name used in SQL (``FROM name``).
        dataset: the dataset (policy) it belongs to.
        source: absolute path of a CSV/Parquet file, or ``duckdb:<abs file>:<table>``.
        privacy_unit: column identifying the privacy unit, or None for record-level
            privacy (each row is its own unit; k = m = 1), for a public table, and for a
            table whose unit is reached through foreign keys (``unit_path``).
        max_groups_per_unit: k, the most GROUP BY groups one unit may affect.
        max_rows_per_unit: m, the most rows one unit may add to one group.
        columns: declared columns by name (read-only mapping, declaration order).
        path: the policy file (for error messages).
        public: True for a public table (``public = true``: no privacy unit, nothing to
            protect): its values and keys may be read as they are (grouped by any
            column, joined, answered exactly and for free when a query reads public
            tables only). A public table is *data*, read from the policy's data
            source like any other; declaring it public is the data owner's statement
            that releasing it exactly harms no one (a catalogue, a calendar, a list of
            regions) — the gateway never makes that judgement from the data.
        key_tuples: the combinations of key columns that occur together in a public table
            (:class:`KeyTuples`): on a public table read by the gateway, one over its key
            columns; on a joined table, one per public table joined. Empty in a policy as loaded.
        unit_path: the privacy unit through foreign keys (:class:`UnitPath`, issue 21), or None.
            Such a table is protected like any other (k, m, bounds) but has no unit column of
            its own (``privacy_unit`` is None and ``record_level`` False); the planner refuses
            queries reading it, before any charge, until it joins along the path.
    """

    name: str
    dataset: str
    source: str
    privacy_unit: str | None
    max_groups_per_unit: int
    max_rows_per_unit: int
    columns: Mapping[str, ColumnPolicy]
    path: Path | None = field(default=None, compare=False)
    public: bool = False
    key_tuples: tuple[KeyTuples, ...] = field(default=(), compare=False, repr=False)
    unit_path: UnitPath | None = None

    @property
    def record_level(self) -> bool:
        """True when every row is its own privacy unit: no ``privacy_unit`` column and no
        ``unit_path`` (also True of a public table, which has neither; see :attr:`public`)."""
        return self.privacy_unit is None and self.unit_path is None

    @property
    def relation(self) -> str:
        """Quoted DuckDB name of the loaded table: ``"<dataset>"."<table>"``."""
        return f"{quote_identifier(self.dataset)}.{quote_identifier(self.name)}"

    def column(self, name: str) -> ColumnPolicy:
        """The declared column ``name`` (exact, else case-insensitive match).

        Raises:
            UnknownColumn: the table declares no such column.
        """
        col = self.find_column(name)
        if col is None:
            raise UnknownColumn(
                f"table {self.name!r} of dataset {self.dataset!r} declares no column {name!r}",
                {"dataset": self.dataset, "table": self.name, "column": name},
            )
        return col

    def find_column(self, name: str) -> ColumnPolicy | None:
        """The declared column ``name`` (exact, else case-insensitive match), or None."""
        if name in self.columns:
            return self.columns[name]
        folded = name.casefold()
        for col in self.columns.values():
            if col.name.casefold() == folded:
                return col
        return None

    def key_combinations(self, columns: Iterable[str]) -> int:
        """Number of public-key combinations of ``columns`` (1 for none): the groups released
        (several columns of one public table count their tuples, :func:`key_domain`).

        Raises:
            UnknownColumn: a column is not declared.
            ValueError: a column has no public keys.
        """
        names = list(columns)
        return math.prod(len(values) for _, values in key_domain(self, names, [self.column(n) for n in names]))

    def check_data_columns(self, available: Iterable[str]) -> None:
        """Check that the unit column and every declared column exist in the loaded data.

        For the engine, at load time. Matching is case-insensitive (DuckDB identifiers).

        Args:
            available: column names of the source as read.

        Raises:
            PolicyError: naming the file, table and the first missing column.
        """
        present = {str(n).casefold() for n in available}
        needed = ([self.privacy_unit] if self.privacy_unit else []) + list(self.columns)
        for name in needed:
            if name.casefold() not in present:
                what = "privacy unit column" if name == self.privacy_unit else "declared column"
                raise _policy_error(
                    self.path, f"{what} is missing from the data source", self.name, name
                )

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable form (without the source path): unit, bounds, columns.

        ``public`` is True for a public table, which has no privacy unit and no
        contribution bounds: ``privacy_unit``, ``max_groups_per_unit`` and
        ``max_rows_per_unit`` are None and ``record_level`` is False (its rows are not
        protected at all; queries reading public tables only are exact and free). A table
        whose unit is reached through foreign keys has ``privacy_unit`` None, ``record_level``
        False and ``unit_path`` (:meth:`UnitPath.to_list`); the key is absent otherwise.
        """
        out = {
            "name": self.name,
            "privacy_unit": self.privacy_unit,
            "record_level": self.record_level and not self.public,
            "public": self.public,
            "max_groups_per_unit": None if self.public else self.max_groups_per_unit,
            "max_rows_per_unit": None if self.public else self.max_rows_per_unit,
            "columns": {n: c.to_dict() for n, c in self.columns.items()},
        }
        if self.unit_path is not None:  # only then: existing descriptions stay as they were
            out["unit_path"] = self.unit_path.to_list()
        return out


@dataclass(frozen=True)
class BudgetPolicy:
    """The published guarantee of a dataset's population and the per-query defaults.

    Attributes:
        epsilon: ε of the population's total cap (ε, δ).
        delta: δ of the cap, in [0, 1).
        default_query_rho: ρ (zCDP, per query) spent by a query that names no budget.
        mechanism: a key of :data:`MECHANISMS`: ``"gaussian"`` (discrete Gaussian,
            default) or ``"laplace"`` (discrete Laplace).
        suppress_ci95_above: cells whose 95 % noise half-width exceeds it are
            suppressed (None: never).
        clamp_counts: clamp noisy counts at 0 (post-processing; default True).
        selection_delta: the part of δ reserved for private partition selection (issue 11;
            DESIGN.md "Accounting"): ρ_cap is fixed at δ − selection_delta and the δ_q of
            selecting queries add up to at most it. Default (issue 22, "no idle δ
            reserve"): δ/2 when a protected table of the population's datasets has a key
            column without public keys (:func:`selection_key_columns`: partition selection
            may be needed), else 0 (no query can select, so all of δ goes to ρ_cap); a
            value stated in the file always wins, and a stated 0 turns partition selection
            off. Built directly (no tables known) the default is δ/2. A population that
            exists keeps its ledger cap until ``dpgate caps apply`` adopts the file's.
        default_selection_delta: δ_q one selecting query spends unless the request names
            ``budget.delta``; default selection_delta/100; ≤ selection_delta.
        selection_delta_stated: True when the file states ``selection_delta`` (or
            ``default_selection_delta``), False when it is the default above.
    """

    epsilon: float
    delta: float
    default_query_rho: float
    mechanism: str = "gaussian"
    suppress_ci95_above: float | None = None
    clamp_counts: bool = True
    selection_delta: float | None = None
    default_selection_delta: float | None = None
    selection_delta_stated: bool = field(default=True, compare=False)

    def __post_init__(self) -> None:
        # defaults that depend on δ (issue 11): selection_delta = δ/2, default δ_q = selection_delta/100
        if self.selection_delta is None:
            object.__setattr__(self, "selection_delta", self.delta / 2)
        if self.default_selection_delta is None:
            object.__setattr__(self, "default_selection_delta", self.selection_delta / 100)


@dataclass(frozen=True)
class DatasetPolicy:
    """One policy file: a dataset, its population and cap, and its tables.

    Attributes:
        name: dataset name (used in the API and as the DuckDB schema).
        population: ledger key: the set of people the budget protects.
        data_version: declared data version, or None (the engine fingerprints the sources).
        budget: cap and defaults.
        allocations: read-only mapping consumer → share of the cap's ρ (sum ≤ 1).
        tables: read-only mapping table name → :class:`TablePolicy`.
        path: the policy file.
        engine: where the tables live and the bounded query runs: ``"duckdb"``
            (default; files), ``"postgres"`` or ``"spark"`` (DESIGN.md, "Engines").
        connection: PostgreSQL connection string (``postgres`` only; may instead come
            from ``DPGATE_CONNECTION_<DATASET>``); never published.
        version_sql: a query on the live source whose result identifies the data
            version (published only as a keyed hash); live engines only.
        load: DuckDB load mode ``"memory"``, ``"in_place"`` or ``"auto"`` (None: the
            setting ``DPGATE_DUCKDB_LOAD``).
        cohorts: the population's cohorts (``[population] cohort_column``, issue 23): one
            budget per cohort; None: one budget for the whole population, never renewed.
        proxy: the dataset answering refused queries exactly and for free (``[dataset] proxy``),
            or None.
        provenance: for a proxy dataset, ``"public"`` or ``"synthetic: how it was made"``; None
            for a dataset that is not a proxy.
        proxy_default_for: consumers whose queries refused for budget fall back to the proxy
            unless the request says otherwise (``[dataset] proxy_default_for``, e.g. dashboards).
    """

    name: str
    population: str
    data_version: str | None
    budget: BudgetPolicy
    allocations: Mapping[str, float]
    tables: Mapping[str, TablePolicy]
    path: Path | None = field(default=None, compare=False)
    engine: str = "duckdb"
    connection: str | None = field(default=None, compare=False, repr=False)
    version_sql: str | None = None
    load: str | None = None
    cohorts: "CohortPolicy | None" = None
    proxy: str | None = None
    provenance: str | None = None
    proxy_default_for: tuple[str, ...] = ()

    def table(self, name: str) -> TablePolicy:
        """The declared table ``name`` (exact, else case-insensitive match).

        Raises:
            UnknownTable: the dataset declares no such table.
        """
        if name in self.tables:
            return self.tables[name]
        folded = name.casefold()
        for t in self.tables.values():
            if t.name.casefold() == folded:
                return t
        raise UnknownTable(
            f"dataset {self.name!r} declares no table {name!r}",
            {"dataset": self.name, "table": name, "tables": sorted(self.tables)},
        )


# --- loading ---------------------------------------------------------------------------


def load_policies(folder: Path) -> dict[str, DatasetPolicy]:
    """Load every ``*.toml`` file of ``folder`` (sorted by file name).

    Args:
        folder: the policies folder. Relative table sources resolve against its
            parent folder (the project root).

    Returns:
        dataset name → policy.

    Raises:
        PolicyError: the folder does not exist, a file is invalid, two files
            declare the same dataset name, or two datasets of one population
            publish different caps (ε, δ) or allocations (the budget follows
            people: one population has one cap).
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise PolicyError(
            f"policies folder {str(folder)!r} does not exist", {"file": str(folder)}
        )
    loaded: dict[str, DatasetPolicy] = {}
    for path in sorted(folder.glob("*.toml")):
        policy = load_policy(path)
        if policy.name in loaded:
            raise _policy_error(
                path, f"dataset {policy.name!r} is also declared in {loaded[policy.name].path}"
            )
        loaded[policy.name] = policy
    out: dict[str, DatasetPolicy] = {}
    for policy in population_selection_defaults(loaded).values():
        path = policy.path
        for other in out.values():
            if other.population == policy.population and (
                (other.budget.epsilon, other.budget.delta, other.budget.selection_delta)
                != (policy.budget.epsilon, policy.budget.delta, policy.budget.selection_delta)
                or dict(other.allocations) != dict(policy.allocations)
            ):
                raise _policy_error(
                    path,
                    f"population {policy.population!r} is also used by {other.path} with a different"
                    " cap or allocations; datasets of one population must publish the same cap",
                )
        out[policy.name] = policy
    check_proxies(out)  # issue 23: a proxy has the same schema and a provenance
    check_population_cohorts(out)
    return out


def load_policy(path: Path) -> DatasetPolicy:
    """Load and validate one policy file.

    Args:
        path: a TOML file. Relative table sources resolve against the parent folder
            of the file's folder (``policies/../``, the project root).

    Raises:
        PolicyError: unreadable file, TOML syntax error, or any invalid field; the
            message names the file, table, column and problem.
    """
    path = Path(path)
    try:
        with path.open("rb") as fh:
            raw = tomllib.load(fh)
    except OSError as exc:
        raise _policy_error(path, f"cannot read the file ({exc.strerror})") from None
    except tomllib.TOMLDecodeError as exc:
        raise _policy_error(path, f"TOML syntax error: {exc}") from None
    return _parse_policy(raw, path)


def parse_policy(raw: Mapping[str, Any], path: Path) -> DatasetPolicy:
    """Validate an already-parsed TOML document (as from ``tomllib.loads``).

    Args:
        raw: the document.
        path: the file it stands for (error messages; relative sources resolve
            against ``path.parent.parent``).

    Raises:
        PolicyError: as :func:`load_policy`.
    """
    return _parse_policy(raw, Path(path))


def quote_identifier(name: str) -> str:
    """Quote a DuckDB identifier: ``"name"`` with embedded quotes doubled."""
    return '"' + name.replace('"', '""') + '"'


# --- validation helpers ----------------------------------------------------------------


def _check_keys(
    obj: Mapping[str, Any], allowed: set[str], path: Path, section: str,
    table: str | None = None, column: str | None = None,
) -> None:
    unknown = sorted(set(obj) - allowed)
    if unknown:
        raise _policy_error(
            path,
            f"unknown key(s) {', '.join(map(repr, unknown))} in {section} "
            f"(allowed: {', '.join(sorted(allowed))})",
            table,
            column,
        )


def _section(raw: Mapping[str, Any], key: str, path: Path, required: bool = True) -> dict:
    value = raw.get(key)
    if value is None:
        if required:
            raise _policy_error(path, f"missing [{key}] section")
        return {}
    if not isinstance(value, dict):
        raise _policy_error(path, f"[{key}] must be a table")
    return value


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _finite_number(v: Any, what: str, path: Path, table=None, column=None) -> float:
    if not _is_number(v):
        raise _policy_error(path, f"{what} must be a number, not {type(v).__name__}", table, column)
    try:
        value = float(v)
    except OverflowError:  # an int beyond the double range
        value = math.inf
    if not math.isfinite(value):
        raise _policy_error(path, f"{what} must be finite (got {_show(v)})", table, column)
    return value


def _bound(v: Any, what: str, ctype: str, path: Path, table: str, column: str) -> float | int:
    """A clamp bound: finite, |v| ≤ :data:`dpgate.limits.MAX_ABS_BOUND`, exact.

    Stored as a float, except an int column's bound beyond ±2**53 (not exactly a double),
    which stays an exact int so that the published bound is the one written.
    """
    value = _finite_number(v, what, path, table, column)
    if abs(value) > limits.MAX_ABS_BOUND:
        raise _policy_error(
            path,
            f"{what} = {_show(v)} is too large: bounds must be at most {limits.MAX_ABS_BOUND:g} in "
            "magnitude, so that sums, averages and variances of the clamped values (and their "
            "noise) are finite doubles for any data",
            table, column,
        )
    if ctype == "int" and isinstance(v, int) and abs(v) > 2**53:
        return v
    return value


def _name(v: Any, what: str, path: Path, table=None, strict: bool = True) -> str:
    if not isinstance(v, str) or not v:
        raise _policy_error(path, f"{what} must be a non-empty string", table)
    if strict and not _NAME_RE.match(v):
        raise _policy_error(
            path, f"{what} {v!r} must be a plain identifier (letters, digits, underscore)", table
        )
    if "\x00" in v:
        raise _policy_error(path, f"{what} must not contain NUL characters", table)
    return v


def _exact(v: int | float) -> Fraction:
    """The number as written in the file: an int exactly, a float as its shortest decimal repr.

    TOML floats are decimal texts; ``repr`` gives back the shortest decimal that reads as
    the same double (``0.3``, not 0.299999999999999988897…), i.e. what the user wrote.
    """
    return Fraction(v) if isinstance(v, int) else Fraction(repr(float(v)))


@lru_cache(maxsize=4096)
def _fixed_point_bounds(lower: float, upper: float, resolution: float) -> tuple[int, int]:
    res = _exact(resolution)
    lo, hi = _exact(lower) / res, _exact(upper) / res
    if lo.denominator != 1 or hi.denominator != 1:  # pragma: no cover - refused at load
        raise ValueError("bounds are not multiples of the resolution")
    return int(lo), int(hi)


def _decimal_exponent(v: int | float) -> float:
    """Exponent of the last non-zero decimal digit of ``v`` as written (+inf for 0)."""
    if v == 0:
        return math.inf
    d = Decimal(v) if isinstance(v, int) else Decimal(repr(float(v)))
    return d.normalize().as_tuple().exponent


def _power_of_ten(e: int) -> float:
    return float(f"1e{e}")


def _default_float_resolution(lower: float, upper: float) -> float:
    """The coarsest power of ten ≤ 10**(floor(log10(max |bound|)) − 6) dividing both bounds."""
    big = max(abs(lower), abs(upper))
    if big == 0:
        return 1e-6
    top = Decimal(repr(float(big))).adjusted() - 6  # floor(log10(big)) − 6, exactly
    return _power_of_ten(int(min(top, _decimal_exponent(lower), _decimal_exponent(upper))))


def _show(v: int | float | Fraction) -> str:
    """A bound or resolution as a user would write it (``1``, ``0.9``, ``1e+100``)."""
    if isinstance(v, Fraction):
        v = int(v) if v.denominator == 1 else float(v)
    if isinstance(v, float) and v.is_integer() and abs(v) < 1e16:
        v = int(v)
    return str(v) if isinstance(v, int) else repr(v)


def _not_a_multiple(name: str, bound: int | float, lower: float, upper: float,
                    resolution: float, ctype: str) -> str:
    q = _exact(bound) / _exact(resolution)
    below, above = (math.floor(q) * _exact(resolution), math.ceil(q) * _exact(resolution))
    text = (
        f"{name} = {_show(bound)} is not a multiple of the resolution {_show(resolution)}, so "
        f"the clamp applied would differ from the published one: use {name} = {_show(below)} "
        f"or {_show(above)}"
    )
    finest = min(Decimal(repr(float(resolution))).adjusted(), _decimal_exponent(lower),
                 _decimal_exponent(upper))
    if ctype == "int" and finest < 0:  # an int column's bounds are whole numbers
        return text + " (an int column's bounds are whole numbers)"
    return text + (", or a resolution that divides both bounds, such as "
                   f"{_show(_power_of_ten(int(finest)))}")


def _parse_public_keys(v: Any, ctype: str, path: Path, table: str, column: str) -> tuple | range:
    if isinstance(v, str):
        m = _RANGE_RE.match(v)
        if not m:
            raise _policy_error(
                path, f'public_keys string must be "range(a, b)", not {v!r}', table, column
            )
        if ctype != "int":
            raise _policy_error(
                path, f"public_keys as a range need an int column (column type is {ctype})",
                table, column,
            )
        a, b = int(m.group(1)), int(m.group(2))
        if a >= b:
            raise _policy_error(path, f"public_keys range({a}, {b}) is empty", table, column)
        if b - a > 10_000_000:
            raise _policy_error(
                path, f"public_keys range({a}, {b}) has more than 10,000,000 keys", table, column
            )
        if max(abs(a), abs(b)) >= 2**63:
            raise _policy_error(path, "public_keys range exceeds the 64-bit range", table, column)
        return range(a, b)
    if not isinstance(v, list):
        raise _policy_error(
            path, 'public_keys must be a list or the string "range(a, b)"', table, column
        )
    if not v:
        raise _policy_error(path, "public_keys must not be empty", table, column)
    keys = []
    for i, key in enumerate(v):
        ok = {
            "int": isinstance(key, int) and not isinstance(key, bool) and abs(key) < 2**63,
            "float": _is_number(key) and math.isfinite(key),
            "text": isinstance(key, str) and "\x00" not in key,
            "bool": isinstance(key, bool),
        }[ctype]
        if not ok:
            raise _policy_error(
                path,
                f"public key #{i + 1} ({type(key).__name__}) is not a valid {ctype} value",
                table,
                column,
            )
        keys.append(float(key) if ctype == "float" else key)
    seen: set = set()
    for key in keys:
        if key in seen:
            raise _policy_error(path, f"duplicate public key {key!r}", table, column)
        seen.add(key)
    return tuple(keys)


_COLUMN_KEYS = {"type", "lower", "upper", "resolution", "public_keys", "unique"}


def _parse_column(name: str, raw: Any, path: Path, table: str) -> ColumnPolicy:
    if "\x00" in name or not name:
        raise _policy_error(path, "column names must be non-empty without NUL", table, name)
    if isinstance(raw, str):  # shorthand: region = "text"
        raw = {"type": raw}
    if not isinstance(raw, dict):
        raise _policy_error(path, "a column must be a table like { type = \"int\" }", table, name)
    _check_keys(raw, _COLUMN_KEYS, path, "the column", table, name)
    unique = raw.get("unique", False)
    if not isinstance(unique, bool):
        raise _policy_error(path, f"unique must be true or false (got {unique!r})", table, name)
    col = _parse_column_fields(name, raw, path, table)
    return dataclasses.replace(col, unique=True) if unique else col


def _parse_column_fields(name: str, raw: Mapping[str, Any], path: Path, table: str) -> ColumnPolicy:
    ctype = raw.get("type")
    if ctype not in COLUMN_TYPES:
        raise _policy_error(
            path, f"unknown type {ctype!r} (expected one of {', '.join(COLUMN_TYPES)})", table, name
        )
    lower, upper, resolution = raw.get("lower"), raw.get("upper"), raw.get("resolution")
    if ctype in TEMPORAL_TYPES:
        return _parse_temporal_column(name, ctype, raw, path, table)
    if ctype not in NUMERIC_TYPES:
        for key in ("lower", "upper", "resolution"):
            if raw.get(key) is not None:
                raise _policy_error(path, f"{key} is not allowed on a {ctype} column", table, name)
    if (lower is None) != (upper is None):
        raise _policy_error(path, "lower and upper must be given together", table, name)
    if lower is not None:
        lower = _bound(lower, "lower", ctype, path, table, name)
        upper = _bound(upper, "upper", ctype, path, table, name)
        if lower > upper:
            raise _policy_error(path, f"lower ({_show(lower)}) > upper ({_show(upper)})", table, name)
    if ctype in NUMERIC_TYPES:
        if resolution is None:
            if ctype == "int":
                resolution = 1.0
            elif lower is not None:
                resolution = _default_float_resolution(lower, upper)
        else:
            resolution = _finite_number(resolution, "resolution", path, table, name)
            if resolution <= 0:
                raise _policy_error(path, f"resolution must be > 0 (got {resolution:g})", table, name)
            if ctype == "int" and resolution != int(resolution):
                raise _policy_error(
                    path, f"resolution of an int column must be a whole number (got {resolution:g})",
                    table, name,
                )
        if resolution is not None and not limits.MIN_RESOLUTION <= resolution <= limits.MAX_RESOLUTION:
            given = raw.get("resolution") is not None
            raise _policy_error(
                path,
                f"resolution must be between {limits.MIN_RESOLUTION:g} and "
                f"{limits.MAX_RESOLUTION:g} (got {resolution:g}"
                + ("" if given else ", the default for these bounds") + "), so that released "
                "values and their noise are finite doubles"
                + ("" if given else "; round the bounds to fewer decimals"),
                table, name,
            )
        if lower is not None:
            for key, bound in (("lower", lower), ("upper", upper)):
                if (_exact(bound) / _exact(resolution)).denominator != 1:
                    raise _policy_error(
                        path, _not_a_multiple(key, bound, lower, upper, resolution, ctype), table, name
                    )
            lo, hi = _fixed_point_bounds(lower, upper, resolution)
            steps = max(abs(lo), abs(hi))
            if steps > MAX_FIXED_POINT_STEPS:
                raise _policy_error(
                    path,
                    f"bad resolution: the bounds span {steps:.3g} steps of {_show(resolution)} "
                    f"(at most 2**62); choose a coarser resolution that divides both bounds"
                    + ("" if raw.get("resolution") is not None else
                       " (the default is the coarsest power of ten ≤ 10**(floor(log10(max "
                       "|bound|)) − 6) that divides both bounds; round the bounds or give one)"),
                    table,
                    name,
                )
    keys = None
    if raw.get("public_keys") is not None:
        keys = _parse_public_keys(raw["public_keys"], ctype, path, table, name)
    return ColumnPolicy(
        name=name,
        type=ctype,
        lower=lower,
        upper=upper,
        resolution=resolution,
        public_keys=keys,
    )


#: Widest declared range of a date/timestamp column (DuckDB's DATE and TIMESTAMP hold it).
TEMPORAL_MIN = _dt.datetime(1, 1, 1)
TEMPORAL_MAX = _dt.datetime(9999, 12, 31, 23, 59, 59)


def parse_temporal(text: Any, ctype: str) -> _dt.date:
    """An ISO ``YYYY-MM-DD`` (date) or ``YYYY-MM-DD[ HH:MM[:SS[.ffffff]]]`` (timestamp) value.

    A TOML date / datetime value is accepted as well. Timestamps are naive (UTC); an offset
    is refused (the engine stores no time zone).

    Raises:
        ValueError: not such a value (message says what is expected).
    """
    if isinstance(text, _dt.datetime):
        value: _dt.date = text
    elif isinstance(text, _dt.date):
        value = text
    elif isinstance(text, str):
        try:
            value = (_dt.date.fromisoformat(text.strip()) if ctype == "date"
                     else _dt.datetime.fromisoformat(text.strip()))
        except ValueError:
            raise ValueError(f"{text!r} is not an ISO {ctype} "
                             + ("(YYYY-MM-DD)" if ctype == "date" else "(YYYY-MM-DD HH:MM:SS)")) from None
    else:
        raise ValueError(f"expected an ISO {ctype} string, not {type(text).__name__}")
    if ctype == "date":
        if isinstance(value, _dt.datetime):
            if value.time() != _dt.time(0):
                raise ValueError(f"{text!r} has a time of day; a date column's bounds are dates")
            value = value.date()
    else:
        if not isinstance(value, _dt.datetime):
            value = _dt.datetime(value.year, value.month, value.day)
        if value.tzinfo is not None:
            raise ValueError(f"{text!r} has a time zone; timestamps are naive (UTC)")
    return value


def _parse_temporal_column(name: str, ctype: str, raw: Mapping, path: Path, table: str) -> ColumnPolicy:
    if raw.get("resolution") is not None:
        raise _policy_error(path, f"resolution is not allowed on a {ctype} column", table, name)
    if raw.get("public_keys") is not None:
        raise _policy_error(
            path, f"public_keys are not supported on a {ctype} column; group by "
            "date_trunc(...) or EXTRACT(...) of it (the domain follows from lower/upper)",
            table, name,
        )
    lower, upper = raw.get("lower"), raw.get("upper")
    if (lower is None) != (upper is None):
        raise _policy_error(path, "lower and upper must be given together", table, name)
    if lower is None:
        return ColumnPolicy(name=name, type=ctype)  # type: ignore[arg-type]
    try:
        lo, hi = parse_temporal(lower, ctype), parse_temporal(upper, ctype)
    except ValueError as e:
        raise _policy_error(path, f"bad bound: {e}", table, name) from None
    if lo > hi:
        raise _policy_error(path, f"lower ({lo.isoformat()}) > upper ({hi.isoformat()})", table, name)
    return ColumnPolicy(name=name, type=ctype, time_lower=lo, time_upper=hi)  # type: ignore[arg-type]


_TABLE_KEYS = {"source", "privacy_unit", "max_groups_per_unit", "max_rows_per_unit", "columns", "public"}


def _bound_int(raw: Mapping, key: str, path: Path, table: str) -> int | None:
    v = raw.get(key)
    if v is None:
        return None
    if not isinstance(v, int) or isinstance(v, bool):
        raise _policy_error(path, f"{key} must be an integer (got {v!r})", table)
    if v < 1:
        raise _policy_error(path, f"{key} must be ≥ 1 (got {v})", table)
    if v > MAX_CONTRIBUTION:
        raise _policy_error(path, f"{key} must be ≤ {MAX_CONTRIBUTION} (got {v})", table)
    return v


_RELATION_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_$]*(\.[A-Za-z_][A-Za-z0-9_$]*){0,2}$")


def _resolve_source(source: Any, path: Path, table: str, engine: str = "duckdb") -> str:
    if not isinstance(source, str) or not source.strip():
        raise _policy_error(path, "source must be a non-empty string", table)
    looks_like_path = "/" in source or "\\" in source or source.lower().endswith((".parquet", ".parq"))
    if engine == "postgres" or (engine == "spark" and not looks_like_path):
        if not _RELATION_RE.match(source):
            raise _policy_error(
                path, f"source {source!r} must be a table or view name ([schema.]table) for the "
                f"{engine} engine", table,
            )
        return source
    root = path.resolve().parent.parent
    if source.startswith("duckdb:"):
        rest = source[len("duckdb:"):]
        file, sep, tname = rest.rpartition(":")
        if not sep or not file or not tname:
            raise _policy_error(path, 'a DuckDB source must be "duckdb:<file>:<table>"', table)
        fpath = Path(file)
        if not fpath.is_absolute():
            fpath = root / fpath
        return f"duckdb:{fpath}:{tname}"
    spath = Path(source)
    if not spath.is_absolute():
        spath = root / spath
    return str(spath)


def _parse_table(name: str, raw: Any, path: Path, dataset: str, engine: str = "duckdb") -> TablePolicy:
    _name(name, "table name", path, name)
    if not isinstance(raw, dict):
        raise _policy_error(path, "a table must be a TOML table", name)
    _check_keys(raw, _TABLE_KEYS, path, "the table", name)
    source = _resolve_source(raw.get("source"), path, name, engine)
    unit = raw.get("privacy_unit")
    unit_path: UnitPath | None = None
    k = _bound_int(raw, "max_groups_per_unit", path, name)
    m = _bound_int(raw, "max_rows_per_unit", path, name)
    public = raw.get("public", False)
    if not isinstance(public, bool):
        raise _policy_error(path, f"public must be true or false (got {public!r})", name)
    if public:
        for key in ("privacy_unit", "max_groups_per_unit", "max_rows_per_unit"):
            if raw.get(key) is not None:
                raise _policy_error(
                    path, f"a public table has no {key}: public = true declares that the table "
                    "holds nothing to protect (drop one of the two)", name)
    if unit is None:
        for key, v in (("max_groups_per_unit", k), ("max_rows_per_unit", m)):
            if v not in (None, 1):
                raise _policy_error(
                    path,
                    f"{key} = {v} needs a privacy_unit column (without one, every row is its "
                    "own unit and k = m = 1)",
                    name,
                )
        k = m = 1
    else:
        if isinstance(unit, dict):  # a privacy unit through foreign keys (issue 21)
            unit_path = _parse_unit_path(unit, path, name)
            unit = None
        elif not isinstance(unit, str) or not unit:
            raise _policy_error(
                path,
                "privacy_unit must be a column name, or { path = [\"<column> -> <table>.<key>\", …, "
                "\"<unit column>\"] } for a unit reached through foreign keys; omit the key for "
                "record-level privacy",
                name,
            )
        elif "\x00" in unit:
            raise _policy_error(path, "privacy_unit must not contain NUL", name)
        k = 1 if k is None else k
        m = 1 if m is None else m
    raw_cols = raw.get("columns", {})
    if not isinstance(raw_cols, dict):
        raise _policy_error(path, "columns must be a TOML table", name)
    columns: dict[str, ColumnPolicy] = {}
    folded: dict[str, str] = {}
    for cname, craw in raw_cols.items():
        col = _parse_column(cname, craw, path, name)
        if cname.casefold() in folded:
            raise _policy_error(
                path,
                f"columns {folded[cname.casefold()]!r} and {cname!r} differ only in case "
                "(DuckDB identifiers are case-insensitive)",
                name,
                cname,
            )
        folded[cname.casefold()] = cname
        if unit is not None and cname.casefold() == unit.casefold() and col.public_keys is not None:
            raise _policy_error(
                path, "the privacy unit column cannot have public keys (grouping by the unit "
                "is never allowed)", name, cname,
            )
        if col.bounded and m * max(map(abs, col.fixed_point_bounds)) > limits.MAX_STEPS:
            raise _policy_error(
                path,
                f"one unit may add max_rows_per_unit × max(|lower|, |upper|) / resolution = "
                f"{m} × {max(map(abs, col.fixed_point_bounds))} steps to a group's sum, more "
                "than 2**62 (the exact per-group aggregates could then overflow on some data); "
                "lower max_rows_per_unit, tighten the bounds or coarsen the resolution",
                name,
                cname,
            )
        columns[cname] = col
    return TablePolicy(
        name=name,
        dataset=dataset,
        source=source,
        privacy_unit=unit,
        max_groups_per_unit=k,
        max_rows_per_unit=m,
        columns=MappingProxyType(columns),
        path=path,
        public=public,
        unit_path=unit_path,
    )


def _parse_unit_path(raw: Mapping[str, Any], path: Path, table: str) -> UnitPath:
    """The syntax of ``privacy_unit = { path = [...] }`` (the tables it names: :func:`_check_unit_paths`)."""
    _check_keys(raw, {"path"}, path, "privacy_unit", table)
    steps = raw.get("path")
    if not isinstance(steps, list) or not all(isinstance(x, str) for x in steps):
        raise _policy_error(path, "privacy_unit.path must be a list of strings: "
                                  "[\"<column> -> <table>.<key>\", …, \"<unit column>\"]", table)
    if len(steps) < 2:
        raise _policy_error(path, "privacy_unit.path needs at least one hop \"<column> -> <table>.<key>\" "
                                  "and then the unit column of the table it reaches (a unit column of this "
                                  "table is written privacy_unit = \"<column>\")", table)
    hops = []
    for i, step in enumerate(steps[:-1]):
        m = _HOP_RE.match(step)
        if m is None:
            raise _policy_error(path, f"privacy_unit.path step {i + 1} ({step!r}) must read "
                                      "\"<column> -> <table>.<key>\"", table)
        hops.append(ForeignKeyHop(*m.groups()))
    last = steps[-1].strip()
    if not _NAME_RE.match(last):
        raise _policy_error(path, f"the last element of privacy_unit.path ({steps[-1]!r}) must be the unit "
                                  f"column of table {hops[-1].table!r} (a plain column name)", table)
    return UnitPath(tuple(hops), last)


def _find_table(tables: Mapping[str, TablePolicy], name: str) -> TablePolicy | None:
    if name in tables:
        return tables[name]
    return next((t for t in tables.values() if t.name.casefold() == name.casefold()), None)


def _check_unit_paths(tables: Mapping[str, TablePolicy], path: Path) -> None:
    """Every privacy unit path names declared tables and columns, through unique keys of one
    type with their foreign keys, without visiting a table twice, to the unit column of a
    protected table that carries it. One clear line per problem (:class:`PolicyError`)."""
    for table in tables.values():
        up = table.unit_path
        if up is None:
            continue
        here, seen = table, [table.name.casefold()]
        for i, hop in enumerate(up.hops, 1):
            where = f"privacy_unit.path step {i} ({hop})"
            fk = here.find_column(hop.column)
            if fk is None:
                raise _policy_error(path, f"{where}: table {here.name!r} declares no column {hop.column!r} "
                                          f"(declare it in [tables.{here.name}.columns])", table.name)
            target = _find_table(tables, hop.table)
            if target is None:
                raise _policy_error(path, f"{where}: no table {hop.table!r} is declared", table.name)
            if target.name.casefold() in seen:
                raise _policy_error(path, f"{where}: the path returns to table {target.name!r}; cycles are "
                                          "refused (a unit path visits each table once)", table.name)
            key = target.find_column(hop.key)
            if key is None:
                raise _policy_error(path, f"{where}: table {target.name!r} declares no column {hop.key!r}",
                                    table.name)
            if not key.unique:
                raise _policy_error(path, f"{where}: {target.name}.{key.name} is not declared unique "
                                          "(unique = true): a key that repeats would attribute one row to "
                                          "several units", table.name)
            if fk.type not in UNIT_PATH_KEY_TYPES or fk.type != key.type:
                raise _policy_error(path, f"{where}: {here.name}.{fk.name} ({fk.type}) and "
                                          f"{target.name}.{key.name} ({key.type}) must both be int or both "
                                          "text", table.name)
            here = target
            seen.append(target.name.casefold())
        if here.public:
            raise _policy_error(path, f"privacy_unit.path ends at public table {here.name!r}, which has no "
                                      "privacy unit", table.name)
        if here.unit_path is not None:
            raise _policy_error(path, f"privacy_unit.path ends at table {here.name!r}, whose unit is itself a "
                                      "path: spell the whole chain to the table that carries the unit column",
                                table.name)
        if here.privacy_unit is None:
            raise _policy_error(path, f"privacy_unit.path ends at table {here.name!r}, which is record-level "
                                      "(no privacy_unit column)", table.name)
        if up.unit.casefold() != here.privacy_unit.casefold():
            raise _policy_error(path, f"privacy_unit.path ends at {here.name}.{up.unit}, which is not the "
                                      f"privacy unit of {here.name!r} ({here.privacy_unit})", table.name)


def _selection_deltas(b: Mapping[str, Any], delta: float, path: Path) -> tuple[float, float, bool]:
    """``[budget] selection_delta`` (in [0, δ)) and ``default_selection_delta`` (default
    selection_delta/100, in (0, selection_delta]; 0 when selection is off), and whether the
    file states either (False: the caller applies :func:`default_selection_deltas`; a stated
    ``default_selection_delta`` alone means selection is wanted: δ/2 is reserved)."""
    stated = "selection_delta" in b or "default_selection_delta" in b
    sel = delta / 2
    if "selection_delta" in b:
        sel = _finite_number(b["selection_delta"], "[budget] selection_delta", path)
        if not (0 <= sel < delta or sel == delta == 0):
            raise _policy_error(path, f"[budget] selection_delta must be in [0, delta) = [0, {delta:g}) "
                                      f"(got {sel:g})")
    per_query = sel / 100
    if "default_selection_delta" in b:
        per_query = _finite_number(b["default_selection_delta"], "[budget] default_selection_delta", path)
        if sel == 0:
            if per_query != 0:
                raise _policy_error(path, "[budget] default_selection_delta needs selection_delta > 0")
        elif not 0 < per_query <= sel:
            raise _policy_error(path, f"[budget] default_selection_delta must be in (0, selection_delta] = "
                                      f"(0, {sel:g}] (got {per_query:g})")
    return sel, per_query, stated


#: The value a draft policy (``dpgate policy init``) leaves for its author to decide.
TODO = "TODO"


def draft_todos(raw: Any, _at: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """The key paths of a parsed policy document whose value is still the draft marker
    ``"TODO"`` (a string, alone or in a list), in document order: e.g.
    ``("budget", "epsilon")``, ``("tables", "people", "columns", "age", "lower")``.

    A draft from ``dpgate policy init`` writes every decision that must not come from the data
    (bounds, key lists, contribution bounds, the privacy unit, the cap) as ``"TODO"``; a policy
    with any left is refused by :func:`load_policy` and listed by ``dpgate datasets check``.
    """
    found: list[tuple[str, ...]] = []
    if isinstance(raw, str):
        if raw.strip() == TODO:
            found.append(_at)
    elif isinstance(raw, Mapping):
        for key, value in raw.items():
            found.extend(draft_todos(value, (*_at, str(key))))
    elif isinstance(raw, list) and any(isinstance(v, str) and v.strip() == TODO for v in raw):
        found.append(_at)
    return found


def _parse_policy(raw: Mapping[str, Any], path: Path) -> DatasetPolicy:
    todos = draft_todos(raw)
    if todos:
        shown = ", ".join(".".join(t) for t in todos[:4]) + (", …" if len(todos) > 4 else "")
        name = raw.get("dataset", {}).get("name") if isinstance(raw.get("dataset"), Mapping) else None
        problem = (f"this is a draft: {len(todos)} value(s) are still \"TODO\" ({shown}); decide them "
                   f"(bounds and keys from domain knowledge, never from the data) — `dpgate datasets check"
                   f"{' ' + name if isinstance(name, str) else ''}` lists them")
        raise PolicyError(f"policy file {str(path)!r}: {problem}",
                          {"file": str(path), "table": None, "column": None, "problem": problem,
                           "todo": [".".join(t) for t in todos]})
    _check_keys(raw, {"dataset", "budget", "allocations", "tables", "population"}, path, "the file")
    ds = _section(raw, "dataset", path)
    _check_keys(ds, {"name", "population", "data_version", "engine", "connection", "version_sql", "load",
                     "proxy", "provenance", "proxy_default_for"},
                path, "[dataset]")
    name = _name(ds.get("name"), "dataset name", path)
    population = _name(ds.get("population"), "population", path, strict=False)
    data_version = ds.get("data_version")
    if data_version is not None and (not isinstance(data_version, str) or not data_version):
        raise _policy_error(path, "data_version must be a non-empty string")
    engine, connection, version_sql, load_mode = _parse_engine(ds, path, data_version)

    b = _section(raw, "budget", path)
    _check_keys(
        b,
        {"epsilon", "delta", "default_query_rho", "mechanism", "suppress_ci95_above", "clamp_counts",
         "selection_delta", "default_selection_delta"},
        path,
        "[budget]",
    )
    for key in ("epsilon", "delta", "default_query_rho"):
        if key not in b:
            raise _policy_error(path, f"[budget] {key} is required")
    epsilon = _finite_number(b["epsilon"], "[budget] epsilon", path)
    if epsilon <= 0:
        raise _policy_error(path, f"[budget] epsilon must be > 0 (got {epsilon:g})")
    delta = _finite_number(b["delta"], "[budget] delta", path)
    if not 0 <= delta < 1:
        raise _policy_error(path, f"[budget] delta must be in [0, 1) (got {delta:g})")
    rho = _finite_number(b["default_query_rho"], "[budget] default_query_rho", path)
    if rho <= 0:
        raise _policy_error(path, f"[budget] default_query_rho must be > 0 (got {rho:g})")
    mechanism = b.get("mechanism", "gaussian")
    if not isinstance(mechanism, str) or mechanism not in MECHANISMS:
        raise _policy_error(
            path, f"[budget] mechanism must be one of {', '.join(MECHANISMS)} (got {mechanism!r})"
        )
    suppress = b.get("suppress_ci95_above")
    if suppress is not None:
        suppress = _finite_number(suppress, "[budget] suppress_ci95_above", path)
        if suppress <= 0:
            raise _policy_error(path, "[budget] suppress_ci95_above must be > 0")
    clamp = b.get("clamp_counts", True)
    if not isinstance(clamp, bool):
        raise _policy_error(path, "[budget] clamp_counts must be true or false")
    selection, per_query, stated = _selection_deltas(b, delta, path)

    alloc_raw = _section(raw, "allocations", path, required=False)
    allocations: dict[str, float] = {}
    for consumer, share in alloc_raw.items():
        share = _finite_number(share, f"allocation {consumer!r}", path)
        if not 0 < share <= 1:
            raise _policy_error(path, f"allocation {consumer!r} must be in (0, 1] (got {share:g})")
        allocations[consumer] = share
    if math.fsum(allocations.values()) > 1 + 1e-9:
        raise _policy_error(
            path, f"allocations sum to {math.fsum(allocations.values()):g}, more than 1"
        )

    tables_raw = _section(raw, "tables", path)
    if not tables_raw:
        raise _policy_error(path, "[tables] declares no table")
    tables: dict[str, TablePolicy] = {}
    for tname, traw in tables_raw.items():
        if any(t.casefold() == tname.casefold() for t in tables):
            raise _policy_error(path, "two tables differ only in case", tname)
        tables[tname] = _parse_table(tname, traw, path, name, engine)
    _check_unit_paths(tables, path)
    if not stated:  # issue 22: no idle δ reserve when no query of this file can select keys
        selection, per_query = default_selection_deltas(delta, bool(selection_key_columns(tables.values())))
    budget = BudgetPolicy(epsilon, delta, rho, mechanism, suppress, clamp, selection, per_query, stated)
    cohorts = _parse_cohorts(_section(raw, "population", path, required=False), tables, path)
    proxy, provenance, proxy_default_for = _parse_proxy(ds, tables, name, path)
    return DatasetPolicy(
        name=name,
        population=population,
        data_version=data_version,
        budget=budget,
        allocations=MappingProxyType(allocations),
        tables=MappingProxyType(tables),
        path=path,
        engine=engine,
        connection=connection,
        version_sql=version_sql,
        load=load_mode,
        cohorts=cohorts,
        proxy=proxy,
        provenance=provenance,
        proxy_default_for=proxy_default_for,
    )


ENGINES: tuple[str, ...] = ("duckdb", "postgres", "spark")
LOAD_MODES: tuple[str, ...] = ("auto", "memory", "in_place")


def _parse_engine(ds: Mapping[str, Any], path: Path, data_version: str | None):
    """``[dataset]`` engine, connection, version_sql and load (DESIGN.md, "Engines")."""
    engine = ds.get("engine", "duckdb")
    if engine not in ENGINES:
        raise _policy_error(path, f"[dataset] engine must be one of {', '.join(ENGINES)} (got {engine!r})")
    connection = ds.get("connection")
    if connection is not None:
        if engine != "postgres":
            raise _policy_error(path, "[dataset] connection is only for engine = \"postgres\"")
        if not isinstance(connection, str) or not connection.strip():
            raise _policy_error(path, "[dataset] connection must be a non-empty string")
    version_sql = ds.get("version_sql")
    if version_sql is not None:
        if engine == "duckdb":
            raise _policy_error(path, "[dataset] version_sql is for live engines (postgres, spark); "
                                "DuckDB files are versioned by their fingerprint")
        if not isinstance(version_sql, str) or not version_sql.strip():
            raise _policy_error(path, "[dataset] version_sql must be a non-empty SELECT")
        if data_version is not None:
            raise _policy_error(path, "[dataset] give data_version or version_sql, not both")
    load_mode = ds.get("load")
    if load_mode is not None:
        if engine != "duckdb":
            raise _policy_error(path, "[dataset] load is for engine = \"duckdb\" (live engines read in place)")
        if load_mode not in LOAD_MODES:
            raise _policy_error(path, f"[dataset] load must be one of {', '.join(LOAD_MODES)} (got {load_mode!r})")
    return engine, connection, version_sql, load_mode


# --- cohorts and proxies (issue 23) ------------------------------------------------------

#: Most cohorts a population may declare (each is one budget in the ledger).
MAX_COHORTS = 10_000
#: Column types a cohort column may have (its public keys name the cohorts).
COHORT_TYPES: tuple[str, ...] = ("text", "int", "bool")


@dataclass(frozen=True)
class CohortPolicy:
    """The cohorts of a population (``[population] cohort_column = "signup_month"``).

    Every unit belongs to exactly one cohort — the value of ``column`` on each of its rows,
    the same on every row and every table, one of the column's public keys (the engines
    check it when the data loads). The ledger keeps one budget per (population, cohort);
    since the cohorts' units are disjoint, a query is charged its full cost on every cohort
    it can touch (parallel composition), and a cohort declared later starts with the whole
    cap. A unit's cohort must never change (e.g. the month the unit first appeared): the
    gateway checks each data version, not across versions.

    Attributes:
        column: the cohort column (declared, with public keys, in every protected table).
        type: its declared type (one of :data:`COHORT_TYPES`).
        keys: the cohorts (the column's public keys, in declaration order).
    """

    column: str
    type: str
    keys: tuple

    def key_text(self, value: Any) -> str:
        """A cohort's name in the ledger: the key as text (``true``/``false`` for booleans)."""
        if isinstance(value, bool):
            return "true" if value else "false"
        return str(value)

    @property
    def names(self) -> tuple[str, ...]:
        """Every cohort's ledger name, in declaration order."""
        return tuple(self.key_text(k) for k in self.keys)

    def to_dict(self) -> dict[str, Any]:
        """``{column, type, cohorts}`` (the public part: the cohorts are public keys)."""
        return {"column": self.column, "type": self.type, "cohorts": list(self.names)}


def _parse_cohorts(section: Mapping[str, Any], tables: Mapping[str, TablePolicy], path: Path) -> CohortPolicy | None:
    """``[population] cohort_column``: validated against every protected table's declaration."""
    _check_keys(section, {"cohort_column"}, path, "[population]")
    column = section.get("cohort_column")
    if column is None:
        return None
    if not isinstance(column, str) or not _NAME_RE.match(column):
        raise _policy_error(path, "[population] cohort_column must be a column name")
    protected = [t for t in tables.values() if not t.public]
    if not protected:
        raise _policy_error(path, "[population] cohort_column needs a protected table (every table is public)")
    found: CohortPolicy | None = None
    for table in protected:
        if table.unit_path is not None:
            raise _policy_error(path, "[population] cohort_column: a table whose privacy unit is a foreign-key "
                                      "path is not supported with cohorts yet (issue 21: each unit's cohort is "
                                      "checked on its rows once the path is joined)", table.name)
    for table in protected:
        col = table.find_column(column)
        if col is None:
            raise _policy_error(path, f"[population] cohort_column {column!r}: every protected table must declare "
                                      "it (each unit's cohort is read from its rows)", table.name, column)
        if table.privacy_unit is not None and col.name.casefold() == table.privacy_unit.casefold():
            raise _policy_error(path, "the cohort column cannot be the privacy unit", table.name, column)
        if col.type not in COHORT_TYPES:
            raise _policy_error(path, f"a cohort column must be of type {', '.join(COHORT_TYPES)} "
                                      f"(got {col.type})", table.name, column)
        if col.public_keys is None:
            raise _policy_error(path, "the cohort column must declare its cohorts as public_keys", table.name, column)
        keys = tuple(col.public_keys)
        if len(keys) > MAX_COHORTS:
            raise _policy_error(path, f"more than {MAX_COHORTS:,} cohorts", table.name, column)
        here = CohortPolicy(col.name, col.type, keys)
        if found is None:
            found = here
        elif (found.type, found.keys) != (here.type, here.keys):
            raise _policy_error(path, "the cohort column must have the same type and public keys in every "
                                      "protected table", table.name, column)
    return found


#: What ``provenance`` may say: ``"public"`` or ``"synthetic: <how it was made>"``.
_PROVENANCE_RE = re.compile(r"^(public|synthetic:\s*\S.*)$", re.S)


def _parse_proxy(ds: Mapping[str, Any], tables: Mapping[str, TablePolicy], name: str,
                 path: Path) -> tuple[str | None, str | None, tuple[str, ...]]:
    """``[dataset] proxy``, ``provenance`` and ``proxy_default_for`` (checked across files by
    :func:`check_proxies`)."""
    proxy = ds.get("proxy")
    if proxy is not None and (not isinstance(proxy, str) or not _NAME_RE.match(proxy)):
        raise _policy_error(path, "[dataset] proxy must name a dataset")
    if proxy is not None and proxy == name:
        raise _policy_error(path, "[dataset] proxy cannot name the dataset itself")
    provenance = ds.get("provenance")
    if provenance is not None:
        if not isinstance(provenance, str) or not _PROVENANCE_RE.match(provenance.strip()):
            raise _policy_error(path, '[dataset] provenance must be "public" or "synthetic: <how it was made>"')
        provenance = provenance.strip()
        private = sorted(t.name for t in tables.values() if not t.public)
        if private:
            raise _policy_error(path, "a dataset with a provenance (a proxy: public or synthetic data) must "
                                      f"declare every table public = true (not: {', '.join(private)})")
        if proxy is not None:
            raise _policy_error(path, "a proxy dataset cannot have a proxy of its own")
    default_for = ds.get("proxy_default_for", [])
    if not isinstance(default_for, list) or not all(isinstance(c, str) and c for c in default_for):
        raise _policy_error(path, "[dataset] proxy_default_for must be a list of consumer names")
    if default_for and proxy is None:
        raise _policy_error(path, "[dataset] proxy_default_for needs [dataset] proxy")
    return proxy, provenance, tuple(default_for)
