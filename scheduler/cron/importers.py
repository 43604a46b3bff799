"""`scheduler schedules import`'s pure half: which reader a source needs, and reading it.

The readers are `import_crontab` (crontab files), `import_cronjob` (Kubernetes CronJob
manifests) and `import_celery` (Celery beat configs, read with `ast`); `imported` turns what
they read into `scheduled_jobs` YAML. docs/migrating.md says what maps and what does not.
"""

from __future__ import annotations

from pathlib import PurePath

from scheduler.cron.import_celery import parse_celery
from scheduler.cron.import_cronjob import parse_cronjobs
from scheduler.cron.import_crontab import parse_crontab
from scheduler.cron.imported import MAX_INPUT_CHARS, Parsed, UnreadableInput

KINDS = ("crontab", "cronjob", "celery")
SYSTEM_CRONTABS = ("/etc/crontab", "/etc/cron.d/")


def detect_kind(path: str, text: str) -> str:
    """The reader for a source: by its name (`.yaml`/`.yml`: cronjob, `.py`: celery), else by
    its text (`kind: CronJob`, a beat schedule), else crontab."""
    suffix = PurePath(path).suffix.lower()
    if suffix in (".yaml", ".yml"):
        return "cronjob"
    if suffix == ".py":
        return "celery"
    if "kind: CronJob" in text:
        return "cronjob"
    if "beat_schedule" in text or "CELERYBEAT_SCHEDULE" in text:
        return "celery"
    return "crontab"


def is_system_crontab(path: str) -> bool:
    """True for /etc/crontab and the files of /etc/cron.d, which have a user column."""
    return path == SYSTEM_CRONTABS[0] or path.startswith(SYSTEM_CRONTABS[1])


def read_source(text: str, kind: str, source: str, system: bool = False) -> Parsed:
    """The entries of one source; UnreadableInput when it cannot be read at all."""
    if len(text) > MAX_INPUT_CHARS:
        raise UnreadableInput(f"{source}: {len(text)} characters; at most {MAX_INPUT_CHARS}")
    if kind == "crontab":
        return parse_crontab(text, source, system=system)
    if kind == "cronjob":
        return parse_cronjobs(text, source)
    if kind == "celery":
        return parse_celery(text, source)
    raise ValueError(f"unknown kind {kind!r} (known: {', '.join(KINDS)})")
