"""Request and response models of the HTTP API (pydantic v2).

Request models are strict (no silent coercion of ``"0.1"`` to a number, no
unknown fields: a body that tries to name its own ``consumer`` is refused) and
reject non-finite numbers (NaN, ±inf) and absurd magnitudes before anything
reaches the gateway. Response models describe the documented fields and let
the gateway add more (``extra="allow"``); non-finite floats in responses (an
RDP order ∞, an ε of ∞ at δ = 0) are written as the strings ``"inf"``,
``"-inf"`` and ``"nan"`` (as in the ledger's reports), since JSON has no literal
for them; requests may write +∞ as ``"inf"`` or ``"Infinity"``.

Units: ``rho`` is a zCDP ρ, ``epsilon`` an ε (pure DP for the Laplace mechanism,
or the ε of an (ε, δ) cap); both are **per release** in requests, **totals**
in spend reports. ``ci95`` is the requested half-width of a 95 % interval of
the noise on each released count/sum, in the column's units.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StringConstraints, model_validator
from pydantic_core import PydanticCustomError

from dpgate import limits
from dpgate.errors import DpgateError, did_you_mean
from dpgate.service import QueryBudget

from dpgate.policy import MECHANISMS
from dpgate.sql.parse import DIALECT_ALIASES, DIALECTS, check_dialect

#: Largest ρ or ε a request may name (anything near it is refused by any sane cap anyway).
MAX_PRIVACY_PARAMETER = QueryBudget.MAX_RHO
#: Largest ci95 half-width a request may name.
MAX_CI95 = QueryBudget.MAX_CI95
#: Longest SQL text accepted.
MAX_SQL_CHARS = 20_000
#: Most RDP orders in an external curve.
MAX_CURVE_POINTS = 1024

#: A population or consumer name (the ledger's rule: 1-128 of ``[A-Za-z0-9._:@/+-]``, starting alphanumeric).
Name = Annotated[str, StringConstraints(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:@/+-]*$")]
DatasetName = Annotated[str, StringConstraints(min_length=1, max_length=128)]
Text = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=1000)]
PositiveParameter = Annotated[float, Field(gt=0, le=MAX_PRIVACY_PARAMETER, allow_inf_nan=False)]


def _infinity_from_text(value: Any) -> Any:
    """Accept ``"inf"``, ``"Infinity"`` or ``"∞"`` for +∞ (JSON has no literal for it)."""
    if isinstance(value, str) and value.strip().lower() in {"inf", "+inf", "infinity", "+infinity", "∞"}:
        return math.inf
    return value


#: An RDP order α > 1 (∞ allowed: the pure-ε limit; NaN refused since NaN > 1 is false).
Order = Annotated[float, BeforeValidator(_infinity_from_text), Field(gt=1)]
#: An RDP curve value ε(α) >= 0 (+∞ allowed, e.g. a Gaussian's curve at α = ∞; NaN refused).
CurveValue = Annotated[float, BeforeValidator(_infinity_from_text), Field(ge=0)]


class RequestModel(BaseModel):
    """Base of request bodies: strict types, unknown fields refused.

    An unknown field is refused with a message that names the fields the object
    accepts and the closest one (``budjet`` → did you mean ``budget``?).
    """

    model_config = ConfigDict(strict=True, extra="forbid")

    #: Extra words for particular unknown fields (why the field does not exist).
    field_hints: ClassVar[dict[str, str]] = {}

    @model_validator(mode="before")
    @classmethod
    def _known_fields(cls, data: Any) -> Any:
        if isinstance(data, dict):
            allowed = list(cls.model_fields)
            unknown = [k for k in data if k not in cls.model_fields]
            if unknown:
                first = str(unknown[0])
                hint = cls.field_hints.get(first) or did_you_mean(first, allowed).strip(" ()")
                more = f" (and {len(unknown) - 1} more)" if len(unknown) > 1 else ""
                message = f"unknown field {first!r}{more}" + (f": {hint}" if hint else "")
                message += f"; expected: {', '.join(allowed)}"
                raise PydanticCustomError("extra_forbidden", "{message}", {"message": message})
        return data


class ResponseModel(BaseModel):
    """Base of response bodies: documented fields typed, extra fields passed through."""

    model_config = ConfigDict(extra="allow")


#: A number in a response; non-finite values are the strings "inf", "-inf" or "nan".
Number = float | Literal["inf", "-inf", "nan"]
#: The mechanisms a request may name (the one list: :data:`dpgate.policy.MECHANISMS`).
MechanismChoice = Literal[tuple(MECHANISMS)]
def _dialect_name(value: Any) -> Any:
    """A dialect in any case or by an alias → its name in :data:`dpgate.sql.parse.DIALECTS`
    (``"DuckDB"`` → ``"duckdb"``, ``"PostgreSQL"`` → ``"postgres"``); an unknown name is a 400
    whose message lists the accepted names (:func:`dpgate.sql.parse.check_dialect`)."""
    if not isinstance(value, str):
        return value
    try:
        return check_dialect(value)
    except DpgateError:  # the message names the accepted names, never the value sent
        raise PydanticCustomError("dialect", "{message}", {"message": (
            f"unknown SQL dialect: use one of {', '.join(DIALECTS)} (any case; also "
            f"{', '.join(sorted(DIALECT_ALIASES))})")}) from None


#: The SQL dialects a request may be written in (the one list: :data:`dpgate.sql.parse.DIALECTS`),
#: accepted in any case and by the aliases of :data:`dpgate.sql.parse.DIALECT_ALIASES`.
DialectChoice = Annotated[Literal[tuple(DIALECTS)], BeforeValidator(_dialect_name)]


# --- requests --------------------------------------------------------------------------


def _budget_field(maximum: float, what: str, exclusive_minimum: float = 0) -> Any:
    """A budget number: typed here, validated by :class:`~dpgate.service.QueryBudget` (one
    validator for HTTP and CLI); the limits are published in the OpenAPI schema."""
    return Field(default=None, description=what,
                 json_schema_extra={"exclusiveMinimum": exclusive_minimum, "maximum": maximum})


class BudgetRequest(RequestModel):
    """The privacy budget of one release: at most one of ``rho``, ``epsilon``, ``ci95``, and ``delta``.

    * ``rho`` — zCDP ρ of this release, summed over its noisy primitives
      (Gaussian: σ = Δ2/√(2ρ) per primitive, Bun & Steinke 2016, Prop. 1.6; for
      the Laplace mechanism it buys ε = √(2ρ), Bun & Steinke 2016, Prop. 1.4).
    * ``epsilon`` — Gaussian: a standalone (ε, δ) guarantee for this release at
      the cap's δ, turned into ρ by the tight conversion of Canonne, Kamath &
      Steinke 2020, Cor. 13; Laplace: the release's pure ε.
    * ``ci95`` — the 95 % half-width wanted on each released cell, in its output
      units; the gateway derives the noise scales and charges the implied cost
      (explain shows it and whether it fits). AVG, VAR and STDDEV need
      ``expected_count``: the rows per group the analyst expects (the half-width of a
      ratio depends on the count, unknown before the release).
    * ``delta`` — for a query that selects keys privately (a GROUP BY column without public
      keys): the δ its threshold mechanism may spend (OpenDP's Gaussian/Laplace threshold;
      the threshold is the smallest whose δ fits); default the policy's
      ``default_selection_delta``. With ``delta`` alone, ρ is the policy's default.

    Values are checked by :class:`dpgate.service.QueryBudget` (the CLI's
    validator too): a value that is not a finite number in (0, max], or a budget
    naming none or several, is 400 ``invalid_budget``.
    """

    rho: float | None = _budget_field(QueryBudget.MAX_RHO, "zCDP ρ of this release")
    epsilon: float | None = _budget_field(QueryBudget.MAX_EPSILON, "ε of this release at the δ it is charged at, the "
                                          "cap's δ less its selection δ (pure ε at δ = 0 for Laplace)")
    ci95: float | None = _budget_field(QueryBudget.MAX_CI95, "95 % half-width wanted on each released cell")
    expected_count: float | None = _budget_field(1e15, "with ci95: rows expected per group (AVG/VAR/STDDEV), > 1",
                                                   exclusive_minimum=1)
    delta: float | None = Field(default=None, description=(
        "δ spent on private partition selection (GROUP BY keys without public keys; issue 11), in (0, 1); "
        "default: the policy's default_selection_delta"), json_schema_extra={"exclusiveMinimum": 0, "exclusiveMaximum": 1})

    def to_query_budget(self) -> QueryBudget:
        """The validated :class:`~dpgate.service.QueryBudget`; raises InvalidBudget."""
        return QueryBudget.from_request({"rho": self.rho, "epsilon": self.epsilon, "ci95": self.ci95,
                                          "expected_count": self.expected_count, "delta": self.delta})


class QueryRequest(RequestModel):
    """``POST /v1/queries`` and ``POST /v1/queries/explain``.

    The consumer whose allocation pays is the API key's, never a field of the body.
    """

    field_hints: ClassVar[dict[str, str]] = {
        "consumer": "the consumer (allocation that pays) comes from the API key, never from the request",
    }

    dataset: DatasetName
    sql: Annotated[str, StringConstraints(min_length=1, max_length=MAX_SQL_CHARS)]
    budget: BudgetRequest | None = Field(
        default=None, description="per-release budget; the dataset's default_query_rho when absent"
    )
    mechanism: MechanismChoice | None = Field(
        default=None, description="noise mechanism; the dataset's policy default when absent"
    )
    dialect: DialectChoice | None = Field(
        default=None,
        description="the SQL dialect `sql` is written in (sqlglot names, any case; also postgresql, "
        "mssql, sqlserver, sparksql, databricks, googlesql, pg); duckdb when absent. "
        "The plan, its hash and the release cache do not depend on it",
    )
    search_id: Annotated[str, StringConstraints(min_length=1, max_length=64)] | None = Field(
        default=None, description="a selection query's search record (issue 15): it must be open and the "
                                  "key's consumer's own (another consumer's is 404 not_found); the "
                                  "selection is recorded in it")
    fallback: Literal["proxy", "none"] | None = Field(
        default=None, description="POST /v1/queries only: when the budget refuses the query, \"proxy\" answers the "
        "same plan on the dataset's proxy (exact, free, labelled source = proxy, dp = false, never cached); "
        "\"none\" never falls back; absent: the policy's proxy_default_for decides (issue 23)")
    trial: bool | None = Field(
        default=None, description="POST /v1/queries/explain only: also run the plan on the dataset's proxy (free) and "
        "show the answer it would give with each cell's ± at the requested budget (issue 23)")
    reference_rows: Annotated[float, Field(gt=1, le=1e15, allow_inf_nan=False)] | None = Field(
        default=None, description="POST /v1/queries/explain only: the group size (rows) at which each output's "
        "expected ± is compared with its column's bounds for the warnings (issue 22); default the budget's "
        "expected_count, else 100")


class DpSgdRequest(RequestModel):
    """A DP-SGD run described by its parameters (the gateway computes the RDP curve)."""

    q: Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)] = Field(description="sampling rate per step")
    noise_multiplier: Annotated[float, Field(gt=0, le=1e6, allow_inf_nan=False)] = Field(
        description="noise standard deviation over the clipping norm")
    steps: Annotated[int, Field(ge=1, le=100_000_000)]
    sampler: Literal["poisson", "shuffle", "fixed_batches", "with_replacement"] = Field(
        description="how batches were drawn; only poisson is amplified by subsampling")

    def to_dict(self) -> dict[str, Any]:
        """``{q, noise_multiplier, steps, sampler}``: the DP-SGD description as
        :mod:`dpgate.training` validates it (q a sampling rate in (0, 1], σ the noise
        multiplier, steps a count; no units)."""
        return {"q": self.q, "noise_multiplier": self.noise_multiplier, "steps": self.steps, "sampler": self.sampler}


class ExternalChargeRequest(RequestModel):
    """``POST /v1/ledger/charges``: charge a cost computed outside the gateway (e.g. DP-SGD).

    * ``kind = "rdp"``: ``curve`` is ε(α) at ``orders`` (default: the ledger's order
      grid ``dpgate.accounting.ORDERS``; a curve on the caller's own grid is mapped onto
      the ledger's conservatively: each ledger order takes the value at the next caller
      order above it, see ``GET /v1/ledger/orders``).
    * ``kind = "gaussian"``: a composition of continuous Gaussian mechanisms of
      total zCDP ``rho`` (eligible for exact Gaussian-DP reporting).
    * ``kind = "zcdp"``: any ρ-zCDP mechanism.
    """

    population: Name
    consumer: Name | None = Field(
        default=None, description="who pays: required with an admin key; a service key's own consumer otherwise"
    )
    kind: Literal["rdp", "gaussian", "zcdp"] = "rdp"
    curve: Annotated[list[CurveValue], Field(min_length=1, max_length=MAX_CURVE_POINTS)] | None = None
    orders: Annotated[list[Order], Field(min_length=1, max_length=MAX_CURVE_POINTS)] | None = None
    rho: PositiveParameter | None = None
    purpose: Text
    search_id: Annotated[str, StringConstraints(min_length=1, max_length=64)] | None = Field(
        default=None, description="the search this charge is a step of (issue 15); failed runs and retries too. "
                                  "It must be the paying consumer's search (another consumer's is 404 not_found; "
                                  "an admin must name the search's consumer)")
    candidate: Annotated[str, StringConstraints(min_length=1, max_length=200)] | None = Field(
        default=None, description="with search_id: the candidate configuration this run trains")
    step: Literal["training", "retry", "evaluation", "stopping", "other"] | None = Field(
        default=None, description="with search_id: what the charge pays for (default training)")
    outcome: Literal["completed", "failed", "target_missed", "discarded", "aborted"] | None = Field(
        default=None, description="with search_id: how the run ended (failed and missed runs stay charged)")
    attempt: Annotated[int, Field(ge=1, le=10_000)] | None = Field(
        default=None, description="with search_id: attempt number of a retried run")
    note: Annotated[str, StringConstraints(min_length=1, max_length=2000)] | None = None
    dp_sgd: DpSgdRequest | None = Field(
        default=None, description="a DP-SGD run by its parameters {q, noise_multiplier, steps, sampler}: the gateway "
        "computes its RDP curve (Poisson-subsampled Gaussian for poisson, no amplification otherwise); with curve, "
        "the caller's curve must be at least the gateway's (issue 23)")
    cohorts: Annotated[list[Annotated[str, StringConstraints(min_length=1, max_length=200)]],
                       Field(min_length=1, max_length=10_000)] | None = Field(
        default=None, description="for a population with cohorts: the cohorts whose units the run read (default: "
        "every cohort its policies declare)")

    @model_validator(mode="after")
    def _consistent(self) -> "ExternalChargeRequest":
        if self.dp_sgd is not None and self.curve is None:
            if self.rho is not None or self.orders is not None:
                raise ValueError("dp_sgd alone describes the run: give neither rho nor orders (or give a curve to "
                                 "have it checked against the gateway's)")
            return self
        if self.kind == "rdp":
            if self.curve is None or self.rho is not None:
                raise ValueError('kind "rdp" needs curve (and optionally orders), not rho')
            if self.orders is not None and len(self.orders) != len(self.curve):
                raise ValueError("orders and curve must have the same length")
        else:
            if self.rho is None or self.curve is not None or self.orders is not None:
                raise ValueError(f'kind "{self.kind}" needs rho, not curve or orders')
        return self


class SearchDataset(RequestModel):
    """A data boundary of a search: a dataset's name and the population (people) it is about."""

    name: Annotated[str, StringConstraints(min_length=1, max_length=200)]
    population: Annotated[str, StringConstraints(min_length=1, max_length=128)] | None = Field(
        default=None, description="the people the data is about (required for training; none: public data)")
    description: Annotated[str, StringConstraints(min_length=1, max_length=500)] | None = None


class SearchCandidate(RequestModel):
    """One candidate configuration (hyper-parameters, base model…); never validation scores."""

    name: Annotated[str, StringConstraints(min_length=1, max_length=200)]
    config: dict[str, Any] | None = None


class SearchRequest(RequestModel):
    """``POST /v1/searches``: declare a tuning/selection search (issue 15); charges nothing.

    ``people``: whether training and validation data hold the same people (one population) or
    disjoint people (different populations, with ``people_split`` saying how they were split;
    disjoint rows of one population are not disjoint people). ``stopping = "data-dependent"``
    is refused unless ``stopping_privatised`` (each stopping decision is then a charged step).
    """

    purpose: Text
    consumer: Name | None = Field(default=None, description="who pays: required with an admin key")
    candidates: Annotated[list[SearchCandidate], Field(min_length=1, max_length=1000)]
    training: SearchDataset
    validation: SearchDataset
    people: Literal["same", "disjoint"] = "same"
    people_split: Annotated[str, StringConstraints(min_length=1, max_length=500)] | None = None
    selection: Literal["private", "public"]
    stopping: Literal["fixed", "data-dependent"] = "fixed"
    stopping_privatised: bool = False


class SearchCloseRequest(RequestModel):
    """``POST /v1/searches/{id}/close``: the selected candidate and its artifact ids."""

    selected: Annotated[str, StringConstraints(min_length=1, max_length=200)]
    artifacts: Annotated[list[Annotated[str, StringConstraints(min_length=1, max_length=500)]],
                         Field(max_length=100)] = []
    selection_release: Annotated[str, StringConstraints(min_length=1, max_length=128)] | None = Field(
        default=None, description="private selection: the selection release recorded in this search")
    note: Annotated[str, StringConstraints(min_length=1, max_length=2000)] | None = None


class SearchRecord(ResponseModel):
    """A search record: declaration, steps with the accountant's state after each, totals, replay."""

    search_id: str
    status: Literal["open", "closed"]
    steps: list[dict[str, Any]]
    totals: dict[str, Any]
    replay: dict[str, Any]


class SearchList(ResponseModel):
    """``GET /v1/searches``: newest first."""

    searches: list[dict[str, Any]]


class RenewalRequest(RequestModel):
    """``POST /v1/admin/populations/{p}/renew``: always refused (409 ``renewal_refused``), with the arithmetic."""

    reason: Text


class CapChangeRequest(RequestModel):
    """``POST /v1/admin/populations/{p}/cap``: a new (ε, δ) cap with the reason for the change."""

    epsilon: Annotated[float, Field(gt=0, le=limits.MAX_CAP_EPSILON, allow_inf_nan=False)]
    delta: Annotated[float, Field(gt=0, lt=1, allow_inf_nan=False)]
    reason: Text


class PinRequest(RequestModel):
    """``PUT /v1/dashboards/{name}/pins/{release_id}``: the title shown on the dashboard (empty:
    the page derives one from the release's column names)."""

    title: Annotated[str, Field(default="", max_length=200)] = ""


# --- responses -------------------------------------------------------------------------


class ErrorBody(BaseModel):
    """The inner object of every error response."""

    code: str = Field(description="stable machine-readable code, e.g. budget_exhausted")
    message: str
    details: dict[str, Any] = Field(default_factory=dict)


class ErrorResponse(BaseModel):
    """Every 4xx/5xx answer: ``{"error": {"code", "message", "details"}}``."""

    error: ErrorBody


class Health(BaseModel):
    """``GET /healthz``."""

    status: Literal["ok"] = "ok"
    version: str


class Readiness(BaseModel):
    """``GET /readyz`` when ready: every check ``"ok"`` (a failed check answers 503
    ``ledger_unavailable`` with the same ``checks`` in ``details``)."""

    status: Literal["ready"] = "ready"
    version: str
    checks: dict[str, Literal["ok"]] = Field(description="ledger, release_store")


class ChargeSummary(ResponseModel):
    """The charge that paid for a release: ρ (zCDP) and ε of this charge alone at ``delta``, the δ it was
    charged at (the cap's δ less its selection δ; 0 for a pure-ε charge), by the ledger's one conversion
    (its cap rule; README "One conversion: the ledger's")."""

    charge_id: str
    rho: Number | None = None
    epsilon_at_delta: Number | None = None
    filter: Literal["renyi", "gdp"] | None = Field(
        default=None, description='the ledger filter that admitted the charge: "renyi" (Rényi/zCDP) or "gdp" '
                                  "(Gaussian-DP, a population of composition gdp)")
    gdp_mu: Number | None = Field(default=None, description="with filter gdp: the release's μ (μ-GDP)")


class Release(ResponseModel):
    """One immutable noisy answer; re-serving it is free post-processing.

    ``charge`` names the ledger charge that paid for the release (ρ and ε of that
    charge alone at the δ it was charged at), or is null when none applies; ``cached`` is
    true when this response served a stored release and spent nothing.
    ``guarantee.renewal`` states the renewal rule (and, with cohorts, the cohorts drawn on).
    A proxy answer (``fallback: "proxy"`` after a budget refusal) has ``source: "proxy"``,
    ``dp: false``, ``proxy {dataset, provenance}``, ``refused`` and ``stored: false``.
    """

    release_id: str
    dataset: str
    columns: list[str]
    rows: list[list[Any]]
    accuracy: dict[str, dict[str, Any]] = Field(
        description="per column, in the column's own units: mechanism, sigma or scale (noise std / Laplace "
                    "scale), ci95 half-width; for a quantile rank_error95 (ranks) instead"
    )
    noise_scales: dict[str, Number] | None = Field(
        default=None,
        description="per primitive (p0, p1, …): the sampler's σ or Laplace scale on the integer scale the bounded "
                    "query computes — rows for counts, integer steps of the resolution for sums, of resolution² "
                    "for sums of squares, ranks for quantiles; see noise_scale_units for the value-scale figure")
    noise_scale_units: dict[str, dict[str, Any]] | None = Field(
        default=None,
        description="per primitive: {kind, column, in (the unit in words), unit (output units per integer step; "
                    "null for a quantile), value_scale (noise_scales × unit, in the output's units)}")
    value_ranges: dict[str, dict[str, Any]] | None = Field(
        default=None,
        description="per aggregate column: {lower, upper (null: unbounded), clamped, rule}: the range its true "
                    "value lies in, from the declared bounds (a count >= 0, an AVG or quantile in [lower, upper], "
                    "a STDDEV in [0, (upper-lower)/2]); clamped: the released value is clamped into it, so a value "
                    "on a bound was at or beyond it before clamping. Error bars may be clipped to it.")
    charge: ChargeSummary | None = None
    cached: bool
    data_version: str | None = None
    created_at: str


class Pin(ResponseModel):
    """A release pinned to a dataset's dashboard."""

    dashboard: str
    release_id: str
    title: str
    pinned_by: str
    pinned_at: str
    release: Release | None = None


class PinList(ResponseModel):
    """``GET /v1/dashboards/{name}/pins``: oldest first."""

    pins: list[Pin]


class ReleaseList(ResponseModel):
    """``GET /v1/releases``: newest first."""

    releases: list[Release]


class Explanation(ResponseModel):
    """``POST /v1/queries/explain``: what a query would do and cost; reads no data, charges nothing."""

    canonical_sql: str
    plan_hash: str
    bounded_sql: str | None = Field(
        description="the bounded DuckDB SQL of the count/sum primitives, with the secret salt shown as "
        "<salt>; null when there are none (a query of quantiles only, or of public tables only)")
    sensitivity: dict[str, dict[str, Number]] = Field(description="per primitive: l1, l2, linf")
    cost: dict[str, Any] = Field(description="rho, epsilon (Laplace), epsilon_at_delta, delta of this release")
    computed_keys: list[dict[str, Any]] = Field(
        default_factory=list,
        description="each computed GROUP BY key: name, canonical expression, rule (case_literals, "
        "predicate, enumerated), type and domain_size (the keys it releases)")
    columns: list[str] = Field(default_factory=list, description="the labels of the released columns, in order")
    contribution: dict[str, Any] = Field(
        default_factory=dict,
        description="how one privacy unit's contribution is bounded: privacy_unit (null: record-level or "
        "public), record_level, max_groups_per_unit (k), max_rows_per_unit (m), groups (key combinations "
        "released; null when keys are selected privately), selected_keys; public true for a query of "
        "public tables only")
    warnings: list[str] = Field(
        default_factory=list,
        description="before paying (issue 22, data-independent): one sentence per output whose expected ± would "
        "swamp it at this budget: a count's ± at least reference_rows (or above the policy's "
        "suppress_ci95_above), a SUM's ± above reference_rows × the bounds' width, an AVG's ± at "
        "reference_rows rows above the bounds' width; the figures are in expected_accuracy (outputs[].bounds, "
        "ci95_at_reference_rows, rows_for_ci95_within_width; warnings with their codes; reference_rows)")


class Cap(ResponseModel):
    """A population's cap: (ε, δ) and the total zCDP ρ it is enforced as."""

    epsilon: Number
    delta: float
    rho: Number | None = None
    alpha_cap: Number | None = Field(default=None, description="the Rényi order whose filter proves the cap")


class ColumnInfo(ResponseModel):
    """The public part of a column's policy."""

    type: str
    lower: float | str | None = Field(
        default=None, description="the lower bound: a number, or an ISO date/timestamp for date and timestamp columns")
    upper: float | str | None = Field(
        default=None, description="the upper bound: a number, or an ISO date/timestamp for date and timestamp columns")
    resolution: float | None = None
    public_keys: list[Any] | str | None = Field(
        default=None, description="the public key list, or \"range(a, b)\" for an integer range"
    )
    unique: bool = Field(
        default=False, description="true when the policy declares the column a key (unique = true), verified "
                                   "on the data when the dataset loads")


class TableInfo(ResponseModel):
    """A table's privacy unit and contribution bounds (k groups, m rows per unit and group).

    A public table (``public: true``) has neither: nothing in it is protected, and a query
    that reads public tables only is answered exactly and costs nothing."""

    privacy_unit: str | None = Field(
        description="the protected entity's column; null = record-level (each row is a unit) or a public table")
    record_level: bool = Field(default=False, description="true when each row is its own privacy unit")
    public: bool = Field(default=False, description="a public table: no privacy unit, queries free and exact")
    max_groups_per_unit: int | None = Field(description="k; null for a public table")
    max_rows_per_unit: int | None = Field(description="m; null for a public table")
    unit_path: list[str] | None = Field(
        default=None, description="the privacy unit through foreign keys (issue 21), as in the policy: "
        "[\"l_orderkey -> orders.o_orderkey\", \"o_custkey\"]; null when the table carries its unit column, "
        "is record-level or public")
    columns: dict[str, ColumnInfo]


class DatasetInfo(ResponseModel):
    """The published guarantee of one dataset: population, cap (ε, δ, as enforced by the
    ledger now), allocations, and per table the privacy unit, contribution bounds and the
    public parts of the schema."""

    name: str
    population: str
    data_version: str | None = None
    engine: str | None = Field(default=None, description="duckdb, postgres or spark: where the bounded query runs")
    versioned_by: str | None = Field(
        default=None, description="declared, fingerprint or version_sql; null: no data version")
    release_cache: str | None = Field(
        default=None, description="'enabled', or 'disabled: …' for a live source without a data version")
    load: dict[str, str] | None = Field(
        default=None, description="per table: memory, in_place (DuckDB over the files) or live")
    cap: Cap
    allocations: dict[str, float]
    tables: dict[str, TableInfo]
    policy_drift: dict[str, Any] | None = Field(
        default=None, description="how the policy file differs from the ledger's cap and allocations, which hold")
    renewal: str | None = Field(
        default=None, description='the renewal rule in force: "fixed cap, no renewal: …" or "per cohort …" (issue 23)')
    cohorts: dict[str, Any] | None = Field(
        default=None, description="for a population with cohorts: the column, the most spent cohort and every "
                                  "cohort's spend (a cohort never charged has the whole cap)")
    attack_bound: dict[str, Any] | None = Field(
        default=None, description="membership-attack bound (largest TPR at FPR = 1 % and the curve over FPR) of the "
                                  "cap and of what has been spent")
    proxy: dict[str, Any] | None = Field(
        default=None, description="the dataset answering refused queries with fallback = proxy, and its provenance")


class DatasetList(ResponseModel):
    """``GET /v1/datasets``."""

    datasets: list[DatasetInfo]


class Amount(ResponseModel):
    """A budget amount: total ρ and its ε by the ledger's one conversion (at the cap's δ less its selection δ)."""

    rho: Number
    epsilon: Number
    mu: Number | None = Field(default=None, description="Gaussian-DP population: μ (√Σμ²)")


class ConsumerSpend(ResponseModel):
    """One allocation's spend (totals). ``share`` is null for a consumer of a population
    without ``[allocations]`` (any consumer may spend up to the whole cap)."""

    share: float | None = Field(description="share of the cap's ρ; null: no allocations (the whole cap)")
    cap_rho: Number
    spent_rho: Number
    spent_epsilon: Number
    remaining_rho: Number
    remaining_epsilon: Number
    charges: int
    remaining_mu: Number | None = Field(default=None, description="Gaussian-DP population: the μ it can still spend")


class BudgetReport(ResponseModel):
    """Spend of a dataset's population: cap, spent and remaining in ρ and in ε (the ledger's conversion),
    overall and per allocation (totals, not per release; ε is not additive)."""

    population: str
    cap: Cap
    spent: Amount
    remaining: Amount
    charges: int
    consumers: dict[str, ConsumerSpend]
    composition: Literal["renyi", "gdp"] | None = Field(
        default=None, description='"gdp" for a Gaussian-DP population: its remaining epsilon is the exact '
                                  "conversion of the remaining μ (Dong, Roth & Su 2022, Cor. 2.13)")
    gdp: dict[str, Any] | None = Field(default=None, description="Gaussian-DP population: mu_cap, spent_mu2, "
                                                                  "remaining_mu2")


class ChargeReceipt(ResponseModel):
    """A ledger charge: id, population, consumer, cost, ρ, ε of this charge alone at the δ it was
    charged at; ``accountant`` ("gateway" for a DP-SGD run charged from its parameters, with
    ``dp_sgd`` and ``formula``; "caller" for a supplied curve) and ``cohorts`` (each charged its
    full cost)."""

    charge_id: str
    population: str
    consumer: str
    rho: Number = Field(description="the stored ρ column: ρ of a zCDP charge; for an RDP curve the bound over every "
                                    "finite order (\"inf\" for a curve that makes no claim at high orders)")
    rho_checked: Number | None = Field(
        default=None, description="the ρ the cap check compared: for an RDP curve the smallest ρ' with "
                                  "ε(α) ≤ α·ρ' at the orders the cap checks (α ≤ alpha_cap); display only")
    epsilon_at_delta: Number | None = None
    created_at: str


class LedgerView(ResponseModel):
    """``GET /v1/admin/ledger``: append-only charge entries and governance events (cap changes)."""

    entries: list[dict[str, Any]]
    events: list[dict[str, Any]]


class CapChangeResult(ResponseModel):
    """The recorded governance event of a cap change: old and new cap, actor, reason, and where the
    population now stands (``exhausted``; ``over_by`` when the cap is below what was spent)."""

    population: str
    actor: str
    reason: str
    old: dict[str, Any] | None = None
    new: dict[str, Any]
    exhausted: bool | None = None
    over_by: dict[str, Any] | None = None


class PopulationOrders(ResponseModel):
    """The orders one population's filter checks."""

    alpha_cap: Number
    rule: str = Field(description='"alpha_cap" (grid orders up to alpha_cap) or "legacy" (every order)')
    checked_orders: list[Number]
    epsilon: Number
    delta: float
    rho: Number


class LedgerOrders(ResponseModel):
    """``GET /v1/ledger/orders``: the ledger's RDP order grid and, per population, α_cap."""

    orders: list[Number]
    populations: dict[str, PopulationOrders]
