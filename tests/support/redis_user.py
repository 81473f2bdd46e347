"""A stand-in for a Procfile process that uses the embedded Redis and is slow to stop.

It connects to ``$COUPONCENTER_VAR_DIR/redis.sock`` (waiting for the server to answer), marks
``user:started`` and waits; on SIGTERM it takes ``STOP_S`` to wind down (a worker finishing its
batch), then writes ``user:last-words`` and exits 0, or exits 3 if Redis is gone by then.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

import redis

STOP_S = 1.0


def main() -> int:
    socket_path = os.path.join(os.environ["COUPONCENTER_VAR_DIR"], "redis.sock")
    client = redis.Redis(unix_socket_path=socket_path, socket_timeout=5)
    deadline = time.monotonic() + 60
    while True:
        try:
            client.set("user:started", "1")
            break
        except (redis.ConnectionError, OSError):
            if time.monotonic() > deadline:
                return 2
            time.sleep(0.1)  # the server is starting
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    print("ready", flush=True)
    stop.wait()
    time.sleep(STOP_S)  # the slow stop under test, not a wait for anything
    try:
        client.set("user:last-words", "ok")
    except (redis.ConnectionError, OSError) as exc:
        print(f"Redis gone before this process stopped: {exc}", flush=True)
        return 3
    print("stopped with Redis still up", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
