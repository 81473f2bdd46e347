"""The production processes of ``bench_day`` (two gunicorns, a Celery worker, a reminder worker,
the expiry sweeper), each started and stopped the way the other benchmarks do
(``couponcenter.coupons.bench.http.Gunicorn``, ``server_env`` and ``stop``), and the rolling
deploy: one process at a time SIGTERMed, waited for, and started again, as an orchestrator
replaces pods.

Two gunicorns stand for two web pods behind a balancer: the load generators pick any ready one
(``Fleet.urls``), so while one is replaced the other answers, as it would in production.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO

from django.conf import settings

from couponcenter.coupons.bench.http import Gunicorn, server_env, stop
from reminders.bench.processes import CELERY_CONCURRENCY, CELERY_NICE, celery_answers
from reminders.engine import leases

READY_S = 120  # a process that is not ready after this long fails the run (Django's start-up)
GUNICORN_WORKERS = 2
GUNICORN_THREADS = 8


@dataclass
class Pod:
    """One production process: its name, how it starts, and how the run knows it is ready."""

    name: str
    start: Callable[[], None]
    ready: Callable[[], bool]
    stop: Callable[[], None]
    pid: Callable[[], int | None]
    restarts: int = 0


@dataclass
class Fleet:
    """The day's processes under the bench's key prefix and delivery queue."""

    prefix: str
    delivery_queue: str
    log_dir: str
    env_extra: dict[str, str] = field(default_factory=dict)
    pods: list[Pod] = field(default_factory=list)
    _gunicorns: dict[str, Gunicorn] = field(default_factory=dict)
    _procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    _logs: dict[str, IO[str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("web-a", "web-b"):
            self.pods.append(self._web(name))
        manage = [sys.executable, str(settings.BASE_DIR / "manage.py")]
        celery = ["nice", "-n", str(CELERY_NICE), sys.executable, "-m", "celery"]
        celery += ["-A", "couponcenter", "worker", "--pool", "prefork"]
        celery += ["--concurrency", str(CELERY_CONCURRENCY), "-Q", self.delivery_queue]
        celery += ["--without-gossip", "--without-mingle", "--without-heartbeat"]
        self.pods.append(self._process("reminder-worker", [*manage, "run_reminder_worker"]))
        self.pods.append(self._process("celery", celery))
        self.pods.append(self._process("expiry-sweeper", [*manage, "run_expiry_sweeper"]))

    # --- the pods ---------------------------------------------------------------------------------

    def _env(self) -> dict[str, str]:
        return server_env(
            DELIVERY_QUEUE=self.delivery_queue,
            THROTTLE_CLAIM="1000000000/min",
            GUNICORN_MAX_REQUESTS="0",
            WEBHOOK_ALLOW_PRIVATE="1",
            LOG_LEVEL=os.environ.get("BENCH_LOG_LEVEL", "WARNING"),
            PYTHONUNBUFFERED="1",
            **self.env_extra,
        )

    def _web(self, name: str) -> Pod:
        def start() -> None:
            self._gunicorns[name] = Gunicorn(
                workers=GUNICORN_WORKERS,
                worker_class="gthread",
                threads=GUNICORN_THREADS,
                env=self._env(),
            )

        def ready() -> bool:
            gunicorn = self._gunicorns.get(name)
            if gunicorn is None:
                return False
            gunicorn.wait_ready(timeout=READY_S)
            return True

        def halt() -> None:
            gunicorn = self._gunicorns.pop(name, None)
            if gunicorn is not None:
                gunicorn.stop()

        def pid() -> int | None:
            gunicorn = self._gunicorns.get(name)
            return gunicorn.proc.pid if gunicorn else None

        return Pod(name, start, ready, halt, pid)

    def _process(self, name: str, argv: list[str]) -> Pod:
        def start() -> None:
            os.makedirs(self.log_dir, exist_ok=True)
            log = self._logs.get(name)
            if log is None:
                log = self._logs[name] = open(  # noqa: SIM115 - closed in close()
                    os.path.join(self.log_dir, f"bench-day-{name}.log"), "a"
                )
            self._procs[name] = subprocess.Popen(
                argv, env=self._env(), stdout=log, stderr=subprocess.STDOUT
            )

        def ready() -> bool:
            proc = self._procs[name]
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with {proc.returncode}; see its log")
            if name == "reminder-worker":
                return any(w.pid == proc.pid for w in leases.list_workers())
            if name == "celery":
                return celery_answers(timeout=0.5)
            return True  # the sweeper: running is ready (it polls for due tasks)

        def halt() -> None:
            proc = self._procs.pop(name, None)
            if proc is not None:
                stop(proc, timeout=60)

        def pid() -> int | None:
            proc = self._procs.get(name)
            return proc.pid if proc else None

        return Pod(name, start, ready, halt, pid)

    # --- the whole fleet --------------------------------------------------------------------------

    def urls(self) -> list[str]:
        """The web pods answering now (one, while the other is replaced)."""
        return [g.url for g in list(self._gunicorns.values())]

    def web(self) -> Gunicorn:
        """A web pod answering now (the rush's: it measures one server, as ``bench_rush``)."""
        return next(iter(self._gunicorns.values()))

    def pod(self, name: str) -> Pod:
        return next(p for p in self.pods if p.name == name)

    def start(self) -> None:
        for pod in self.pods:
            pod.start()
        for pod in self.pods:
            _until_ready(pod)

    def close(self) -> None:
        for pod in reversed(self.pods):
            pod.stop()
        for log in self._logs.values():
            log.close()

    def rolling_deploy(
        self,
        *,
        order: tuple[str, ...] | None = None,
        gaps: dict[str, float] | None = None,
        say: Callable[[str], None] = lambda line: None,
    ) -> list[dict[str, float | str]]:
        """Each pod in turn: SIGTERM, wait for it to exit (it drains what it holds), its gap in
        ``gaps`` (the orchestrator placing the new pod), start it again, wait until it is ready.
        Returns per pod the seconds it was down."""
        steps = []
        for name in order or tuple(p.name for p in self.pods):
            pod = self.pod(name)
            began = time.monotonic()
            say(f"deploy: {name} (pid {pod.pid()}) SIGTERM")
            pod.stop()
            stopped = time.monotonic()
            time.sleep((gaps or {}).get(name, 0.0))  # the orchestrator placing the new pod
            pod.start()
            _until_ready(pod)
            pod.restarts += 1
            steps.append(
                {
                    "pod": name,
                    "drain_s": round(stopped - began, 2),
                    "down_s": round(time.monotonic() - began, 2),
                }
            )
            say(f"deploy: {name} back (pid {pod.pid()}) after {steps[-1]['down_s']} s")
        return steps


def _until_ready(pod: Pod) -> None:
    deadline = time.monotonic() + READY_S
    while not pod.ready():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{pod.name} was not ready after {READY_S} s; see its log")
        time.sleep(0.1)  # polls the process's readiness
