"""The release as one typed value: the document served to clients, and the noisy primitives
behind it that only the gateway reads.

A *release* is one immutable noisy answer plus everything needed to interpret and
audit it (query, plan hash, bounds, mechanism, noise scales, accuracy, rows, the
charge that paid for it, the data version, the cap the ledger enforced, the
post-processing rules applied). Serving it again is post-processing of a DP output
and costs no privacy budget (Dwork & Roth 2014, Prop. 2.1).

The noisy primitives (noisy counts and sums per group, their noise scales) are DP
outputs as well; they are stored with the release so that a query differing only
in post-processing (output order and names, HAVING, ORDER BY, LIMIT, display
settings such as suppression) is answered from them for free — but they are never
served: :meth:`Release.to_dict` returns the document only.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Mapping

__all__ = ["NoisyPrimitives", "Release", "new_release_id", "now"]


def new_release_id() -> str:
    """A fresh release id: ``rel_`` + 24 hex characters."""
    return "rel_" + uuid.uuid4().hex[:24]


def now() -> str:
    """The current time as an ISO-8601 UTC string with microseconds."""
    return datetime.now(timezone.utc).isoformat(timespec="microseconds")


@dataclass(frozen=True)
class NoisyPrimitives:
    """The noisy primitives behind a release, keyed by each primitive's signature
    (``kind:column``, independent of the plan's primitive ids).

    Attributes:
        keys: group-key column → key values, one per row (JSON scalars).
        values: primitive signature → noisy integers (integer units), one per row.
        scales: primitive signature → σ (discrete Gaussian) or b (discrete Laplace), integer units.
        halfwidths: primitive signature → 95 % half-width of its noise, integer units.
    """

    keys: Mapping[str, list[Any]]
    values: Mapping[str, list[int]]
    scales: Mapping[str, float]
    halfwidths: Mapping[str, float]

    def to_dict(self) -> dict[str, Any]:
        """``{keys, values, scales, halfwidths}`` (JSON-ready, as stored)."""
        return {"keys": {k: list(v) for k, v in self.keys.items()},
                "values": {k: [int(x) for x in v] for k, v in self.values.items()},
                "scales": {k: float(v) for k, v in self.scales.items()},
                "halfwidths": {k: float(v) for k, v in self.halfwidths.items()}}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "NoisyPrimitives":
        """Inverse of :meth:`to_dict`."""
        return cls(dict(data["keys"]), dict(data["values"]), dict(data["scales"]), dict(data["halfwidths"]))


@dataclass(frozen=True)
class Release:
    """One stored release.

    Attributes:
        release_id: ``rel_`` + 24 hex characters.
        cache_key: the key it is stored under (:class:`~dpgate.releases.keys.CacheKeys`:
            the noise key for a release computed from fresh noise, the release key for one
            derived from stored noisy primitives).
        dataset: dataset name.
        plan_hash: the plan's canonical hash.
        created_at: ISO-8601 UTC timestamp.
        document: the JSON-ready release document as served (columns, rows, accuracy,
            charge, bounds, mechanism, guarantee, post_processing, …), without the
            per-request ``cached`` and ``paid_by``.
        noisy: the noisy primitives behind it (never served), or None.
    """

    release_id: str
    cache_key: str
    dataset: str
    plan_hash: str
    created_at: str
    document: Mapping[str, Any] = field(repr=False)
    noisy: NoisyPrimitives | None = field(default=None, repr=False)

    @property
    def body(self) -> dict[str, Any]:
        """The stored JSON body: the document plus ``noisy`` (when present)."""
        body = dict(self.document)
        if self.noisy is not None:
            body["noisy"] = self.noisy.to_dict()
        return body

    @classmethod
    def from_body(cls, release_id: str, cache_key: str, dataset: str, plan_hash: str, created_at: str,
                  body: Mapping[str, Any]) -> "Release":
        """A release from its stored columns and JSON body (``noisy`` split off)."""
        document = dict(body)
        noisy = document.pop("noisy", None)
        return cls(release_id, cache_key, dataset, plan_hash, created_at, document,
                   None if noisy is None else NoisyPrimitives.from_dict(noisy))

    @property
    def post_processing(self) -> Mapping[str, Any] | None:
        """The post-processing (display) settings the rows were derived with, or None if the
        release predates their recording."""
        value = self.document.get("post_processing")
        return value if isinstance(value, Mapping) else None

    def to_dict(self, *, cached: bool) -> dict[str, Any]:
        """The release document with ``cached`` set (True when served from the store).

        ``paid_by`` always names the charge that paid for the release; ``charge``
        is that charge only for the request that created it, and None when the
        release is served again (which costs nothing). The noisy primitives are not
        part of it.
        """
        doc = json.loads(json.dumps(self.document))  # a deep copy callers may modify
        doc.pop("noisy", None)
        doc["cached"] = cached
        doc["paid_by"] = doc.get("charge")
        if cached:
            doc["charge"] = None  # serving a stored release is post-processing: cost 0
        return doc
