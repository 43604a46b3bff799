"""Console sign-in: which token a browser signed in with, kept in a signed cookie.

The cookie carries `{kind, issued, csrf}` (never the token), signed with HMAC-SHA256 under a key
derived from both configured tokens:

- nobody forges one without a token, and the read token's holder cannot make an admin session
  (the key covers the admin token too);
- changing either token ends every session at once (the key changes); so does
  `SCHEDULER_UI_SESSION_TTL` after sign-in;
- nothing is kept on the server: every instance, leader or standby, accepts the same cookie.

`csrf` is the session's form token: every form that changes something carries it and the
console compares it before acting. Flash messages (what an action did) ride in a second signed
cookie that is read once.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import secrets
from dataclasses import dataclass
from typing import Any

from scheduler.settings import Settings

SESSION_COOKIE = "mqs_session"
FLASH_COOKIE = "mqs_flash"
_LABEL = b"mq-scheduler console session v1"
MAX_FLASH = 700


@dataclass(frozen=True, slots=True)
class Session:
    kind: str  # "admin" or "read"
    issued: int  # Unix seconds
    csrf: str


@dataclass(frozen=True, slots=True)
class Flash:
    kind: str  # "ok" or "error"
    message: str


class Signer:
    """Signs and checks cookie values under the key of the configured tokens."""

    def __init__(self, settings: Settings) -> None:
        tokens = [
            t.get_secret_value() if t is not None else None
            for t in (settings.admin_token, settings.read_token)
        ]
        material = json.dumps(tokens).encode()
        self._key = hmac.new(_LABEL, material, hashlib.sha256).digest()
        self._ttl = int(settings.ui_session_ttl.total_seconds())

    def _mac(self, purpose: str, body: str) -> str:
        digest = hmac.new(self._key, f"{purpose}:{body}".encode(), hashlib.sha256).digest()
        return _b64(digest)

    def sign(self, purpose: str, doc: dict[str, Any]) -> str:
        body = _b64(json.dumps(doc, separators=(",", ":")).encode())
        return f"{body}.{self._mac(purpose, body)}"

    def unsign(self, purpose: str, value: str | None) -> dict[str, Any] | None:
        """The signed document, or None for a value this key did not sign for `purpose`."""
        if not value or value.count(".") != 1:
            return None
        body, mac = value.split(".")
        if not hmac.compare_digest(mac, self._mac(purpose, body)):
            return None
        try:
            doc = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
        except (ValueError, binascii.Error):
            return None
        return doc if isinstance(doc, dict) else None

    # -- sessions --------------------------------------------------------------------------------
    def new_session(self, kind: str, now: float) -> tuple[Session, str]:
        session = Session(kind, int(now), secrets.token_urlsafe(24))
        doc = {"k": session.kind, "t": session.issued, "c": session.csrf}
        return session, self.sign("session", doc)

    def session(self, value: str | None, now: float) -> Session | None:
        """The session a cookie holds, or None: unsigned, altered, expired or ill-formed."""
        doc = self.unsign("session", value)
        if doc is None:
            return None
        kind, issued, csrf = doc.get("k"), doc.get("t"), doc.get("c")
        if (
            kind not in ("admin", "read")
            or not isinstance(issued, int)
            or not isinstance(csrf, str)
        ):
            return None
        if not 0 <= now - issued < self._ttl:
            return None
        return Session(kind, issued, csrf)

    # -- flash messages --------------------------------------------------------------------------
    def flash(self, kind: str, message: str) -> str:
        return self.sign("flash", {"k": kind, "m": message[:MAX_FLASH]})

    def read_flash(self, value: str | None) -> Flash | None:
        doc = self.unsign("flash", value)
        if doc is None or doc.get("k") not in ("ok", "error"):
            return None
        return Flash(str(doc["k"]), str(doc.get("m", "")))


def same_token(given: str, expected: str) -> bool:
    return hmac.compare_digest(given.encode(), expected.encode())


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")
