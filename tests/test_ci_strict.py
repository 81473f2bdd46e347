"""Under CI=1 a skipped test fails the run, and a run off PostgreSQL refuses to start."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROBE = "tests/support/skip_probe.py"


def _pytest(**env: str) -> subprocess.CompletedProcess:
    full = {**os.environ, **env}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", PROBE],
        cwd=ROOT, env=full, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


# The probe's tests touch no database: any PostgreSQL URL satisfies the CI=1 check.
PG_URL = "postgres://postgres@127.0.0.1:5432/ci_probe_never_connected"


def test_a_skip_is_a_failure_under_ci():
    done = _pytest(CI="1", DATABASE_URL=PG_URL)
    out = done.stdout + done.stderr
    assert done.returncode != 0, out
    assert "1 failed, 1 passed" in out and "skipped under CI=1" in out


def test_without_ci_a_skip_is_a_skip():
    done = _pytest(CI="")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed, 1 skipped" in done.stdout


def test_ci_refuses_to_run_off_postgresql():
    done = _pytest(CI="1", DATABASE_URL="sqlite:///var/ci-probe.sqlite3")
    assert done.returncode != 0
    assert "CI=1 runs on PostgreSQL only" in done.stdout + done.stderr
