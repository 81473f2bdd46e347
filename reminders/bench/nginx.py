"""A fast webhook receiver for ``bench_fanout``, ``bench_days`` and ``bench_day``: nginx from
Debian's packages answering 204 to every POST, started and stopped by the benchmark on a free
loopback port.

Everything it writes (its configuration, pid file, error and access logs, temporary files) lives
in a temporary directory of its own, removed when it stops; no root path, no system service.
One worker process, so the sender and the load generator keep the machine's other core.

The access log is the proof of delivery: one line per request with its arrival time (``$msec``),
its path, its status and the Standard Webhooks headers (``webhook-id``, ``webhook-timestamp``,
``webhook-signature``), so a run counts what arrived, not what a sender believes it sent.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from couponcenter.core.process import die_with_parent
from couponcenter.coupons.bench.http import free_port, stop

INSTALL = "apt-get install nginx-light (make bench does)"
# How often nginx writes its buffered access log (the ``flush=`` below).
LOG_FLUSH_S = 0.1
# The access log's fields, tab-separated (a signature holds spaces while a secret rotates).
LOG_FIELDS = ("msec", "uri", "status", "webhook_id", "webhook_timestamp", "webhook_signature")
_LOG_FORMAT = "\\t".join(
    ("$msec", "$request_uri", "$status", "$http_webhook_id", "$http_webhook_timestamp")
    + ("$http_webhook_signature",)
)

CONFIG = """\
daemon off;
master_process on;
worker_processes 1;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
events {{ worker_connections 4096; }}
http {{
  client_body_temp_path {dir}/body;
  proxy_temp_path {dir}/proxy;
  fastcgi_temp_path {dir}/fastcgi;
  uwsgi_temp_path {dir}/uwsgi;
  scgi_temp_path {dir}/scgi;
  log_format webhooks '{log_format}';
  access_log {dir}/access.log webhooks buffer=256k flush={flush_ms}ms;
  keepalive_requests 1000000;
  keepalive_timeout 75s;
  server {{
    listen 127.0.0.1:{port} backlog=4096;
    location / {{ return 204; }}
  }}
}}
"""


class NginxMissing(RuntimeError):
    pass


@dataclass(frozen=True)
class Arrival:
    """One access-log line."""

    at: float  # epoch seconds, millisecond resolution
    path: str
    status: int
    webhook_id: str
    webhook_timestamp: str
    webhook_signature: str


@dataclass
class Nginx:
    url: str
    directory: Path
    process: subprocess.Popen
    # What ``count`` has read of the log: a benchmark polls it many times a second while the
    # log grows to hundreds of thousands of lines, so each poll reads only the new lines.
    _read_to: int = field(default=0, init=False, repr=False)
    _counts: Counter[str] = field(default_factory=Counter, init=False, repr=False)

    @property
    def access_log(self) -> Path:
        return self.directory / "access.log"

    def count(self, path: str) -> int:
        """Requests logged for ``path`` so far (the log is written every ``LOG_FLUSH_S``)."""
        with open(self.access_log, "rb") as log:
            log.seek(self._read_to)
            new = log.read()
        whole = new[: new.rfind(b"\n") + 1]  # a line still being written is read next time
        self._read_to += len(whole)
        for line in whole.splitlines():
            fields = line.split(b"\t", 2)
            if len(fields) > 2:
                self._counts[fields[1].decode(errors="replace")] += 1
        return self._counts[path]

    def wait_logged(self, path: str, count: int) -> int:
        """Until ``count`` requests to ``path`` are in the log (it is written in buffers), or a
        few flush intervals passed (the check that follows then says what is missing); the
        requests logged."""
        deadline = time.monotonic() + 20 * LOG_FLUSH_S
        while (logged := self.count(path)) < count and time.monotonic() < deadline:
            time.sleep(LOG_FLUSH_S / 10)
        return logged

    def arrivals(self, path: str) -> list[Arrival]:
        """Every logged request to ``path``, in the order they were logged."""
        found = []
        with open(self.access_log, encoding="utf-8") as log:
            for line in log:
                fields = line.rstrip("\n").split("\t")
                if len(fields) == len(LOG_FIELDS) and fields[1] == path:
                    at, uri, status, *headers = fields
                    found.append(Arrival(float(at), uri, int(status), *headers))
        return found


def nginx_missing(bench: str) -> str | None:
    """What to install when nginx, the receiver ``bench`` fires its timeouts at, is not there."""
    if nginx_binary() is None:
        return f"{bench} fires its timeouts at nginx: {INSTALL}"
    return None


def nginx_binary() -> str | None:
    return shutil.which("nginx") or next(
        (p for p in ("/usr/sbin/nginx",) if Path(p).exists()), None
    )


@contextmanager
def nginx_receiver(*, timeout_s: float = 15) -> Iterator[Nginx]:
    """nginx on a free loopback port until it accepts connections; stopped (and its directory
    removed) on the way out. ``NginxMissing`` when it is not installed."""
    binary = nginx_binary()
    if binary is None:
        raise NginxMissing(f"nginx is not installed: {INSTALL}")
    directory = Path(tempfile.mkdtemp(prefix="ccbench-nginx-"))
    port = free_port()
    conf = directory / "nginx.conf"
    conf.write_text(
        CONFIG.format(
            dir=directory, port=port, log_format=_LOG_FORMAT, flush_ms=round(LOG_FLUSH_S * 1000)
        )
    )
    (directory / "access.log").touch()
    # -e: the error log before the configuration is read (else the compiled-in root path).
    argv = [binary, "-p", str(directory), "-c", str(conf), "-e", str(directory / "error.log")]
    # A run killed outright (no ``finally``) takes nginx with it.
    process = subprocess.Popen(
        argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, preexec_fn=die_with_parent
    )
    try:
        _wait_listening(process, port, directory, timeout_s)
        yield Nginx(f"http://127.0.0.1:{port}", directory, process)
    finally:
        stop(process)
        shutil.rmtree(directory, ignore_errors=True)


def _wait_listening(process: subprocess.Popen, port: int, directory: Path, timeout_s: float):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            errors = process.stderr.read().decode(errors="replace") if process.stderr else ""
            log = directory / "error.log"
            errors += log.read_text(errors="replace") if log.exists() else ""
            raise RuntimeError(f"nginx exited with {process.returncode}: {errors[-1000:]}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nginx did not listen on {port} within {timeout_s:.0f} s")
