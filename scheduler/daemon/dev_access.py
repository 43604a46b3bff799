"""How the CLI finds a development daemon: `DATA_DIR/api.json`, written by embedded mode only.

`scheduler run --embedded` (what `scripts/dev` runs) writes this file, mode 0600, once its API
listens: the API's real URL (after an automatic move off a taken 8055) and, when the daemon set
no token of its own, the throwaway admin and read tokens it made for this data dir (kept across
restarts, so an exported token and a console sign-in stay valid). The operator CLI reads it only
when neither `--url` nor `SCHEDULER_API_URL` is given, and sends its token only to that URL.
A daemon run without `--embedded` never writes it. Standard library only: the CLI imports it.
"""

from __future__ import annotations

import json
import os
import re
import secrets
from dataclasses import dataclass
from pathlib import Path

FILE_NAME = "api.json"
DATA_DIR_ENV = "SCHEDULER_DATA_DIR"
DEFAULT_DATA_DIR = ".scheduler-data"
MAX_FILE_BYTES = 16 * 1024  # the file holds a URL and two tokens; anything larger is not ours
_TOKEN = re.compile(r"[A-Za-z0-9_-]{16,128}\Z")
_URL = re.compile(r"https?://[A-Za-z0-9.:\[\]_-]{1,300}\Z")


@dataclass(frozen=True, slots=True)
class DevAccess:
    """What `api.json` says: where the embedded daemon's API listens and its dev tokens."""

    url: str | None = None
    admin_token: str | None = None
    read_token: str | None = None
    pid: int | None = None


def data_dir() -> Path:
    """The data dir the CLI looks in: `SCHEDULER_DATA_DIR`, else `.scheduler-data` here."""
    return Path(os.environ.get(DATA_DIR_ENV) or DEFAULT_DATA_DIR)


def access_file(directory: Path | None = None) -> Path:
    return (directory if directory is not None else data_dir()) / FILE_NAME


def read(path: Path) -> DevAccess | None:
    """The file's contents, or None when it is absent, too large or not what this module
    writes (a field that fails its pattern is dropped, never sent anywhere)."""
    try:
        with open(path, "rb") as handle:
            raw = handle.read(MAX_FILE_BYTES + 1)
    except OSError:
        return None
    if len(raw) > MAX_FILE_BYTES:
        return None
    try:
        doc = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(doc, dict):
        return None
    pid = doc.get("pid")
    return DevAccess(
        url=_valid(doc.get("url"), _URL),
        admin_token=_valid(doc.get("admin_token"), _TOKEN),
        read_token=_valid(doc.get("read_token"), _TOKEN),
        pid=pid if isinstance(pid, int) and not isinstance(pid, bool) and pid > 0 else None,
    )


def _valid(value: object, pattern: re.Pattern[str]) -> str | None:
    return value if isinstance(value, str) and pattern.match(value) else None


def new_token(kind: str) -> str:
    """A throwaway token, `dev-<kind>-` and 32 random URL-safe characters."""
    return f"dev-{kind}-{secrets.token_urlsafe(24)}"


def write(path: Path, access: DevAccess) -> None:
    """Replace the file atomically; created 0600 (it holds an admin token), never readable by
    others even for a moment."""
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {k: v for k, v in _fields(access).items() if v is not None}
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)  # an umask cannot widen it, a leftover tmp file is narrowed
        os.write(fd, (json.dumps(doc, indent=2) + "\n").encode())
    finally:
        os.close(fd)
    os.replace(tmp, path)


def _fields(access: DevAccess) -> dict[str, object]:
    return {
        "url": access.url,
        "admin_token": access.admin_token,
        "read_token": access.read_token,
        "pid": access.pid,
    }


def pid_running(pid: int) -> bool:
    """Whether a process with this id exists (signal 0: nothing is sent)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, owned by another user
        return True
    return True
