"""API keys and principals: who is calling, and what their role lets them do.

An API key is a random secret handed to one principal ``{name, role, consumer}``.
Keys live in a JSON file **outside** the policies folder (``Settings.resolved_keys_file()``,
default ``$DPGATE_HOME/keys.json``, file mode 0600). The file stores, per key, only

* ``key_id`` — a short public prefix of the key (``dpg_<key_id>_<secret>``), used to
  find the entry, and shown by ``dpgate keys list``;
* ``sha256`` — the hex SHA-256 digest of the whole key string.

The secret itself is printed once when the key is created and never stored. Keys
carry 256 bits of entropy (``secrets.token_urlsafe(32)``), so a fast hash is the
right tool (a slow password hash protects low-entropy secrets; this is not one).
The presented key's digest is compared with :func:`hmac.compare_digest`.

Roles and what each may do are fixed in one table, :data:`ROLE_PERMISSIONS`:

============  ============================================================================
role          permissions
============  ============================================================================
analyst       run queries and explain them, charged to the key's consumer (the consumer
              always comes from the key, never from the request); read releases and
              datasets; read budgets; declare, read and close search records
dashboard     read stored releases (free post-processing) and datasets; pin and unpin
              stored releases on dashboards (curation; spends nothing)
admin         read releases, datasets, every budget and the ledger; explain queries;
              change a population's cap (a governance event with a reason); post
              external charges for any consumer; search records; curate dashboards
service       post external charges (for its own consumer only, if the key names one);
              read datasets; declare, read and close search records
============  ============================================================================

No role both spends budget and governs it: admins do not run queries.
"""

from __future__ import annotations

import datetime as _dt
import enum
import hashlib
import hmac
import json
import logging
import os
import re
import secrets
import stat
import tempfile
import threading
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Collection, Iterable

from dpgate.errors import (
    Conflict,
    Forbidden,
    InvalidRequest,
    NotFound,
    PolicyError,
    Unauthenticated,
    UnknownConsumer,
    did_you_mean,
)

log = logging.getLogger(__name__)

#: Prefix of every dpgate API key: ``dpg_<key_id>_<secret>``.
KEY_PREFIX = "dpg_"
#: Version of the keys-file format written by this module.
KEYS_FILE_VERSION = 1

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}$")
_CONSUMER_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@/+-]{0,127}$")  # the ledger's name rule
_KEY_RE = re.compile(r"^dpg_([0-9a-f]{12})_([A-Za-z0-9_-]{20,128})$")


class Permission(str, enum.Enum):
    """One action of the HTTP API that a role may be granted."""

    QUERY = "query"  #: POST /v1/queries (spends the key's consumer's allocation)
    EXPLAIN = "explain"  #: POST /v1/queries/explain (reads no data, charges nothing)
    READ_RELEASES = "read_releases"  #: GET /v1/releases, GET /v1/releases/{id}
    READ_DATASETS = "read_datasets"  #: GET /v1/datasets, GET /v1/datasets/{name}
    READ_BUDGET = "read_budget"  #: GET /v1/datasets/{name}/budget
    CHARGE_EXTERNAL = "charge_external"  #: POST /v1/ledger/charges
    READ_LEDGER = "read_ledger"  #: GET /v1/admin/ledger
    SET_CAP = "set_cap"  #: POST /v1/admin/populations/{p}/cap
    RELOAD_DATASETS = "reload_datasets"  #: POST /v1/admin/datasets/{name}/reload
    SEARCH = "search"  #: POST/GET /v1/searches, POST /v1/searches/{id}/close (issue 15)
    CURATE_DASHBOARDS = "curate_dashboards"  #: pin/unpin stored releases on a dashboard (issue 24)


class Role(str, enum.Enum):
    """The role of a principal; see :data:`ROLE_PERMISSIONS`."""

    ANALYST = "analyst"
    DASHBOARD = "dashboard"
    ADMIN = "admin"
    SERVICE = "service"


#: The one role → permission table of the gateway.
ROLE_PERMISSIONS: dict[Role, frozenset[Permission]] = {
    Role.ANALYST: frozenset(
        {
            Permission.QUERY,
            Permission.EXPLAIN,
            Permission.READ_RELEASES,
            Permission.READ_DATASETS,
            Permission.READ_BUDGET,
            Permission.SEARCH,
        }
    ),
    Role.DASHBOARD: frozenset({Permission.READ_RELEASES, Permission.READ_DATASETS, Permission.CURATE_DASHBOARDS}),
    Role.ADMIN: frozenset(
        {
            Permission.EXPLAIN,
            Permission.READ_RELEASES,
            Permission.READ_DATASETS,
            Permission.READ_BUDGET,
            Permission.READ_LEDGER,
            Permission.SET_CAP,
            Permission.RELOAD_DATASETS,
            Permission.CHARGE_EXTERNAL,
            Permission.SEARCH,
            Permission.CURATE_DASHBOARDS,
        }
    ),
    Role.SERVICE: frozenset({Permission.CHARGE_EXTERNAL, Permission.READ_DATASETS, Permission.SEARCH}),
}

#: Roles whose keys must name a consumer (the allocation they spend).
ROLES_REQUIRING_CONSUMER = frozenset({Role.ANALYST, Role.SERVICE})


@dataclass(frozen=True)
class Principal:
    """The authenticated caller of one request.

    Attributes:
        name: the key's unique name (used as ``actor`` in governance events).
        role: the principal's :class:`Role`.
        consumer: the allocation the principal spends (analyst) or charges for
            (service); ``None`` for roles that spend nothing.
        key_id: the public prefix of the key that authenticated the request.
    """

    name: str
    role: Role
    consumer: str | None
    key_id: str

    def can(self, permission: Permission) -> bool:
        """Whether the principal's role grants ``permission``."""
        return permission in ROLE_PERMISSIONS[self.role]

    def require(self, permission: Permission) -> None:
        """Raise :class:`~dpgate.errors.Forbidden` unless the role grants ``permission``."""
        if not self.can(permission):
            raise Forbidden(
                f"role {self.role.value!r} may not {permission.value.replace('_', ' ')}",
                {"role": self.role.value, "permission": permission.value},
            )


@dataclass(frozen=True)
class KeyRecord:
    """One entry of the keys file (no secret: only its SHA-256 digest).

    Attributes:
        name: unique name of the key among active keys.
        role: role value (``"analyst"``, ``"dashboard"``, ``"admin"``, ``"service"``).
        consumer: consumer (allocation) name or ``None``.
        key_id: 12 hex characters, the public prefix of the key.
        sha256: hex SHA-256 digest of the full key string.
        created_at: ISO-8601 UTC timestamp.
        revoked_at: ISO-8601 UTC timestamp, or ``None`` while the key is active.
    """

    name: str
    role: str
    consumer: str | None
    key_id: str
    sha256: str
    created_at: str
    revoked_at: str | None = None

    @property
    def active(self) -> bool:
        """Whether the key has not been revoked."""
        return self.revoked_at is None

    def public_dict(self) -> dict[str, Any]:
        """The record without its digest (what ``dpgate keys list`` shows)."""
        d = asdict(self)
        d.pop("sha256")
        return d


def _article(word: str) -> str:
    """``"an"`` before a vowel sound (analyst, admin), else ``"a"``."""
    return "an" if word[:1].lower() in "aeiou" else "a"


def hash_key(key: str) -> str:
    """Hex SHA-256 digest of an API key string (UTF-8)."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def parse_role(value: str) -> Role:
    """Parse a role name; raises :class:`~dpgate.errors.InvalidRequest` listing the valid roles."""
    try:
        return Role(value)
    except ValueError:
        raise InvalidRequest(
            f"unknown role {value!r}; expected one of {', '.join(r.value for r in Role)}",
            {"role": value, "allowed": [r.value for r in Role]},
        ) from None


class KeyStore:
    """The API keys file: create, list, revoke and authenticate keys.

    The file is re-read whenever its modification time or size changes, so a key
    added or revoked with ``dpgate keys`` takes effect in a running server
    without a restart. Writes go to a temporary file (mode 0600) that replaces
    the old one atomically.

    Args:
        path: the keys file (need not exist yet; it is created on the first add).

    Raises:
        PolicyError: (on reading) the file is not valid JSON or not in the
            expected format.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._stamp: tuple[int, int] | None = None
        self._records: list[KeyRecord] = []

    # --- reading ---------------------------------------------------------------------

    def _file_stamp(self) -> tuple[int, int] | None:
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return None
        return (st.st_mtime_ns, st.st_size)

    def _load(self) -> list[KeyRecord]:
        """(Re)read the file if it changed; returns the current records."""
        with self._lock:
            stamp = self._file_stamp()
            if stamp == self._stamp:
                return self._records
            if stamp is None:
                records: list[KeyRecord] = []
            else:
                records = self._read_file()
            self._stamp, self._records = stamp, records
            return records

    def _read_file(self) -> list[KeyRecord]:
        try:
            mode = stat.S_IMODE(self.path.stat().st_mode)
            if mode & 0o077:
                log.warning(
                    "API keys file %s is readable by others (mode %o); run chmod 600 on it",
                    self.path,
                    mode,
                )
            raw = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise PolicyError(
                f"cannot read API keys file {self.path}: {exc.__class__.__name__}",
                {"file": str(self.path)},
            ) from None
        if not isinstance(raw, dict) or not isinstance(raw.get("keys"), list):
            raise PolicyError(
                f"API keys file {self.path} is not a dpgate keys file (expected an object with 'keys')",
                {"file": str(self.path)},
            )
        records = []
        fields = set(KeyRecord.__dataclass_fields__)
        for i, entry in enumerate(raw["keys"]):
            if not isinstance(entry, dict) or not {"name", "role", "key_id", "sha256"} <= set(entry):
                raise PolicyError(
                    f"API keys file {self.path}: entry {i} lacks name, role, key_id or sha256",
                    {"file": str(self.path), "entry": i},
                )
            if entry["role"] not in {r.value for r in Role}:
                raise PolicyError(
                    f"API keys file {self.path}: entry {i} has unknown role {entry['role']!r}",
                    {"file": str(self.path), "entry": i},
                )
            entry = {k: v for k, v in entry.items() if k in fields}
            entry.setdefault("consumer", None)
            entry.setdefault("created_at", "")
            consumer = entry["consumer"]
            if consumer is not None and (not isinstance(consumer, str) or not _CONSUMER_RE.match(consumer)):
                raise PolicyError(
                    f"API keys file {self.path}: entry {i} ({entry['name']!r}) has an invalid consumer name",
                    {"file": str(self.path), "entry": i},
                )
            if Role(entry["role"]) in ROLES_REQUIRING_CONSUMER and not consumer:
                # the consumer that pays always comes from the key: a spending key without one
                # could otherwise charge whatever consumer a request names
                raise PolicyError(
                    f"API keys file {self.path}: entry {i} ({entry['name']!r}) is {_article(entry['role'])} "
                    f"{entry['role']} key without a consumer; every {entry['role']} key must name the "
                    "allocation it spends (revoke it and create it again with "
                    f"'dpgate keys add NAME --role {entry['role']} --consumer C')",
                    {"file": str(self.path), "entry": i, "name": entry["name"]},
                )
            records.append(KeyRecord(**entry))
        return records

    def records(self, *, include_revoked: bool = False) -> list[KeyRecord]:
        """The key records in creation order (active ones only unless ``include_revoked``)."""
        return [r for r in self._load() if include_revoked or r.active]

    # --- writing ---------------------------------------------------------------------

    def _write(self, records: Iterable[KeyRecord]) -> None:
        records = list(records)
        parent = self.path.parent
        if not parent.exists():
            parent.mkdir(parents=True, mode=0o700)
        payload = {"version": KEYS_FILE_VERSION, "keys": [asdict(r) for r in records]}
        fd, tmp = tempfile.mkstemp(prefix=".keys-", suffix=".json", dir=parent)
        try:
            os.fchmod(fd, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump(payload, fh, indent=2)
                fh.write("\n")
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            raise
        with self._lock:
            self._stamp, self._records = self._file_stamp(), records

    def add(
        self,
        name: str,
        *,
        role: str | Role,
        consumer: str | None = None,
        known_consumers: Collection[str] | None = None,
    ) -> tuple[str, KeyRecord]:
        """Create a key for a new principal and store its digest.

        Args:
            name: unique among active keys; letters, digits, ``_.@-``, at most 64 characters.
            role: one of :class:`Role`.
            consumer: the allocation the key spends; required for ``analyst`` and
                ``service`` keys.
            known_consumers: the consumers the policies allocate budget to; when
                given, any other consumer is refused (a key for it would fail
                every query). None: not checked.

        Returns:
            ``(key, record)``: the secret key string (shown once, never stored) and
            the stored record.

        Raises:
            InvalidRequest: bad name, role or consumer; a consumer missing where required.
            UnknownConsumer: ``consumer`` is not in ``known_consumers``.
            Conflict: an active key with that name exists.
        """
        role = parse_role(role.value if isinstance(role, Role) else role)
        if not _NAME_RE.match(name or ""):
            raise InvalidRequest(
                "key name must be 1-64 characters: letters, digits, '_', '.', '@' or '-', "
                "starting with a letter or digit",
                {"name": name},
            )
        if consumer is not None and not _CONSUMER_RE.match(consumer):
            raise InvalidRequest(
                "consumer must be 1-128 characters: letters, digits and ._:@/+- (starting alphanumeric)",
                {"consumer": consumer},
            )
        if role in ROLES_REQUIRING_CONSUMER and not consumer:
            raise InvalidRequest(
                f"{_article(role.value)} {role.value} key needs --consumer (the allocation it spends)",
                {"role": role.value},
            )
        if consumer is not None and known_consumers is not None and consumer not in known_consumers:
            known = sorted(known_consumers)
            raise UnknownConsumer(
                f"no policy allocates budget to consumer {consumer!r}{did_you_mean(consumer, known)}; "
                f"allocations: {', '.join(known) if known else '(none)'}",
                {"consumer": consumer, "consumers": known},
            )
        records = self.records(include_revoked=True)
        if any(r.name == name and r.active for r in records):
            raise Conflict(f"an active API key named {name!r} exists; revoke it first", {"name": name})
        known_ids = {r.key_id for r in records}
        while True:
            key_id = secrets.token_hex(6)
            if key_id not in known_ids:
                break
        key = f"{KEY_PREFIX}{key_id}_{secrets.token_urlsafe(32)}"
        record = KeyRecord(
            name=name,
            role=role.value,
            consumer=consumer,
            key_id=key_id,
            sha256=hash_key(key),
            created_at=_now(),
        )
        self._write([*records, record])
        return key, record

    def revoke(self, name: str) -> KeyRecord:
        """Revoke the active key named ``name`` (it stays in the file, marked revoked).

        Raises:
            NotFound: no active key has that name.
        """
        records = self.records(include_revoked=True)
        for i, r in enumerate(records):
            if r.name == name and r.active:
                revoked = KeyRecord(**{**asdict(r), "revoked_at": _now()})
                records[i] = revoked
                self._write(records)
                return revoked
        raise NotFound(f"no active API key named {name!r}", {"name": name})

    # --- authentication --------------------------------------------------------------

    def authenticate(self, key: str | None) -> Principal:
        """Map a presented API key to its principal.

        The key's ``key_id`` finds the entry; the SHA-256 digest of the whole key is
        compared with :func:`hmac.compare_digest` (constant time).

        Raises:
            Unauthenticated: no key, a malformed key, an unknown or revoked key.
        """
        if not key:
            raise Unauthenticated(
                "missing API key: send 'Authorization: Bearer <key>' or 'X-API-Key: <key>'"
            )
        match = _KEY_RE.match(key.strip())
        if match is None:
            raise Unauthenticated(f"invalid API key: dpgate keys look like '{KEY_PREFIX}<12 hex digits>_<secret>'")
        key_id = match.group(1)
        digest = hash_key(key.strip())
        found: KeyRecord | None = None
        for r in self._load():
            # compare every candidate with the same key_id (normally one) in constant time
            if r.key_id == key_id and hmac.compare_digest(r.sha256, digest):
                found = r
        if found is None:
            raise Unauthenticated("invalid API key: no key with this id and secret (check for a copy-paste error)")
        if not found.active:
            raise Unauthenticated(
                f"API key {found.name!r} was revoked at {found.revoked_at}; ask an admin for a new key",
                {"key": found.name, "revoked_at": found.revoked_at},
            )
        return Principal(name=found.name, role=Role(found.role), consumer=found.consumer, key_id=found.key_id)
