"""Replay and verify: recompute a ledger's whole state from its entries alone.

:class:`Replay` is fed every entry in chain order and checks the hash chain,
the governance events, and that every charge fitted both its filters when it
was written (by the rule of the cap in force then: legacy caps by the legacy
rule, caps fixed since by the α_cap rule). :func:`stored_state_problems` then
compares the backend's stored derived state (populations, spend totals, chain
head, triggers, migrations) with the replay; :meth:`Ledger.verify` reports the
result as a :class:`VerifyReport`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from dpgate.accounting import Cost
from dpgate.errors import DpgateError
from dpgate.ledger.caps import CapSpec, population_from_row
from dpgate.ledger.entries import GENESIS_HASH, entry_hash
from dpgate.ledger.filter import BudgetCurve, Totals, filter_decision
from dpgate.ledger.validation import validate_cost

__all__ = ["Replay", "VerifyReport", "stored_state_problems"]


@dataclass(frozen=True)
class VerifyReport:
    """Result of :meth:`Ledger.verify`.

    Attributes:
        ok: True if no problem was found.
        problems: one sentence per problem (empty if ok).
        entries: number of entries in the hash chain (charges + events).
        head: hash of the last entry (:data:`GENESIS_HASH` if empty) — record it
            elsewhere to detect a rewrite of the whole chain later.
        charges, events: how many of each.
    """

    ok: bool
    problems: list[str]
    entries: int
    head: str
    charges: int = 0
    events: int = 0

    def to_dict(self) -> dict[str, Any]:
        """``{ok, problems, entries, head, charges, events}``."""
        return {"ok": self.ok, "problems": list(self.problems), "entries": self.entries,
                "head": self.head, "charges": self.charges, "events": self.events}


@dataclass
class _PopState:
    cap: CapSpec
    allocations: dict[str, float]
    cohort_column: str | None = None


class Replay:
    """Recompute a ledger's state from its entries, in chain order, and report problems.

    Feed every chain entry (charge and event dicts as stored, each with
    ``type``, ``seq``, ``prev_hash`` and ``hash``) in ``seq`` order to
    :meth:`feed`; then compare :attr:`populations` and :attr:`totals` with the
    backend's stored state. Checks: consecutive ``seq`` from 1; each
    ``prev_hash`` is the previous entry's hash; each hash recomputes; events
    are well-formed; every charge names a population that existed, a consumer
    it allocated, a valid cost matching its ``kind``/``rho`` columns, and fitted
    both filters when it was written.

    Attributes:
        problems: sentences describing what is wrong.
        populations: name → {"cap": CapSpec, "allocations": dict}.
        totals: (population, consumer or "") → :class:`Totals`.
        head: hash of the last entry fed.
        count, charges, events: entries fed.
    """

    def __init__(self) -> None:
        self.problems: list[str] = []
        self._pops: dict[str, _PopState] = {}
        self.totals: dict[tuple[str, str], Totals] = {}
        self.head = GENESIS_HASH
        self.count = 0
        self.charges = 0
        self.events = 0
        self.release_keys: set[tuple[str, str]] = set()
        #: (population, cohort, consumer or "") → Totals of the charges that drew on the cohort
        self.cohort_totals: dict[tuple[str, str, str], Totals] = {}

    @property
    def populations(self) -> dict[str, dict[str, Any]]:
        """name → ``{"cap": CapSpec, "allocations": dict}`` as replayed."""
        return {n: {"cap": s.cap, "allocations": dict(s.allocations)} for n, s in self._pops.items()}

    @property
    def cohort_columns(self) -> dict[str, str]:
        """population → cohort column, for the populations with cohorts, as replayed."""
        return {n: s.cohort_column for n, s in self._pops.items() if s.cohort_column is not None}

    def feed(self, entry: Mapping[str, Any]) -> None:
        """Check and apply one entry (see the class docstring)."""
        self.count += 1
        seq = entry.get("seq")
        where = f"entry seq={seq}"
        if seq != self.count:
            self.problems.append(f"{where}: expected seq {self.count} (entries missing or reordered)")
        if entry.get("prev_hash") != self.head:
            self.problems.append(f"{where}: prev_hash does not match the previous entry's hash "
                                 "(an entry was removed, inserted or edited)")
        if entry_hash(entry) != entry.get("hash"):
            self.problems.append(f"{where}: hash mismatch (the entry was edited)")
        self.head = str(entry.get("hash"))
        try:
            if entry.get("type") == "event":
                self.events += 1
                self._event(entry, where)
            elif entry.get("type") == "charge":
                self.charges += 1
                self._charge(entry, where)
            else:
                self.problems.append(f"{where}: unknown entry type {entry.get('type')!r}")
        except (ValueError, KeyError, TypeError, json.JSONDecodeError) as exc:
            self.problems.append(f"{where}: malformed entry ({exc})")

    def _event(self, e: Mapping[str, Any], where: str) -> None:
        pop = e["population"]
        new = json.loads(e["new"])
        kind = e["kind"]
        if kind == "population_created":
            if pop in self._pops:
                self.problems.append(f"{where}: population {pop!r} created twice")
            self._pops[pop] = _PopState(CapSpec.from_dict(new["cap"]), dict(new["allocations"]),
                                        new.get("cohort_column"))
            return
        state = self._pops.get(pop)
        if state is None:
            self.problems.append(f"{where}: event for unknown population {pop!r}")
            return
        old = json.loads(e["old"]) if e.get("old") else None
        if kind == "cap_changed":
            if old is not None and CapSpec.from_dict(old) != state.cap:
                self.problems.append(f"{where}: the event's old cap is not the cap in force")
            state.cap = CapSpec.from_dict(new)
        elif kind == "allocations_changed":
            if old is not None and dict(old["allocations"]) != state.allocations:
                self.problems.append(f"{where}: the event's old allocations are not those in force")
            state.allocations = dict(new["allocations"])
        elif kind == "cohorts_changed":
            if old is not None and old.get("cohort_column") != state.cohort_column:
                self.problems.append(f"{where}: the event's old cohort column is not the one in force")
            if any(p == pop for p, _ in self.totals):
                self.problems.append(f"{where}: the cohort rule of {pop!r} changed after it was charged")
            state.cohort_column = new.get("cohort_column")
        else:
            self.problems.append(f"{where}: unknown event kind {kind!r}")

    def _charge(self, c: Mapping[str, Any], where: str) -> None:
        pop, consumer = c["population"], c["consumer"]
        cost = Cost.from_dict(json.loads(c["cost"]))
        sel = float(c.get("selection_delta") or 0.0)
        if cost.kind != c["kind"]:
            self.problems.append(f"{where}: kind column {c['kind']!r} differs from the cost's {cost.kind!r}")
        if cost.rho_bound() != c["rho"]:
            self.problems.append(f"{where}: rho column {c['rho']!r} differs from the cost's {cost.rho_bound()!r}")
        state = self._pops.get(pop)
        if state is None:
            self.problems.append(f"{where}: charge for unknown population {pop!r}")
            return
        if c.get("release_key") is not None:
            key = (pop, c["release_key"])
            if key in self.release_keys:
                self.problems.append(f"{where}: release_key charged twice")
            self.release_keys.add(key)
        if state.allocations and consumer not in state.allocations:
            self.problems.append(f"{where}: charge for consumer {consumer!r} without an allocation")
            share = 0.0
        else:
            share = state.allocations.get(consumer, 1.0) if state.allocations else 1.0
        pt = self.totals.get((pop, ""), Totals())
        ct = self.totals.get((pop, consumer), Totals())
        cap = state.cap
        cohorts = json.loads(c["cohorts"]) if c.get("cohorts") is not None else None
        if (cohorts is None) != (state.cohort_column is None):
            self.problems.append(f"{where}: a charge {'without' if cohorts is None else 'with'} cohorts for population "
                                 f"{pop!r}, which {'has' if state.cohort_column else 'has no'} cohorts")
        if cohorts is not None and (not cohorts or cohorts != sorted(set(cohorts))):
            self.problems.append(f"{where}: the charge's cohorts are not a sorted list of distinct names")
        # the scopes whose filters admitted the charge: the population's, or each cohort's
        scopes = [(pt, ct, f"population {pop!r}")] if cohorts is None else [
            (self.cohort_totals.get((pop, k, ""), Totals()), self.cohort_totals.get((pop, k, consumer), Totals()),
             f"cohort {k!r} of population {pop!r}") for k in cohorts]
        try:
            validate_cost(cost)
        except DpgateError as exc:
            self.problems.append(f"{where}: invalid cost ({exc.message})")
        else:
            for spt, sct, label in scopes:
                if not filter_decision(spt, cost, BudgetCurve.of(cap), selection_delta=sel).ok:
                    self.problems.append(f"{where}: charge exceeded {label}'s budget when written")
                if not filter_decision(sct, cost, BudgetCurve.of(cap, share), selection_delta=sel).ok:
                    self.problems.append(f"{where}: charge exceeded consumer {consumer!r}'s budget in {label} "
                                         "when written")
        self.totals[(pop, "")] = pt.add(cost, sel)
        self.totals[(pop, consumer)] = ct.add(cost, sel)
        for k in cohorts or ():
            for who in ("", consumer):
                key = (pop, k, who)
                self.cohort_totals[key] = self.cohort_totals.get(key, Totals()).add(cost, sel)


def _totals_match(got: tuple[Any, ...], want: Totals) -> bool:
    """Stored totals against the replayed ones. A stored Σμ² of NULL (no GDP account: totals
    written before schema version 6, whose histories the Rényi filter governs) is not compared:
    the replay of such a history may find a GDP claim in every charge (continuous Gaussian or
    pure ε) that the stored row never tracked. NULL is fail-safe: a Gaussian-DP scope without
    an account admits nothing."""
    row = want.to_row()
    if len(got) == len(row) and got[-1] is None:
        return got[:-1] == row[:-1]
    return got == row


def stored_state_problems(
    replay: Replay,
    *,
    head: tuple[int, str] | None,
    populations: Mapping[str, Iterable[Any]],
    totals: Mapping[tuple[str, str], Iterable[Any]],
    triggers: Iterable[str],
    required_triggers: Iterable[str],
    versions: Iterable[int],
    required_versions: Iterable[int],
    cohort_columns: Mapping[str, str] | None = None,
    cohort_totals: Mapping[tuple[str, str, str], Totals] | None = None,
) -> list[str]:
    """Compare a backend's stored derived state with a :class:`Replay` of its entries.

    Args:
        replay: the replay of every entry (fed already).
        head: the stored chain head ``(seq, hash)``, or None if missing.
        populations: name → stored row in :data:`~dpgate.ledger.caps.POPULATION_COLUMNS` order.
        totals: (population, consumer or "") → stored ``Totals.to_row()`` tuple.
        triggers: names of the append-only triggers present (and enabled).
        required_triggers: the names that must be present.
        versions: the schema migration versions recorded.
        required_versions: the versions this dpgate applies.
        cohort_columns: population → stored cohort column (None: not compared).
        cohort_totals: (population, cohort, consumer or "") → stored Totals (None: not compared).

    Returns:
        The replay's problems followed by one sentence per difference (empty: consistent).
    """
    problems = list(replay.problems)
    if head is None:
        problems.append("the chain head row is missing")
    elif (head[0], head[1]) != (replay.count, replay.head):
        problems.append(
            f"the chain head (seq {head[0]}, {head[1][:12]}…) does not match the last entry "
            f"(seq {replay.count}, {replay.head[:12]}…): entries were removed or added"
        )
    present = set(triggers)
    for name in required_triggers:
        if name not in present:
            problems.append(f"append-only trigger {name!r} is missing")
    recorded = set(versions)
    for version in required_versions:
        if version not in recorded:
            problems.append(f"schema migration {version} is not recorded")
    replayed = replay.populations
    for name in sorted(set(populations) | set(replayed)):
        if name not in replayed:
            problems.append(f"population {name!r} has no population_created event")
            continue
        if name not in populations:
            problems.append(f"population {name!r} was created by an event but is missing")
            continue
        try:
            cap, allocs = population_from_row(tuple(populations[name]))
        except (ValueError, TypeError, AttributeError):
            problems.append(f"population {name!r}: the stored row is malformed")
            continue
        if cap != replayed[name]["cap"]:
            problems.append(f"population {name!r}: the cap in force differs from its events")
        if allocs != replayed[name]["allocations"]:
            problems.append(f"population {name!r}: the allocations in force differ from its events")
    for key in sorted(set(totals) | set(replay.totals)):
        label = f"population {key[0]!r}" + (f" consumer {key[1]!r}" if key[1] else "")
        want = replay.totals.get(key)
        got = totals.get(key)
        if want is None or got is None or not _totals_match(tuple(got), want):
            problems.append(f"{label}: the stored spend totals differ from the sum of its entries")
    if cohort_columns is not None and dict(cohort_columns) != replay.cohort_columns:
        problems.append("the stored cohort columns of the populations differ from their events")
    if cohort_totals is not None:
        for key in sorted(set(cohort_totals) | set(replay.cohort_totals)):
            want, got = replay.cohort_totals.get(key), cohort_totals.get(key)
            if want is None or got is None or not _totals_match(got.to_row(), want):
                who = f" consumer {key[2]!r}" if key[2] else ""
                problems.append(f"population {key[0]!r} cohort {key[1]!r}{who}: the stored cohort totals differ "
                                "from the sum of the charges that drew on it")
    return problems
