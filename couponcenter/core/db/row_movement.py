"""Statements on a table partitioned by a column they change (a status), where an UPDATE moves
the row to another partition.

Within one table, a READ COMMITTED statement that meets a row a concurrent transaction changed
waits for it and then checks the row's new version against its WHERE. When the concurrent change
moved the row to another partition, PostgreSQL cannot follow it and raises
``serialization_failure`` ("tuple to be locked/updated was already moved to another partition due
to concurrent update") instead. Run again, the statement reads the row where it is now, with its
new values: the outcome the same statement has on a plain table. ``retry_if_moved`` does that,
in a savepoint, so the caller's transaction goes on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

from django.db import OperationalError, connection, transaction

logger = logging.getLogger(__name__)
T = TypeVar("T")

SERIALIZATION_FAILURE = "40001"
# Each run after the first sees a newer committed state; a row moved again in between is rare.
ATTEMPTS = 5


def moved_by_concurrent_update(error: BaseException) -> bool:
    cause = error.__cause__
    return getattr(
        cause, "pgcode", None
    ) == SERIALIZATION_FAILURE and "moved to another partition" in str(cause)


def retry_if_moved(work: Callable[[], T], *, attempts: int = ATTEMPTS) -> T:
    """``work()`` (one statement, or a few that may be run again together) in a savepoint, run
    again when it met a row a concurrent transaction moved to another partition."""
    if connection.vendor != "postgresql":
        return work()
    for attempt in range(1, attempts + 1):
        try:
            with transaction.atomic():
                return work()
        except OperationalError as error:
            if attempt == attempts or not moved_by_concurrent_update(error):
                raise
            logger.info("a row moved to another partition meanwhile: run again (%d)", attempt)
    raise AssertionError("unreachable")
