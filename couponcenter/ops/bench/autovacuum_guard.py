"""The undo of a benchmark's ``ALTER SYSTEM SET autovacuum = on`` that outlives the benchmark.

``ALTER SYSTEM`` is the server's, and it survives restarts: a run killed outright (SIGKILL from
an OOM killer or a timeout; no ``finally`` runs) would leave autovacuum on for good. So the run
starts this guard first, in a session of its own (a Ctrl-C to the run's process group does not
reach it), with a pipe on its stdin. The run writes ``DONE`` once it has put the setting back
itself; the guard then exits. If the pipe closes without it, the run died, and the guard puts
the setting back. It needs no Django: libpq's ``PG*`` variables, set by the run, say where.

    python -m couponcenter.ops.bench.autovacuum_guard <own setting or "">
"""

from __future__ import annotations

import sys

DONE = b"put back\n"


def put_back_statement(own: str | None) -> str:
    """What puts the server's ``autovacuum`` as it was: the ``postgresql.auto.conf`` entry it had
    (``own``), or none."""
    if own is None:
        return "ALTER SYSTEM RESET autovacuum"
    return f"ALTER SYSTEM SET autovacuum = {'on' if own == 'on' else 'off'}"


def main(argv: list[str]) -> int:
    own = argv[1] or None
    if sys.stdin.buffer.read() == DONE:
        return 0
    import psycopg2

    conn = psycopg2.connect("")  # libpq's PG* environment
    try:
        conn.autocommit = True  # ALTER SYSTEM runs outside a transaction block
        with conn.cursor() as cursor:
            cursor.execute(put_back_statement(own))
            cursor.execute("SELECT pg_reload_conf()")
    finally:
        conn.close()
    print("autovacuum put back by the guard: the run ended without doing it", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
