"""Loading policy files: one TOML file, a parsed mapping, or a folder of them (with the checks
across files: populations, cohorts, proxies).

Part of :mod:`dpgate.policy`.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from dpgate.errors import PolicyError
from dpgate.errors import policy_error as _policy_error
from dpgate.policy.dataset import _parse_policy
from dpgate.policy_checks import check_population_cohorts, check_proxies
from dpgate.selection_reserve import population_selection_defaults

if TYPE_CHECKING:
    from dpgate.policy.dataset import DatasetPolicy


# --- loading ---------------------------------------------------------------------------


def load_policies(folder: Path) -> dict[str, DatasetPolicy]:
    """Load every ``*.toml`` file of ``folder`` (sorted by file name).

    Args:
        folder: the policies folder. Relative table sources resolve against its
            parent folder (the project root).

    Returns:
        dataset name → policy.

    Raises:
        PolicyError: the folder does not exist, a file is invalid, two files
            declare the same dataset name, or two datasets of one population
            publish different caps (ε, δ), allocations or ``[budget] composition``
            (the budget follows people: one population has one cap and one filter).
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise PolicyError(
            f"policies folder {str(folder)!r} does not exist", {"file": str(folder)}
        )
    loaded: dict[str, DatasetPolicy] = {}
    for path in sorted(folder.glob("*.toml")):
        policy = load_policy(path)
        if policy.name in loaded:
            raise _policy_error(
                path, f"dataset {policy.name!r} is also declared in {loaded[policy.name].path}"
            )
        loaded[policy.name] = policy
    out: dict[str, DatasetPolicy] = {}
    for policy in population_selection_defaults(loaded).values():
        path = policy.path
        for other in out.values():
            if other.population == policy.population and other.budget.composition != policy.budget.composition:
                raise _policy_error(
                    path,
                    f"population {policy.population!r} is also used by {other.path} with [budget] composition = "
                    f"{other.budget.composition!r}, this file states {policy.budget.composition!r}; datasets of "
                    "one population must state the same composition (the population has one filter)",
                )
            if other.population == policy.population and (
                (other.budget.epsilon, other.budget.delta, other.budget.selection_delta)
                != (policy.budget.epsilon, policy.budget.delta, policy.budget.selection_delta)
                or dict(other.allocations) != dict(policy.allocations)
            ):
                raise _policy_error(
                    path,
                    f"population {policy.population!r} is also used by {other.path} with a different"
                    " cap or allocations; datasets of one population must publish the same cap",
                )
        out[policy.name] = policy
    check_proxies(out)  # issue 23: a proxy has the same schema and a provenance
    check_population_cohorts(out)
    return out


def load_policy(path: Path) -> DatasetPolicy:
    """Load and validate one policy file.

    Args:
        path: a TOML file. Relative table sources resolve against the parent folder
            of the file's folder (``policies/../``, the project root).

    Raises:
        PolicyError: unreadable file, TOML syntax error, or any invalid field; the
            message names the file, table, column and problem.
    """
    path = Path(path)
    try:
        with path.open("rb") as fh:
            raw = tomllib.load(fh)
    except OSError as exc:
        raise _policy_error(path, f"cannot read the file ({exc.strerror})") from None
    except tomllib.TOMLDecodeError as exc:
        raise _policy_error(path, f"TOML syntax error: {exc}") from None
    return _parse_policy(raw, path)


def parse_policy(raw: Mapping[str, Any], path: Path) -> DatasetPolicy:
    """Validate an already-parsed TOML document (as from ``tomllib.loads``).

    Args:
        raw: the document.
        path: the file it stands for (error messages; relative sources resolve
            against ``path.parent.parent``).

    Raises:
        PolicyError: as :func:`load_policy`.
    """
    return _parse_policy(raw, Path(path))
