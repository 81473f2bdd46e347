"""The expiry window (docs/expiry.md, docs/operations.md): a coupon expires at most
``EXPIRY_WINDOW_S`` after its ``expire_at``, whether an urgent path is behind or not.

The sweep yields to the urgent paths (``couponcenter.core.holdback``) only while what is due can
still be swept inside the window. Before each batch it waits while a path is behind, and stops
waiting once

    now + poll + SAFETY x (due tasks / the sweep's rate) >= oldest due expire_at + EXPIRY_WINDOW_S

The rate is the sweeper's own, measured over the batches it swept (a batch a second before it has
swept any); ``SAFETY`` doubles the estimate, since the sweep will then share the machine with the
paths it yielded to; the poll (``HOLDBACK_POLL_MS``) is there because the next look comes that
much later. Past that point the sweep runs until the urgent paths are on target again.
Cost, once per poll while it waits: the head of the pending index and a count over it (capped at
``selectors.COUNT_CAP``).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from django.conf import settings

from couponcenter.core.holdback import Holdback
from couponcenter.core.urgency import UrgencySignal

from . import selectors, services

EXPIRY_SWEEP = "expiry sweep"
EXPIRY_RETENTION = "expiry retention"
SAFETY = 2.0


def expiry_due(now_ms: int) -> bool:
    """Whether a task is due at ``now_ms`` (the head of the pending index): with none, a batch
    finds nothing, and the sweep has nothing to hold back."""
    oldest = services.next_due_at()
    return oldest is not None and oldest <= datetime.fromtimestamp(now_ms / 1000, tz=UTC)


def expiry_must_run(now_ms: int, *, rate_per_s: float) -> str | None:
    """Why the sweep must not wait any longer at ``now_ms``, or None while it still may."""
    now = datetime.fromtimestamp(now_ms / 1000, tz=UTC)
    oldest = services.next_due_at()
    if oldest is None or oldest > now:
        return None  # nothing due: nothing to keep inside the window
    due = selectors.pending_due_count(now=now)
    needed_s = SAFETY * due / max(rate_per_s, 1.0)
    left_s = (oldest + timedelta(seconds=settings.EXPIRY_WINDOW_S) - now).total_seconds()
    if left_s > needed_s + settings.HOLDBACK_POLL_MS / 1000:
        return None
    return (
        f"expiry window: {due} due since {oldest:%Y-%m-%d %H:%M:%S}, about {needed_s:.0f} s "
        f"of sweeping for {max(left_s, 0):.0f} s left (EXPIRY_WINDOW_S)"
    )


def expiry_holdback(
    *,
    rate_per_s: Callable[[], float],
    signal: UrgencySignal | None = None,
    sleep: Callable[[float], object],
) -> Holdback:
    """The sweep's hold-back: no limit but the expiry window's (not ``HOLDBACK_MAX_S``)."""
    return Holdback(
        EXPIRY_SWEEP,
        must_run=lambda now_ms: expiry_must_run(now_ms, rate_per_s=rate_per_s()),
        max_hold_s=None,
        signal=signal,
        sleep=sleep,
    )
