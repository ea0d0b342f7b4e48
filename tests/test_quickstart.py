"""The README's two commands on a clean clone, exactly as written (slow tier: ``pytest --all``).

It clones the repository's committed HEAD into a temporary folder and runs, with ``bash``, the
two command lines the README's Quickstart shows, taken from the README itself:

1. ``python3 -m venv .venv && . .venv/bin/activate && pip install -e . && dpgate serve
   --demo-keys`` — on a free port (``DPGATE_PORT``; the command is unchanged), waits for
   ``/healthz``, sends one query with the printed analyst key, and stops the server;
2. ``python3 -m venv .venv && . .venv/bin/activate && pip install -e '.[test]' && pytest`` —
   which must pass; its duration is printed in the run's summary (and the pip install's
   apart, for the README's figures).

Both install from the package index. ``DPGATE_QUICKSTART_TEST=0`` skips it (e.g. offline).
"""

from __future__ import annotations

import os
import queue
import re
import shutil
import signal
import subprocess
import threading
import time

import httpx
import pytest
from _api_server import ANALYST_KEY_RE, REPO, free_port, wait_healthy

pytestmark = pytest.mark.skipif(
    os.environ.get("DPGATE_QUICKSTART_TEST") == "0" or shutil.which("git") is None or shutil.which("bash") is None,
    reason="DPGATE_QUICKSTART_TEST=0, or no git/bash",
)

SERVE = "pip install -e . && dpgate serve --demo-keys"
TESTS = "pip install -e '.[test]' && pytest"


def readme_command(readme: str, ending: str) -> str:
    """The one command line of a ```bash block of the README that ends with ``ending``."""
    blocks = re.findall(r"```bash\n(.*?)```", readme, flags=re.S)
    lines = [line.strip() for block in blocks for line in block.splitlines() if line.strip().endswith(ending)]
    assert len(lines) == 1, f"expected one README command ending with {ending!r}, found {lines}"
    return lines[0]


def _clean_env(tmp_path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("DPGATE_", "VIRTUAL_ENV", "PYTHONPATH", "PYTEST_", "COV_"))}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    env["HOME"] = str(tmp_path / "home")  # no user-level config or caches of the developer's
    (tmp_path / "home").mkdir(exist_ok=True)
    return env


class _Shell:
    """``bash -c LINE`` in its own process group, its output collected line by line."""

    def __init__(self, line: str, *, cwd, env) -> None:
        self.lines: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        self.proc = subprocess.Popen(["bash", "-c", line], cwd=cwd, env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, bufsize=1, start_new_session=True)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._queue.put(line.rstrip("\n"))
        self._queue.put(None)

    def wait_for(self, pattern: str, timeout_s: float) -> re.Match[str]:
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout_s
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self._queue.get(timeout=left)
            except queue.Empty:
                break
            if line is None:
                break
            self.lines.append(line)
            if m := regex.search(line):
                return m
        raise AssertionError(f"no line matching {pattern!r}; output:\n" + "\n".join(self.lines[-80:]))

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=30)


def test_the_readmes_two_commands_pass_on_a_clean_clone(tmp_path, record_property):
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    serve_line, tests_line = readme_command(readme, SERVE), readme_command(readme, TESTS)
    assert serve_line.startswith("python3 -m venv .venv && . .venv/bin/activate && ")
    assert tests_line.startswith("python3 -m venv .venv && . .venv/bin/activate && ")
    env = _clean_env(tmp_path)
    clone = tmp_path / "dpgate"
    done = subprocess.run(["git", "clone", "--quiet", str(REPO), str(clone)], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr

    # 1. the gateway (on a free port: DPGATE_PORT; the command line is the README's)
    port = free_port()
    server = _Shell(serve_line, cwd=clone, env={**env, "DPGATE_PORT": str(port)})
    try:
        key = server.wait_for(ANALYST_KEY_RE, timeout_s=1800).group(1)
        wait_healthy(f"http://127.0.0.1:{port}", timeout_s=600)
        r = httpx.post(f"http://127.0.0.1:{port}/v1/queries", headers={"Authorization": f"Bearer {key}"},
                       json={"dataset": "usage", "sql": "SELECT region, COUNT(DISTINCT user_id) AS users FROM "
                                                         "prompts WHERE week = 0 GROUP BY region"}, timeout=120)
        assert r.status_code == 200, r.text
        assert r.json()["columns"] == ["region", "users"] and len(r.json()["rows"]) == 5
    finally:
        server.stop()

    # 2. the tests, exactly as written (the fast tier), timed; the install is timed apart
    shutil.rmtree(clone / ".dpgate", ignore_errors=True)  # the server's state: not part of a fresh clone
    t0 = time.monotonic()
    install = subprocess.run(["bash", "-c", tests_line.removesuffix(" && pytest")], cwd=clone, env=env,
                             capture_output=True, text=True, timeout=3600)
    t_install = time.monotonic() - t0
    assert install.returncode == 0, install.stdout[-4000:] + install.stderr[-4000:]
    t0 = time.monotonic()
    run = subprocess.run(["bash", "-c", tests_line], cwd=clone, env=env, capture_output=True, text=True,
                         timeout=3600)
    t_total = time.monotonic() - t0
    tail = "\n".join(run.stdout.strip().splitlines()[-15:])
    assert run.returncode == 0, f"the README's test command failed:\n{run.stdout[-6000:]}\n{run.stderr[-3000:]}"
    summary = re.findall(r"^.*\b\d+ passed.*$", run.stdout, flags=re.M)
    record_property("dpgate_summary",
                    f"quickstart: the README's test command passed on a clean clone in {t_total / 60:.1f} min "
                    f"(its pip install, already done: first install {t_install / 60:.1f} min); "
                    f"{summary[-1].strip('= ') if summary else tail}")
