"""The embedded Redis under ``make run`` keeps its data: the Procfile's ``redis`` line, run by
honcho as ``make run`` runs it, snapshots on a policy (``CONFIG GET save`` is not empty), and on
Ctrl-C stops after the processes that use it, saving, so a restart finds every key."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
import redis

from couponcenter.core.redis import EMBEDDED_SAVE, stop_embedded_server
from tests.support.checkout import ROOT, checkout

pytestmark = pytest.mark.slow

START_TIMEOUT_S = 90


def procfile_line(name: str) -> str:
    lines = (ROOT / "Procfile").read_text().splitlines()
    return next(line.split(":", 1)[1].strip() for line in lines if line.startswith(f"{name}:"))


class Run:
    """``honcho start`` on a Procfile in the checkout, as ``make run`` starts it."""

    def __init__(self, where: Path, env: dict[str, str], log: Path) -> None:
        self.log = log
        self.honcho = subprocess.Popen(
            [".venv/bin/honcho", "start", "-f", "Procfile.test"],
            cwd=where,
            env=env,
            stdout=log.open("w"),
            stderr=subprocess.STDOUT,
        )

    def output(self) -> str:
        return self.log.read_text()

    def ctrl_c(self) -> str:
        """What a terminal's Ctrl-C does: SIGINT to honcho (its processes run in sessions of
        their own, so the terminal's signal reaches only honcho)."""
        self.honcho.send_signal(signal.SIGINT)
        self.honcho.wait(timeout=60)
        return self.output()

    def kill(self) -> None:
        if self.honcho.poll() is None:
            self.honcho.kill()
            self.honcho.wait(timeout=30)


def wait_for(condition, what: str, run: Run) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while not condition():
        assert time.monotonic() < deadline, (
            f"{what}: not within {START_TIMEOUT_S} s\n{run.output()}"
        )
        assert run.honcho.poll() is None, f"honcho exited\n{run.output()}"
        time.sleep(0.1)  # polls the condition


def answers(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except (redis.ConnectionError, OSError):
        return False


def test_embedded_redis_saves_and_outlives_its_users_on_ctrl_c(tmp_path):
    where = checkout(tmp_path / "checkout")
    (where / "Procfile.test").write_text(
        f"redis: {procfile_line('redis')}\nuser: .venv/bin/python -m tests.support.redis_user\n"
    )
    var = where / "var"
    env = {k: v for k, v in os.environ.items() if k not in {"REDIS_URL", "CELERY_BROKER_URL"}}
    env.update(
        DEBUG="1",
        COUPONCENTER_VAR_DIR=str(var),
        COUPONCENTER_REDIS_AUTOSTART="0",
        PYTHONPATH=str(ROOT),
        PYTHONUNBUFFERED="1",
    )
    socket_path = var / "redis.sock"
    client = redis.Redis(unix_socket_path=str(socket_path), socket_timeout=5)
    runs: list[Run] = []
    try:
        first = Run(where, env, tmp_path / "first.log")
        runs.append(first)
        wait_for(lambda: answers(client) and client.get("user:started"), "the user started", first)
        # A save policy is in force, the one the code sets.
        policy = " ".join(" ".join(pair) for pair in EMBEDDED_SAVE)
        assert client.config_get("save") == {"save": policy}
        assert policy
        client.set("test:kept", "yes")
        client.close()

        out = first.ctrl_c()
        assert first.honcho.returncode == 130, out
        assert "stopped the embedded redis-server (its data is saved)" in out, out
        # The user stopped with Redis still answering its last write. That the write came before
        # the server's final save is shown below, by the write found after the restart: the
        # order of the two processes' lines here is honcho's, which reads each from a pipe of its
        # own, not the order in which they were written.
        assert re.search(r"user\.1 +\| stopped with Redis still up", out), out
        assert re.search(r"redis\.1 +\| .*Saving the final RDB snapshot", out), out
        assert not socket_path.exists()
        assert (var / "redis.rdb").exists()

        second = Run(where, env, tmp_path / "second.log")
        runs.append(second)
        wait_for(lambda: answers(client), "the server answered again", second)
        assert client.get("test:kept") == b"yes"
        assert client.get("user:last-words") == b"ok"  # written after Ctrl-C, saved at the stop
        client.close()
        second.ctrl_c()
        assert "stopped the embedded redis-server (its data is saved)" in second.output()
    finally:
        client.close()
        for run in runs:
            run.kill()
        stop_embedded_server(socket_path)
