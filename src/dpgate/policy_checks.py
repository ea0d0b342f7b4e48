"""Checks across the policies of one folder (:func:`dpgate.policy.load_policies` runs them):
every proxy has a provenance and its dataset's schema (issue 23), and the datasets of one
population agree on its cohort rule."""

from __future__ import annotations

from typing import Any, Mapping

from dpgate.errors import policy_error as _policy_error

__all__ = ["check_population_cohorts", "check_proxies"]


def check_proxies(policies: Mapping[str, Any]) -> None:
    """Every ``proxy`` names a loaded dataset with a ``provenance`` and the same schema: for each
    protected table, a table of the same name declaring the same columns with the same types,
    and the privacy unit column (a proxy's tables are public, so the unit is a plain column).

    Raises:
        PolicyError: naming the dataset, the proxy and the first difference.
    """
    for policy in policies.values():
        if policy.proxy is None:
            continue
        proxy = policies.get(policy.proxy)
        if proxy is None:
            raise _policy_error(policy.path, f"[dataset] proxy {policy.proxy!r} names no dataset of the "
                                             "policies folder")
        if proxy.provenance is None:
            raise _policy_error(policy.path, f"proxy {proxy.name!r} declares no provenance "
                                             '("public" or "synthetic: …" in its [dataset])')
        for table in policy.tables.values():
            if table.public:
                continue
            twin = proxy.tables.get(table.name)
            if twin is None:
                raise _policy_error(policy.path, f"proxy {proxy.name!r} has no table {table.name!r} (a proxy has "
                                                 "the same schema)", table.name)
            needed = dict((c.name, c.type) for c in table.columns.values())
            for cname, ctype in needed.items():
                other = twin.find_column(cname)
                if other is None or other.type != ctype:
                    raise _policy_error(policy.path, f"proxy {proxy.name!r}: column {cname!r} of {table.name!r} "
                                                     f"must be declared there with type {ctype}", table.name, cname)
            if table.privacy_unit is not None and twin.find_column(table.privacy_unit) is None:
                raise _policy_error(policy.path, f"proxy {proxy.name!r}: table {table.name!r} must declare the "
                                                 f"privacy unit column {table.privacy_unit!r}", table.name)


def check_population_cohorts(policies: Mapping[str, Any]) -> None:
    """Datasets of one population agree on its cohort column (or all have none).

    Raises:
        PolicyError: two datasets of one population declare different cohort columns.
    """
    seen: dict[str, Any] = {}
    for policy in policies.values():
        if policy.provenance is not None:
            continue  # a proxy never charges its population
        other = seen.setdefault(policy.population, policy)
        a = None if other.cohorts is None else other.cohorts.column
        b = None if policy.cohorts is None else policy.cohorts.column
        if a != b:
            raise _policy_error(policy.path, f"population {policy.population!r} is also used by {other.path} "
                                             f"with cohort column {a!r}, here {b!r}: one population has one "
                                             "cohort rule")
