"""Read a crontab: a user's (`crontab -l`) or the system's (`/etc/crontab`, `/etc/cron.d/*`,
with a user column after the five time fields).

Comments and blank lines are skipped; `NAME=value` lines set the environment of the entries
after them (kept in each job's `data.env`), `CRON_TZ=` (or `TZ=`) their time zone. Each entry's
command goes into `data.command`: mq-scheduler publishes a message, and the worker on the
subject runs the command. Pure.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from scheduler.cron.expression import MACROS, CronExpr, CronSyntaxError
from scheduler.cron.imported import Entry, Parsed, foreign_term

_ENV = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(.*)")
_FIELD_LIKE = re.compile(r"[0-9*?,/LW#-]+")  # a sixth token that reads as a time field
FIELD_NAMES = ("minute", "hour", "day-of-month", "month", "day-of-week")
_SHELL_STOP = {"|", "||", "&&", ";", ">", ">>", "<", "2>&1", "&"}
REBOOT = "@reboot runs once when cron starts; mq-scheduler has no such event (run it at boot)"


@dataclass(slots=True)
class _State:
    env: dict[str, str] = field(default_factory=dict)
    zone: tuple[str, str, int] | None = None  # (variable, value, line)
    mailto: bool = False


def parse_crontab(text: str, source: str, system: bool = False) -> Parsed:
    """The entries of a crontab; `system` for the form with a user column."""
    state = _State()
    entries: list[Entry] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if (env := _ENV.fullmatch(line)) is not None:
            _set(state, env.group(1), _unquote(env.group(2)), number)
            continue
        entries.append(_entry(line, number, state, system))
    has_env = any("env" in e.job.get("data", {}) for e in entries)
    with_env = " (with data.env)" if has_env else ""
    notes = [
        "mq-scheduler runs no command: it publishes to the job's subject, and a worker there "
        f"runs data.command{with_env}"
    ]
    if any(e.skipped is None and "timezone" not in e.job for e in entries):
        notes.append(
            "no CRON_TZ= line: cron reads these entries in the host's time zone; they are "
            "written in --timezone's (UTC unless given)"
        )
    if state.mailto:
        notes.append("MAILTO: cron mails a command's output; nothing here does (the worker logs)")
    return Parsed(source, tuple(entries), tuple(notes))


def _unquote(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        return value[1:-1]
    return value


def _set(state: _State, name: str, value: str, line: int) -> None:
    if name == "CRON_TZ" or (name == "TZ" and (state.zone is None or state.zone[0] == "TZ")):
        state.zone = (name, value, line) if value else None
    if name == "MAILTO":
        state.mailto = True
    elif name != "CRON_TZ":
        state.env[name] = value


def _entry(line: str, number: int, state: _State, system: bool) -> Entry:
    count = 1 if line.startswith("@") else 5
    parts = line.split(None, count)
    fields, rest = parts[:count], (parts[count] if len(parts) > count else "")
    sixth = rest.split(None, 1)[0] if rest else ""
    user = ""
    if system:
        pieces = rest.split(None, 1)
        user, rest = (pieces[0], pieces[1]) if len(pieces) == 2 else ("", "")
    command = rest.strip()
    hint = _name_hint(command) or f"crontab-line-{number}"
    if len(fields) < count or not command:
        what = "a user and a command" if system else "a command"
        return _skip(number, hint, f"expected five time fields (or a @macro), then {what}")
    problem = _foreign(fields, sixth)
    cron = "" if problem is not None else (fields[0].lower() if count == 1 else " ".join(fields))
    if problem is None:
        problem = _checked(cron)
    if problem is not None:
        return _skip(number, hint, problem)
    return _job(number, hint, cron, command, user, state)


def _skip(line: int, hint: str, reason: str) -> Entry:
    return Entry(line=line, name_hint=hint, skipped=reason)


def _foreign(fields: list[str], sixth: str) -> str | None:
    """Why the time fields are not cron that jobs here take (L, W, #, ?, a sixth field)."""
    if fields[0].lower() == "@reboot":
        return REBOOT
    if len(fields) == 1:
        return None
    for name, text in zip(FIELD_NAMES, fields, strict=True):
        if (term := foreign_term(text)) is not None:
            return f"{name} field {text!r}: {term!r} is not cron syntax that jobs here take"
    if _FIELD_LIKE.fullmatch(sixth):
        return (
            f"a sixth time field {sixth!r} (seconds or year, Quartz-style?): a crontab has "
            "five; write this job by hand"
        )
    return None


def _checked(cron: str) -> str | None:
    if cron.startswith("@") and cron not in MACROS:
        return f"unknown macro {cron!r} (known: @reboot, {', '.join(MACROS)})"
    try:
        CronExpr.parse(cron)
    except CronSyntaxError as exc:
        return str(exc)
    return None


def _job(number: int, hint: str, cron: str, command: str, user: str, state: _State) -> Entry:
    data: dict[str, object] = {"command": command}
    if user:
        data["user"] = user
    if state.env:
        data["env"] = dict(state.env)
    job: dict[str, object] = {"cron": cron, "data": data, "description": f"crontab line {number}"}
    notes, skipped = [], None
    if state.zone is not None:
        variable, zone, line = state.zone
        try:
            ZoneInfo(zone)
            job["timezone"] = zone
        except (ZoneInfoNotFoundError, ValueError):
            skipped = f"{variable}={zone} (line {line}): unknown time zone (use an IANA name)"
        if variable == "TZ":
            notes.append(
                f"time zone from TZ= (line {line}): cronie reads schedules in CRON_TZ only, "
                "other crons in TZ; check which yours did"
            )
    if re.search(r"(?<!\\)%", command):
        notes.append(
            "the command holds an unescaped %: cron turns it into a newline and feeds the rest "
            "to stdin; data.command keeps it as written"
        )
    if CronExpr.parse(cron).day_or:
        notes.append("day-of-month and day-of-week both set: fires on either (as cron does)")
    return Entry(number, hint, job, skipped=skipped, notes=tuple(notes))


def _name_hint(command: str) -> str:
    """A name from the command's first words: `/usr/bin/php artisan schedule:run` -> php-artisan-
    schedule-run (program names only, options and redirections left out)."""
    words: list[str] = []
    for word in command.split():
        if word in _SHELL_STOP or word[0] in "<>|&;" or len(words) == 3:
            break
        if word.startswith("-") or (not words and _ENV.fullmatch(word)):
            continue
        words.append(word.rstrip("/").rsplit("/", 1)[-1])
    return "-".join(words)[:40]
