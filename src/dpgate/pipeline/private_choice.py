"""One private choice charged, computed and stored under single flight: the common step of private
bounds (:mod:`dpgate.pipeline.private_bounds`), private truncation's row cap
(:mod:`dpgate.pipeline.private_truncation`) and its per-unit sum clamps
(:mod:`dpgate.pipeline.private_sum_clamp`).

Each choice is an exponential-mechanism selection over a histogram of the units' contributions
(``BIN``/``COUNT`` columns of its statement); it is charged before its statement reads any data,
and stored as a release of its own, so that a concurrent identical request waits for it and a later
one reuses it for free (:class:`dpgate.releases.ReleaseCache`'s flight).
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from dpgate import accounting
from dpgate.errors import Internal
from dpgate.releases import Release


def histogram(values: Mapping[str, Any], size: int, bin_column: str, count_column: str) -> list[int]:
    """The per-candidate counts (length ``size``) from a choice statement's ``(bin, count)`` rows."""
    hist = [0] * size
    for b, c in zip(values[bin_column].tolist(), values[count_column].tolist()):
        hist[int(b)] += int(c)
    return hist


def charged_choice(gw: Any, keys: Any, cost: accounting.Cost, *, population: str, consumer: str, purpose: str,
                   metadata: dict[str, Any], scope: tuple[str, ...] | None,
                   compute: Callable[[Any], Release]) -> tuple[Release, Any]:
    """Charge ``cost`` then ``compute(receipt)`` the choice's release, single flight under ``keys``.

    Returns:
        ``(release, receipt)``; receipt None when the release was found stored or another request paid.
    Raises:
        Internal: the ledger charged another cost than ``cost``. BudgetExhausted and the ledger's
        errors (before anything is read); what ``compute`` raises (after the charge, which stays).
    """
    paid: list[Any] = []

    def charge(attempt: str) -> Any:
        receipt = gw.ledger.charge(population, consumer, cost, purpose=purpose, release_key=attempt,
                                   metadata=metadata, **({"cohorts": scope} if scope is not None else {}))
        if not getattr(receipt, "duplicate", False) and getattr(receipt, "cost", cost) != cost:
            raise Internal("the ledger charged a cost other than the calibrated one",
                           {"charge_id": getattr(receipt, "charge_id", None)})
        paid.append(receipt)
        return receipt

    with gw.release_cache.flight(keys) as flight:
        hit = flight.lookup()
        if hit is not None:
            return hit, None
        release, fresh = flight.run(charge=charge, compute=compute)
    return release, (paid[-1] if fresh and paid else None)
