"""The operator CLI's side of the management API: requests, error messages, tables.

Exit codes a script can branch on: 0 done, 1 refused or not found (401, 403, 404, 409), 2 usage
or invalid input (argparse, 400, 422), 3 the daemon is unreachable or failing (connection
refused, 5xx).
"""

from __future__ import annotations

import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from scheduler.commands.render import text

URL_ENV = "SCHEDULER_API_URL"
DEFAULT_URL = "http://127.0.0.1:8055"
OK, REFUSED, USAGE, UNAVAILABLE = 0, 1, 2, 3
CLOSED_STDOUT = 141  # 128 + SIGPIPE: what a shell reports for a tool that SIGPIPE stopped


class ApiFailure(Exception):
    """A call that did not succeed, with the exit code and the line to print."""

    def __init__(self, exit_code: int, message: str, body: Any = None) -> None:
        super().__init__(message)
        self.exit_code = exit_code
        self.body = body


@dataclass(frozen=True)
class ApiClient:
    url: str
    token: str | None
    timeout: float = 10.0

    @classmethod
    def from_args(cls, url: str | None, token: str | None, timeout: float) -> ApiClient:
        base = (url or os.environ.get(URL_ENV) or DEFAULT_URL).rstrip("/")
        if not base.startswith(("http://", "https://")):
            raise ApiFailure(USAGE, f"--url / {URL_ENV}: {base!r} must start with http(s)://")
        chosen = (
            token
            or os.environ.get("SCHEDULER_ADMIN_TOKEN")
            or os.environ.get("SCHEDULER_READ_TOKEN")
        )
        return cls(base, chosen or None, timeout)

    def call(
        self,
        method: str,
        path: str,
        query: dict[str, Any] | None = None,
        body: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> Any:
        """The decoded JSON answer of a 2xx, else ApiFailure with a message saying what to do.
        `headers` are sent as well (an Idempotency-Key)."""
        params = {k: _text(v) for k, v in (query or {}).items() if v is not None}
        url = self.url + path + ("?" + urllib.parse.urlencode(params) if params else "")
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Accept": "application/json", **(headers or {})}
        if data is not None:
            headers["Content-Type"] = "application/json"
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        req = urllib.request.Request(url, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                return json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as err:
            raise _failure(err, method) from None
        except (urllib.error.URLError, OSError) as err:
            reason = getattr(err, "reason", err)
            raise ApiFailure(
                UNAVAILABLE,
                f"cannot reach {self.url} ({reason}): is the daemon running? "
                f"Set {URL_ENV} or --url to its management API",
            ) from None


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _failure(err: urllib.error.HTTPError, method: str) -> ApiFailure:
    try:
        body = json.loads(err.read() or b"{}")
    except ValueError:
        body = {}
    detail = body.get("detail") if isinstance(body, dict) else None
    status = err.code
    message = f"{status}: {detail or err.reason}"
    if status == 401:
        wanted = "SCHEDULER_ADMIN_TOKEN" if method != "GET" else "SCHEDULER_READ_TOKEN"
        message += f" (set {wanted} or pass --token)"
    if status in (400, 422):
        return ApiFailure(USAGE, message, body)
    if status >= 500:
        return ApiFailure(UNAVAILABLE, message, body)
    return ApiFailure(REFUSED, message, body)


def table(rows: Sequence[Sequence[Any]], header: Sequence[str]) -> str:
    """A plain table: None prints as '-', booleans yes/no, floats with one decimal; columns of
    numbers are right-aligned, the others left-aligned; control characters are escaped."""
    cells = [[text(v) for v in row] for row in rows]
    widths = [len(h) for h in header]
    for row in cells:
        widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]
    numeric = [_numeric([row[i] for row in rows]) for i in range(len(header))]
    lines = [_line(header, widths, numeric)]
    lines += [_line(row, widths, numeric) for row in cells]
    return "\n".join(lines)


def _numeric(column: Sequence[Any]) -> bool:
    values = [v for v in column if v is not None]
    return bool(values) and all(
        isinstance(v, int | float) and not isinstance(v, bool) for v in values
    )


def _line(cells: Sequence[str], widths: Sequence[int], right: Sequence[bool]) -> str:
    padded = (c.rjust(w) if r else c.ljust(w) for c, w, r in zip(cells, widths, right, strict=True))
    return "  ".join(padded).rstrip()


def emit(doc: Any, as_json: bool, text: str) -> None:
    """Print the answer (its JSON with --json) and flush, so a closed stdout is found here."""
    print(json.dumps(doc, indent=2, sort_keys=True) if as_json else text, flush=True)


def fail(exc: ApiFailure, as_json: bool) -> int:
    if as_json and exc.body is not None:
        print(json.dumps(exc.body, indent=2, sort_keys=True), flush=True)
    print(f"scheduler: {exc}", file=sys.stderr)
    return exc.exit_code


def stdout_closed() -> int:
    """The reader of stdout went away (`scheduler dlq list | head`): stop quietly, as a tool
    killed by SIGPIPE does. stdout is pointed at /dev/null so the interpreter's last flush
    finds nowhere to fail (the recipe of the Python docs' note on SIGPIPE)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # no file descriptor (stdout replaced by a test): nothing to do
        pass
    return CLOSED_STDOUT
