"""The deletion of a benchmark's Redis namespace and delivery queue when the run is killed
outright (``namespace.bench_namespace``).

A run killed with SIGKILL runs no ``finally``: its keys and its queue's bindings in the broker
would stay in Redis for good, one set per killed run. So the run starts this guard in a session
of its own (a Ctrl-C to the run's process group does not reach it), with a pipe on its stdin,
as ``autovacuum_guard`` does. The run writes ``DONE`` once it has deleted them itself; the guard
then exits. If the pipe closes without it, the run died: the guard waits for the run's own
processes (its workers, which the kernel stops when the run dies, and which write under the
prefix until they have) to end, then deletes them, with the run's environment (its Redis and its
broker).

    python -m reminders.bench.namespace_guard <key prefix> <delivery queue>
"""

from __future__ import annotations

import contextlib
import os
import sys

import psutil

DONE = b"deleted\n"
# The longest the guard waits for the run's processes to end (their graceful stop is bounded well
# inside it); what is still running then may leave a key or two behind.
USERS_WAIT_S = 120.0


def _users_of(prefix: str) -> list[psutil.Process]:
    """The processes working under ``prefix``: the bench starts each with it in its environment."""
    found = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if proc.pid != os.getpid() and proc.environ().get("REDIS_KEY_PREFIX") == prefix:
                found.append(proc)
    return found


def main(argv: list[str]) -> int:
    prefix, queue = argv[1], argv[2]
    if sys.stdin.buffer.read() == DONE:
        return 0
    psutil.wait_procs(_users_of(prefix), timeout=USERS_WAIT_S)
    import django

    django.setup()
    from couponcenter.core.redis import broker_queue_delete
    from reminders.bench.tables import delete_keys

    delete_keys(prefix)
    broker_queue_delete(queue)
    print(
        f"the bench's Redis keys ({prefix}) and queue ({queue}) deleted by the guard: the run "
        "ended without doing it",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
