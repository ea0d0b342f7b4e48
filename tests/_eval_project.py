"""Test support: a synthetic model-evaluation project (issue 15), written to a folder.

``eval.csv`` has one row per user and candidate, ``(user_id, candidate, correct ∈ {0, 1})``,
for 200 users and 5 candidates whose exact accuracies are fixed below (a: 100, b: 110, c: 120,
d: 104, e: 90 correct answers). ``max_groups_per_unit = 5``: every user contributes to every
candidate. Not a test module (leading underscore).
"""

from __future__ import annotations

from pathlib import Path

from dpgate.service import Gateway
from dpgate.settings import Settings

CANDIDATES = ["a", "b", "c", "d", "e"]
#: Exact SUM(correct) per candidate (200 users, user u is correct on c iff u < CORRECT[c]).
CORRECT = {"a": 100, "b": 110, "c": 120, "d": 104, "e": 90}
USERS = 200

POLICY = """
[dataset]
name = "evals"
population = "eval-users"
data_version = "v1"

[budget]
epsilon = {epsilon}
delta = 1e-6
default_query_rho = 0.01

[allocations]
analysts = 0.5
training = 0.5

[tables.eval]
source = "{source}"
privacy_unit = "user_id"
max_groups_per_unit = 5
max_rows_per_unit = 1

[tables.eval.columns]
user_id = {{ type = "int" }}
candidate = {{ type = "text", public_keys = {keys} }}
correct = {{ type = "int", lower = 0, upper = 1 }}
split = {{ type = "text" }}
score = {{ type = "float", lower = -1, upper = 1, resolution = 0.5 }}
"""


def write_eval_project(root: Path, *, epsilon: float = 1e4, drop_user: int | None = None,
                       candidates: tuple[str, ...] = tuple(CANDIDATES),
                       selection_delta: float | None = None) -> Path:
    """Write ``root/policies/evals.toml`` and ``root/eval.csv``; return the policies folder.
    ``drop_user``: leave that user's rows out (a neighbouring dataset); ``candidates``: a subset
    of :data:`CANDIDATES` (the table's rows and public keys); ``selection_delta``: the budget's
    reserve for partition selection (None: the default δ/2; 0: none, ε stated at the full δ)."""
    root.mkdir(parents=True, exist_ok=True)
    lines = ["user_id,candidate,correct,split,score"]
    for u in range(USERS):
        if u == drop_user:
            continue
        for c in candidates:
            lines.append(f"{u},{c},{int(u < CORRECT[c])},s{u % 3},{((u % 5) - 2) / 2}")
    csv = root / "eval.csv"
    csv.write_text("\n".join(lines) + "\n")
    policies = root / "policies"
    policies.mkdir(exist_ok=True)
    keys = "[" + ", ".join(f'"{c}"' for c in candidates) + "]"
    text = POLICY.format(epsilon=epsilon, source=csv.as_posix(), keys=keys)
    if selection_delta is not None:
        text = text.replace("delta = 1e-6\n", f"delta = 1e-6\nselection_delta = {selection_delta!r}\n", 1)
    (policies / "evals.toml").write_text(text)
    return policies


def open_eval_gateway(root: Path, **kwargs) -> Gateway:
    """A gateway over :func:`write_eval_project` (state in ``root/home``)."""
    policies = write_eval_project(root, **kwargs)
    return Gateway.open(Settings(policies=policies, home=root / "home"))
