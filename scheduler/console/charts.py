"""Small bar charts as inline SVG, built on the server: no script, no CDN, no chart library.

The page's Content-Security-Policy forbids inline styles, so a chart carries only geometry
and class names (`console.css` colours them) and one `<title>` per bar for its tooltip. Every
text is escaped here; the result is marked safe for the templates.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from markupsafe import Markup, escape

WIDTH = 240  # the viewBox; CSS stretches the chart to its box
HEIGHT = 48
GAP = 0.2  # share of a bar's slot left empty
FLOOR = 1.0  # a bar with a value above zero is at least this high, so it shows


@dataclass(frozen=True, slots=True)
class Bar:
    """One bar: its value (None: no data), its tooltip, and whether it is abnormal."""

    value: float | None
    label: str
    abnormal: bool = False


def bars(points: Sequence[Bar], name: str, top: float | None = None) -> Markup:
    """A bar chart of `points`, left to right, scaled to `top` (default: the largest value).

    `name` is its accessible name (`role="img"`); a bar without data is drawn as a faint full
    slot, an abnormal one with the class `abnormal`."""
    values = [p.value for p in points if p.value is not None]
    scale = top if top else max(values, default=0.0)
    slot = WIDTH / max(len(points), 1)
    parts = [
        f'<svg class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" preserveAspectRatio="none" '
        f'role="img" aria-label="{escape(name)}" xmlns="http://www.w3.org/2000/svg">'
        f"<title>{escape(name)}</title>"
    ]
    for i, point in enumerate(points):
        parts.append(_bar(point, i * slot, slot, scale))
    parts.append("</svg>")
    return Markup("".join(parts))


def _bar(point: Bar, x: float, slot: float, scale: float) -> str:
    width = slot * (1 - GAP)
    if point.value is None:
        kind, height = "none", float(HEIGHT)
    else:
        kind = "abnormal" if point.abnormal else "bar"
        height = 0.0 if scale <= 0 else min(point.value / scale, 1.0) * HEIGHT
        if point.value > 0:
            height = max(height, FLOOR)
    y = HEIGHT - height
    return (
        f'<rect class="{kind}" x="{x:.2f}" y="{y:.2f}" width="{width:.2f}" '
        f'height="{height:.2f}"><title>{escape(point.label)}</title></rect>'
    )
