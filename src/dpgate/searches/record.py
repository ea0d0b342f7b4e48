"""Search records (issue 15): a tuning/selection search with every step it charged.

A *search* chooses among candidate configurations (fine-tunes, hyper-parameters) trained on
private data and selected on a validation set. Each step spends the same population's budget,
so the record keeps them all — failed runs, retries after a missed target, discarded
candidates and the selection — with the accountant's state after each one:

* ``POST /v1/searches`` declares it (:meth:`Searches.create`): population (from the training
  data), consumer, purpose, the candidate configurations, the training and validation datasets
  (data boundaries), whether selection uses public or private data, and the stopping rule;
* training runs charge their RDP curves with ``search_id`` (``POST /v1/ledger/charges``;
  :meth:`Searches.record_charge`), and a selection query may carry it
  (:meth:`Searches.record_selection`);
* ``POST /v1/searches/{id}/close`` records the selected candidate and artifact ids
  (:meth:`Searches.close`). A closed search cannot be reopened: a new search is a new record on
  the same budget.

**Accountant state.** After each charged step the record stores (i) the search's own
composed cost — the exact totals of its charges (:class:`~dpgate.ledger.filter.Totals`), as the
ρ-equivalent at the orders the cap checks and as ε at the cap's δ less its selection δ by the
ledger's one conversion (:func:`dpgate.ledger.caps.ledger_epsilon`) — and (ii) the population's spend *as of that ledger entry*: the
ledger's spend report (:func:`~dpgate.ledger.reports.build_spend_report`) over its charges up to
the entry's ``seq``, under the cap and allocations in force then. Both are pure functions of
immutable ledger entries, so :meth:`Searches.get` recomputes every step and reports any
difference (``replay.ok``); it also lists ledger charges naming the search that the record lacks.
(The ledger's hash chain itself is checked by ``dpgate ledger verify``.)

**Guard rails.** Data-dependent stopping (early stopping on private metrics) is refused unless
the search states its stopping decisions are privatised (each is then a charged step of the
search: a selection query or an external charge with ``step = "stopping"``). Raw private
validation scores are never stored or returned: declarations, charges and the closing step
refuse fields named like metrics (:data:`SCORE_WORDS`), and selection steps keep only the
release's keys, mechanism and charge. Training and validation data of different populations
must be stated to hold disjoint *people* (with how they were split): disjoint rows of one
population are not disjoint people, and such a claim is refused. Selection on public data is
recorded at close as free post-processing of the training transcript (cost 0).

**Ownership.** A search belongs to the consumer it was declared for (``body.consumer``: the API
key's consumer, or the one an admin named). Every read and write takes ``owner``: the consumer
the caller acts for, or None for every consumer (admin keys, the operator's CLI). A search of
another consumer is answered exactly like a missing one (:class:`~dpgate.errors.NotFound`, the
same message and details), so its existence is not confirmed. Every charged step is paid by the
search's consumer: a charge or selection query whose consumer differs is refused before the
charge (:meth:`Searches.check_open`), so one allocation's record never holds another's spend.
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
from typing import Any, Mapping

from dpgate import accounting
from dpgate.errors import Conflict, InvalidRequest, NotFound, UnknownPopulation
from dpgate.jsonsafe import json_safe
from dpgate.ledger.entries import canonical_json, utc_now
from dpgate.ledger.reports import build_spend_report
from dpgate.searches.store import SearchStore

__all__ = ["SCORE_WORDS", "Searches", "STEP_KINDS", "new_search_id"]

#: Field names refused anywhere in a search's free-form parts (configs, artifacts, notes):
#: raw private validation scores are never stored.
SCORE_WORDS = ("score", "accuracy", "loss", "metric", "auc", "f1", "precision", "recall", "perplexity",
               "bleu", "rouge", "validation_result", "eval_result")
#: Kinds of charged steps an external charge may name.
STEP_KINDS = ("training", "retry", "evaluation", "stopping", "other")
#: Outcomes a charged step may record.
OUTCOMES = ("completed", "failed", "target_missed", "discarded", "aborted")
_SCORE_RE = re.compile("|".join(SCORE_WORDS), re.IGNORECASE)
_MAX_CANDIDATES = 1000
_MAX_DEPTH = 6


def new_search_id() -> str:
    """``srch_`` + 24 hex characters (OS CSPRNG)."""
    return "srch_" + secrets.token_hex(12)


def _text(name: str, value: Any, *, required: bool = True, limit: int = 500) -> str | None:
    if value is None and not required:
        return None
    if not isinstance(value, str) or not value.strip() or len(value) > limit:
        raise InvalidRequest(f"{name} must be a non-empty text of at most {limit} characters", {"field": name})
    return value


def _no_scores(where: str, value: Any, depth: int = 0) -> None:
    """Refuse score-like field names in free-form JSON (raw validation scores are never stored)."""
    if depth > _MAX_DEPTH:
        raise InvalidRequest(f"{where} is nested too deeply", {"field": where})
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                raise InvalidRequest(f"{where}: keys must be text", {"field": where})
            if _SCORE_RE.search(key):
                raise InvalidRequest(
                    f"{where}.{key}: raw private validation scores are never stored in a search record; "
                    "select with a selection query (its keys are released, not its scores) or record the "
                    "artifact id only", {"field": f"{where}.{key}", "reason": "raw_scores"})
            _no_scores(f"{where}.{key}", item, depth + 1)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _no_scores(f"{where}[{i}]", item, depth + 1)
    elif value is not None and not isinstance(value, (str, int, float, bool)):
        raise InvalidRequest(f"{where} must be JSON", {"field": where})


def _step_hash(body: Mapping[str, Any]) -> str:
    return hashlib.sha256(canonical_json({k: v for k, v in body.items() if k != "hash"}).encode()).hexdigest()


def _chain(body: dict[str, Any], previous: Mapping[str, Any] | None) -> dict[str, Any]:
    body["prev_hash"] = "0" * 64 if previous is None else previous["hash"]
    body["hash"] = _step_hash(body)
    return body


def _enc(x: float) -> float | str:
    return "inf" if x == float("inf") else float(x)


def _plain(value: Any) -> Any:
    """``value`` as stored JSON reads back (tuples as lists, non-finite floats as text): what a
    recomputed state is compared in."""
    return json.loads(json.dumps(json_safe(value), sort_keys=True))


class Searches:
    """Search records over a ledger (one per gateway).

    Args:
        ledger: the budget ledger (its entries are the source of every number).
        store: the search store in the ledger's database.
    """

    def __init__(self, ledger: Any, store: SearchStore) -> None:
        self.ledger = ledger
        self.store = store

    # ------------------------------------------------------------------ declaration

    def create(self, spec: Mapping[str, Any], *, consumer: str, actor: str) -> dict[str, Any]:
        """Declare a search; charges nothing.

        Args:
            spec: ``{purpose, candidates: [{name, config?}], training: {name, population},
                validation: {name, population | None}, people: "same" | "disjoint",
                people_split?: text, selection: "private" | "public",
                stopping: "fixed" | "data-dependent", stopping_privatised?: bool}``.
            consumer: the allocation its charges spend (from the API key).
            actor: who declared it.
        Returns:
            The record (:meth:`get`).
        Raises:
            InvalidRequest: a malformed declaration, score-like fields, data-dependent stopping
                that is not privatised, populations that differ without stated disjoint people,
                or disjoint people claimed within one population.
            UnknownPopulation: a population the ledger does not know.
        """
        purpose = _text("purpose", spec.get("purpose"))
        candidates = spec.get("candidates")
        if not isinstance(candidates, list) or not 1 <= len(candidates) <= _MAX_CANDIDATES:
            raise InvalidRequest(f"candidates must list 1 to {_MAX_CANDIDATES} configurations",
                                 {"field": "candidates"})
        names: list[str] = []
        clean = []
        for i, cand in enumerate(candidates):
            if not isinstance(cand, Mapping) or set(cand) - {"name", "config"}:
                raise InvalidRequest("each candidate is {name, config?}", {"field": f"candidates[{i}]"})
            name = _text(f"candidates[{i}].name", cand.get("name"), limit=200)
            if name in names:
                raise InvalidRequest(f"candidate {name!r} is listed twice", {"field": f"candidates[{i}].name"})
            config = cand.get("config") or {}
            _no_scores(f"candidates[{i}].config", config)
            names.append(name)  # type: ignore[arg-type]
            clean.append({"name": name, "config": config})
        training = self._dataset("training", spec.get("training"), required_population=True)
        validation = self._dataset("validation", spec.get("validation"), required_population=False)
        selection = spec.get("selection")
        if selection not in ("private", "public"):
            raise InvalidRequest('selection must be "private" (a selection query on private validation data) or '
                                 '"public" (public data: free post-processing)', {"field": "selection"})
        if selection == "private" and validation["population"] is None:
            raise InvalidRequest("private selection needs a validation dataset with a population",
                                 {"field": "validation.population"})
        people = spec.get("people", "same")
        split = spec.get("people_split")
        vpop, tpop = validation["population"], training["population"]
        if people not in ("same", "disjoint"):
            raise InvalidRequest('people must be "same" or "disjoint"', {"field": "people"})
        if vpop is not None and vpop == tpop and people == "disjoint":
            raise InvalidRequest(
                f"training and validation data both belong to population {tpop!r}: disjoint rows are not "
                "disjoint people, so both spend one budget (declare people = \"same\")",
                {"field": "people", "reason": "disjoint_rows_not_people"})
        if vpop is not None and vpop != tpop:
            if people != "disjoint" or not isinstance(split, str) or not split.strip():
                raise InvalidRequest(
                    f"training ({tpop!r}) and validation ({vpop!r}) data belong to different populations: state "
                    "people = \"disjoint\" and how the people were split (people_split); if the same people "
                    "are in both, they must be one population", {"field": "people", "reason": "populations_differ"})
        stopping = spec.get("stopping", "fixed")
        privatised = spec.get("stopping_privatised", False)
        if stopping not in ("fixed", "data-dependent"):
            raise InvalidRequest('stopping must be "fixed" or "data-dependent"', {"field": "stopping"})
        if not isinstance(privatised, bool):
            raise InvalidRequest("stopping_privatised must be true or false", {"field": "stopping_privatised"})
        if stopping == "data-dependent" and not privatised:
            raise InvalidRequest(
                "data-dependent stopping (early stopping on private metrics) is refused unless its stopping "
                "decisions are themselves privatised and charged: set stopping_privatised = true and charge "
                "each decision to this search (a selection query, or a charge with step = \"stopping\")",
                {"field": "stopping", "reason": "unprivatised_stopping"})
        known = set(self.ledger.populations())
        for pop in {tpop, vpop} - {None}:
            if pop not in known:
                raise UnknownPopulation(f"unknown population {pop!r}", {"population": pop})
            allocations = self.ledger.spend(pop).allocations
            if allocations and consumer not in allocations:  # its charges could never be admitted
                raise InvalidRequest(
                    f"consumer {consumer!r} has no allocation of population {pop!r} (allocations: "
                    f"{', '.join(sorted(allocations))}): the search's charges could not be admitted",
                    {"field": "consumer", "consumer": consumer})
        body = {
            "purpose": purpose, "consumer": consumer, "actor": actor, "candidates": clean,
            "training": training, "validation": validation, "people": people,
            "people_split": split if people == "disjoint" else None, "selection": selection,
            "stopping": stopping, "stopping_privatised": privatised,
            "populations": sorted({tpop, vpop} - {None}),
        }
        search_id = new_search_id()
        self.store.create(search_id, tpop, utc_now(), body)  # type: ignore[arg-type]
        return self.get(search_id)

    @staticmethod
    def _dataset(field: str, value: Any, *, required_population: bool) -> dict[str, Any]:
        if not isinstance(value, Mapping) or set(value) - {"name", "population", "description"}:
            raise InvalidRequest(f"{field} is {{name, population, description?}}", {"field": field})
        name = _text(f"{field}.name", value.get("name"), limit=200)
        pop = value.get("population")
        if pop is None and required_population:
            raise InvalidRequest(f"{field}.population is required (the people the data is about)",
                                 {"field": f"{field}.population"})
        if pop is not None:
            _text(f"{field}.population", pop, limit=128)
        return {"name": name, "population": pop,
                "description": _text(f"{field}.description", value.get("description"), required=False)}

    # ------------------------------------------------------------------ ownership

    def owned(self, search_id: str, *, owner: str | None) -> dict[str, Any]:
        """The stored search (declaration and steps) if ``owner`` may see it.

        Args:
            owner: the consumer the caller acts for; None: any consumer's search (admin keys,
                the operator's CLI).
        Raises:
            NotFound: no such search, or a search of another consumer (the same error: the
                answer does not confirm that it exists).
        """
        rec = self.store.get(search_id)
        if owner is not None and rec["body"].get("consumer") != owner:
            raise NotFound("no search with that id", {"search_id": search_id})
        return rec

    # ------------------------------------------------------------------ steps

    def check_open(self, search_id: str, *, population: str, consumer: str, candidate: str | None = None,
                   any_consumer: bool = False) -> dict[str, Any]:
        """The search's record if it is open, is paid by ``consumer``, spends ``population`` and
        lists ``candidate``. Called before anything is charged.

        Args:
            consumer: the allocation the step's charge would spend.
            any_consumer: False (default): the caller acts for ``consumer`` and sees only its
                searches (:meth:`owned`); True: an admin paying for a consumer, who sees every
                search (the payer must still be the search's consumer).
        Raises:
            NotFound: no such search, or one the caller may not see. Conflict: it is closed.
            InvalidRequest: it is paid by another consumer (an admin naming the wrong one),
            spends another population, or does not declare the candidate.
        """
        rec = self.owned(search_id, owner=None if any_consumer else consumer)
        if rec["steps"] and rec["steps"][-1]["kind"] == "close":
            raise Conflict("the search is closed: a closed search cannot be reopened or extended (start a new "
                           "search on the same budget)", {"search_id": search_id})
        paid_by = rec["body"].get("consumer")
        if consumer != paid_by:
            raise InvalidRequest(f"search {search_id} spends consumer {paid_by!r}'s allocation: its steps are "
                                 f"charged to {paid_by!r}, not {consumer!r}",
                                 {"search_id": search_id, "consumer": consumer, "search_consumer": paid_by})
        if population not in rec["body"]["populations"]:
            raise InvalidRequest(f"search {search_id} spends population(s) {rec['body']['populations']}, not "
                                 f"{population!r}", {"search_id": search_id, "population": population})
        if candidate is not None and candidate not in {c["name"] for c in rec["body"]["candidates"]}:
            raise InvalidRequest(f"candidate {candidate!r} is not declared in search {search_id}",
                                 {"search_id": search_id, "candidate": candidate})
        return rec

    def record_charge(self, search_id: str, receipt: Mapping[str, Any], *, step: str, candidate: str | None,
                      outcome: str | None, attempt: int | None, note: str | None) -> dict[str, Any]:
        """Append a charged step (a training run, retry, evaluation or stopping decision).

        The ledger charge is already written (it carries ``search_id`` in its metadata); the step
        names it and stores the accountant's state after it.
        """
        extra = {"step_kind": step, "candidate": candidate, "outcome": outcome, "attempt": attempt, "note": note}
        return self._append_charged(search_id, "charge", receipt["charge_id"], receipt["population"], extra)

    def record_selection(self, search_id: str, release: Mapping[str, Any], *, consumer: str) -> dict[str, Any]:
        """Append a selection step: the release's keys, mechanism and charge (never scores). A
        release served from the store (``cached``) is recorded with cost 0 (post-processing)."""
        sel = release.get("selection", {})
        extra = {"release_id": release["release_id"], "dataset": release["dataset"],
                 "selected": [row[0] if len(row) == 1 else row for row in release["rows"]],
                 "mechanism": release.get("mechanism"), "epsilon": sel.get("epsilon"), "k": sel.get("k"),
                 "delta_u": sel.get("delta_u"), "candidates": sel.get("candidates"),
                 "cached": bool(release.get("cached")), "consumer": consumer}
        charge = release.get("charge")
        population = release.get("guarantee", {}).get("population")
        if release.get("cached") or not charge:
            extra["note"] = "served from the release store: post-processing of an earlier selection, cost 0"
            return self._append_free(search_id, "selection", extra)
        return self._append_charged(search_id, "selection", charge["charge_id"], population, extra)

    def close(self, search_id: str, *, selected: str, artifacts: list[str], selection_release: str | None,
              note: str | None, actor: str, owner: str | None = None) -> dict[str, Any]:
        """Close the search with the selected candidate and artifact ids (Conflict if closed).

        Private selection must name a selection release recorded in this search whose keys include
        ``selected``. Public selection is recorded as free post-processing of the training
        transcript (cost 0).

        Args:
            owner: the consumer the caller acts for (:meth:`owned`); None: any (admin, CLI).
        Raises:
            NotFound (no such search, or another consumer's), Conflict, InvalidRequest.
        """
        rec = self.owned(search_id, owner=owner)
        body = rec["body"]
        _text("selected", selected, limit=200)
        if selected not in {c["name"] for c in body["candidates"]}:
            raise InvalidRequest(f"candidate {selected!r} is not declared in this search", {"field": "selected"})
        if not isinstance(artifacts, list) or not all(isinstance(a, str) and a and len(a) <= 500 for a in artifacts) \
                or len(artifacts) > 100:
            raise InvalidRequest("artifacts is a list of at most 100 artifact ids (text)", {"field": "artifacts"})
        _text("note", note, required=False, limit=2000)
        info: dict[str, Any] = {"selected": selected, "artifacts": artifacts, "note": note, "actor": actor,
                                "selection": body["selection"]}
        if body["selection"] == "private":
            steps = {s["body"].get("release_id"): s for s in rec["steps"] if s["kind"] == "selection"}
            if selection_release is None or selection_release not in steps:
                raise InvalidRequest("private selection: name the selection release (selection_release) recorded "
                                     "in this search", {"field": "selection_release"})
            chosen = steps[selection_release]["body"]["selected"]
            if selected not in chosen:
                raise InvalidRequest(f"{selected!r} is not among the keys the selection released ({chosen})",
                                     {"field": "selected"})
            info["selection_release"] = selection_release
        else:
            if selection_release is not None:
                raise InvalidRequest("a search declared with public selection names no selection release",
                                     {"field": "selection_release"})
            info["cost"] = {"rho": 0.0}
            info["post_processing"] = ("selection on public data: free post-processing of the training "
                                       "transcript (Dwork & Roth 2014, Prop. 2.1); no charge")
        self._append_free(search_id, "close", info)
        return self.get(search_id)

    @staticmethod
    def _charge_ids(rec: Mapping[str, Any]) -> list[str]:
        return [s["body"]["charge_id"] for s in rec["steps"] if s["body"].get("charge_id")]

    def _append_charged(self, search_id: str, kind: str, charge_id: str, population: str,
                        extra: dict[str, Any]) -> dict[str, Any]:
        def build(number: int, previous: dict[str, Any] | None) -> dict[str, Any]:
            view = _LedgerView(self.ledger)
            entry = view.entry(charge_id)
            ids = self._charge_ids(self.store.get(search_id)) + [charge_id]
            body = {**extra, "charge_id": charge_id, "population": population, "seq": entry["seq"],
                    "cost": _plain(entry["cost"]), "rho": _plain(entry["rho"]),
                    "epsilon_at_delta": _plain(entry["epsilon_at_delta"]),
                    "accountant": {"search": view.composed(ids, entry["seq"]),
                                   "population": view.population_states(population, [entry["seq"]])[entry["seq"]]}}
            return _chain(body, previous)

        return self.store.append(search_id, kind, utc_now(), build)

    def _append_free(self, search_id: str, kind: str, extra: dict[str, Any]) -> dict[str, Any]:
        def build(number: int, previous: dict[str, Any] | None) -> dict[str, Any]:
            view = _LedgerView(self.ledger)
            last = view.last_seq()
            ids = self._charge_ids(self.store.get(search_id))
            body = {**extra, "cost": {"rho": 0.0}, "accountant": {"search": view.composed(ids, last),
                                                                  "as_of_seq": last}}
            return _chain(body, previous)

        return self.store.append(search_id, kind, utc_now(), build)

    # ------------------------------------------------------------------ reading

    def get(self, search_id: str, *, owner: str | None = None) -> dict[str, Any]:
        """The record: declaration, steps (each with the accountant's state after it), totals, and
        ``replay``: each step recomputed from the ledger's entries (``ok``, ``problems``).

        Args:
            owner: the consumer the caller acts for (:meth:`owned`); None: any (admin, CLI).
        Raises:
            NotFound: no such search, or another consumer's.
        """
        rec = self.owned(search_id, owner=owner)
        body = rec["body"]
        steps = [{"step": s["step"], "kind": s["kind"], "created_at": s["created_at"], **s["body"]}
                 for s in rec["steps"]]
        closed = bool(steps) and steps[-1]["kind"] == "close"
        ids = [s["charge_id"] for s in steps if s.get("charge_id")]
        view = _LedgerView(self.ledger)
        return {
            "search_id": rec["search_id"], "created_at": rec["created_at"], "status": "closed" if closed else "open",
            **body,
            "steps": steps,
            "totals": {"charges": len(ids), "retries": sum(1 for s in steps if s.get("step_kind") == "retry"),
                       "failed": sum(1 for s in steps if s.get("outcome") in ("failed", "target_missed")),
                       **view.composed(ids)},
            "result": steps[-1] if closed else None,
            "replay": self.replay(rec, view),
        }

    def list(self, population: str | None = None, *, limit: int = 100,
             consumer: str | None = None) -> list[dict[str, Any]]:
        """Searches newest first: id, population, purpose, consumer, created_at (no steps).

        Args:
            population: only this population's searches (None: all).
            limit: at most this many (1-1000).
            consumer: only the searches this consumer owns (None: every consumer's; callers
                acting for a consumer pass their own).
        """
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 1000:
            raise InvalidRequest("limit must be an integer in [1, 1000]", {"field": "limit"})
        return [{"search_id": r["search_id"], "population": r["population"], "created_at": r["created_at"],
                 "purpose": r["body"]["purpose"], "consumer": r["body"]["consumer"]}
                for r in self.store.list(population, limit=limit, consumer=consumer)]

    def replay(self, rec: Mapping[str, Any], view: "_LedgerView | None" = None) -> dict[str, Any]:
        """Recompute every step from the ledger and check the step chain; ``{ok, problems, ledger_charges}``."""
        view = view or _LedgerView(self.ledger)
        problems: list[str] = []
        previous: Mapping[str, Any] | None = None
        ids: list[str] = []
        pending: list[tuple[str, Mapping[str, Any], int]] = []  # population states to check
        for s in rec["steps"]:
            b = s["body"]
            where = f"step {s['step']}"
            if b.get("prev_hash") != ("0" * 64 if previous is None else previous["hash"]) or \
                    _step_hash(b) != b.get("hash"):
                problems.append(f"{where}: the step chain does not verify (a step was edited or removed)")
            previous = b
            if not b.get("charge_id"):
                if "as_of_seq" in b.get("accountant", {}) and \
                        view.composed(ids, b["accountant"]["as_of_seq"]) != b["accountant"]["search"]:
                    problems.append(f"{where}: the search's composed cost does not replay")
                continue
            ids.append(b["charge_id"])
            entry = view.by_id.get(b["charge_id"])
            if entry is None:
                problems.append(f"{where}: charge {b['charge_id']} is not in the ledger")
                continue
            if entry["seq"] != b.get("seq") or _plain(entry["cost"]) != b.get("cost"):
                problems.append(f"{where}: the ledger's charge differs from the recorded one")
            if view.composed(ids, entry["seq"]) != b["accountant"]["search"]:
                problems.append(f"{where}: the search's composed cost does not replay")
            pending.append((where, b, entry["seq"]))
        for pop in {b["population"] for _, b, _ in pending}:
            mine = [(w, b, q) for w, b, q in pending if b["population"] == pop]
            states = view.population_states(pop, [q for _, _, q in mine])
            for where, b, q in mine:
                if states[q] != b["accountant"]["population"]:
                    problems.append(f"{where}: the population's state does not replay")
        pops = set(rec["body"]["populations"])
        tagged = sorted(e["charge_id"] for e in view.charges if e["population"] in pops
                        and (e.get("metadata") or {}).get("search_id") == rec["search_id"])
        missing = sorted(set(tagged) - set(ids))
        if missing:
            problems.append(f"ledger charges naming this search are missing from the record: {missing}")
        return {"ok": not problems, "problems": problems, "ledger_charges": tagged}


class _LedgerView:
    """One read of the ledger (charges ascending by ``seq``, governance events), from which every
    recorded number is recomputed: the same exact totals (:class:`~dpgate.ledger.filter.Totals`)
    and spend report (:func:`~dpgate.ledger.reports.build_spend_report`) as the ledger's own, under
    the cap and allocations in force at a given entry. One pass per question, no hash checks
    (``dpgate ledger verify`` checks the chain)."""

    def __init__(self, ledger: Any) -> None:
        self.ledger = ledger
        self.charges = ledger.entries(None)
        self.by_id = {e["charge_id"]: e for e in self.charges}
        self.events = ledger.events(None)

    def entry(self, charge_id: str) -> dict[str, Any]:
        """The ledger's charge entry ``charge_id`` (as :meth:`Ledger.entries` gives it).

        Raises:
            NotFound: no charge of the ledger has that id.
        """
        try:
            return self.by_id[charge_id]
        except KeyError:
            raise NotFound("no ledger charge with that id", {"charge_id": charge_id}) from None

    def config_at(self, population: str, seq: int | None) -> tuple[Any, dict[str, float]]:
        """(cap, allocations) of ``population`` in force at ledger entry ``seq`` (None: now)."""
        from dpgate.ledger.caps import CapSpec

        cap, allocations = None, {}
        for ev in self.events:
            if ev["population"] != population or (seq is not None and ev["seq"] > seq):
                continue
            new = ev["new"]
            if ev["kind"] == "population_created":
                cap, allocations = CapSpec.from_dict(new["cap"]), dict(new["allocations"])
            elif ev["kind"] == "cap_changed":
                cap = CapSpec.from_dict(new)
            elif ev["kind"] == "allocations_changed":
                allocations = dict(new["allocations"])
        if cap is None:
            raise UnknownPopulation(f"unknown population {population!r}", {"population": population})
        return cap, allocations

    def population_states(self, population: str, seqs: list[int]) -> dict[int, dict[str, Any]]:
        """The population's spend as of each ledger entry in ``seqs`` (one sweep)."""
        from dpgate.ledger.filter import Totals

        wanted = sorted(set(seqs))
        out: dict[int, dict[str, Any]] = {}
        total, consumers = Totals(), {}
        i = 0
        charges = [e for e in self.charges if e["population"] == population]
        for seq in wanted:
            while i < len(charges) and charges[i]["seq"] <= seq:
                e = charges[i]
                cost = accounting.Cost.from_dict(e["cost"])
                sel = float(e.get("selection_delta") or 0.0)
                total = total.add(cost, sel)
                consumers[e["consumer"]] = consumers.get(e["consumer"], Totals()).add(cost, sel)
                i += 1
            cap, allocations = self.config_at(population, seq)
            report = build_spend_report(population, cap, allocations, total, dict(consumers)).to_dict()
            out[seq] = _plain({"as_of_seq": seq, "spent": report["spent"], "remaining": report["remaining"],
                               "cap": report["cap"], "conversion": report.get("conversion")})
        return out

    def composed(self, charge_ids: list[str], seq: int | None = None) -> dict[str, Any]:
        """The composed cost of these charges per population, as the ledger accounts a spend: exact
        totals, ρ-equivalent at the orders the cap checks and ε at the cap's δ less its selection δ by
        the ledger's one conversion — under the cap in force at ledger entry ``seq`` (None: now), so a recorded
        state replays even after a later cap change."""
        from dpgate.ledger.filter import BudgetCurve, Totals

        totals: dict[str, Totals] = {}
        for cid in charge_ids:
            e = self.by_id.get(cid)
            if e is None or (seq is not None and e["seq"] > seq):
                continue
            totals[e["population"]] = totals.get(e["population"], Totals()).add(
                accounting.Cost.from_dict(e["cost"]), float(e.get("selection_delta") or 0.0))
        out: dict[str, Any] = {}
        for pop, t in sorted(totals.items()):
            cap, _ = self.config_at(pop, seq)
            budget = BudgetCurve.of(cap)
            eps, conversion = t.spent_epsilon(budget, cap.rho_delta)
            out[pop] = {"charges": t.charges, "rho": t.rho_equivalent(budget), "epsilon_at_delta": eps,
                        "delta": cap.rho_delta, "conversion": conversion,
                        "cap": {"epsilon": cap.epsilon, "delta": cap.delta}}
        return _plain({"by_population": out})

    def last_seq(self) -> int:
        """The newest entry's ``seq`` (charges and events)."""
        return max([e["seq"] for e in self.charges[-1:]] + [e["seq"] for e in self.events[-1:]] + [0])


def population_state(ledger: Any, population: str, seq: int) -> dict[str, Any]:
    """The population's spend as of ledger entry ``seq``: ρ spent and remaining, ε (ledger's conversion),
    under the cap and allocations in force then (:class:`_LedgerView`). A pure function of
    immutable entries, so it replays."""
    return _LedgerView(ledger).population_states(population, [seq])[seq]
