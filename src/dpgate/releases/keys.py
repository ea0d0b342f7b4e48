"""The two cache keys of a query, and the attempt keys of its charge.

* The **noise key** names the noisy primitives: what is charged and noised (the
  plan's noise signature — table, filter, grouping, primitives, the policy parts
  they use — the data version, the mechanism and the budget). Queries with the
  same noise key are answered from one charge.
* The **release key** names this exact question and presentation: the plan hash
  (post-processing included: outputs, HAVING, ORDER BY, LIMIT), the same data
  version, mechanism and budget, and the *post-processing settings* of the policy
  (``suppress_ci95_above``, ``clamp_counts``, …). Changing a display setting
  changes every release key, so the identical query and a reordered one are both
  re-derived from the stored noisy primitives under the new rules (free), never
  one served old rows and the other new ones.

The ledger's single-flight key of a charge (its ``release_key``) is an *attempt
key*: the noise key for the first attempt, ``<noise key>:retry:<n>`` after n
attempts whose release was never stored (see :mod:`dpgate.releases.cache`).
"""

from __future__ import annotations

import hashlib
import json
import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

__all__ = ["cache_key", "CacheKeys", "attempt_key"]


def _digest(payload: Mapping[str, Any]) -> str:
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def cache_key(plan_hash: str, data_version: str, mechanism: str, budget: Mapping[str, Any],
              post_processing: Mapping[str, Any] | None = None) -> str:
    """A cache key: SHA-256 hex of the plan hash (or noise signature), data version, mechanism,
    budget and (release keys only) the post-processing settings.

    Args:
        plan_hash: :attr:`dpgate.sql.plan.QueryPlan.plan_hash`, or a noise signature.
        data_version: the dataset's data version (policy value or keyed source fingerprint).
        mechanism: ``"gaussian"`` or ``"laplace"``.
        budget: the resolved budget of the query, e.g. ``{"rho": 0.001}`` (JSON-serialisable).
        post_processing: the policy's display settings (None: not part of the key).
    """
    payload: dict[str, Any] = {"plan": plan_hash, "data": data_version, "mechanism": mechanism,
                               "budget": dict(budget)}
    if post_processing is not None:
        payload["post_processing"] = dict(post_processing)
    return _digest(payload)


def attempt_key(noise_key: str, attempt: int) -> str:
    """The ledger ``release_key`` of attempt ``attempt`` (0-based) at charging ``noise_key``."""
    return noise_key if attempt == 0 else f"{noise_key}:retry:{attempt}"


@dataclass(frozen=True)
class CacheKeys:
    """The keys of one query.

    Attributes:
        release: the release key (this exact query, post-processing and display settings
            included).
        noise: the noise key (the noisy primitives; what is charged).
    """

    release: str
    noise: str

    @classmethod
    def of(cls, *, plan_hash: str, noise_signature: str, data_version: str, mechanism: str,
           budget: Mapping[str, Any], post_processing: Mapping[str, Any]) -> "CacheKeys":
        """Both keys of a query (see the module docstring).

        Args:
            plan_hash: the plan's canonical hash.
            noise_signature: what the plan noises (post-processing left out).
            data_version, mechanism, budget: as :func:`cache_key`.
            post_processing: the policy's display settings (JSON-serialisable).
        """
        return cls(
            release=cache_key(plan_hash, data_version, mechanism, budget, post_processing),
            noise=cache_key(noise_signature, data_version, mechanism, budget),
        )


#: Budget-policy fields that are not post-processing (the cap and per-query defaults).
#: (``selection_delta_stated`` says how the file set the reserve, not what a release shows: left out
#: of release keys, so stored releases stay served — tests/test_plan_replay.py.)
_NOT_POST_PROCESSING = frozenset({"epsilon", "delta", "default_query_rho", "mechanism", "selection_delta",
                                  "default_selection_delta", "selection_delta_stated", "composition",
                                  "private_bounds_share", "private_bounds_max_rank_error"})


def post_processing_settings(policy: Any) -> dict[str, Any]:
    """The dataset policy's display settings — every budget-policy field that is post-processing
    (``suppress_ci95_above``, ``clamp_counts``, …), i.e. not the cap or a per-query default.

    They are part of each release key and recorded in each release (``post_processing``),
    so that a change applies to the identical query and a reordered one alike.
    """
    budget = policy.budget
    if dataclasses.is_dataclass(budget):
        return {f.name: getattr(budget, f.name) for f in dataclasses.fields(budget)
                if f.name not in _NOT_POST_PROCESSING}
    return {}  # pragma: no cover - policies are dataclasses
