"""The Docker set-up (issue 9: .dockerignore, compose hygiene; issue 14: compose shows the
PostgreSQL engine). Docker cannot run here: the files are checked statically, the compose file
with ``docker compose config`` / ``docker-compose config`` when a client has it, and the
compose's sample dataset and policy against the local PostgreSQL (a fresh schema).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import psycopg
import pytest

from _engines import as_query, PG_URL, pg_schema, pg_unavailable
from dpgate.engines import EngineSet
from dpgate.policy import load_policies, load_policy

REPO = Path(__file__).resolve().parents[1]
COMPOSE = (REPO / "docker-compose.yml").read_text()


def test_dockerignore_keeps_secrets_and_virtualenvs_out_of_the_build_context():
    lines = {line.strip() for line in (REPO / ".dockerignore").read_text().splitlines()}
    for needed in (".venv", ".dpgate", "**/.dpgate", "keys.json", "*.key", ".env", ".git", "bench/.data"):
        assert needed in lines, needed


def test_compose_has_no_default_passwords():
    # every password comes from the environment and is mandatory (${VAR:?message})
    assert not re.search(r"^\s*\w*PASSWORD:[ \t]*[^$\s]", COMPOSE, re.M)
    for var in ("POSTGRES_PASSWORD", "DPGATE_LEDGER_PASSWORD", "DPGATE_READER_PASSWORD"):
        assert re.search(r"\$\{" + var + r":\?", COMPOSE), var
    assert not re.search(r"postgresql://\w+:(?!\$\{)", COMPOSE)  # no literal password in a URL


def test_compose_publishes_on_loopback_and_mounts_policies_and_data():
    ports = re.findall(r'^\s*-\s*"([^"]+)"\s*$', COMPOSE.split("ports:")[1].split("volumes:")[0], re.M)
    assert ports == ["${DPGATE_PUBLISH:-127.0.0.1:8000}:8000"]
    assert "./docker/policies:/app/policies:ro" in COMPOSE and "./data:/app/data:ro" in COMPOSE
    assert COMPOSE.count("ports:") == 1  # PostgreSQL is not published on the host


def test_compose_config_validates_when_a_client_is_present():
    for argv in (["docker", "compose"], ["docker-compose"]):
        if not shutil.which(argv[0]):
            continue
        env = {"PATH": "/usr/bin:/bin:/usr/local/bin", "POSTGRES_PASSWORD": "a", "DPGATE_LEDGER_PASSWORD": "b",
               "DPGATE_READER_PASSWORD": "c"}
        done = subprocess.run([*argv, "config"], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
        if done.returncode != 0 and re.search(r"unknown command|is not a docker command", done.stderr + done.stdout):
            continue
        assert done.returncode == 0, done.stderr
        assert "127.0.0.1:8000:8000" in done.stdout
        missing = subprocess.run([*argv, "config"], cwd=REPO, env={"PATH": env["PATH"]},
                                 capture_output=True, text=True, timeout=60)
        assert missing.returncode != 0 and "POSTGRES_PASSWORD" in (missing.stderr + missing.stdout)
        return
    pytest.skip("no docker compose client on this machine")


def test_compose_policies_are_valid():
    policies = load_policies(REPO / "docker" / "policies")
    assert policies["warehouse"].engine == "postgres" and policies["warehouse"].connection is None


@pytest.mark.postgres
def test_compose_sample_dataset_runs_on_the_postgres_engine(tmp_path):
    reason = pg_unavailable()
    if reason:
        pytest.skip(reason)
    from dpgate.sql.bound import bounded_query
    from dpgate.sql.parse import parse_query

    sql = (REPO / "docker" / "postgres" / "sample_orders.sql.in").read_text()
    with pg_schema() as schema:
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f'SET search_path = "{schema}"')
            conn.execute(sql)
        text = (REPO / "docker" / "policies" / "warehouse.toml").read_text().replace("sample.orders", f"{schema}.orders")
        (tmp_path / "policies").mkdir()
        (tmp_path / "policies" / "warehouse.toml").write_text(text)
        policy = load_policy(tmp_path / "policies" / "warehouse.toml")
        from dpgate.engines import EngineOptions

        with EngineSet(options=EngineOptions(environ={"DPGATE_CONNECTION_WAREHOUSE": PG_URL})) as e:
            e.load({"warehouse": policy})
            assert e.describe("warehouse")["versioned_by"] == "version_sql"
            plan = parse_query("SELECT region, COUNT(*), AVG(amount) FROM orders GROUP BY region", policy)
            out = e.execute(as_query(bounded_query(plan, policy, salt=1)))
            assert out["region"].tolist() == ["eu", "us", "apac", "latam", "africa"]
            assert 100_000 < sum(out["p0"].tolist()) <= 200_000
