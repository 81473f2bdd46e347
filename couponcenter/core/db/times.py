"""Times through raw SQL, as the ORM would pass and read them.

SQLite stores naive UTC text and compares it as text, and returns text from raw queries; the
ORM hides both, a raw ``cursor.execute`` does not.
"""

from __future__ import annotations

from datetime import UTC, datetime

from django.db import connection


def db_time(value: datetime):
    """A time as a raw SQL parameter (the ORM's form for this database)."""
    return connection.ops.adapt_datetimefield_value(value)


def aware_time(value) -> datetime:
    """A time read by raw SQL, as an aware ``datetime``."""
    if isinstance(value, str):  # SQLite returns text from raw SQL
        value = datetime.fromisoformat(value)
    return value if value.tzinfo else value.replace(tzinfo=UTC)
