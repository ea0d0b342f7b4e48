"""The gateway facade: policies, engines, ledger and release store, and one query's dispatch.

One query (see the design's "Data flow of one query")::

    policy → compile once (plan + strategy) → release cache lookup
        hit  → stored release, cost 0, cached = true
        miss → calibrate → render + engine checks → ledger.charge (before any data access)
             → bounded statements in the engine → noise (OpenDP) → post-processing → store release

``query`` and ``explain`` share one dispatch: :func:`dpgate.pipeline.runners.runner_for` on the
strategy :func:`dpgate.pipeline.strategy.choose` picked. A query that fails validation, planning
or calibration costs nothing. Once the charge is written it stays, whatever happens after
(execution error, timeout, noise or storage failure): charges are never refunded.

Identical concurrent requests are *single-flight*, and a charged release that was never stored
does not block its question: both are the release cache's (:class:`dpgate.releases.ReleaseCache`).
The ledger owns each population's cap and allocations once created: opening a gateway creates
missing populations from the policy files, and reports (never applies) a policy file that
differs (:meth:`Gateway.policy_drift`). Governance and store operations: :mod:`dpgate.pipeline.admin`.
"""

from __future__ import annotations

import logging
import secrets
from pathlib import Path
from typing import Any, Callable, Mapping

from dpgate.engines import EngineOptions, EngineSet
from dpgate.errors import BudgetExhausted, QueryTimeout, UnknownConsumer, UnknownDataset, UnsupportedQuery
from dpgate.ledger import Ledger, open_ledger
from dpgate.notices import first_notice
from dpgate.pipeline.admin import (AdminOperations, DatasetViews, StoreOperations, check_population_moves, ensure_populations,
                                   fingerprint_key, published_version)
from dpgate.pipeline.budget import QueryBudget
from dpgate.pipeline import private_bounds, private_truncation
from dpgate.pipeline.planning import check_text, compile_query, public_values, with_public_table_keys
from dpgate.pipeline.runners import QueryContext, Runner, runner_for
from dpgate.pipeline.strategy import ExactPublic, Strategy, TopK
from dpgate.policy import DatasetPolicy, load_policies
from dpgate.postprocess.expected import accuracy_reference, check_reference_rows, column_bounds, expected_accuracy
from dpgate.releases import ReleaseCache, ReleaseStore, open_release_store
from dpgate.settings import Settings
from dpgate.sql.explain import contribution, released_columns
from dpgate.sql.plan import QueryPlan

__all__ = ["Gateway", "RELEASE_LEASE_MARGIN_S"]

#: Margin (seconds) added to the engine's query timeout to make the release lease: how long
#: after a charge its release must be stored before another process declares it lost.
RELEASE_LEASE_MARGIN_S = 60.0
log = logging.getLogger("dpgate")


class Gateway(DatasetViews, AdminOperations, StoreOperations):
    """The in-process gateway: policies, the engines, the ledger and the release store.

    Build it with :meth:`open` (which loads policies and data) or inject the
    parts (tests). All public methods return JSON-ready dicts and raise
    :class:`~dpgate.errors.DpgateError` subclasses. Thread-safe.

    Args:
        policies: dataset name → policy.
        engine: a loaded :class:`~dpgate.engines.EngineSet` (one engine per dataset).
        data_versions: dataset name → published data version (from ``EngineSet.load``,
            keyed by :func:`_published_version`); None for a live source whose version
            comes from ``version_sql`` per query, or is unknown (release cache off).
        ledger: the budget ledger.
        releases: the release store (same backend as the ledger).
        salt_source: draws the secret that picks each unit's k groups (default: 63 bits
            from the OS CSPRNG; tests pass a constant to compare engines).
        fingerprint_key: the key of published data fingerprints (default: a per-process key).
        notice: ``(kind, key, text) -> bool``, whether a warning is new (default: every warning
            is); :meth:`open` passes :func:`dpgate.notices.first_notice` on the state folder, so a
            policy-drift warning is logged once per change.
    """

    def __init__(
        self,
        policies: Mapping[str, DatasetPolicy],
        engine: EngineSet,
        data_versions: Mapping[str, str | None],
        ledger: Ledger,
        releases: ReleaseStore,
        *,
        salt_source: Callable[[], int] | None = None,
        fingerprint_key: bytes | None = None,
        notice: Callable[[str, str, str], bool] | None = None,
    ) -> None:
        self.policies = dict(policies)
        self.engine = engine
        self.data_versions = dict(data_versions)
        self._salt_source = salt_source or (lambda: secrets.randbits(63))
        # keys published data fingerprints; a gateway built without one keys them per process
        self._fingerprint_key = fingerprint_key or secrets.token_bytes(32)
        self.ledger = ledger
        self.release_store = releases
        timeout = getattr(engine, "timeout_s", None)
        self.release_cache = ReleaseCache(releases, lease_s=(timeout or 30.0) + RELEASE_LEASE_MARGIN_S)
        check_population_moves(ledger, self.policies)  # issue 23: no renewal by renaming a population
        for population, drift in ensure_populations(ledger, self.policies).items():
            text = drift.message()
            # said once per change of the drift (`notice`: dpgate.notices.first_notice on the state
            # folder), not on every start or command; the API and `dpgate budget --json` always report it
            new = notice("policy_drift", population, text) if notice is not None else bool(text)
            if text:
                log.log(logging.WARNING if new else logging.DEBUG, "%s", text)

    @classmethod
    def open(cls, settings: Settings, *, progress: Callable[[str], None] | None = None,
             salt_source: Callable[[], int] | None = None) -> "Gateway":
        """Load the policies, the data (each dataset's engine), the ledger and the release store.

        Args:
            settings: injected configuration.
            progress: called with human-readable progress lines (loading large files).
            salt_source: see :class:`Gateway` (tests only; default: the OS CSPRNG).
        Raises:
            PolicyError: a policy file is invalid or names a missing source or column.
            LedgerError: the ledger cannot be opened.
        """
        policies = load_policies(Path(settings.policies))
        settings.home.mkdir(parents=True, exist_ok=True)
        engine = EngineSet(options=EngineOptions(
            timeout_s=settings.query_timeout_s,
            duckdb_memory_limit=settings.duckdb_memory_limit,
            duckdb_threads=settings.duckdb_threads,
            duckdb_load=settings.duckdb_load,
            in_place_above_bytes=settings.duckdb_in_place_above,
            spark_master=settings.spark_master,
        ))
        try:
            versions = engine.load(policies, progress=progress)
            ledger = open_ledger(settings.ledger_url_with_wait())  # bounded waits: 503 ledger_unavailable after
        except BaseException:
            engine.close()
            raise
        try:
            store = open_release_store(ledger)
            key = fingerprint_key(settings, store)
        except BaseException:
            ledger.close()
            engine.close()
            raise
        versions = {name: None if v is None else published_version(v, key) for name, v in versions.items()}
        home = settings.home
        return cls(policies, engine, versions, ledger, store, fingerprint_key=key, salt_source=salt_source,
                   notice=lambda kind, k, text: first_notice(home, kind, k, text))

    def close(self) -> None:
        """Close the search and release stores, the ledger and the engine."""
        searches = getattr(self, "_searches", None)
        if searches is not None:
            try:
                searches.store.close()
            except Exception:  # noqa: BLE001 - closing must not mask the caller's error
                pass
        for closer in (self.release_store.close, self.ledger.close, self.engine.close):
            try:
                closer()
            except Exception:  # noqa: BLE001 - closing must not mask the caller's error
                pass

    def __enter__(self) -> "Gateway":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----------------------------------------------------------------- datasets

    def policy(self, dataset: str) -> DatasetPolicy:
        """The policy of ``dataset``; raises :class:`UnknownDataset`."""
        try:
            return self.policies[dataset]
        except KeyError:
            raise UnknownDataset.named(dataset, self.policies) from None

    def population_of(self, dataset: str) -> str:
        """The population (ledger key) whose budget ``dataset`` spends."""
        return self.policy(dataset).population

    def datasets(self) -> list[dict[str, Any]]:
        """The published guarantee of every dataset (see :meth:`dataset`)."""
        return [self.dataset(name) for name in sorted(self.policies)]

    def _data_version(self, dataset: str) -> str:
        """The published data version a query is cached under.

        A declared version or a source fingerprint is fixed at load (reload to change
        it); ``version_sql`` is evaluated now and published keyed (HMAC), like a
        fingerprint. Without any version the release cache is off for the dataset:
        every query gets a fresh ``unversioned:`` key that nothing else shares.
        """
        version = self.data_versions.get(dataset)
        if version is not None:
            return version
        describe = getattr(self.engine, "describe", None)
        if describe is not None and describe(dataset)["versioned_by"] == "version_sql":
            raw = self.engine.current_version(dataset)
            if raw is not None:
                return published_version(raw, self._fingerprint_key)
        return f"unversioned:{secrets.token_hex(16)}"

    def reload(self, dataset: str, *, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
        """Load ``dataset``'s data again without a restart (its files changed).

        The new data gets a new data version (a new fingerprint, or the policy's
        declared one); releases of the old data stay stored and are served as they
        were; queries on the new data are computed and charged afresh. Queries
        running during the reload finish on the old data.

        Returns:
            The dataset view (:meth:`dataset`) after the reload.
        Raises:
            UnknownDataset; PolicyError (the new files are invalid: the old data keeps serving).
        """
        self.policy(dataset)
        report = self.engine.reload(dataset, progress=progress)
        raw = report.data_version
        self.data_versions[dataset] = (None if raw is None
                                       else published_version(raw, self._fingerprint_key))
        return self.dataset(dataset)

    # ----------------------------------------------------------------- planning

    def compile(self, dataset: str, sql: str, dialect: str | None = None
                ) -> tuple[DatasetPolicy, QueryPlan, Strategy]:
        """Plan ``sql`` once and choose its release strategy (:func:`dpgate.pipeline.planning.compile_query`).

        Returns:
            ``(policy, plan, strategy)``: the policy the plan reads (a joined table's for a join),
            the validated plan and its strategy. Reads no protected data, charges nothing.
        Raises:
            UnknownDataset, InvalidSql, UnsupportedQuery, UnknownTable, UnknownColumn (nothing charged).
        """
        policy = self._with_public_table_keys(self.policy(dataset))
        check_text(sql)
        return compile_query(policy, sql, dialect, values_of=self._public_values_of(policy, dialect))

    def _public_values_of(self, policy: DatasetPolicy, dialect: str | None):
        """The exact answers of public IN/EXISTS subqueries (:func:`dpgate.pipeline.planning.public_values`),
        cached per data version and subquery (public data only)."""
        cache = self.__dict__.setdefault("_public_values_cache", {})
        version = self.data_versions.get(policy.name)

        def values_of(select):
            key = (policy.name, version, select.sql(dialect="duckdb"))
            if version is not None and key in cache:
                return cache[key]
            values = public_values(self.engine, policy, select, dialect)
            if version is not None:
                cache[key] = values
            return values
        return values_of

    def _plan(self, dataset: str, sql: str, dialect: str | None = None) -> tuple[DatasetPolicy, QueryPlan]:
        """``(policy, plan)`` of :meth:`compile`."""
        policy, plan, _ = self.compile(dataset, sql, dialect)
        return policy, plan

    def _with_public_table_keys(self, policy: DatasetPolicy) -> DatasetPolicy:
        """The policy with its public tables' values as keys (:func:`dpgate.pipeline.planning.with_public_table_keys`)."""
        cache = self.__dict__.setdefault("_public_keys_cache", {})
        return with_public_table_keys(self.engine, policy, self.data_versions.get(policy.name), cache)

    def _runner(self, dataset: str, policy: DatasetPolicy, strategy: Strategy) -> Runner:
        """The one dispatch of :meth:`query` and :meth:`explain`: the strategy's runner, given what it
        may use explicitly."""
        return runner_for(strategy, QueryContext(
            dataset=dataset, policy=policy, ledger=self.ledger, engine=self.engine,
            release_cache=self.release_cache, data_version=lambda: self._data_version(dataset),
            salt_source=self._salt_source))

    # ----------------------------------------------------------------- explain

    def explain(self, dataset: str, sql: str, *, budget: QueryBudget | None = None,
                mechanism: str | None = None, consumer: str | None = None,
                dialect: str | None = None, trial: bool = False,
                reference_rows: float | None = None) -> dict[str, Any]:
        """:meth:`_explain`'s document with ``expected_accuracy``: each primitive's sensitivity in
        its unit and each output's expected 95 % half-width
        (:func:`dpgate.postprocess.expected.expected_accuracy`, from the document alone), and
        ``warnings`` (issue 22 item 6): one sentence per output whose ± would swamp it, compared
        with its column's bounds (``column_bounds``) at a group of ``reference_rows`` rows
        (default: the budget's ``expected_count``, else
        :data:`~dpgate.postprocess.expected.DEFAULT_REFERENCE_ROWS`), data-independent.

        Raises:
            as :meth:`_explain`; InvalidRequest: ``reference_rows`` not a number > 1.
        """
        check_reference_rows(reference_rows)
        if consumer is not None:
            self._check_consumer(self.policy(dataset), consumer)
        doc, planned = self._explain(dataset, sql, budget=budget, mechanism=mechanism, consumer=consumer,
                                     dialect=dialect, trial=trial)
        if doc.get("plan") and not doc.get("public") and not doc.get("public_keys_only"):
            # issue 22 item 6: the bounds and group size each output's ± is compared with (data-independent);
            # ``planned`` declares the plan's source view (a join's, per-unit subquery's, unit path's)
            doc["column_bounds"] = column_bounds(planned, doc["plan"])
            doc["accuracy_reference"] = accuracy_reference(
                self.policy(dataset), reference_rows, None if budget is None else budget.expected_count)
        doc["expected_accuracy"] = expected_accuracy(doc)
        doc["warnings"] = [w["message"] for w in doc["expected_accuracy"].get("warnings", [])]
        return doc

    def _check_consumer(self, policy: DatasetPolicy, consumer: str) -> None:
        """Raise :class:`~dpgate.errors.UnknownConsumer` when the population allocates its budget
        and ``consumer`` has no allocation (the ledger's allocations in force; an open population
        admits any consumer). Charges nothing."""
        allocations = self.ledger.allocations(policy.population)  # one row: this runs on every request
        if allocations and consumer not in allocations:
            raise UnknownConsumer(
                f"population {policy.population!r} has no allocation for consumer {consumer!r}",
                {"population": policy.population, "consumer": consumer, "consumers": sorted(allocations)})

    def _explain(self, dataset: str, sql: str, *, budget: QueryBudget | None = None,
                 mechanism: str | None = None, consumer: str | None = None,
                 dialect: str | None = None, trial: bool = False) -> tuple[dict[str, Any], DatasetPolicy]:
        """Plan, bounded SQL (salt hidden), sensitivities and cost of a query (the strategy's runner),
        and the policy it was planned against (declaring the plan's source view).

        Reads no data and charges nothing. Raises the same errors as :meth:`query`
        before its charge. ``cost.fits`` says whether the charge fits what is left
        for ``consumer`` (or for the population when None), from the ledger's spend
        report: a charge that does not fit is refused by :meth:`query` with
        ``budget_exhausted`` and nothing is written. A ``ci95`` budget adds
        ``accuracy_target``: each cell's rule and the half-width it will report.
        ``dialect`` is as for :meth:`query`. With ``trial``, the plan also runs on the dataset's
        proxy (free; :func:`dpgate.proxy.trial`): ``trial`` holds what the answer would look like
        and the ± each cell would carry at the requested budget (issue 23 item 6). For a
        population with cohorts, ``cohorts`` lists the cohorts the charge would draw on and
        ``cost.fits`` is checked against each of them.

        Raises:
            as :meth:`query` before its charge; InvalidRequest: ``trial`` without a proxy.
        """
        compiled, budget, note = private_bounds.for_explain(  # issue 22 item 3
            self, dataset, sql, dialect, self.compile(dataset, sql, dialect), budget=budget, mechanism=mechanism,
            consumer=consumer)
        (policy, plan, strategy), budget, note_m = private_truncation.for_explain(  # issue 22 item 4
            self, dataset, sql, dialect, compiled, budget=budget, mechanism=mechanism, consumer=consumer)
        # what dpgate explain prints as well: the released columns and the contribution bounds
        parts = getattr(strategy, "parts", None)  # a union's plan is its first part's, over that part's tables
        shown = {"columns": released_columns(plan),
                 "contribution": contribution(plan, parts[0].policy if parts else policy)}
        on_proxy = None
        if trial:  # utility trial on the proxy (issue 23 item 6): free, reads only the proxy
            from dpgate.proxy import trial as proxy_trial

            def on_proxy(plan: QueryPlan, cal: Any) -> Any:
                return proxy_trial(self, policy, plan, cal)

        return note(note_m(self._runner(dataset, policy, strategy).explain(
            shown, budget=budget, mechanism=mechanism, consumer=consumer, trial=on_proxy))), policy

    # ----------------------------------------------------------------- query

    def query(self, dataset: str, sql: str, *, consumer: str, budget: QueryBudget | None = None,
              mechanism: str | None = None, dialect: str | None = None,
              search_id: str | None = None, fallback: str | None = None) -> dict[str, Any]:
        """Answer ``sql`` with a DP release (:meth:`_answer`); when the budget refuses it and
        ``fallback`` is ``"proxy"`` (or None and the policy's ``proxy_default_for`` names the
        consumer), answer the same plan on the dataset's proxy instead: exact, free, labelled
        ``"source": "proxy"``, ``"dp": false``, never stored in the release cache
        (:mod:`dpgate.proxy`, issue 23). ``fallback = "none"`` never falls back.

        Raises:
            as :meth:`_answer`; InvalidRequest: ``fallback`` not "proxy"/"none", or "proxy" for a
            dataset without a proxy (checked before anything is charged).
        """
        from dpgate.proxy import check_fallback, fallback_answer  # proxy hook (issue 23)

        check_fallback(self.policy(dataset), fallback)
        try:
            return self._answer(dataset, sql, consumer=consumer, budget=budget, mechanism=mechanism,
                                dialect=dialect, search_id=search_id)
        except QueryTimeout as exc:  # one after the charge says charged (runners._charged_execution)
            exc.details.setdefault("charged", False)
            raise
        except BudgetExhausted as refusal:
            answer = fallback_answer(self, dataset, sql, consumer=consumer, dialect=dialect, fallback=fallback,
                                     refusal=refusal)
            if answer is None:
                raise
            return answer

    def _answer(self, dataset: str, sql: str, *, consumer: str, budget: QueryBudget | None = None,
                mechanism: str | None = None, dialect: str | None = None,
                search_id: str | None = None) -> dict[str, Any]:
        """Answer ``sql`` on ``dataset`` with a DP release, charged to ``consumer``'s allocation.

        Args:
            dataset: dataset name (policy).
            sql: the analyst's SQL text (never executed as such).
            consumer: the allocation that pays (from the principal, not the request).
            budget: the release's budget (None: the policy's ``default_query_rho``).
            mechanism: ``"gaussian"`` (discrete Gaussian, zCDP) or ``"laplace"``
                (discrete Laplace, pure ε); None: the policy's default. A selection query
                (keys only, ORDER BY an aggregate, LIMIT k) always uses the exponential
                mechanism (:mod:`dpgate.selection`) and ignores it.
            search_id: a selection query's search record (:mod:`dpgate.searches`): it must be
                open and of the dataset's population; the selection is recorded in it.
            dialect: the SQL dialect ``sql`` is written in (one of
                :data:`dpgate.sql.parse.DIALECTS`; None: ``duckdb``). The plan, its hash
                and the release cache do not depend on it.
        Returns:
            The release document: ``{release_id, dataset, columns, rows, accuracy,
            charge: {rho, epsilon_at_delta, charge_id} | None, cached, data_version,
            created_at, guarantee, …}``. A cache hit has ``cached = True`` and
            ``charge = None`` (it cost nothing).
        Raises:
            InvalidSql, UnsupportedQuery, UnknownTable, UnknownColumn, InvalidBudget,
            UnknownDataset, UnknownConsumer: before any charge.
            BudgetExhausted: the charge did not fit; nothing was written.
            QueryTimeout: ``details.charged`` says whether it came before the charge (nothing
            charged) or after it (the charge stays; ``details.charge_id`` names it).
            ExecutionError, MechanismError: after the charge, which stays.
        """
        policy, _, strategy = self.compile(dataset, sql, dialect)
        self._check_consumer(policy, consumer)  # before the cache: a stored release is not served to a typo
        if search_id is not None and not isinstance(strategy, TopK):  # a search records selections only
            if isinstance(strategy, ExactPublic):
                raise UnsupportedQuery("this query reads public tables only: it is answered exactly and free, "
                                       "without search_id; a search records public-data selection when it is "
                                       "closed", {"reason": "search_public_query"})
            raise UnsupportedQuery("search_id goes with a selection query (keys only, ORDER BY an aggregate, "
                                   "LIMIT k); charge other steps of a search through /v1/ledger/charges",
                                   {"reason": "search_needs_selection"})
        if search_id is not None:  # the consumer's own search only (another's: NotFound)
            self.searches.check_open(search_id, population=policy.population, consumer=consumer)
        compiled, budget, note = private_bounds.for_answer(  # issue 22 item 3: estimates charged first
            self, dataset, sql, dialect, (policy, _, strategy), budget=budget, mechanism=mechanism, consumer=consumer,
            then=private_truncation.check_next(self, dataset, (policy, _, strategy), mechanism=mechanism,
                                               consumer=consumer))
        (policy, _, strategy), budget, note_m = private_truncation.for_answer(  # issue 22 item 4: the choice of m first
            self, dataset, sql, dialect, compiled, budget=budget, mechanism=mechanism, consumer=consumer)
        release = note(note_m(self._runner(dataset, policy, strategy).answer(
            consumer=consumer, budget=budget, mechanism=mechanism, search_id=search_id)))
        if search_id is not None:  # selection hook (issue 15): the selection is recorded in its search
            self.searches.record_selection(search_id, release, consumer=consumer)
        return release
