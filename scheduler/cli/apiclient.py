"""The operator CLI's side of the management API: requests, error messages, tables.

Where the API is: `--url`, else `SCHEDULER_API_URL`, else the URL a development daemon
(`scheduler run --embedded`, `scripts/dev`) wrote in `.scheduler-data/api.json` (or under
`SCHEDULER_DATA_DIR`), else http://127.0.0.1:8055. The token: `--token`, else
`SCHEDULER_ADMIN_TOKEN`, else `SCHEDULER_READ_TOKEN`, else that file's dev token, sent only to
the URL written beside it (however the URL was given).

Exit codes a script can branch on: 0 done, 1 refused or not found (401, 403, 404, 409), 2 usage
or invalid input (argparse, 400, 422), 3 no answer from mq-scheduler's API (connection refused,
another program answering, 5xx).
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

from scheduler.cli.render import text
from scheduler.daemon import dev_access

URL_ENV = "SCHEDULER_API_URL"
ADMIN_ENV, READ_ENV = "SCHEDULER_ADMIN_TOKEN", "SCHEDULER_READ_TOKEN"
DEFAULT_URL = "http://127.0.0.1:8055"
OK, REFUSED, USAGE, UNAVAILABLE = 0, 1, 2, 3
CLOSED_STDOUT = 141  # 128 + SIGPIPE: what a shell reports for a tool that SIGPIPE stopped
PROBLEM_TYPE = "application/problem+json"  # every error the API answers has this type


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
    url_from: str = "--url"  # where the URL came from, for the messages
    token_from: str | None = None  # where the token came from (None: no token)

    @classmethod
    def from_args(cls, url: str | None, token: str | None, timeout: float) -> ApiClient:
        """The client the command line and the environment describe (module docstring)."""
        base, url_from, local = _url(url)
        if not base.startswith(("http://", "https://")):
            raise ApiFailure(USAGE, f"{url_from}: {base!r} must start with http(s)://")
        chosen, token_from = _token(token, base, local)
        return cls(base, chosen, timeout, url_from, token_from)

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
                raw = resp.read()
                kind = resp.headers.get_content_type()
        except urllib.error.HTTPError as err:
            raise self._failure(err, method) from None
        except (urllib.error.URLError, OSError) as err:
            raise ApiFailure(UNAVAILABLE, self._unreachable(getattr(err, "reason", err))) from None
        try:
            return json.loads(raw or b"null")
        except ValueError:
            raise ApiFailure(UNAVAILABLE, self._foreign(resp.status, kind)) from None

    def _unreachable(self, reason: object) -> str:
        where = f"cannot reach {self.url} ({reason}, URL from {self.url_from})"
        local = dev_access.access_file()
        if self.url_from == str(local):
            gone = _stale_pid(local)
            if gone is not None:
                return (
                    f"{where}: the daemon that wrote it (pid {gone}) has stopped; start it "
                    "again (scripts/dev)"
                )
        return (
            f"{where}: is the daemon running? Set {URL_ENV} or --url to its management API "
            "(the `API` line of its start banner)"
        )

    def _foreign(self, status: int, kind: str) -> str:
        return (
            f"{self.url} answered HTTP {status} ({kind or 'no content type'}), which is not "
            f"mq-scheduler's management API (URL from {self.url_from}): another program "
            f"listens there. Set {URL_ENV} or --url to the `API` line of the daemon's banner"
        )

    def _failure(self, err: urllib.error.HTTPError, method: str) -> ApiFailure:
        if err.headers.get_content_type() != PROBLEM_TYPE:
            return ApiFailure(UNAVAILABLE, self._foreign(err.code, err.headers.get_content_type()))
        return _failure(err, method, self.token_from)


def _url(given: str | None) -> tuple[str, str, dev_access.DevAccess | None]:
    """(URL, where it came from, the dev daemon's file: its token may go to its own URL)."""
    path = dev_access.access_file()
    local = dev_access.read(path)
    if given:
        return given.rstrip("/"), "--url", local
    if os.environ.get(URL_ENV):
        return os.environ[URL_ENV].rstrip("/"), URL_ENV, local
    if local is not None and local.url is not None:
        return local.url.rstrip("/"), str(path), local
    return DEFAULT_URL, f"the default (no {URL_ENV}, no {path})", None


def _token(
    given: str | None, base: str, local: dev_access.DevAccess | None
) -> tuple[str | None, str | None]:
    """(token, where it came from); a dev file's token goes only to the URL it came with."""
    if given:
        return given, "--token"
    for name in (ADMIN_ENV, READ_ENV):
        if os.environ.get(name):
            return os.environ[name], name
    if local is not None and local.url is not None and local.url.rstrip("/") == base:
        chosen = local.admin_token or local.read_token
        if chosen:
            return chosen, str(dev_access.access_file())
    return None, None


def _stale_pid(path: Any) -> int | None:
    """The pid in the dev daemon's file when that process no longer runs, else None."""
    local = dev_access.read(path)
    if local is None or local.pid is None or dev_access.pid_running(local.pid):
        return None
    return local.pid


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _failure(err: urllib.error.HTTPError, method: str, token_from: str | None = None) -> ApiFailure:
    """The failure for an error answer; `token_from` says where the token sent came from
    (None: none was sent), for the hint on a 401 or 403."""
    try:
        body = json.loads(err.read() or b"{}")
    except ValueError:
        body = {}
    detail = body.get("detail") if isinstance(body, dict) else None
    status = err.code
    message = f"{status}: {detail or err.reason}"
    hint = _token_hint(status, body, method, token_from)
    if hint:
        message += f"; {hint}"
    if status in (400, 422):
        return ApiFailure(USAGE, message, body)
    if status >= 500:
        return ApiFailure(UNAVAILABLE, message, body)
    return ApiFailure(REFUSED, message, body)


def _token_hint(status: int, body: Any, method: str, token_from: str | None) -> str | None:
    """What to do about a 401 or 403: which variable or flag, and which token was sent."""
    code = body.get("code") if isinstance(body, dict) else None
    write = method != "GET"
    if status == 401 and token_from is None:
        wanted = ADMIN_ENV if write else f"{READ_ENV} (or {ADMIN_ENV})"
        return f"set {wanted} or pass --token"
    if status == 401:
        wanted = ADMIN_ENV if write else f"{READ_ENV} or {ADMIN_ENV}"
        return (
            f"the token from {token_from} is not one of this daemon's: "
            f"set {wanted} or pass --token with the daemon's token"
        )
    if status == 403 and code == "forbidden":
        return (
            f"the token from {token_from} is the read token: set {ADMIN_ENV} "
            "or pass --token with the admin token"
        )
    return None


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
