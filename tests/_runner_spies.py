"""Shared by the runner-level tests (tests/test_pipeline_runners.py, tests/test_union.py): a small
shop (orders of 400 users, 1-3 rows each, a public regions table), a spy wrapper and the event
recorder that lists renders, engine checks/executions and ledger charges in order."""

from __future__ import annotations

from pathlib import Path

import pytest

import dpgate.pipeline.runners as runners
from dpgate.service import Gateway
from dpgate.settings import Settings

POLICY = """
[dataset]
name = "shop"
population = "shoppers"
data_version = "v1"

[budget]
epsilon = 4.0
delta = 1e-5
default_query_rho = 0.05

[tables.orders]
source = "{orders}"
privacy_unit = "user_id"
max_groups_per_unit = 1
max_rows_per_unit = 3

[tables.orders.columns]
user_id = {{ type = "int" }}
region = {{ type = "text", public_keys = ["eu", "us", "apac"] }}
model = {{ type = "text" }}
amount = {{ type = "int", lower = 0, upper = 100 }}

[tables.regions]
source = "{regions}"
public = true

[tables.regions.columns]
region = {{ type = "text" }}
zone = {{ type = "text" }}
"""

class Spy:
    """Wraps an object; records ``(name, …)`` in ``events`` for the methods named."""

    def __init__(self, inner, events: list, names: tuple[str, ...]) -> None:
        self._inner, self._events, self._names = inner, events, names

    def __getattr__(self, name):
        attr = getattr(self._inner, name)
        if name not in self._names:
            return attr

        def call(*args, **kwargs):
            out = attr(*args, **kwargs)
            self._events.append((name, args, kwargs, out))
            return out
        return call


def open_shop(tmp_path: Path) -> Gateway:
    """A gateway over the shop (salt fixed at 12345); the caller closes it."""
    orders = tmp_path / "orders.csv"
    lines = ["user_id,region,model,amount"]
    for u in range(400):
        for j in range(1 + u % 3):
            lines.append(f"{u},{['eu', 'us', 'apac'][u % 3]},{['m1', 'm2'][u % 2]},{(u * 7 + j * 13) % 101}")
    orders.write_text("\n".join(lines) + "\n")
    regions = tmp_path / "regions.csv"
    regions.write_text("region,zone\neu,north\nus,west\napac,east\n")
    folder = tmp_path / "policies"
    folder.mkdir()
    (folder / "shop.toml").write_text(POLICY.format(orders=orders.as_posix(), regions=regions.as_posix()))
    return Gateway.open(Settings(policies=folder, home=tmp_path / "home"), salt_source=lambda: 12345)


def record_events(gw: Gateway, monkeypatch) -> list:
    """Spy the tree builders of :mod:`dpgate.pipeline.runners`, the ledger's ``charge`` and the engine's
    ``check``/``execute``; returns the shared event list ``(kind, args, kwargs, value)``."""
    gw.compile("shop", "SELECT COUNT(*) FROM orders")  # reads the public table's keys (cached per data version)
    out: list = []
    for name in ("bounded_query", "histogram_query", "exact_query"):
        real = getattr(runners, name)

        def spied(*args, _real=real, _name=name, **kwargs):
            value = _real(*args, **kwargs)
            out.append(("render", (_name,), kwargs, value))
            return value
        monkeypatch.setattr(runners, name, spied)
    monkeypatch.setattr(gw, "ledger", Spy(gw.ledger, out, ("charge",)))
    monkeypatch.setattr(gw, "engine", Spy(gw.engine, out, ("check", "execute")))
    return out


@pytest.fixture
def gw(tmp_path: Path):
    """The shop (:func:`open_shop`: orders of 400 users, 1-3 rows each; public regions), closed after."""
    g = open_shop(tmp_path)
    yield g
    g.close()


@pytest.fixture
def events(gw, monkeypatch) -> list:
    """Renders, engine checks/executions and ledger charges, in order (:func:`record_events`)."""
    return record_events(gw, monkeypatch)


def neighbour_shop(tmp_path: Path, removed: int) -> Gateway:
    """A gateway over the shop of ``tmp_path`` without user ``removed``'s rows (the neighbouring
    dataset; same salt); the caller closes it."""
    lines = (tmp_path / "orders.csv").read_text().splitlines()
    kept = [lines[0]] + [line for line in lines[1:] if int(line.split(",")[0]) != removed]
    assert len(kept) < len(lines), "the removed user has rows"
    folder = tmp_path / f"neighbour-{removed}"
    (folder / "policies").mkdir(parents=True)
    (folder / "orders.csv").write_text("\n".join(kept) + "\n")
    (folder / "regions.csv").write_text((tmp_path / "regions.csv").read_text())
    (folder / "policies" / "shop.toml").write_text(POLICY.format(orders=(folder / "orders.csv").as_posix(),
                                                                 regions=(folder / "regions.csv").as_posix()))
    return Gateway.open(Settings(policies=folder / "policies", home=folder / "home"), salt_source=lambda: 12345)


def exact_bounded_parts(gw: Gateway, sql: str) -> list[dict[str, list]]:
    """Each part's exact bounded values per primitive of a multi-part release (its prepared
    statement executed without noise)."""
    policy, _, strategy = gw.compile("shop", sql)
    runner = gw._runner("shop", policy, strategy)
    out = []
    for part in runner.parts:
        part.prepare(gw.engine, 12345)
        values = gw.engine.execute(part._general)
        out.append({p.id: [float(v) for v in values[p.id]] for p in part.plan.primitives})
    return out
