"""Engines that run the bounded query where the data lives (DESIGN.md, "Engines").

* :mod:`dpgate.engines.base` — the :class:`~dpgate.engines.base.Engine` protocol and
  what every engine shares (schema checks, the privacy unit rule, portable rendering);
* :mod:`dpgate.engines.duckdb` — embedded DuckDB, in memory or in place (default);
* :mod:`dpgate.engines.postgres` — PostgreSQL, read-only, where the data lives;
* :mod:`dpgate.engines.spark` — Spark SQL (optional extra ``dpgate[spark]``);
* :mod:`dpgate.engines.registry` — :class:`EngineSet`: one engine per dataset, routing, reloads.

Importing this package imports no database client: each engine module is
imported when a dataset uses it.
"""

from dpgate.engines.base import Engine, EngineOptions, LoadReport, TableInfo, source_files, source_fingerprint
from dpgate.engines.registry import EngineSet, open_engine

__all__ = ["Engine", "EngineOptions", "EngineSet", "LoadReport", "TableInfo", "open_engine",
           "source_files", "source_fingerprint"]
