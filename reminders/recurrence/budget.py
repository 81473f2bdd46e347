"""Evaluating recurrence rules under a time budget: ``Calculator`` keeps a child process that
answers one query at a time and is killed once a query runs past ``RECURRENCE_BUDGET_MS``
(see ``reminders.recurrence`` for why a rule is never evaluated in the worker's own process).

Both ends of the pipe live here. Run as ``python -m reminders.recurrence.budget``, this module is
the child: it says ``ready``, then reads one JSON query a line on stdin (``rule``, ``start``,
``after``) and answers one JSON line on stdout (``at`` or ``error``, and ``ms``, what the
evaluation cost). It imports no Django.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from reminders.recurrence import rules

STARTUP_TIMEOUT_S = 30  # a loaded machine may take seconds to start the child

_DIED = object()
_PARENT_ENV = "COUPONCENTER_RECURRENCE_PARENT"


class Exceeded(Exception):
    """The rule's evaluation ran past its time budget (the child was killed)."""


@dataclass(frozen=True)
class Answer:
    at: datetime | None  # the next occurrence; None: the series is over
    ms: float  # what the evaluation cost in the child


class Calculator:
    """A child process that evaluates rules, one query at a time, killed when a query runs past
    ``budget_ms`` (and started again for the next query). Kept per process and name
    (``calculator()``); thread-safe; a forked process starts its own."""

    def __init__(self, budget_ms: int) -> None:
        self.budget_ms = budget_ms
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._pid = os.getpid()
        self._buffer = b""

    def next_after(self, rule: str, series_start: datetime, after: datetime) -> Answer:
        """``Exceeded`` past the budget; ``ValueError`` for a rule that does not parse."""
        query = {"rule": rule, "start": series_start.isoformat(), "after": after.isoformat()}
        with self._lock:
            reply = self._ask(json.dumps(query).encode() + b"\n")
        if "error" in reply:
            raise ValueError(reply["error"])
        at = reply["at"]
        return Answer(datetime.fromisoformat(at) if at else None, reply["ms"])

    def close(self) -> None:
        with self._lock:
            self._kill()

    def _ask(self, line: bytes) -> dict:
        for attempt in (1, 2):  # a child that died between queries is started again, once
            proc = self._child()
            try:
                proc.stdin.write(line)
                proc.stdin.flush()
            except (BrokenPipeError, OSError):
                self._kill()
                if attempt == 2:
                    raise
                continue
            reply = self._read_line(proc, time.monotonic() + self.budget_ms / 1000)
            if reply is not None and reply is not _DIED:
                return json.loads(reply)
            self._kill()
            if reply is None:  # still working: past its budget
                raise Exceeded(f"not found within {self.budget_ms} ms")
        raise OSError("the recurrence child process keeps dying")

    def _read_line(self, proc: subprocess.Popen, deadline: float) -> bytes | object | None:
        """The child's next line; None past the deadline, ``_DIED`` when its output ended."""
        fd = proc.stdout.fileno()
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while b"\n" not in self._buffer:
                left = deadline - time.monotonic()
                if left <= 0 or not sel.select(left):
                    return None
                chunk = os.read(fd, 65536)
                if not chunk:  # the child died
                    return _DIED
                self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line

    def _child(self) -> subprocess.Popen:
        if self._pid != os.getpid():  # forked: the parent's child is not ours to talk to
            self._proc, self._pid, self._buffer = None, os.getpid(), b""
        if self._proc is None or self._proc.poll() is not None:
            root = str(Path(__file__).resolve().parents[2])
            env = {
                **os.environ,
                _PARENT_ENV: str(os.getpid()),
                "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])),
            }
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "reminders.recurrence.budget"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                env=env,
                cwd=root,
            )
            self._buffer = b""
            # The budget is for the rule, not for starting Python: wait for the child's word.
            if self._read_line(self._proc, time.monotonic() + STARTUP_TIMEOUT_S) != b"ready":
                self._kill()
                raise OSError("the recurrence child process did not start")
        return self._proc

    def _kill(self) -> None:
        proc, self._proc, self._buffer = self._proc, None, b""
        if proc is not None and self._pid == os.getpid():
            proc.kill()
            proc.wait()
            for stream in (proc.stdin, proc.stdout):
                with contextlib.suppress(OSError):
                    stream.close()


_calculators: dict[str, Calculator] = {}
_calculators_lock = threading.Lock()


def calculator(name: str = "") -> Calculator:
    """The calculator ``name`` of this process (a worker keeps one per topic, so one tenant's
    costly rules wait only on each other), with the budget of ``RECURRENCE_BUDGET_MS``."""
    from django.conf import settings  # here, not above: the child imports this module

    budget = settings.RECURRENCE_BUDGET_MS
    with _calculators_lock:
        calc = _calculators.get(name)
        if calc is None or calc.budget_ms != budget:
            if calc is not None:
                calc.close()
            calc = _calculators[name] = Calculator(budget)
        return calc


# --- the child ------------------------------------------------------------------------------------


def _serve() -> None:
    _die_with_parent()
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    for line in sys.stdin.buffer:
        started = time.perf_counter()
        try:
            query = json.loads(line)
            start = datetime.fromisoformat(query["start"])
            at = rules.next_after(query["rule"], start, datetime.fromisoformat(query["after"]))
            reply = {"at": at.isoformat() if at else None}
        except (ValueError, KeyError, TypeError, OverflowError) as exc:
            reply = {"error": str(exc) or exc.__class__.__name__}
        reply["ms"] = (time.perf_counter() - started) * 1000
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


def _die_with_parent() -> None:
    """Killed with its parent (Linux): a parent killed mid-query must not leave the child to
    finish a rule past its budget."""
    try:
        import ctypes
        import signal

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        if str(os.getppid()) != os.environ.get(_PARENT_ENV):  # it died before the line above
            os._exit(1)
    except (OSError, AttributeError):
        pass  # not Linux: the parent's kill on its budget still holds


if __name__ == "__main__":
    _serve()
