"""Gateway settings: CLI flags, then ``DPGATE_*`` environment variables, then defaults.

Settings are built explicitly (``Settings()`` or ``Settings(**overrides)``) and
passed to whatever needs them; nothing reads them at import time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal
from urllib.parse import parse_qsl, urlencode, urlsplit

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
        query_timeout_s: per-query DuckDB timeout in seconds.
        max_body_bytes: largest accepted HTTP request body (413 above).
        http_header_timeout_s, http_body_timeout_s: seconds a client has to send a request's
            headers, then its body (408 ``request_timeout`` after; the connection is closed).
        http_keep_alive_s: seconds an idle keep-alive connection stays open.
        http_max_connections: open connections or requests in flight above which requests are
            answered 503 ``server_busy``.
        ledger_wait_s: seconds a request waits for the ledger before 503 ``ledger_unavailable``.
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
            a random key created once in the shared release store, so replicas sharing a ledger share it).
    """

    model_config = SettingsConfigDict(env_prefix="DPGATE_", extra="ignore")

    policies: Path = Field(
        default=Path("./policies"),
        description="policies folder: one TOML file per dataset",
        json_schema_extra={"flag": "--policies"},
    )
    home: Path = Field(
        default=Path("./.dpgate"),
        description="state folder: SQLite ledger and release store, API keys file",
        json_schema_extra={"flag": "--home"},
    )
    ledger_url: str | None = Field(
        default=None,
        description="ledger and release store; `postgresql://…` for a ledger shared by replicas",
        json_schema_extra={"flag": "--ledger-url", "default_text": "`sqlite:///$DPGATE_HOME/ledger.sqlite`"},
    )
    host: str = Field(default="127.0.0.1", description="bind address of `dpgate serve`",
                      json_schema_extra={"flag": "--host"})
    port: int = Field(default=8000, ge=1, le=65535, description="bind port of `dpgate serve`",
                      json_schema_extra={"flag": "--port"})
    keys_file: Path | None = Field(
        default=None,
        description="API keys file (SHA-256 digests only, mode 0600)",
        json_schema_extra={"flag": "--keys-file", "default_text": "`$DPGATE_HOME/keys.json`"},
    )
    query_timeout_s: float = Field(
        default=30.0, gt=0, description="per-query engine timeout, seconds (504 `query_timeout`: `details.charged` false when it came before the charge, nothing charged; true after it: the charge stays, `details.charge_id`)",
        json_schema_extra={"flag": "--query-timeout"},
    )
    max_body_bytes: int = Field(
        default=64 * 1024, gt=0, description="largest HTTP request body, bytes (413 `payload_too_large` above)",
        json_schema_extra={"flag": "--max-body-bytes"},
    )
    http_header_timeout_s: float = Field(
        default=10.0, gt=0,
        description="seconds a client has to send a request's line and headers (from its first byte, or from "
        "the connection's start): then 408 `request_timeout` and the connection is closed",
        json_schema_extra={"flag": "--http-header-timeout"},
    )
    http_body_timeout_s: float = Field(
        default=10.0, gt=0,
        description="seconds a client has to send a request's whole body once its headers are in "
        "(408 `request_timeout`, connection closed)",
        json_schema_extra={"flag": "--http-body-timeout"},
    )
    http_keep_alive_s: float = Field(
        default=5.0, gt=0, description="seconds an idle keep-alive connection stays open between requests",
        json_schema_extra={"flag": "--http-keep-alive"},
    )
    http_max_connections: int = Field(
        default=1000, ge=1,
        description="open connections (or requests in flight) above which a request is answered 503 "
        "`server_busy` with `Retry-After`",
        json_schema_extra={"flag": "--http-max-connections"},
    )
    ledger_wait_s: float = Field(
        default=2.0, gt=0,
        description="seconds a request waits for the ledger (a SQLite write lock; a PostgreSQL pooled connection "
        "or lock) before 503 `ledger_unavailable` with `Retry-After`; a `busy_timeout_ms`, `pool_timeout_ms` or "
        "`lock_timeout_ms` in the ledger URL wins",
        json_schema_extra={"flag": "--ledger-wait"},
    )
    duckdb_memory_limit: str | None = Field(
        default=None, description="DuckDB `memory_limit`, e.g. `4GB`",
        json_schema_extra={"flag": "--duckdb-memory-limit", "default_text": "DuckDB's default (80 % of RAM)"},
    )
    duckdb_threads: int | None = Field(
        default=None, ge=1, description="DuckDB `threads`",
        json_schema_extra={"flag": "--duckdb-threads", "default_text": "DuckDB's default (the cores)"},
    )
    duckdb_load: Literal["auto", "memory", "in_place"] = Field(
        default="auto",
        description="how DuckDB datasets without a `[dataset] load` read their files: `memory` (a copy), "
        "`in_place` (views over the files) or `auto` (in place above the threshold below)",
        json_schema_extra={"flag": "--duckdb-load"},
    )
    duckdb_in_place_above: int = Field(
        default=1_000_000_000, ge=0,
        description="`auto` load: a table whose source files total more bytes is queried in place",
        json_schema_extra={"flag": "--duckdb-in-place-above"},
    )
    spark_master: str = Field(
        default="local[*]", description="Spark master URL of datasets with `engine = \"spark\"`",
        json_schema_extra={"flag": "--spark-master"},
    )
    fingerprint_key: str | None = Field(
        default=None,
        repr=False,
        description="secret keying the published data version when it is a fingerprint of the source files; "
        "replicas sharing a ledger should share it (environment only: a secret does not belong on a command line)",
        json_schema_extra={"default_text": "random, created once in the release store (shared by replicas of one ledger)"},
    )

    def resolved_ledger_url(self) -> str:
        """The ledger URL, defaulting to ``sqlite:///<home>/ledger.sqlite``."""
        if self.ledger_url:
            return self.ledger_url
        return f"sqlite:///{(self.home / 'ledger.sqlite').resolve()}"

    def ledger_url_with_wait(self) -> str:
        """The ledger URL the gateway opens: :meth:`resolved_ledger_url` with the request path's
        bounded waits (``ledger_wait_s`` as SQLite ``busy_timeout_ms``, PostgreSQL
        ``pool_timeout_ms`` and ``lock_timeout_ms``) unless the URL sets them itself."""
        url = self.resolved_ledger_url()
        wait_ms = str(max(1, round(self.ledger_wait_s * 1000)))
        scheme = url.split(":", 1)[0].lower()
        names = ("busy_timeout_ms",) if scheme == "sqlite" else ("pool_timeout_ms", "lock_timeout_ms")
        present = {k for k, _ in parse_qsl(urlsplit(url).query, keep_blank_values=True)}
        extra = urlencode([(name, wait_ms) for name in names if name not in present])
        if not extra:
            return url
        return url + ("&" if "?" in url else "?") + extra

    def resolved_keys_file(self) -> Path:
        """The API keys file, defaulting to ``<home>/keys.json``."""
        return self.keys_file if self.keys_file is not None else self.home / "keys.json"


def setting_flag(name: str) -> str | None:
    """The command-line flag of setting ``name`` (e.g. ``"--port"``), or None (environment only)."""
    extra = Settings.model_fields[name].json_schema_extra
    return extra.get("flag") if isinstance(extra, dict) else None  # type: ignore[return-value]


def configuration_table() -> str:
    """The README's configuration table (Markdown), generated from :class:`Settings`.

    One row per setting: what it is, its ``DPGATE_*`` variable, its flag and its
    default. A test checks that README.md contains exactly this table.
    """
    prefix = Settings.model_config.get("env_prefix", "")
    rows = ["| setting | env | flag | default |", "|---|---|---|---|"]
    for name, field in Settings.model_fields.items():
        extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
        default = extra.get("default_text")
        if default is None:
            value = field.default
            default = f"`{value}`" if not isinstance(value, Path) else f"`{value.as_posix()}`"
            if isinstance(value, Path) and not value.is_absolute():
                default = f"`./{value.as_posix()}`"
        flag = extra.get("flag")
        rows.append(
            f"| {field.description or name} | `{prefix}{name.upper()}` | {f'`{flag}`' if flag else '—'} | {default} |"
        )
    return "\n".join(rows) + "\n"
