"""A cron expression in plain words ("Every 5 minutes, on Monday through Friday").

The time of day, the day of the month and the month are worded by `cron-descriptor` (MIT, the
Python port of the cron-expression-descriptor family), fed the expression as our own parser
(`scheduler.cron.expression`) reads it. The days are then combined by our rule, not the library's:

- Day-of-month and day-of-week combine with OR unless either field starts with `*` (Debian
  cron, cronsim). cron-descriptor says "or" only for some spellings (`1 * 1` gets it,
  `1,15 * 1-5` does not) and says "or" for `*/2 * 1`, which is AND for us; so the day phrase
  is built here from the two parsed fields.
- Day-of-week is worded from the parsed set, where 7 is Sunday and `1/2` is Monday, Wednesday
  and Friday (the library says "Sunday through Sunday" for `0-7` and "every 2 days of the week"
  for `1/2`).

An expression our parser refuses has no words (`None`), and so has any the library fails on:
the page then shows the expression alone, never a guess.
"""

from __future__ import annotations

from functools import lru_cache

from cron_descriptor import ExpressionDescriptor, Options

from scheduler.cron.expression import MACROS, CronExpr, CronSyntaxError

__all__ = ["describe"]

DAY_NAMES = ("Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday")
WEEK = (1, 2, 3, 4, 5, 6, 0)  # Monday first, so `5-7` reads "Friday through Sunday"
ALL_DAYS = tuple(range(1, 32))
ALL_WEEKDAYS = tuple(range(7))
MAX_TEXT = 200  # longer text is no cron expression a YAML file passed


def _options() -> Options:
    options = Options()
    options.use_24hour_time_format = True
    options.verbose = False
    options.locale_code = "en_US"
    return options


@lru_cache(maxsize=1024)
def describe(text: str) -> str | None:
    """The expression in words, or None when it cannot be worded safely."""
    if len(text) > MAX_TEXT:
        return None
    try:
        expr = CronExpr.parse(text)
    except CronSyntaxError:
        return None
    fields = MACROS.get(expr.text.lower(), expr.text).split()
    if len(fields) == 5:
        fields.insert(0, "0")
    try:
        return _words(expr, fields)
    except Exception:  # the library's own error types vary by version: no words, the cron shows
        return None


def _words(expr: CronExpr, fields: list[str]) -> str:
    second, minute, hour, dom, month, _ = fields
    library = ExpressionDescriptor(f"{second} {minute} {hour} {dom} {month} *", _options())
    time = library.get_time_of_day_description()
    days = _days(expr, library.get_day_of_month_description())
    text = f"{time}{days}{library.get_month_description()}"
    text = str(library.transform_verbosity(text, use_verbose_format=False))  # no ", every hour"
    return text[:1].upper() + text[1:]


def _days(expr: CronExpr, dom_words: str) -> str:
    """The day phrase (`, on day 1 of the month, or on Monday`) under our OR/AND rule."""
    any_dom = expr.days == ALL_DAYS
    any_dow = expr.weekdays == ALL_WEEKDAYS
    weekdays = f"on {weekday_names(expr.weekdays)}"
    if expr.day_or:
        if any_dom or any_dow:  # one of the two matches every day
            return ""
        return f"{dom_words}, or {weekdays}"
    if any_dow:
        return "" if any_dom else dom_words
    if any_dom:
        return f", {weekdays}"
    return f"{dom_words}, if that day is a {weekday_names(expr.weekdays, joiner='or')}"


def weekday_names(days: tuple[int, ...], joiner: str = "and") -> str:
    """`Monday through Friday`, `Monday, Wednesday and Friday` (runs of 3+ become ranges)."""
    chosen = [d for d in WEEK if d in days]
    runs: list[list[int]] = []
    for day in chosen:
        if runs and WEEK.index(day) == WEEK.index(runs[-1][-1]) + 1:
            runs[-1].append(day)
        else:
            runs.append([day])
    parts: list[str] = []
    for run in runs:
        if len(run) >= 3:
            parts.append(f"{DAY_NAMES[run[0]]} through {DAY_NAMES[run[-1]]}")
        else:
            parts.extend(DAY_NAMES[d] for d in run)
    if len(parts) == 1:
        return parts[0]
    return ", ".join(parts[:-1]) + f" {joiner} {parts[-1]}"
