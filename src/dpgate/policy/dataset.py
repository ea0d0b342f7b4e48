"""One dataset's policy: the budget (cap, defaults, selection δ), the engine, the proxy, and the
reading of a whole policy file's mapping into :class:`DatasetPolicy`.

Part of :mod:`dpgate.policy`.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Mapping

from dpgate import limits
from dpgate.errors import PolicyError, UnknownTable
from dpgate.errors import policy_error as _policy_error
from dpgate.policy.cohorts import _parse_cohorts
from dpgate.policy.fields import _NAME_RE, _check_keys, _finite_number, _name, _section
from dpgate.policy.private_bounds import DEFAULT_MAX_RANK_ERROR, DEFAULT_SHARE
from dpgate.policy.tables import _check_unit_paths, _parse_table
from dpgate.selection_reserve import default_selection_deltas, selection_key_columns

if TYPE_CHECKING:
    from dpgate.policy.cohorts import CohortPolicy
    from dpgate.policy.tables import TablePolicy


#: The composition rules ``[budget] composition`` may name (the ledger's
#: :data:`dpgate.ledger.caps.COMPOSITIONS`, repeated here: the policy layer does not import the ledger).
COMPOSITIONS: tuple[str, ...] = ("renyi", "gdp")

#: The mechanisms a policy (``[budget] mechanism``) or a request may name, each mapped to the
#: OpenDP measurement it means (:mod:`dpgate.mechanisms`). The one definition of the list.
MECHANISMS: Mapping[str, str] = MappingProxyType(
    {"gaussian": "discrete_gaussian", "laplace": "discrete_laplace"}
)


@dataclass(frozen=True)
class BudgetPolicy:
    """The published guarantee of a dataset's population and the per-query defaults.

    Attributes:
        epsilon: ε of the population's total cap (ε, δ).
        delta: δ of the cap, in (0, 1).
        default_query_rho: ρ (zCDP, per query) spent by a query that names no budget, in
            (0, :data:`dpgate.limits.MAX_QUERY_RHO`].
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
        composition: the population's composition rule, a value of :data:`COMPOSITIONS`:
            ``"renyi"`` (the Rényi/zCDP filter, default) or ``"gdp"`` (the Gaussian-DP filter,
            :mod:`dpgate.ledger.filter`; fixed in the ledger before the population's first
            charge). A ``"gdp"`` population admits no partition selection (its δ has no GDP
            claim), so its ``selection_delta`` defaults to 0 and a stated positive one is refused.
        private_bounds_share: the share of a query's budget (ρ, or ε under pure DP) spent on
            estimating the clamp of each ``bounds = "private"`` column it needs that has no
            estimate yet (issue 22 item 3; several columns split it equally), in (0, 1); default 0.1.
        private_bounds_max_rank_error: the largest 95 % rank error (privacy units) an estimate
            may have: a query whose share buys a worse one is refused before any charge; > 0,
            default 1000.
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
    composition: str = "renyi"
    private_bounds_share: float = DEFAULT_SHARE
    private_bounds_max_rank_error: float = DEFAULT_MAX_RANK_ERROR

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


def _selection_deltas(b: Mapping[str, Any], delta: float, path: Path) -> tuple[float, float, bool]:
    """``[budget] selection_delta`` (in [0, δ)) and ``default_selection_delta`` (default
    selection_delta/100, in (0, selection_delta]; 0 when selection is off), and whether the
    file states either (False: the caller applies :func:`default_selection_deltas`; a stated
    ``default_selection_delta`` alone means selection is wanted: δ/2 is reserved)."""
    stated = "selection_delta" in b or "default_selection_delta" in b
    sel = delta / 2
    if "selection_delta" in b:
        sel = _finite_number(b["selection_delta"], "[budget] selection_delta", path)
        if not 0 <= sel < delta:
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
         "selection_delta", "default_selection_delta", "composition", "private_bounds_share",
         "private_bounds_max_rank_error"},
        path,
        "[budget]",
    )
    for key in ("epsilon", "delta", "default_query_rho"):
        if key not in b:
            raise _policy_error(path, f"[budget] {key} is required")
    epsilon = _finite_number(b["epsilon"], "[budget] epsilon", path)
    if epsilon <= 0 or epsilon > limits.MAX_POLICY_EPSILON:
        raise _policy_error(path, f"[budget] epsilon must be > 0 and at most {limits.MAX_POLICY_EPSILON:g} "
                                  f"(got {epsilon:g})")
    delta = _finite_number(b["delta"], "[budget] delta", path)
    if not 0 < delta < 1:  # as the ledger's cap (dpgate.ledger.caps.validate_cap): δ = 0 admits no release
        raise _policy_error(path, f"[budget] delta must be in (0, 1) (got {delta:g}); the cap's delta must "
                                  "be in (0, 1): a Gaussian release needs delta > 0")
    rho = _finite_number(b["default_query_rho"], "[budget] default_query_rho", path)
    if not 0 < rho <= limits.MAX_QUERY_RHO:
        raise _policy_error(path, f"[budget] default_query_rho must be > 0 and at most {limits.MAX_QUERY_RHO:g} "
                                  f"(the largest rho one query may spend), got {rho:g}")
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
    composition = _composition(b, selection, stated, path)

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
        selects = composition != "gdp" and bool(selection_key_columns(tables.values()))
        selection, per_query = default_selection_deltas(delta, selects)
    share, max_rank = _private_bounds_settings(b, path)
    budget = BudgetPolicy(epsilon, delta, rho, mechanism, suppress, clamp, selection, per_query, stated,
                          composition, share, max_rank)
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


def _private_bounds_settings(b: Mapping[str, Any], path: Path) -> tuple[float, float]:
    """``[budget] private_bounds_share`` in (0, 1) and ``private_bounds_max_rank_error`` > 0 (issue 22 item 3)."""
    share = _finite_number(b.get("private_bounds_share", DEFAULT_SHARE), "[budget] private_bounds_share", path)
    if not 0 < share < 1:
        raise _policy_error(path, f"[budget] private_bounds_share must be in (0, 1) (got {share:g})")
    rank = _finite_number(b.get("private_bounds_max_rank_error", DEFAULT_MAX_RANK_ERROR),
                          "[budget] private_bounds_max_rank_error", path)
    if not rank > 0:
        raise _policy_error(path, f"[budget] private_bounds_max_rank_error must be > 0 (got {rank:g})")
    return share, rank


def _composition(b: Mapping[str, Any], selection: float, stated: bool, path: Path) -> str:
    """``[budget] composition`` (default ``"renyi"``); ``"gdp"`` refuses a stated positive
    ``selection_delta`` (the Gaussian-DP filter refuses every partition selection's δ, so the
    reserve could never be spent)."""
    comp = b.get("composition", "renyi")
    if not isinstance(comp, str) or comp not in COMPOSITIONS:
        raise _policy_error(path, f"[budget] composition must be one of {', '.join(map(repr, COMPOSITIONS))} "
                                  f"(got {comp!r})")
    if comp == "gdp" and stated and selection > 0:
        raise _policy_error(path, "[budget] composition = \"gdp\" admits no partition selection (its delta has no "
                                  "Gaussian-DP claim), so selection_delta must be 0 or omitted "
                                  f"(got {selection:g}); give the key columns public keys")
    return comp


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
