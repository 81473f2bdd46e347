"""Celery tasks of the reminders app: they only delegate to services."""

import logging

from celery import shared_task

from reminders.services.delivery import reminders_deliver

logger = logging.getLogger(__name__)


@shared_task(name="reminders.tasks.deliver_reminders", acks_late=True)
def deliver_reminders(batch: dict) -> dict[str, int]:
    """Deliver one batch of merged reminder messages (never one task per reminder).

    No Celery-level retry: failed items are nacked into the engine, which retries exactly those
    with backoff and moves them to the dead queue past the attempt limit.
    """
    return reminders_deliver(batch)


@shared_task(name="reminders.tasks.log_timeout_job")
def log_timeout_job(jobs: list[dict] | None = None, job: dict | None = None) -> None:
    """The demo action of the ``order.close`` topic: log each fired job of the batch (``job``:
    a single job, the form of tasks a queue may still hold from before batches)."""
    for one in jobs if jobs is not None else [job]:
        logger.info("order.close fired", extra={"job": one})
