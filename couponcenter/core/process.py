"""Process-wide settings for the long-running workers (the dispatch loop, the expiry sweeper,
Celery's children)."""

from __future__ import annotations

import gc
import signal
from collections.abc import Callable

# Allocations between young-generation collections (Python's default: 700).
GC_GEN0_THRESHOLD = 20_000


def tune_gc() -> None:
    """Move everything alive after start-up out of the collector's view, and collect the young
    generation less often. A 200,000-reminder burst allocates a tuple per entry in the dispatch
    loop and a row per reminder in delivery; with the default thresholds the collector walked
    Django's whole heap again and again in the middle of it (in the dispatch loop, twice the time
    of building the entries). Garbage is still collected: only less often, and not start-up's."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_GEN0_THRESHOLD, *gc.get_threshold()[1:])


def stop_on_signals(stop: Callable[[int, object], object]) -> None:
    """SIGTERM and SIGINT call a loop's ``stop``, which only sets its flag (all a signal handler
    may safely do): the loop finishes the work in hand, then returns."""
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
