"""Template filters for the console."""

from django import template

register = template.Library()


@register.filter
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
