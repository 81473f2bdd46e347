"""Server-rendered inline SVG line charts for the console: no JavaScript, nothing fetched.

Presentation only: the numbers come from ``couponcenter.ops.overview``.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

WIDTH, HEIGHT = 560, 170
LEFT, RIGHT, TOP, BOTTOM = 52, 10, 12, 36
LEGEND_STEP = 95  # px between legend entries: five fit in the width


def _nice_max(value: float) -> float:
    if value <= 0:
        return 1
    magnitude = 10 ** (len(str(int(value))) - 1)
    for step in (1, 2, 2.5, 5, 10):
        if value <= step * magnitude:
            return step * magnitude
    return 10 * magnitude


def _label(value: float) -> str:
    if value >= 1_000_000:
        return f"{value / 1_000_000:g}M"
    if value >= 1000:
        return f"{value / 1000:g}k"
    return f"{value:g}"


# A duration axis's unit: the first whose upper limit (ms) is above the value.
_DURATION_UNITS = (
    (1000, 1, "ms"),
    (120_000, 1000, "s"),
    (7_200_000, 60_000, "min"),
    (float("inf"), 3_600_000, "h"),
)


def _duration_unit(ms: float) -> tuple[int, str]:
    return next((size, name) for limit, size, name in _DURATION_UNITS if ms < limit)


def duration_label(ms: float, unit_of: float | None = None) -> str:
    """An axis label for a duration in ms, in the unit that reads best for ``unit_of`` (the axis
    top; the value itself by default): "0", "250 ms", "1.5 s", "90 s", "2 min", "1.5 h"."""
    if ms <= 0:
        return "0"
    size, name = _duration_unit(ms if unit_of is None else unit_of)
    return f"{ms / size:.3g} {name}"


def _nice_duration_max(ms: float) -> float:
    """A round top for a duration axis, round in the unit its labels use."""
    if ms <= 0:
        return 1
    size, _ = _duration_unit(ms)
    return _nice_max(ms / size) * size


DASH = 6  # px of each flat line's turn along the axis


def _line(rows, key: str, colour: str, x, y, *, under: bool, turn=None) -> list[str]:
    """One line's SVG: a polyline per run of values (None breaks it), a dot for a lone value.
    ``turn`` (i, n): the i-th of n lines drawn over one another, dashed so that each shows."""
    segments, current = [], []
    for i, row in enumerate(rows):
        value = row.get(key)
        if value is None:
            if current:
                segments.append(current)
            current = []
            continue
        current.append(f"{x(i):.1f},{y(value):.1f}")
    if current:
        segments.append(current)
    width, opacity = ("5", "0.45") if under else ("1.5", "1")
    out = []
    for seg in segments:
        if len(seg) == 1:
            cx, cy = seg[0].split(",")
            radius = 3.5 if under else 2
            out.append(
                f'<circle cx="{cx}" cy="{cy}" r="{radius}" fill="{colour}"'
                f' fill-opacity="{opacity}" data-line="{escape(key)}"/>'
            )
        else:
            dash = (
                f' stroke-dasharray="{DASH} {DASH * (turn[1] - 1)}"'
                f' stroke-dashoffset="{-DASH * turn[0]}"'
                if turn
                else ""
            )
            out.append(
                f'<polyline fill="none" stroke="{colour}" stroke-width="{width}"'
                f' stroke-opacity="{opacity}" stroke-linejoin="round"{dash}'
                f' data-line="{escape(key)}" points="{" ".join(seg)}"/>'
            )
    return out


def line_chart(
    rows: Sequence[dict],
    lines: Sequence[tuple[str, str, str]],
    *,
    title: str,
    unit: str = "",
    durations: bool = False,
    stamp_format: str = "%H:%M",
    under_first: bool = False,
) -> SafeString:
    """``rows`` oldest first, each with ``minute`` (epoch s) and the ``lines`` keys.

    ``lines`` are (key, label, colour). Missing values (None) break the line. ``durations``: the
    values are ms, labelled in ms, s, min or h. ``under_first``: the first line is drawn wide and
    pale beneath the others, so a line that runs on top of it (delivered on dispatched) leaves
    it visible. A line at zero throughout is drawn before the rest, so it hides none of them.
    """
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    values = [row[key] for row in rows for key, _, _ in lines if row.get(key) is not None]
    peak = max(values, default=0)
    top = _nice_duration_max(peak) if durations else _nice_max(peak)
    n = max(len(rows) - 1, 1)

    def x(i: int) -> float:
        return LEFT + plot_w * i / n

    def y(v: float) -> float:
        return TOP + plot_h * (1 - v / top)

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="cc-chart" viewBox="0 0 {WIDTH} {HEIGHT}"'
        f' width="{WIDTH}" height="{HEIGHT}" role="img" aria-label="{escape(title)}">',
        f"<title>{escape(title)}</title>",
        f'<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" fill="#fafafa"'
        ' stroke="#ddd"/>',
    ]

    def axis_label(value: float) -> str:
        return duration_label(value, top) if durations else f"{_label(value)}{unit}"

    for frac in (0, 0.5, 1):
        gy = y(top * frac)
        parts.append(
            f'<line x1="{LEFT}" x2="{LEFT + plot_w}" y1="{gy:.1f}" y2="{gy:.1f}" stroke="#e5e5e5"/>'
            f'<text x="{LEFT - 4}" y="{gy + 4:.1f}" text-anchor="end" font-size="10"'
            f' fill="#666" class="cc-axis">{escape(axis_label(top * frac))}</text>'
        )
    if rows:
        last = len(rows) - 1
        for i in (0, len(rows) // 2, last):
            stamp = datetime.fromtimestamp(rows[i]["minute"], tz=UTC).strftime(stamp_format)
            anchor = "end" if i == last and last else "middle"
            parts.append(
                f'<text x="{x(i):.1f}" y="{TOP + plot_h + 14}" text-anchor="{anchor}"'
                f' font-size="10" fill="#666">{stamp}</text>'
            )
    # A line that stays at zero is drawn first, beneath the others: drawn last (dropped, most
    # of the time) it would hide every line that is zero too at those minutes.
    # Lines at zero together are dashed in turn, so each shows its colour along the axis.
    flat = [key for key, _, _ in lines if not any(row.get(key) for row in rows)]
    order = sorted(range(len(lines)), key=lambda li: lines[li][0] not in flat)
    for li in order:
        key, _, colour = lines[li]
        under = under_first and li == 0 and len(lines) > 1 and key not in flat
        turn = (flat.index(key), len(flat)) if key in flat and len(flat) > 1 else None
        parts.extend(_line(rows, key, colour, x, y, under=under, turn=turn))
    for li, (key, label, colour) in enumerate(lines):
        lx = LEFT + li * LEGEND_STEP
        parts.append(
            f'<rect x="{lx}" y="{HEIGHT - 14}" width="10" height="10" fill="{colour}"/>'
            f'<text x="{lx + 14}" y="{HEIGHT - 5}" font-size="11" fill="#333"'
            f' class="cc-legend" data-key="{escape(key)}">{escape(label)}</text>'
        )
    parts.append("</svg>")
    return mark_safe("".join(parts))  # noqa: S308 - every interpolated text is escaped above


COUNT_LINES = (
    ("dispatched", "dispatched", "#417690"),
    ("delivered", "delivered", "#2e7d32"),
    ("failed", "failed", "#ef6c00"),
    ("dead", "dead", "#c62828"),
    ("dropped", "dropped", "#8e24aa"),
)
BACKLOG_LINES = (
    ("backlog", "scheduled", "#417690"),
    ("overdue", "overdue", "#c62828"),
)
COUNTED = tuple(name for name, *_ in COUNT_LINES)
LATENESS_LINES = (
    ("lateness_p50_ms", "p50", "#1565c0"),
    ("lateness_p99_ms", "p99", "#c62828"),
)
