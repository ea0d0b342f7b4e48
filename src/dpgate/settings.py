"""Gateway settings: CLI flags, then ``DPGATE_*`` environment variables, then defaults.

Settings are built explicitly (``Settings()`` or ``Settings(**overrides)``) and
passed to whatever needs them; nothing reads them at import time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    """Configuration of one gateway process.

    Attributes:
        policies: folder of ``*.toml`` policy files (``DPGATE_POLICIES``).
        home: state folder: SQLite ledger and release store, API keys file
            (``DPGATE_HOME``).
        ledger_url: ``sqlite:///path`` (default: ``$home/ledger.sqlite``) or
            ``postgresql://…`` for a ledger shared by several replicas
            (``DPGATE_LEDGER_URL``).
        host, port: bind address of ``dpgate serve``.
        keys_file: API keys file (hashes only); default ``$home/keys.json``.
        query_timeout_s: per-query timeout in seconds, on every engine (DuckDB interrupt,
            PostgreSQL ``statement_timeout``, Spark job interruption).
        max_body_bytes: largest accepted HTTP request body (413 above).
        duckdb_memory_limit: DuckDB ``memory_limit`` (e.g. ``"4GB"``), or None.
        duckdb_threads: DuckDB ``threads``, or None for DuckDB's default.
        duckdb_load: how DuckDB datasets without a ``[dataset] load`` are read:
            ``"auto"`` (in place above ``duckdb_in_place_above`` bytes, else in memory),
            ``"memory"`` or ``"in_place"`` (``DPGATE_DUCKDB_LOAD``).
        duckdb_in_place_above: size in bytes of a table's source files above which
            ``auto`` queries it in place (``DPGATE_DUCKDB_IN_PLACE_ABOVE``; 1 GB).
        spark_master: Spark master URL for datasets with ``engine = "spark"``
            (``DPGATE_SPARK_MASTER``; default ``local[*]``).
        fingerprint_key: secret keying the published data version when it is a
            fingerprint of the source files (``DPGATE_FINGERPRINT_KEY``; default:
            a random key kept in ``$home/fingerprint.key``).
    """

    model_config = SettingsConfigDict(env_prefix="DPGATE_", extra="ignore")

    policies: Path = Path("./policies")
    home: Path = Path("./.dpgate")
    ledger_url: str | None = None
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=1, le=65535)
    keys_file: Path | None = None
    query_timeout_s: float = Field(default=30.0, gt=0)
    max_body_bytes: int = Field(default=64 * 1024, gt=0)
    duckdb_memory_limit: str | None = None
    duckdb_threads: int | None = Field(default=None, ge=1)
    duckdb_load: Literal["auto", "memory", "in_place"] = "auto"
    duckdb_in_place_above: int = Field(default=1_000_000_000, ge=0)
    spark_master: str = "local[*]"
    fingerprint_key: str | None = Field(default=None, repr=False)

    def resolved_ledger_url(self) -> str:
        """The ledger URL, defaulting to ``sqlite:///<home>/ledger.sqlite``."""
        if self.ledger_url:
            return self.ledger_url
        return f"sqlite:///{(self.home / 'ledger.sqlite').resolve()}"

    def resolved_keys_file(self) -> Path:
        """The API keys file, defaulting to ``<home>/keys.json``."""
        return self.keys_file if self.keys_file is not None else self.home / "keys.json"
