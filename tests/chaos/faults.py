"""Fault injection for the chaos suite: a TCP proxy that can cut connections, a private Redis.

- ``TcpProxy``: a real TCP proxy on 127.0.0.1 in front of PostgreSQL (or anything TCP). ``cut()``
  closes the listening socket (new connections are refused) and resets every open connection;
  ``restore()`` listens again on the same port. ``latency_s`` delays each chunk sent upstream, to
  make a database (and so the inbox gateway) slow.
- ``RedisServer``: a ``redis-server`` process of our own on a free loopback port, which the tests
  may SHUTDOWN, restart empty and FLUSHALL (the shared Redis is never touched that way).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import struct
import subprocess
import threading
import time
from pathlib import Path

import redis

CONNECT_TIMEOUT_S = 5


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _reset(sock: socket.socket) -> None:
    """Drop a connection for good: both peers see it end (an RST where the kernel can).

    ``shutdown`` first: a bare ``close()`` while a pump thread is blocked in ``recv`` on the same
    socket leaves the connection open, and PostgreSQL then keeps an "idle in transaction"
    session holding its row locks (which is what a half-open connection does in production).
    """
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()


class TcpProxy:
    """127.0.0.1:<port> -> upstream, one thread per direction per connection."""

    def __init__(self, upstream_host: str, upstream_port: int, *, port: int | None = None):
        self.upstream = (upstream_host, upstream_port)
        self.port = port or free_port()
        self.latency_s = 0.0
        self.accepted = 0
        self._lock = threading.Lock()
        self._conns: set[socket.socket] = set()
        self._listener: socket.socket | None = None
        self._closed = False
        self.restore()

    # --- control -----------------------------------------------------------------------------

    @property
    def is_cut(self) -> bool:
        return self._listener is None

    def cut(self) -> None:
        """Refuse new connections and reset every open one."""
        with self._lock:
            listener, self._listener = self._listener, None
            conns, self._conns = self._conns, set()
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        for sock in conns:
            _reset(sock)

    def restore(self) -> None:
        if self._listener is not None or self._closed:
            return
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(128)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def close(self) -> None:
        self._closed = True
        self.cut()

    def open_connections(self) -> int:
        with self._lock:
            return len(self._conns) // 2

    # --- plumbing ----------------------------------------------------------------------------

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # cut: the listener was closed
            try:
                server = socket.create_connection(self.upstream, timeout=CONNECT_TIMEOUT_S)
                server.settimeout(None)
            except OSError:
                _reset(client)
                continue
            with self._lock:
                if self._listener is not listener:  # cut while we were connecting
                    _reset(client)
                    _reset(server)
                    continue
                self._conns |= {client, server}
                self.accepted += 1
            for src, dst, delay in ((client, server, True), (server, client, False)):
                threading.Thread(target=self._pump, args=(src, dst, delay), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, delay: bool) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if delay and self.latency_s:
                    time.sleep(self.latency_s)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            with self._lock:
                tracked = src in self._conns
                self._conns.discard(src)
                self._conns.discard(dst)
            if tracked:  # a normal close on one side: pass it on (a cut already reset both)
                with contextlib.suppress(OSError):
                    dst.shutdown(socket.SHUT_WR)
                src.close()
                dst.close()


class RedisServer:
    """A private ``redis-server`` on 127.0.0.1:<free port>, no persistence."""

    def __init__(self, workdir: Path, *, port: int | None = None):
        self.port = port or free_port()
        self.workdir = workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=5)

    def start(self) -> RedisServer:
        binary = shutil.which("redis-server") or "/usr/bin/redis-server"
        log = open(self.workdir / f"redis-{self.starts}.log", "wb")  # noqa: SIM115 (owned by proc)
        self.proc = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self.workdir), "--maxclients", "1000"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        log.close()
        self.starts += 1
        deadline = time.monotonic() + 20
        while True:
            with contextlib.suppress(redis.RedisError, OSError):
                if self.client().ping():
                    return self
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"redis-server on port {self.port} did not start")
            time.sleep(0.05)

    def shutdown(self) -> None:
        """SHUTDOWN NOSAVE: the server exits and everything in it is gone."""
        if self.proc is None or self.proc.poll() is not None:
            return
        with contextlib.suppress(redis.RedisError):
            self.client().shutdown(nosave=True)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=15)

    def restart(self, *, down_s: float = 0.0) -> None:
        self.shutdown()
        time.sleep(down_s)  # the outage itself, not an assertion
        self.start()

    def flushall(self) -> None:
        self.client().flushall()

    def stop(self) -> None:
        self.shutdown()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=15)


class PrivatePostgres:
    """A PostgreSQL cluster of the test's own (``initdb`` into a temporary folder, trust auth,
    127.0.0.1:<free port>, no fsync), which the test may stop and start: a real server going
    away and coming back, not a cut connection. Runs as the ``postgres`` user when the tests run
    as root (the server refuses root)."""

    def __init__(self, workdir: Path, *, port: int | None = None):
        self.port = port or free_port()
        self.data = workdir / "data"
        self.log = workdir / "postgres.log"
        self.workdir = workdir
        # The server's own binaries (Debian's /usr/bin/pg_ctl is a wrapper that wants a cluster
        # registered with pg_ctlcluster).
        bins = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
        found = shutil.which("initdb") if not bins else None
        self.bin = bins[-1].parent if bins else (Path(found).parent if found else None)

    @property
    def available(self) -> bool:
        return self.bin is not None

    def url(self, name: str) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{name}"

    def _run(self, *argv: str, timeout: float = 60) -> None:
        command = [str(self.bin / argv[0]), *argv[1:]]
        if os.getuid() == 0:
            command = ["runuser", "-u", "postgres", "--", *command]
        subprocess.run(command, check=True, capture_output=True, timeout=timeout)

    def init(self) -> PrivatePostgres:
        self.workdir.mkdir(parents=True, exist_ok=True)
        if os.getuid() == 0:
            shutil.chown(self.workdir, "postgres", "postgres")
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync",
                  "-E", "UTF8")  # fmt: skip
        return self

    def start(self) -> None:
        options = (f"-p {self.port} -c listen_addresses=127.0.0.1 -c fsync=off "
                   f"-c unix_socket_directories={self.workdir}")  # fmt: skip
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", options, "-w",
                  "start")  # fmt: skip

    def stop(self) -> None:
        """A fast shutdown: every session is ended, the server exits."""
        self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")

    def running(self) -> bool:
        return (self.data / "postmaster.pid").exists()

    def close(self) -> None:
        if self.running():
            with contextlib.suppress(subprocess.SubprocessError):
                self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        shutil.rmtree(self.workdir, ignore_errors=True)
