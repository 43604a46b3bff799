"""The report's HTML pieces: numbers and tables, values escaped."""

from __future__ import annotations

from html import escape
from typing import Any


def num(value: Any) -> str:
    """A table cell's value: a dash for None, thousands separated, one decimal for floats."""
    if value is None:
        return "<span class='muted'>-</span>"
    if isinstance(value, float):
        return f"{value:,.1f}"
    if isinstance(value, int):
        return f"{value:,}"
    return escape(str(value))


def table(headers: list[str], rows: list[list[Any]], breach: list[bool] | None = None) -> str:
    """A table that scrolls sideways in its own box; the first column left-aligned, the rows
    whose `breach` is true marked."""
    head = "".join(
        f"<th class='l'>{escape(h)}</th>" if i == 0 else f"<th>{escape(h)}</th>"
        for i, h in enumerate(headers)
    )
    body = []
    for index, row in enumerate(rows):
        cls = " class='breach'" if breach and breach[index] else ""
        cells = "".join(
            f"<td class='l'>{escape(str(v))}</td>" if i == 0 else f"<td>{num(v)}</td>"
            for i, v in enumerate(row)
        )
        body.append(f"<tr{cls}>{cells}</tr>")
    return f"<div class='scroll'><table><tr>{head}</tr>{''.join(body)}</table></div>"
