"""Process-wide settings for the long-running workers (the dispatch loop, the expiry sweeper,
Celery's children, gunicorn's workers)."""

from __future__ import annotations

import ctypes
import gc
import signal
import sys
from collections.abc import Callable

# Allocations between young-generation collections (Python's default: 700).
GC_GEN0_THRESHOLD = 20_000


def freeze_start_up() -> None:
    """Move everything alive after start-up (Django, the app, its settings) out of the
    collector's view: a full collection otherwise walks all of it again, while every thread of the
    process waits. Garbage made from here on is collected as before."""
    gc.collect()
    gc.freeze()


def tune_gc() -> None:
    """``freeze_start_up``, and collect the young generation less often. A 200,000-reminder burst
    allocates a tuple per entry in the dispatch loop and a row per reminder in delivery; with the
    default thresholds the collector walked Django's whole heap again and again in the middle of
    it (in the dispatch loop, twice the time of building the entries). Garbage is still
    collected: only less often, and not start-up's."""
    freeze_start_up()
    gc.set_threshold(GC_GEN0_THRESHOLD, *gc.get_threshold()[1:])


# Looked up here, not in the child: between fork and exec only async-signal-safe work is sound,
# and resolving a symbol takes the dynamic loader's lock, which another thread may hold.
_PR_SET_PDEATHSIG = 1
_prctl = ctypes.CDLL(None, use_errno=True).prctl if sys.platform.startswith("linux") else None


def die_with_parent() -> None:
    """For ``Popen(preexec_fn=...)``: the child gets SIGTERM when the thread that started it
    exits, so a parent killed outright (SIGKILL runs no ``finally``) leaves no process behind.
    Only for a child whose starting thread outlives it; elsewhere than Linux, nothing."""
    if _prctl is not None:
        _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def sigterm_unwinds() -> None:
    """SIGTERM raises ``KeyboardInterrupt``, as Ctrl-C does, in a command that changes things it
    must put back (a benchmark's processes, rows and settings): by default SIGTERM ends the
    process on the spot, ``finally`` blocks unrun."""
    signal.signal(signal.SIGTERM, signal.default_int_handler)


def stop_on_signals(stop: Callable[[int, object], object]) -> None:
    """SIGTERM and SIGINT call a loop's ``stop``, which only sets its flag (all a signal handler
    may safely do): the loop finishes the work in hand, then returns."""
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
