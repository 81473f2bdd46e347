"""Timeout-job actions run inside the worker processes of the chaos tests (``callable`` topics)."""

from __future__ import annotations

import logging
import os
import signal
import time

from reminders.models import TimeoutJob

logger = logging.getLogger("tests.chaos")


def announce_and_sleep(jobs: list[TimeoutJob]) -> None:
    """Say when the action starts and ends for each job of the batch, sleeping
    ``attribute["sleep_s"]`` in between, so a test can freeze the worker in the middle of it."""
    for job in jobs:
        logger.warning("chaos-action start job=%s pid=%s", job.pk, os.getpid())
        time.sleep(float(job.attribute.get("sleep_s", 0)))
        logger.warning("chaos-action done job=%s pid=%s", job.pk, os.getpid())


def poison_or_ok(jobs: list[TimeoutJob]) -> None:
    """A poison pill (``attribute["poison"]``) kills its worker outright, every time."""
    for job in jobs:
        if job.attribute.get("poison"):
            logger.warning("chaos-poison job=%s killing pid=%s", job.pk, os.getpid())
            os.kill(os.getpid(), signal.SIGKILL)
