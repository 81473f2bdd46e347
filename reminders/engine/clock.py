"""The engine's time: milliseconds since the epoch, the unit of every due time, score and ``now``.

Plain Python, so every layer may use it: the engine, the reminders app, the ops console and the
benchmarks read the clock here and convert a ``datetime`` here, and nowhere else.
"""

from __future__ import annotations

import time
from datetime import datetime


def epoch_ms(moment: datetime | None = None) -> int:
    """``moment`` (default: now) in milliseconds since the epoch."""
    return time.time_ns() // 1_000_000 if moment is None else int(moment.timestamp() * 1000)
