"""Ledger entries: the append-only charges and governance events, and their hash chain.

Every entry is a dict with the stored columns (:data:`CHARGE_COLUMNS`,
:data:`EVENT_COLUMNS`), its ``type`` and its ``hash``: SHA-256 of its canonical
serialisation (:func:`canonical_json`, every field but ``hash``), which
includes ``prev_hash``, the previous entry's hash. Editing, inserting or
dropping an entry therefore changes every later hash.

Columns added after the first schema (:data:`OPTIONAL_CHARGE_COLUMNS`) are part
of an entry, and of its hash, only when set: entries written before they
existed keep their hashes.
"""

from __future__ import annotations

import hashlib
import heapq
import json
import math
import secrets
from dataclasses import dataclass
from datetime import datetime, timezone
from functools import lru_cache
from typing import Any, Iterable, Iterator, Mapping

from dpgate.accounting import Cost
from dpgate.errors import InvalidBudget, InvalidRequest
from dpgate.ledger.cohorts import cohorts_json, validate_cohorts
from dpgate.ledger.validation import is_utf8, real, validate_cost, validate_name, validate_text

__all__ = [
    "GENESIS_HASH",
    "CHARGE_COLUMNS",
    "OPTIONAL_CHARGE_COLUMNS",
    "STORED_CHARGE_COLUMNS",
    "EVENT_COLUMNS",
    "utc_now",
    "canonical_json",
    "entry_hash",
    "ChargeRequest",
    "prepare_charge",
    "new_charge_entry",
    "new_event_entry",
    "charge_entry",
    "event_entry",
    "display_charge",
    "display_event",
    "event_cap",
    "event_old_cap",
    "exported_entry",
    "hashed_entry",
    "JSON_TEXT_FIELDS",
    "iter_sorted_entries",
]

#: ``prev_hash`` of the first entry of a ledger (64 zeros).
GENESIS_HASH = "0" * 64

#: Columns of a stored charge present in every entry, in storage order.
CHARGE_COLUMNS: tuple[str, ...] = (
    "seq", "charge_id", "population", "consumer", "kind", "rho", "epsilon_at_delta", "delta",
    "cost", "purpose", "release_key", "metadata", "created_at", "prev_hash", "hash",
)  # fmt: skip

#: Columns of a stored charge that are part of an entry only when set: ``selection_delta``
#: (schema version 2) — the δ_q the charge spent on partition selection; ``cohorts`` (schema
#: version 5, :mod:`dpgate.ledger.cohorts`) — the cohorts it drew on, a compact sorted JSON list.
OPTIONAL_CHARGE_COLUMNS: tuple[str, ...] = ("selection_delta", "cohorts")

#: Every stored charge column, in storage order.
STORED_CHARGE_COLUMNS: tuple[str, ...] = CHARGE_COLUMNS + OPTIONAL_CHARGE_COLUMNS

#: Columns of a stored governance event, in storage order.
EVENT_COLUMNS: tuple[str, ...] = (
    "seq", "event_id", "population", "kind", "actor", "reason", "old", "new", "created_at",
    "prev_hash", "hash",
)  # fmt: skip


def utc_now() -> str:
    """The current time as an ISO-8601 UTC string with microseconds (``…Z``)."""
    return datetime.now(timezone.utc).isoformat(timespec="microseconds").replace("+00:00", "Z")


def canonical_json(obj: Any) -> str:
    """The canonical serialisation hashed by the chain: sorted keys, no spaces, UTF-8.

    Floats are written with Python's shortest round-trip ``repr`` (so a value
    read back from the store serialises identically); ``inf`` as ``Infinity``.
    """
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=True)


def entry_hash(entry: Mapping[str, Any]) -> str:
    """SHA-256 hex digest of an entry's canonical serialisation (every field but ``hash``).

    The entry includes ``prev_hash`` (the previous entry's hash, or
    :data:`GENESIS_HASH`), so the entries form a hash chain: editing, inserting
    or dropping an entry changes every later hash.
    """
    body = {k: v for k, v in entry.items() if k != "hash"}
    return hashlib.sha256(canonical_json(body).encode("utf-8")).hexdigest()


@lru_cache(maxsize=1024)
def _cost_json_rho(cost: Cost) -> tuple[str, float]:
    """The stored (canonical JSON, ρ or ρ-bound) of a cost (memoised: costs repeat)."""
    return canonical_json(cost.to_dict()), cost.rho_bound()


@dataclass(frozen=True)
class ChargeRequest:
    """A validated charge, ready to be checked and stored (see :func:`prepare_charge`).

    Attributes:
        population, consumer: who pays.
        cost: the validated cost.
        purpose: the stored description.
        release_key: the single-flight key or None.
        metadata_json: the metadata's canonical JSON text (sorted keys, no NaN/∞).
        cost_json: the cost's canonical JSON text (``Cost.to_dict``).
        rho: the cost's ρ (or ρ-bound of an RDP curve over every finite grid order,
            ``Cost.rho_bound``; may be ∞), stored in the ``rho`` column.
        selection_delta: δ_q spent on partition selection (0: none).
        cohorts: the cohorts the charge draws on (sorted), or None for a population without cohorts.
    """

    population: str
    consumer: str
    cost: Cost
    purpose: str
    release_key: str | None
    metadata_json: str
    cost_json: str
    rho: float
    selection_delta: float = 0.0
    cohorts: tuple[str, ...] | None = None


def prepare_charge(
    population: Any,
    consumer: Any,
    cost: Any,
    *,
    purpose: Any,
    release_key: Any = None,
    metadata: Any = None,
    selection_delta: Any = 0.0,
    cohorts: Any = None,
) -> ChargeRequest:
    """Validate the arguments of :meth:`Ledger.charge` before any store access.

    Raises:
        InvalidRequest: bad population or consumer name, purpose (non-empty, ≤ 10000
            characters), release_key (non-empty, ≤ 512), or metadata (not a mapping,
            not JSON-serialisable, NaN or ∞).
        InvalidBudget: invalid cost (:func:`~dpgate.ledger.validation.validate_cost`), or a
            selection δ not a finite number in [0, 1).
        InvalidRequest: bad cohorts (:func:`dpgate.ledger.cohorts.validate_cohorts`).
    """
    validate_name(population, "population")
    validate_name(consumer, "consumer")
    cost = validate_cost(cost)
    validate_text(purpose, "purpose")
    validate_text(release_key, "release_key", optional=True, limit=512)
    sel = real(selection_delta, "selection_delta", InvalidBudget)
    if not 0.0 <= sel < 1.0:
        raise InvalidBudget(f"selection_delta must be in [0, 1), got {sel!r}", {"selection_delta": repr(sel)})
    if metadata is not None and not isinstance(metadata, Mapping):
        raise InvalidRequest("metadata must be a mapping", {})
    try:  # the canonical serialisation, refusing NaN and infinity
        meta_json = json.dumps(dict(metadata or {}), sort_keys=True, separators=(",", ":"),
                               ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidRequest(f"metadata must be JSON-serialisable without NaN or infinity: {exc}",
                             {}) from None
    if not is_utf8(meta_json):
        raise InvalidRequest("metadata must be valid Unicode (no lone surrogates)", {})
    cost_json, rho = _cost_json_rho(cost)
    return ChargeRequest(population, consumer, cost, purpose, release_key, meta_json, cost_json, rho, sel,
                         validate_cohorts(cohorts))


def new_charge_entry(
    request: ChargeRequest,
    *,
    seq: int,
    prev_hash: str,
    epsilon_at_delta: float,
    delta: float,
) -> dict[str, Any]:
    """A new charge entry (a dict with :data:`CHARGE_COLUMNS`, the optional columns that are
    set, ``type`` and its ``hash``).

    Args:
        request: the validated charge.
        seq: its position in the hash chain (the head's ``seq`` + 1).
        prev_hash: the head's hash (:data:`GENESIS_HASH` for the first entry).
        epsilon_at_delta: the charge alone as ε at ``delta`` (the ledger's conversion).
        delta: the cap's δ.
    """
    entry: dict[str, Any] = {
        "type": "charge",
        "seq": seq,
        "charge_id": "chg_" + secrets.token_hex(12),
        "population": request.population,
        "consumer": request.consumer,
        "kind": request.cost.kind,
        "rho": request.rho,
        "epsilon_at_delta": epsilon_at_delta,
        "delta": delta,
        "cost": request.cost_json,
        "purpose": request.purpose,
        "release_key": request.release_key,
        "metadata": request.metadata_json,
        "created_at": utc_now(),
        "prev_hash": prev_hash,
    }
    if request.selection_delta:
        entry["selection_delta"] = request.selection_delta
    if request.cohorts is not None:
        entry["cohorts"] = cohorts_json(request.cohorts)
    entry["hash"] = entry_hash(entry)
    return entry


def new_event_entry(
    population: str,
    kind: str,
    actor: str,
    reason: str,
    old: Mapping[str, Any] | None,
    new: Mapping[str, Any],
    *,
    seq: int,
    prev_hash: str,
) -> dict[str, Any]:
    """A new governance event entry (a dict with :data:`EVENT_COLUMNS`, ``type`` and its ``hash``).

    Args:
        population: the population concerned.
        kind: ``population_created``, ``cap_changed`` or ``allocations_changed``.
        actor, reason: who and why.
        old, new: the values before (None on creation) and after, stored as canonical JSON.
        seq, prev_hash: the chain position and the head's hash.
    """
    entry: dict[str, Any] = {
        "type": "event",
        "seq": seq,
        "event_id": "evt_" + secrets.token_hex(12),
        "population": population,
        "kind": kind,
        "actor": actor,
        "reason": reason,
        "old": None if old is None else canonical_json(old),
        "new": canonical_json(new),
        "created_at": utc_now(),
        "prev_hash": prev_hash,
    }
    entry["hash"] = entry_hash(entry)
    return entry


def charge_entry(row: Iterable[Any]) -> dict[str, Any]:
    """A stored charge row (:data:`STORED_CHARGE_COLUMNS` order) as a chain entry dict (``type``
    "charge"); optional columns that are NULL are left out (they are not part of the hash)."""
    d = dict(zip(STORED_CHARGE_COLUMNS, row))
    for name in OPTIONAL_CHARGE_COLUMNS:
        if d.get(name) is None:
            d.pop(name, None)
    d["type"] = "charge"
    return d


def event_entry(row: Iterable[Any]) -> dict[str, Any]:
    """A stored event row (:data:`EVENT_COLUMNS` order) as a chain entry dict (``type`` "event")."""
    d = dict(zip(EVENT_COLUMNS, row))
    d["type"] = "event"
    return d


def display_charge(entry: Mapping[str, Any]) -> dict[str, Any]:
    """A charge entry for :meth:`Ledger.entries`: ``cost`` and ``metadata`` parsed, ∞ as ``"inf"``."""
    d = dict(entry)
    d["cost"] = json.loads(d["cost"])
    d["metadata"] = json.loads(d["metadata"])
    if isinstance(d.get("cohorts"), str):
        d["cohorts"] = json.loads(d["cohorts"])
    for name in ("epsilon_at_delta", "rho"):
        if isinstance(d.get(name), float) and math.isinf(d[name]):
            d[name] = "inf"
    return d


def display_event(entry: Mapping[str, Any]) -> dict[str, Any]:
    """An event entry for :meth:`Ledger.events`: ``old`` and ``new`` parsed."""
    d = dict(entry)
    d["old"] = json.loads(d["old"]) if d["old"] is not None else None
    d["new"] = json.loads(d["new"])
    return d


#: Entry fields stored (and hashed) as canonical JSON text.
JSON_TEXT_FIELDS: tuple[str, ...] = ("cost", "metadata", "old", "new")


def exported_entry(entry: Mapping[str, Any]) -> dict[str, Any]:
    """A chain entry as ``dpgate ledger export`` writes it: the JSON-text fields
    (:data:`JSON_TEXT_FIELDS`) as JSON objects instead of JSON strings inside JSON.

    Its ``hash`` is unchanged: :func:`hashed_entry` rebuilds the hashed form exactly
    (each object re-serialised with :func:`canonical_json`, which is what was stored).
    """
    d = dict(entry)
    for name in JSON_TEXT_FIELDS:
        if isinstance(d.get(name), str):
            d[name] = json.loads(d[name])
    return d


def hashed_entry(entry: Mapping[str, Any]) -> dict[str, Any]:
    """The form an entry's ``hash`` is computed over, from an exported line of either format:
    a JSON-text field given as an object (exports since issue 24) is serialised with
    :func:`canonical_json`; given as a string (older exports, or a stored row) it is kept.
    ``entry_hash(hashed_entry(line)) == line["hash"]`` for every line of a sound export."""
    d = dict(entry)
    for name in JSON_TEXT_FIELDS:
        if name in d and d[name] is not None and not isinstance(d[name], str):
            d[name] = canonical_json(d[name])
    return d


def event_cap(event: Mapping[str, Any]) -> dict[str, Any] | None:
    """The cap in force after a governance event (``CapSpec.to_dict`` form: epsilon, delta,
    rho_cap, …), or None for an event that does not set one (``allocations_changed``).

    ``population_created`` stores ``{"cap": …, "allocations": …}`` as ``new``;
    ``cap_changed`` stores the cap itself. Accepts ``new`` parsed or as JSON text.
    """
    new = event.get("new")
    if isinstance(new, str):
        new = json.loads(new)
    if not isinstance(new, Mapping):
        return None
    kind = event.get("kind")
    if kind == "population_created":
        cap = new.get("cap")
        return dict(cap) if isinstance(cap, Mapping) else None
    if kind == "cap_changed":
        return dict(new.get("cap", new)) if isinstance(new.get("cap", new), Mapping) else None
    return None


def event_old_cap(event: Mapping[str, Any]) -> dict[str, Any] | None:
    """The cap in force before a ``cap_changed`` event (None for other events)."""
    old = event.get("old")
    if isinstance(old, str):
        old = json.loads(old)
    if event.get("kind") != "cap_changed" or not isinstance(old, Mapping):
        return None
    cap = old.get("cap", old)
    return dict(cap) if isinstance(cap, Mapping) else None


def iter_sorted_entries(*streams: Iterable[Mapping[str, Any]]) -> Iterator[Mapping[str, Any]]:
    """Merge entry streams (each ascending by ``seq``) into one ascending stream."""
    return heapq.merge(*streams, key=lambda e: e["seq"])
