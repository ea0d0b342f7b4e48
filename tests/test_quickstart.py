"""The README's quickstart on a clean clone, in a fresh virtual environment.

Slow (a pip install from the package index), so it only runs with
``DPGATE_QUICKSTART_TEST=1`` (set by ``.ci/run``). It clones the repository's
committed HEAD into a temporary folder, creates a fresh venv, runs the README's
first command — ``pip install -e . && dpgate serve --demo-keys`` (on a free
port) — waits for ``/healthz``, sends one query with the printed analyst key,
and stops the server. (The README's second command, ``pip install -e '.[test]'
&& pytest``, is what ``.ci/run`` itself runs on a clean clone.)
"""

from __future__ import annotations

import os
import subprocess
import sys

import httpx
import pytest
from _api_server import ANALYST_KEY_RE, REPO, ServeProcess, free_port, wait_healthy

pytestmark = pytest.mark.skipif(
    os.environ.get("DPGATE_QUICKSTART_TEST") != "1",
    reason="slow (pip install into a fresh venv); set DPGATE_QUICKSTART_TEST=1",
)


def _run(argv: list[str], *, cwd, env, timeout: float) -> None:
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{argv} failed:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"


def test_readme_quickstart_on_a_clean_clone(tmp_path):
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert "pip install -e . && dpgate serve --demo-keys" in readme
    assert "pip install -e '.[test]' && pytest" in readme  # run by .ci/run itself

    env = {k: v for k, v in os.environ.items() if not k.startswith(("DPGATE_", "VIRTUAL_ENV", "PYTHONPATH"))}
    clone = tmp_path / "dpgate"
    _run(["git", "clone", "--quiet", str(REPO), str(clone)], cwd=tmp_path, env=env, timeout=120)
    # README: python3 -m venv .venv && . .venv/bin/activate && pip install -e . && dpgate serve --demo-keys
    venv = clone / ".venv"
    _run([sys.executable, "-m", "venv", str(venv)], cwd=clone, env=env, timeout=120)
    bin_dir = venv / ("Scripts" if os.name == "nt" else "bin")
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    env["VIRTUAL_ENV"] = str(venv)

    # pip install -e . (from the package index)
    _run([str(bin_dir / "pip"), "install", "--quiet", "-e", "."], cwd=clone, env=env, timeout=1800)

    # dpgate serve --demo-keys (on a free port instead of 8000; the sample data is generated)
    port = free_port()
    server = ServeProcess([str(bin_dir / "dpgate"), "serve", "--demo-keys", "--port", str(port)], cwd=clone, env=env)
    try:
        analyst_key = server.wait_for_line(ANALYST_KEY_RE, timeout_s=300).group(1)
        wait_healthy(f"http://127.0.0.1:{port}", timeout_s=300, proc=server)
        r = httpx.post(
            f"http://127.0.0.1:{port}/v1/queries",
            headers={"Authorization": f"Bearer {analyst_key}"},
            json={
                "dataset": "usage",
                "sql": "SELECT region, COUNT(DISTINCT user_id) AS users FROM prompts WHERE week = 0 GROUP BY region",
            },
            timeout=120,
        )
        assert r.status_code == 200, r.text
        release = r.json()
        assert release["columns"] == ["region", "users"] and len(release["rows"]) == 5
    finally:
        server.stop()
