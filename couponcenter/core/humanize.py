"""Durations and moments as people read them: "850 ms", "3 min 4 s", "2026-11-24 09:34:44 UTC (12 s
ago)". Used by the console's template filters and the admin."""

from datetime import UTC, datetime

from django.utils import timezone


def ms_age(value: int | None) -> str:
    """An age in ms as "-", "850 ms", "12.5 s", "3 min 4 s" or "2 h 5 min"."""
    if not value:
        return "-"
    if value < 1000:
        return f"{value} ms"
    seconds = value / 1000
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {secs} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min"


def when(value) -> str:
    """A moment (a datetime or an ISO 8601 string) as local, readable time and how long ago:
    "2026-11-24 09:34:44 UTC (12 s ago)"; "-" for nothing."""
    if not value:
        return "-"
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value)
        except ValueError:
            return value
    if timezone.is_naive(value):
        value = timezone.make_aware(value, UTC)
    local = timezone.localtime(value)
    age_ms = (timezone.now() - value).total_seconds() * 1000
    ago = (
        "just now"
        if abs(age_ms) < 1000
        else (f"{ms_age(int(age_ms))} ago" if age_ms > 0 else f"in {ms_age(int(-age_ms))}")
    )
    return f"{local:%Y-%m-%d %H:%M:%S} {local.tzname()} ({ago})"
