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


def line_chart(
    rows: Sequence[dict],
    lines: Sequence[tuple[str, str, str]],
    *,
    title: str,
    unit: str = "",
) -> SafeString:
    """``rows`` oldest first, each with ``minute`` (epoch s) and the ``lines`` keys.

    ``lines`` are (key, label, colour). Missing values (None) break the line.
    """
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    values = [row[key] for row in rows for key, _, _ in lines if row.get(key) is not None]
    top = _nice_max(max(values, default=0))
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
    for frac in (0, 0.5, 1):
        gy = y(top * frac)
        parts.append(
            f'<line x1="{LEFT}" x2="{LEFT + plot_w}" y1="{gy:.1f}" y2="{gy:.1f}" stroke="#e5e5e5"/>'
            f'<text x="{LEFT - 4}" y="{gy + 4:.1f}" text-anchor="end" font-size="10"'
            f' fill="#666">{_label(top * frac)}{escape(unit)}</text>'
        )
    if rows:
        last = len(rows) - 1
        for i in (0, len(rows) // 2, last):
            stamp = datetime.fromtimestamp(rows[i]["minute"], tz=UTC).strftime("%H:%M")
            anchor = "end" if i == last and last else "middle"
            parts.append(
                f'<text x="{x(i):.1f}" y="{TOP + plot_h + 14}" text-anchor="{anchor}"'
                f' font-size="10" fill="#666">{stamp}</text>'
            )
    for li, (key, label, colour) in enumerate(lines):
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
        for seg in segments:
            if len(seg) == 1:
                cx, cy = seg[0].split(",")
                parts.append(f'<circle cx="{cx}" cy="{cy}" r="2" fill="{colour}"/>')
            else:
                parts.append(
                    f'<polyline fill="none" stroke="{colour}" stroke-width="1.5"'
                    f' points="{" ".join(seg)}"/>'
                )
        lx = LEFT + li * 110
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
    ("dropped", "dropped", "#8e24aa"),
)
COUNTED = tuple(name for name, *_ in COUNT_LINES)
LATENESS_LINES = (
    ("lateness_p50_ms", "p50", "#1565c0"),
    ("lateness_p99_ms", "p99", "#c62828"),
)
