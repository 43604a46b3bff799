"""What every console page uses: who is signed in (`Viewer`), a checked form (`Actor`), the
templates, and the console's own URLs.

The console's pages (`overview`, `schedules`, ...) import this module and nothing of
`scheduler.console.console`, which mounts them: the import graph has no cycle.

URLs: every console path is written relative to the path the console is mounted at
(`base_of`, `/ui` by default: `scheduler.console.console.mount`). Templates see it as `base`;
Python code builds URLs with `View.url`.
"""

from __future__ import annotations

import hashlib
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import parse_qsl, urlencode, urlsplit

from fastapi import Depends, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates
from jinja2 import Environment, FileSystemLoader, StrictUndefined

from scheduler import __version__
from scheduler.console import display
from scheduler.console.client import Answer, Api
from scheduler.console.session import (
    FLASH_COOKIE,
    SESSION_COOKIE,
    Flash,
    Session,
    Signer,
    same_token,
)
from scheduler.settings import Settings

HERE = Path(__file__).parent
DEFAULT_BASE = "/ui"
FRAGMENT_HEADER = "x-console-fragment"
MAX_FORM = 64 << 10
NAV = (  # paths under the console's base
    ("overview", "/", "Overview"),
    ("schedules", "/schedules", "Schedules"),
    ("delayed", "/delayed", "Delayed tasks"),
    ("dead-letters", "/dead-letters", "Dead letters"),
    ("drift", "/drift", "Drift"),
    ("activity", "/activity", "Activity"),
)


def base_of(request: Request) -> str:
    """The path the console is mounted at (`/ui`), as `mount` recorded it."""
    base: str = getattr(request.app.state, "console_base", DEFAULT_BASE)
    return base


def _common(request: Request) -> dict[str, Any]:
    """What every template sees: the console's base path, the menu and the version."""
    return {"base": base_of(request), "nav": NAV, "version": __version__}


templates = Jinja2Templates(
    env=Environment(
        loader=FileSystemLoader(HERE / "templates"),
        autoescape=True,
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    ),
    context_processors=[_common],
)
templates.env.filters.update(display.FILTERS)


class SignInRequired(Exception):
    """No valid session where tokens are configured."""


class ConsoleProblem(Exception):
    """A request the console refuses itself (a stale form, a foreign origin), shown as a page."""

    def __init__(self, status: int, title: str, message: str) -> None:
        super().__init__(message)
        self.status, self.title, self.message = status, title, message


def page(request: Request, template: str, status: int = 200, **context: Any) -> HTMLResponse:
    """A console template rendered for `request` (the security headers come from the
    console's middleware, `scheduler.console.console.SecurityHeaders`)."""
    context.setdefault("active", "")
    return templates.TemplateResponse(request, template, context, status_code=status)


@dataclass
class View:
    """What one console request knows: who signed in, how to reach the API, the flash."""

    request: Request
    settings: Settings
    mode: str  # "admin", "read", or "open" (no token configured)
    session: Session | None
    signer: Signer
    api: Api

    @property
    def can_act(self) -> bool:
        return self.mode == "admin"

    @property
    def csrf(self) -> str:
        return self.session.csrf if self.session else ""

    @property
    def base(self) -> str:
        return base_of(self.request)

    def url(self, path: str, **params: Any) -> str:
        """The console URL of `path` (relative to the base), with the non-empty parameters."""
        return page_url(self.base + path, **params)

    def form_key(self) -> str:
        """A fresh Idempotency-Key for one rendered action form: submitting that form twice
        (a double click, a resent POST) acts once and shows the first answer again."""
        return uuid.uuid4().hex

    def flash(self) -> Flash | None:
        return self.signer.read_flash(self.request.cookies.get(FLASH_COOKIE))

    def render(self, template: str, status: int = 200, **context: Any) -> HTMLResponse:
        """A page of the console (or only its live part, for a refresh by console.js)."""
        flash = self.flash()
        response = page(
            self.request, template, status, view=self, flash=flash, now=datetime.now(UTC),
            **context,
        )  # fmt: skip
        if flash is not None and not is_fragment(self.request):
            response.delete_cookie(FLASH_COOKIE, path=self.base)
        return response

    def failed(self, answer: Answer, back: str | None = None) -> HTMLResponse:
        """The API's refusal or error as a page, with the API's status and explanation."""
        title = "Not done" if self.request.method == "POST" else "Cannot show this"
        return self.render(
            "error.html", answer.status, title=title, message=answer.detail, back=back
        )

    def redirect(self, url: str, flash: tuple[str, str] | None = None) -> RedirectResponse:
        """303 to `url` (a console path), with a message for the next page."""
        response = RedirectResponse(safe_next(url, self.base), status_code=303)
        if flash is not None:
            set_cookie(self.request, response, FLASH_COOKIE, self.signer.flash(*flash))
        return response


def settings_of(request: Request) -> Settings:
    return request.app.state.backend.settings  # type: ignore[no-any-return]


def tokens_configured(settings: Settings) -> bool:
    return settings.admin_token is not None or settings.read_token is not None


def is_fragment(request: Request) -> bool:
    return request.headers.get(FRAGMENT_HEADER) == "1"


async def viewer(request: Request) -> View:
    """Dependency of every page: the signed-in session, or open reading with no token set."""
    settings = settings_of(request)
    signer = Signer(settings)
    if not tokens_configured(settings):
        return View(request, settings, "open", None, signer, Api(request, None))
    session = signer.session(request.cookies.get(SESSION_COOKIE), time.time())
    token = None
    if session is not None:
        token = settings.admin_token if session.kind == "admin" else settings.read_token
    if session is None or token is None:
        raise SignInRequired
    api = Api(request, token.get_secret_value(), session_tag(session))
    return View(request, settings, session.kind, session, signer, api)


def session_tag(session: Session) -> str:
    """A short tag naming one console session in the activity log: a digest of its CSRF
    token (which it never reveals), the same on every request of that session."""
    return f"{session.kind}-{hashlib.sha256(session.csrf.encode()).hexdigest()[:12]}"


Viewer = Annotated[View, Depends(viewer)]


@dataclass(frozen=True)
class Form:
    view: View
    fields: dict[str, str]

    def get(self, name: str) -> str:
        return self.fields.get(name, "").strip()

    @property
    def key(self) -> str | None:
        """The form's Idempotency-Key (`idem`), passed on to the API, which checks it."""
        return self.get("idem") or None


async def actor(request: Request) -> Form:
    """Dependency of every form that changes something: same origin, the session's CSRF token."""
    view = await viewer(request)
    check_origin(request)
    fields = await read_form(request)
    if view.session is not None and not same_token(fields.get("csrf", ""), view.session.csrf):
        raise ConsoleProblem(
            403,
            "Form expired",
            "This form does not carry this session's token (it is older than your last sign-in, "
            "or it did not come from this console). Reload the page and try again.",
        )
    return Form(view, fields)


Actor = Annotated[Form, Depends(actor)]


def check_origin(request: Request) -> None:
    """Refuse a form posted from another site (SameSite=Strict already keeps the cookie away)."""
    origin = request.headers.get("origin")
    site = request.headers.get("sec-fetch-site")
    foreign = site not in (None, "same-origin", "none")
    if origin not in (None, "null"):
        foreign = foreign or urlsplit(origin).netloc != request.headers.get("host")
    if foreign:
        raise ConsoleProblem(403, "Refused", "This form was sent from another site.")


async def read_form(request: Request) -> dict[str, str]:
    if "application/x-www-form-urlencoded" not in request.headers.get("content-type", ""):
        raise ConsoleProblem(415, "Not a form", "Send the console's own forms.")
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM:
            raise ConsoleProblem(413, "Form too large", "The form is larger than 64 KiB.")
    return dict(parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True))


def safe_next(url: str | None, base: str = DEFAULT_BASE) -> str:
    """A console path to go to next; anything else (another site, a scheme) becomes the
    console's overview (`/ui/`)."""
    if not url or not url.startswith(base) or url.startswith("//") or "\\" in url:
        return base + "/"
    return url


def secure_cookies(request: Request) -> bool:
    return settings_of(request).ui_secure_cookie or request.url.scheme == "https"


def set_cookie(request: Request, response: Response, name: str, value: str) -> None:
    """A console cookie: HttpOnly, SameSite=Strict, limited to the console's path."""
    response.set_cookie(
        name,
        value,
        path=base_of(request),
        httponly=True,
        samesite="strict",
        secure=secure_cookies(request),
    )


def page_url(path: str, **params: Any) -> str:
    """A URL with the non-empty query parameters."""
    query = urlencode({k: v for k, v in params.items() if v not in (None, "")})
    return f"{path}?{query}" if query else path


async def shown(
    view: View, api_path: str, template: str, name: str, active: str, back: str | None = None
) -> HTMLResponse:
    """A page showing one object the API answers for `api_path` (as `name`), or the API's
    refusal."""
    answer = await view.api.get(api_path)
    if not answer.ok:
        return view.failed(answer, back)
    return view.render(template, active=active, **{name: answer.body})


def fragment_or(view: View, full: str, part: str, **context: Any) -> HTMLResponse:
    """The whole page, or only its live part when console.js refreshes it."""
    return view.render(part if is_fragment(view.request) else full, **context)


def sign_in_url(request: Request) -> str:
    """The sign-in page, sending the browser back to this page afterwards."""
    base = base_of(request)
    target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    return page_url(base + "/login", next=safe_next(target, base))
