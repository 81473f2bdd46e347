"""Rebuild Redis from the database (``rebuild_reminder_queues`` and the worker's reconcile)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from reminders.models import ReminderSubscription, TimeoutJob

from .subscriptions import subscriptions_rebuild
from .timeouts import timeout_jobs_rebuild

Progress = Callable[[str, int], None]


def queues_pending_counts() -> dict[str, int]:
    return {
        "timeout jobs": TimeoutJob.objects.filter(status=TimeoutJob.Status.PENDING).count(),
        "reminders": ReminderSubscription.objects.filter(
            status=ReminderSubscription.Status.SCHEDULED
        ).count(),
    }


def queues_rebuild(
    *, due_before: datetime | None = None, progress: Progress | None = None
) -> dict[str, int]:
    """Idempotently rebuild pending jobs and scheduled reminders; returns how many were added."""

    def step(name: str) -> Callable[[int], None] | None:
        return None if progress is None else (lambda n: progress(name, n))

    return {
        "timeout jobs": timeout_jobs_rebuild(due_before=due_before, progress=step("timeout jobs")),
        "reminders": subscriptions_rebuild(due_before=due_before, progress=step("reminders")),
    }
