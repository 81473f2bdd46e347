"""Celery tasks only for the lifecycle tests (loaded with ``celery worker --include``)."""

import time
from pathlib import Path

from celery import shared_task


@shared_task(name="tests.lifecycle.slow_write")
def slow_write(path: str, seconds: float) -> None:
    Path(path).with_suffix(".started").write_text("started")
    time.sleep(seconds)
    Path(path).write_text("done")


@shared_task(name="tests.lifecycle.record_metric")
def record_metric(topic: str, n: int) -> None:
    from reminders import metrics

    metrics.record(topic, {"delivered": n}, [5.0] * n)


def sleepy_action(jobs) -> None:
    """A ``callable`` timeout action that takes a while (runs inside run_reminder_worker)."""
    import os

    print(f"sleepy action {' '.join(str(job.pk) for job in jobs)}", flush=True)
    time.sleep(float(os.environ.get("CC_LIFECYCLE_SLEEP_S", "0")))
