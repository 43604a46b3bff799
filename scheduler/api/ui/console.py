"""The operator console at `/ui/`: server-rendered pages over the management API.

Mounted on the API's own app and port (`mount`). Every page is a client of the API
(`scheduler.api.ui.client`): it reads and acts through the same routes, tokens and log lines.

Who may do what follows the API's rule:
- tokens configured: nothing shows without signing in; the read token looks, the admin token
  acts (the API itself refuses a read token's write, whatever the page offers);
- no token configured: pages are open for reading, as the API's reads are, and every action is
  refused with the API's 403 naming `SCHEDULER_ADMIN_TOKEN`; each page says so.

Each response carries a Content-Security-Policy that allows only this console's own script and
style files (no inline script runs), forbids framing, and is never cached. Forms that change
something carry the session's CSRF token and must come from this origin.
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

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from jinja2 import Environment, FileSystemLoader, StrictUndefined

from scheduler import __version__
from scheduler.api.auth import token_kind
from scheduler.api.ui import display
from scheduler.api.ui.client import Answer, Api
from scheduler.api.ui.session import (
    COOKIE_PATH,
    FLASH_COOKIE,
    SESSION_COOKIE,
    Flash,
    Session,
    Signer,
    same_token,
)
from scheduler.settings import Settings

HERE = Path(__file__).parent
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cache-Control": "no-store",
}
FRAGMENT_HEADER = "x-console-fragment"
MAX_FORM = 64 << 10
NAV = (
    ("overview", "/ui/", "Overview"),
    ("schedules", "/ui/schedules", "Schedules"),
    ("delayed", "/ui/delayed", "Delayed tasks"),
    ("dead-letters", "/ui/dead-letters", "Dead letters"),
    ("drift", "/ui/drift", "Drift"),
    ("activity", "/ui/activity", "Activity"),
)
STATIC = {"console.css": "text/css", "console.js": "text/javascript"}

templates = Environment(
    loader=FileSystemLoader(HERE / "templates"),
    autoescape=True,
    undefined=StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)
templates.filters.update(display.FILTERS)

router = APIRouter(prefix="/ui", include_in_schema=False)


class SignInRequired(Exception):
    """No valid session where tokens are configured."""


class ConsoleProblem(Exception):
    """A request the console refuses itself (a stale form, a foreign origin), shown as a page."""

    def __init__(self, status: int, title: str, message: str) -> None:
        super().__init__(message)
        self.status, self.title, self.message = status, title, message


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

    def form_key(self) -> str:
        """A fresh Idempotency-Key for one rendered action form: submitting that form twice
        (a double click, a resent POST) acts once and shows the first answer again."""
        return uuid.uuid4().hex

    def flash(self) -> Flash | None:
        return self.signer.read_flash(self.request.cookies.get(FLASH_COOKIE))

    def render(self, template: str, status: int = 200, **context: Any) -> HTMLResponse:
        """A page of the console (or only its live part, for a refresh by console.js)."""
        flash = self.flash()
        context.setdefault("active", "")
        html = templates.get_template(template).render(
            view=self, nav=NAV, flash=flash, version=__version__, now=datetime.now(UTC), **context
        )
        response = HTMLResponse(html, status_code=status, headers=SECURITY_HEADERS)
        if flash is not None and not is_fragment(self.request):
            response.delete_cookie(FLASH_COOKIE, path=COOKIE_PATH)
        return response

    def failed(self, answer: Answer, back: str | None = None) -> HTMLResponse:
        """The API's refusal or error as a page, with the API's status and explanation."""
        title = "Not done" if self.request.method == "POST" else "Cannot show this"
        return self.render(
            "error.html", answer.status, title=title, message=answer.detail, back=back
        )

    def redirect(self, url: str, flash: tuple[str, str] | None = None) -> RedirectResponse:
        """303 to `url` (a console path), with a message for the next page."""
        response = RedirectResponse(safe_next(url), status_code=303, headers=SECURITY_HEADERS)
        if flash is not None:
            set_cookie(self.request, response, FLASH_COOKIE, self.signer.flash(*flash))
        return response


def settings_of(request: Request) -> Settings:
    settings: Settings = request.app.state.backend.settings
    return settings


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


def safe_next(url: str | None) -> str:
    """A console path to go to next; anything else (another site, a scheme) becomes /ui/."""
    if not url or not url.startswith("/ui") or url.startswith("//") or "\\" in url:
        return "/ui/"
    return url


def secure_cookies(request: Request) -> bool:
    return settings_of(request).ui_secure_cookie or request.url.scheme == "https"


def set_cookie(request: Request, response: Response, name: str, value: str) -> None:
    response.set_cookie(
        name,
        value,
        path=COOKIE_PATH,
        httponly=True,
        samesite="strict",
        secure=secure_cookies(request),
    )


def page_url(path: str, **params: Any) -> str:
    """A console URL with the non-empty query parameters."""
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


# -- sign-in ------------------------------------------------------------------------------------
@router.get("/login")
async def login_page(request: Request, next: str = "/ui/") -> Response:
    settings = settings_of(request)
    signer = Signer(settings)
    if not tokens_configured(settings):
        return RedirectResponse("/ui/", status_code=303, headers=SECURITY_HEADERS)
    return _login_form(request, signer, safe_next(next), None, 200)


@router.post("/login")
async def login(request: Request) -> Response:
    check_origin(request)
    settings = settings_of(request)
    signer = Signer(settings)
    fields = await read_form(request)
    target = safe_next(fields.get("next"))
    token = fields.get("token", "").strip()
    kind = token_kind(token, settings) if token else None
    if kind is None:
        problem = "That token is not one this daemon knows. Paste the value of "
        problem += "SCHEDULER_ADMIN_TOKEN (to act) or SCHEDULER_READ_TOKEN (to look)."
        return _login_form(request, signer, target, problem, 401)
    _, cookie = signer.new_session(kind, time.time())
    response = RedirectResponse(target, status_code=303, headers=SECURITY_HEADERS)
    set_cookie(request, response, SESSION_COOKIE, cookie)
    return response


@router.post("/logout")
async def logout(form: Actor) -> Response:
    response = form.view.redirect("/ui/login", ("ok", "Signed out."))
    response.delete_cookie(SESSION_COOKIE, path=COOKIE_PATH)
    return response


def _login_form(
    request: Request, signer: Signer, target: str, problem: str | None, status: int
) -> HTMLResponse:
    flash = signer.read_flash(request.cookies.get(FLASH_COOKIE))
    html = templates.get_template("login.html").render(
        view=None, nav=NAV, active="", next=target, problem=problem, flash=flash,
        version=__version__,
    )  # fmt: skip
    response = HTMLResponse(html, status_code=status, headers=SECURITY_HEADERS)
    if flash is not None:
        response.delete_cookie(FLASH_COOKIE, path=COOKIE_PATH)
    return response


# -- static files -------------------------------------------------------------------------------
@router.get("/static/{name}")
async def static(name: str) -> Response:
    if name not in STATIC:
        return Response("not found", status_code=404, headers=SECURITY_HEADERS)
    headers = {**SECURITY_HEADERS, "Cache-Control": "public, max-age=3600"}
    body = (HERE / "static" / name).read_bytes()
    return Response(body, media_type=STATIC[name], headers=headers)


# -- mounting -----------------------------------------------------------------------------------
def mount(app: FastAPI) -> None:
    """Add the console's routes and its error pages to the API's app."""
    from scheduler.api.ui import activity, dead_letters, delayed, drift, overview, schedules

    for module in (overview, schedules, delayed, dead_letters, drift, activity):
        app.include_router(module.router)
    app.include_router(router)
    app.include_router(fallback)
    app.add_exception_handler(SignInRequired, _sign_in)
    app.add_exception_handler(ConsoleProblem, _problem)


fallback = APIRouter(include_in_schema=False)


@fallback.get("/ui")
async def ui_root() -> Response:
    return RedirectResponse("/ui/", status_code=308, headers=SECURITY_HEADERS)


@fallback.api_route("/ui/{rest:path}", methods=["GET", "POST"])
async def not_found(view: Viewer) -> Response:
    return view.render(
        "error.html", 404, title="Not found", message="There is no console page here."
    )


async def _sign_in(request: Request, _: Exception) -> Response:
    if is_fragment(request) or request.method != "GET":
        status = 401 if is_fragment(request) else 303
        headers = (
            {**SECURITY_HEADERS, "Location": "/ui/login"} if status == 303 else SECURITY_HEADERS
        )
        return Response("sign in first", status_code=status, headers=headers)
    target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    url = page_url("/ui/login", next=safe_next(target))
    return RedirectResponse(url, status_code=303, headers=SECURITY_HEADERS)


async def _problem(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ConsoleProblem)
    html = templates.get_template("error.html").render(
        view=None, nav=NAV, active="", flash=None, version=__version__, title=exc.title,
        message=exc.message,
    )  # fmt: skip
    return HTMLResponse(html, status_code=exc.status, headers=SECURITY_HEADERS)
