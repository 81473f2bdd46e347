"""The load generators of the HTTP benchmarks: ``wrk`` (C) driven by a Lua script the benchmark
writes, or, where wrk is not installed, a small asyncio client in this module. Both answer the
same summary (``requests``, ``duration_us``, ``s201``, ``s409``, ``sother``, ``errors``,
``p50_us``, ``p99_us``) with the CPU seconds the generator itself used, so a report can say how
much of the machine the generator took. What to send is the benchmark's (``http``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator


def run_wrk(
    *, url: str, script: str, args: list[str], seconds: float, connections: int, threads: int
) -> tuple[dict, float]:
    """Run wrk; returns its BENCH_JSON summary and the CPU seconds wrk itself used."""
    with tempfile.NamedTemporaryFile("w", suffix=".lua") as lua:
        lua.write(script)
        lua.flush()
        duration = f"{max(1, round(seconds))}s"
        cmd = ["wrk", "-t", str(threads), "-c", str(connections), "-d", duration, "--timeout"]
        cmd += ["10s", "-s", lua.name, url, "--", *args]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        with _killed_on_error(proc):
            return _wrk_summary(proc, proc.stdout.read())


def run_wrk_until_done(
    *,
    url: str,
    script: str,
    args: list[str],
    connections: int,
    max_seconds: float,
    on_line: Callable[[str], None] = lambda line: None,
) -> tuple[dict, float]:
    """Run wrk with one connection per thread until each thread has printed ``BENCH_DONE``
    (its share of the work is done), then stop it; returns its BENCH_JSON summary and the CPU
    seconds wrk itself used. Every line wrk prints goes to ``on_line`` as it comes.

    wrk sleeps its whole ``-d`` even when its threads have stopped; SIGINT ends that sleep, and wrk
    then prints its summary and runs the script's ``done()``. ``max_seconds`` (the ``-d``) bounds
    a run whose threads never finish. wrk ignores SIGINT until its threads are started, so a
    script must not finish within its first moments (the rush's users tap for a second before
    the coupon opens)."""
    with tempfile.NamedTemporaryFile("w", suffix=".lua") as lua:
        lua.write(script)
        lua.flush()
        cmd = ["wrk", "-t", str(connections), "-c", str(connections)]
        cmd += ["-d", f"{max(1, round(max_seconds))}s", "--timeout", "10s", "-s", lua.name, url]
        proc = subprocess.Popen(
            [*cmd, "--", *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        out, done = [], 0
        with _killed_on_error(proc):
            for line in proc.stdout:
                out.append(line)
                on_line(line)
                if line.startswith("BENCH_DONE "):
                    done += 1
                    if done == connections:  # not reaped until _wrk_summary: still wrk's pid
                        os.kill(proc.pid, signal.SIGINT)
            return _wrk_summary(proc, "".join(out))


@contextlib.contextmanager
def _killed_on_error(proc: subprocess.Popen) -> Iterator[None]:
    """wrk killed and reaped if the run ends early (an error, Ctrl-C, SIGTERM): it would go on
    loading the server for the rest of its ``-d``."""
    try:
        yield
    except BaseException:
        if proc.returncode is None:
            proc.kill()
            proc.wait()
        raise


def _wrk_summary(proc: subprocess.Popen, out: str) -> tuple[dict, float]:
    """Reap wrk (its CPU seconds come with it) and read its BENCH_JSON line."""
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    lines = [line for line in out.splitlines() if line.startswith("BENCH_JSON ")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"wrk failed ({proc.returncode}):\n{out[-2000:]}")
    return json.loads(lines[-1][len("BENCH_JSON ") :]), usage.ru_utime + usage.ru_stime


# --- the Python generator (when wrk is not installed) -------------------------------------------


async def _python_client(
    *,
    port: int,
    path_for: Callable[[int], str],
    body_for: Callable[[int], bytes] | None,
    headers: str,
    seconds: float,
    connections: int,
    first: int,
) -> dict:
    statuses: Counter[int] = Counter()
    latencies: list[float] = []
    counter = iter(range(first, first + 10**9))
    deadline = time.perf_counter() + seconds
    errors = 0

    async def one_connection() -> None:
        nonlocal errors
        reader = writer = None
        while time.perf_counter() < deadline:
            if writer is None:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
            n = next(counter)
            body = body_for(n) if body_for else b""
            method = "POST" if body_for else "GET"
            head = f"{method} {path_for(n)} HTTP/1.1\r\nHost: 127.0.0.1\r\n{headers}"
            request = f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body
            started = time.perf_counter()
            try:
                writer.write(request)
                status_line = await reader.readline()
                length, close = 0, False
                while (line := await reader.readline()) not in (b"\r\n", b""):
                    name, _, value = line.decode("latin-1").partition(":")
                    if name.lower() == "content-length":
                        length = int(value)
                    elif name.lower() == "connection" and "close" in value.lower():
                        close = True
                await reader.readexactly(length)
                statuses[int(status_line.split()[1])] += 1
                latencies.append(time.perf_counter() - started)
            except (OSError, asyncio.IncompleteReadError, IndexError, ValueError):
                errors += 1
                close = True
            if close:
                writer.close()
                reader = writer = None

    started = time.perf_counter()
    await asyncio.gather(*(one_connection() for _ in range(connections)))
    elapsed = time.perf_counter() - started
    latencies.sort()

    def pct(q: float) -> int:
        return int(latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1e6)

    return {
        "requests": sum(statuses.values()),
        "duration_us": int(elapsed * 1e6),
        "s201": statuses[201],
        "s409": statuses[409],
        "sother": sum(n for code, n in statuses.items() if code not in (201, 409)),
        "non2xx": sum(n for code, n in statuses.items() if not 200 <= code < 300),
        "errors": errors,
        "p50_us": pct(0.50) if latencies else 0,
        "p99_us": pct(0.99) if latencies else 0,
    }


def run_python(**kwargs) -> tuple[dict, float]:
    """The asyncio client's summary (the keys of wrk's) and the CPU seconds it used."""
    before = time.process_time()
    summary = asyncio.run(_python_client(**kwargs))
    return summary, time.process_time() - before
