"""Gunicorn in production: ``gunicorn couponcenter.wsgi -c gunicorn.conf.py``.

Every knob comes from the environment (the platform's conventions first: ``PORT``,
``WEB_CONCURRENCY``):

- ``GUNICORN_BIND`` (default ``0.0.0.0:$PORT``, ``PORT`` default 8000);
- ``WEB_CONCURRENCY`` worker processes (default 2 x CPUs + 1); ``GUNICORN_WORKER_CLASS`` (``sync``,
  or ``gthread`` with ``GUNICORN_THREADS`` threads each, which also keeps connections alive);
- ``GUNICORN_TIMEOUT`` kills a worker stuck on one request; ``GUNICORN_GRACEFUL_TIMEOUT`` is how
  long SIGTERM waits for the requests in flight before the workers are killed (keep it below the
  orchestrator's own kill delay, e.g. Kubernetes' ``terminationGracePeriodSeconds`` of 30 s);
- ``GUNICORN_ACCESS_LOG`` (``1``: to stderr, default; ``0``: off; or a file path);
- ``FORWARDED_ALLOW_IPS`` the proxies whose ``X-Forwarded-*`` headers are trusted.

With ``PROMETHEUS_MULTIPROC_DIR`` set, every worker writes its metrics to that directory and
``/metrics`` adds them up; a worker that exits is marked dead so its live gauges go away.
"""

import multiprocessing
import os

bind = os.environ.get("GUNICORN_BIND") or f"0.0.0.0:{os.environ.get('PORT', '8000')}"
workers = int(os.environ.get("WEB_CONCURRENCY") or multiprocessing.cpu_count() * 2 + 1)
worker_class = os.environ.get("GUNICORN_WORKER_CLASS", "sync")
threads = int(os.environ.get("GUNICORN_THREADS", "1"))
timeout = int(os.environ.get("GUNICORN_TIMEOUT", "30"))
graceful_timeout = int(os.environ.get("GUNICORN_GRACEFUL_TIMEOUT", "20"))
keepalive = int(os.environ.get("GUNICORN_KEEPALIVE", "5"))
# Recycle workers now and then so a slow leak can never take a worker down in the middle of a sale.
max_requests = int(os.environ.get("GUNICORN_MAX_REQUESTS", "20000"))
max_requests_jitter = max_requests // 10
forwarded_allow_ips = os.environ.get("FORWARDED_ALLOW_IPS", "127.0.0.1,::1")
# The heartbeat file on tmpfs: on a container's overlay filesystem a slow fsync can get a healthy
# worker killed for "timeout".
worker_tmp_dir = "/dev/shm" if os.path.isdir("/dev/shm") else None

_access_log = os.environ.get("GUNICORN_ACCESS_LOG", "1")
accesslog = None if _access_log in {"0", "", "off"} else "-" if _access_log == "1" else _access_log
# One line per request, logfmt: easy to grep, and parsed by Loki / Vector / Datadog as is.
# %(M)s is the duration in ms; x-request-id is whatever the edge proxy set.
access_log_format = (
    'remote=%(h)s method=%(m)s path="%(U)s" query="%(q)s" status=%(s)s bytes=%(B)s '
    'duration_ms=%(M)s request_id="%({x-request-id}i)s" user_agent="%(a)s"'
)
errorlog = "-"
loglevel = os.environ.get("GUNICORN_LOG_LEVEL", "info")
proc_name = "couponcenter-web"


def child_exit(server, worker) -> None:
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(worker.pid)


def post_worker_init(worker) -> None:
    # The app is loaded by now. Frozen out of the collector's view, it is no longer walked by
    # every full collection while the worker's threads wait, in the middle of a rush. The young
    # generation keeps Python's threshold here (unlike ``tune_gc``'s workers): a request's garbage
    # is small, and the larger threshold cost the rush answers (BENCHMARKS.md).
    from couponcenter.core.process import freeze_start_up

    freeze_start_up()
