"""``dpgate serve`` as a user runs it: a child process on a fresh project (no sample data yet)."""

from __future__ import annotations

import os
import shutil
import sys

import httpx
from _api_server import ANALYST_KEY_RE, REPO, ServeProcess, free_port, wait_healthy


def test_serve_on_a_fresh_checkout_generates_data_prints_keys_and_answers(tmp_path):
    (tmp_path / "policies").mkdir()
    shutil.copy(REPO / "policies" / "usage.toml", tmp_path / "policies" / "usage.toml")
    assert not (tmp_path / "sample_data").exists()
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("DPGATE_")}
    server = ServeProcess(
        [sys.executable, "-m", "dpgate", "serve", "--demo-keys", "--port", str(port), "--log-level", "warning"],
        cwd=tmp_path,
        env=env,
    )
    try:
        analyst_key = server.wait_for_line(ANALYST_KEY_RE, timeout_s=120).group(1)
        server.wait_for_line(rf"listening on http://127\.0\.0\.1:{port}", timeout_s=120)
        wait_healthy(f"http://127.0.0.1:{port}", timeout_s=60, proc=server)
        r = httpx.post(
            f"http://127.0.0.1:{port}/v1/queries",
            headers={"Authorization": f"Bearer {analyst_key}"},
            json={"dataset": "usage", "sql": "SELECT region, COUNT(*) AS n FROM prompts GROUP BY region"},
            timeout=60,
        )
        assert r.status_code == 200, r.text
        assert r.json()["charge"]["rho"] == 0.001  # the policy's default_query_rho
    finally:
        status = server.stop()
    output = "\n".join(server.lines)
    assert "generating" in output  # the progress line of the sample data
    assert (tmp_path / "sample_data" / "usage" / "prompts.parquet").is_file()
    keys_file = tmp_path / ".dpgate" / "keys.json"
    assert oct(keys_file.stat().st_mode & 0o777) == "0o600"
    assert analyst_key not in keys_file.read_text()
    assert status == 0, output

    # a second start finds the keys and does not print new ones
    port = free_port()
    again = ServeProcess(
        [sys.executable, "-m", "dpgate", "serve", "--demo-keys", "--port", str(port), "--log-level", "warning"],
        cwd=tmp_path,
        env=env,
    )
    try:
        again.wait_for_line(r"already holds API keys", timeout_s=120)
        wait_healthy(f"http://127.0.0.1:{port}", timeout_s=60, proc=again)
    finally:
        again.stop()
    assert "dpg_" not in "\n".join(again.lines)
