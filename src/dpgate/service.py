"""The query pipeline of the gateway, without HTTP or CLI — re-exported from :mod:`dpgate.pipeline`.

Issue 20 step 6 split this module along its seams: :mod:`dpgate.pipeline.gateway` (the
:class:`Gateway` facade), :mod:`~dpgate.pipeline.strategy` (the release strategy chosen once),
:mod:`~dpgate.pipeline.runners` (one runner per strategy), :mod:`~dpgate.pipeline.budget`
(:class:`QueryBudget` and the resolved budget), :mod:`~dpgate.pipeline.documents` (release and
explain documents), :mod:`~dpgate.pipeline.planning` (plan once, public tables' keys) and
:mod:`~dpgate.pipeline.admin` (caps, populations, external charges, store views). The names
below keep ``from dpgate.service import …`` working for the API, CLI, UI, tests and benchmarks.
"""

from __future__ import annotations

from dpgate.pipeline.admin import (apply_policies, check_population_moves, ensure_populations, fingerprint_key,
                                   population_policies, published_version)
from dpgate.pipeline.budget import QueryBudget, ResolvedBudget
from dpgate.pipeline.documents import noise_scale_units
from dpgate.pipeline.gateway import RELEASE_LEASE_MARGIN_S, Gateway
from dpgate.pipeline.planning import MAX_PUBLIC_TABLE_KEYS
from dpgate.releases import open_release_store

_published_version = published_version  # the former private name

__all__ = ["Gateway", "MAX_PUBLIC_TABLE_KEYS", "QueryBudget", "RELEASE_LEASE_MARGIN_S", "ResolvedBudget",
           "apply_policies", "check_population_moves", "ensure_populations", "fingerprint_key",
           "noise_scale_units", "open_release_store", "population_policies"]
