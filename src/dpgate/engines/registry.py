"""The gateway's engines: one :class:`~dpgate.engines.base.Engine` per dataset, behind one object.

:class:`EngineSet` opens each dataset's engine by its policy's ``[dataset] engine``
(``duckdb`` default, ``postgres``, ``spark``), routes a bounded query to the
engine of the dataset whose tables it reads (the query names
``"<dataset>"."<table>"``), and reloads one dataset without a restart: a new
engine is loaded beside the old one and swapped in; queries already running on
the old engine finish there, then it is closed.

``EngineSet(timeout_s=…, memory_limit=…, threads=…)`` with ``load(policies)``,
``check(tree)``, ``execute(tree)`` and ``close()`` keeps the interface of the former
``dpgate.engine.Engine`` (an alias of this class during the transition).
"""

from __future__ import annotations

import threading
from dataclasses import replace
from typing import Any, Callable, Mapping

import numpy as np
from sqlglot import exp

from dpgate.engines.base import Engine, EngineOptions, LoadReport, Query, relations
from dpgate.engines.cohorts import check_cohort_rule
from dpgate.errors import ExecutionError, PolicyError, UnknownDataset
from dpgate.policy import DatasetPolicy

__all__ = ["EngineSet", "open_engine"]


def open_engine(policy: DatasetPolicy, options: EngineOptions) -> Engine:
    """A new, unloaded engine for ``policy`` by its ``engine`` kind.

    Raises:
        PolicyError: an unknown engine kind, or its client library is not installed
            (pyspark is an optional extra: ``pip install 'dpgate[spark]'``).
    """
    kind = getattr(policy, "engine", "duckdb") or "duckdb"
    if kind == "duckdb":
        from dpgate.engines.duckdb import DuckDBEngine

        return DuckDBEngine(policy, options)
    if kind == "postgres":
        from dpgate.engines.postgres import PostgresEngine

        return PostgresEngine(policy, options)
    if kind == "spark":
        try:
            from dpgate.engines.spark import SparkEngine
        except ImportError:
            raise PolicyError(
                f"dataset {policy.name!r} uses the Spark engine but pyspark is not installed "
                "(pip install 'dpgate[spark]'; Spark needs Java 17+)",
                {"dataset": policy.name, "engine": "spark"},
            ) from None
        return SparkEngine(policy, options)
    raise PolicyError(f"dataset {policy.name!r}: unknown engine {kind!r}", {"dataset": policy.name})


class EngineSet:
    """Every dataset's engine, with routing by the dataset a query reads and live reloads.

    Args:
        timeout_s, memory_limit, threads: shorthands for :class:`EngineOptions`
            fields (``timeout_s``, ``duckdb_memory_limit``, ``duckdb_threads``).
        options: full engine options (the shorthands override its fields).
        factory: builds one dataset's engine (tests inject fakes); default :func:`open_engine`.

    Raises:
        ValueError: a non-positive timeout or threads < 1.
    """

    def __init__(self, *, timeout_s: float | None = None, memory_limit: str | None = None,
                 threads: int | None = None, options: EngineOptions | None = None,
                 factory: Callable[[DatasetPolicy, EngineOptions], Engine] = open_engine) -> None:
        opts = options or EngineOptions()
        if timeout_s is not None:
            opts = replace(opts, timeout_s=float(timeout_s))
        if memory_limit is not None:
            opts = replace(opts, duckdb_memory_limit=str(memory_limit))
        if threads is not None:
            if int(threads) < 1:
                raise ValueError(f"threads must be >= 1, got {threads!r}")
            opts = replace(opts, duckdb_threads=int(threads))
        if not (opts.timeout_s > 0 and opts.timeout_s != float("inf")):
            raise ValueError(f"timeout_s must be finite and > 0, got {opts.timeout_s!r}")
        self.options = opts
        self.timeout_s = opts.timeout_s
        self._factory = factory
        self._engines: dict[str, Engine] = {}
        self._policies: dict[str, DatasetPolicy] = {}
        self.reports: dict[str, LoadReport] = {}
        self._inflight: dict[int, int] = {}
        self._retired: dict[int, Engine] = {}
        self._lock = threading.Lock()
        self._reload_lock = threading.Lock()
        self._loaded = False
        self._closed = False

    # ------------------------------------------------------------------ loading

    def load(self, policies: Mapping[str, DatasetPolicy],
             progress: Callable[[str], None] | None = None) -> dict[str, str | None]:
        """Open and load every dataset's engine (sorted by name).

        Returns:
            dataset name → raw data version (see :class:`LoadReport`; None when the
            version comes from ``version_sql`` per query, or is unknown).

        Raises:
            PolicyError: as the engines' ``load``. ExecutionError: already loaded or closed.

        On any failure every engine opened so far is closed, and so is the set.
        """
        with self._lock:
            if self._closed:
                raise ExecutionError("the engine is closed")
            if self._loaded:
                raise ExecutionError("the engine is already loaded and locked down; create a new engine")
            self._loaded = True
        try:
            for name in sorted(policies):
                engine = self._factory(policies[name], self.options)
                try:
                    report = engine.load(progress)
                    check_cohort_rule(engine, policies[name])  # issue 23: each unit in one cohort
                except BaseException:
                    engine.close()
                    raise
                self._engines[name] = engine
                self._policies[name] = policies[name]
                self.reports[name] = report
        except BaseException:
            self.close()
            raise
        return {name: r.data_version for name, r in self.reports.items()}

    def reload(self, dataset: str, policy: DatasetPolicy | None = None,
               progress: Callable[[str], None] | None = None) -> LoadReport:
        """Load ``dataset`` again (its files may have changed) and swap the new engine in.

        Queries running on the old engine finish there; it is closed afterwards.
        A failed reload leaves the old engine serving.

        Args:
            dataset: dataset name.
            policy: the policy to load with (default: the one loaded before).

        Raises:
            UnknownDataset: not loaded here. PolicyError: as ``load``.
        """
        with self._reload_lock:
            with self._lock:
                if dataset not in self._engines:
                    raise UnknownDataset(f"unknown dataset {dataset!r}", {"dataset": dataset})
                policy = policy or self._policies[dataset]
            engine = self._factory(policy, self.options)
            try:
                report = engine.load(progress)
                check_cohort_rule(engine, policy)  # issue 23: each unit in one cohort
            except BaseException:
                engine.close()
                raise
            with self._lock:
                old = self._engines[dataset]
                self._engines[dataset] = engine
                self._policies[dataset] = policy
                self.reports[dataset] = report
                if self._inflight.get(id(old), 0):
                    self._retired[id(old)] = old
                    old = None
            if old is not None:
                old.close()
            return report

    # ------------------------------------------------------------------ lookups

    def engine(self, dataset: str) -> Engine:
        """The engine serving ``dataset`` now. Raises :class:`UnknownDataset`."""
        with self._lock:
            try:
                return self._engines[dataset]
            except KeyError:
                raise UnknownDataset(f"unknown dataset {dataset!r}", {"dataset": dataset}) from None

    def unit_is_unique(self, dataset: str, table: str) -> bool:
        """True when the load established one row per privacy unit in ``dataset.table``."""
        return self.engine(dataset).unit_is_unique(table)

    def current_version(self, dataset: str) -> str | None:
        """The raw data version of ``dataset`` now (``version_sql`` evaluated; see the engines)."""
        return self._run(dataset, lambda e: e.current_version())

    def describe(self, dataset: str) -> dict[str, Any]:
        """What may be published about how ``dataset`` is served: engine kind, how its data
        version is known (``declared``, ``fingerprint``, ``version_sql`` or None: release
        cache off) and per table the load mode (never data-derived facts)."""
        report = self.reports.get(dataset)
        if report is None:
            raise UnknownDataset(f"unknown dataset {dataset!r}", {"dataset": dataset})
        return {
            "engine": report.engine,
            "versioned_by": report.versioned_by,
            "tables": {name: {"load": info.mode} for name, info in report.tables.items()},
        }

    # ------------------------------------------------------------------ queries

    def _dataset_of(self, query: Query) -> str:
        """The dataset whose tables the query tree reads (no parse, no copy).

        Raises:
            ExecutionError: not a query tree, or it reads no (or several) loaded datasets' tables.
        """
        if not isinstance(query, exp.Query):
            raise ExecutionError("the engine executes exactly one SELECT statement, handed as a sqlglot "
                                 "query tree (not SQL text)")
        names = {ds for ds, _ in relations(query)} & set(self._engines)
        if len(names) == 1:
            return names.pop()
        if not names and len(self._engines) == 1:
            return next(iter(self._engines))
        if not names:
            raise ExecutionError("the query reads no table of a loaded dataset")
        raise ExecutionError("a query reads the tables of exactly one dataset")

    def _run(self, dataset: str, fn: Callable[[Engine], Any]) -> Any:
        with self._lock:
            if self._closed:
                raise ExecutionError("the engine is closed")
            if not self._loaded:
                raise ExecutionError("the engine has no data yet: call load() first")
            try:
                engine = self._engines[dataset]
            except KeyError:
                raise UnknownDataset(f"unknown dataset {dataset!r}", {"dataset": dataset}) from None
            self._inflight[id(engine)] = self._inflight.get(id(engine), 0) + 1
        try:
            return fn(engine)
        finally:
            with self._lock:
                left = self._inflight[id(engine)] - 1
                if left:
                    self._inflight[id(engine)] = left
                else:
                    del self._inflight[id(engine)]
                retired = self._retired.pop(id(engine), None) if not left else None
            if retired is not None:
                retired.close()

    def _route(self, query: Query, fn: Callable[[Engine], Any], dataset: str | None = None) -> Any:
        with self._lock:
            if self._closed:
                raise ExecutionError("the engine is closed")
            if not self._loaded:
                raise ExecutionError("the engine has no data yet: call load() first")
        return self._run(dataset if dataset is not None else self._dataset_of(query), fn)

    def render(self, query: Query, *, dataset: str | None = None) -> str:
        """The query rendered by the engine of the dataset it reads, or of ``dataset`` (salt included)."""
        return self._route(query, lambda e: e.render(query), dataset)

    def check(self, query: Query, *, dataset: str | None = None) -> None:
        """EXPLAIN the query on its dataset's engine (reads no data); see ``Engine.check``.

        ``dataset``: route to that dataset's engine (default: the dataset whose tables the tree reads).
        """
        return self._route(query, lambda e: e.check(query), dataset)

    def execute(self, query: Query, *, dataset: str | None = None) -> dict[str, np.ndarray]:
        """Run the query on its dataset's engine (or ``dataset``'s); see ``Engine.execute``."""
        return self._route(query, lambda e: e.execute(query), dataset)

    def close(self) -> None:
        """Close every engine (idempotent); later calls raise ExecutionError."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            engines = list(self._engines.values()) + list(self._retired.values())
            self._retired.clear()
        for engine in engines:
            try:
                engine.close()
            except Exception:  # noqa: BLE001 - closing must not mask the caller's error
                pass

    def __enter__(self) -> "EngineSet":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
