"""The operator console at `/ui/`: server-rendered pages over the management API.

Mounted on the API's own app and port (`mount`), at `/ui` unless told otherwise. Every page is
a client of the API (`scheduler.console.client`): it reads and acts through the same routes,
tokens and log lines.

Who may do what follows the API's rule:
- tokens configured: nothing shows without signing in; the read token looks, the admin token
  acts (the API itself refuses a read token's write, whatever the page offers);
- no token configured: pages are open for reading, as the API's reads are, and every action is
  refused with the API's 403 naming `SCHEDULER_ADMIN_TOKEN`; each page says so.

Each response under the console's path carries a Content-Security-Policy that allows only this
console's own script and style files (no inline script runs), forbids framing, and is never
cached (`SecurityHeaders`, one middleware for every route). Forms that change something carry
the session's CSRF token and must come from this origin.

The pages live in their own modules (`overview`, `schedules`, ...), which import
`scheduler.console.view` and never this module.
"""

from __future__ import annotations

import os
import time

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.routing import APIRoute
from starlette.datastructures import MutableHeaders
from starlette.routing import Mount
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from scheduler.api.app import ApiBackend, build_api
from scheduler.api.auth import token_kind
from scheduler.console import activity, dead_letters, delayed, drift, overview, schedules
from scheduler.console.session import FLASH_COOKIE, SESSION_COOKIE, Signer
from scheduler.console.view import (
    DEFAULT_BASE,
    HERE,
    Actor,
    ConsoleProblem,
    SignInRequired,
    Viewer,
    base_of,
    check_origin,
    is_fragment,
    page,
    read_form,
    safe_next,
    set_cookie,
    settings_of,
    sign_in_url,
    tokens_configured,
)

__all__ = ["SECURITY_HEADERS", "SecurityHeaders", "mount", "safe_next"]

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
STATIC_CACHE = "public, max-age=3600"  # the pages ask for ?v=<version>: a release changes the URL
STATIC_TYPES = {".css": "text/css; charset=utf-8", ".js": "text/javascript; charset=utf-8"}
PAGES = (overview, schedules, delayed, dead_letters, drift, activity)


class SecurityHeaders:
    """Every answer under the console's path gets `SECURITY_HEADERS`; a header an answer sets
    itself wins (the static files' `Cache-Control`, the audit report's sandbox CSP)."""

    def __init__(self, app: ASGIApp, base: str) -> None:
        self.app = app
        self.base = base

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "") if scope["type"] == "http" else ""
        if path != self.base and not path.startswith(self.base + "/"):
            await self.app(scope, receive, send)
            return

        async def stamped(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in SECURITY_HEADERS.items():
                    headers.setdefault(name, value)
            await send(message)

        await self.app(scope, receive, stamped)


class Assets(StaticFiles):
    """console.css and console.js, cached for an hour, with their types fixed here rather
    than left to the host's mimetypes tables (Python 3.11's calls .js application/javascript)."""

    mounted: Mount | None = None  # where `mount` put it

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # FastAPI names no route in the scope for a mount; the request counter labels by it
        # (`route`), and would count these answers as `unmatched`.
        if self.mounted is not None:
            scope.setdefault("route", self.mounted)
        await super().__call__(scope, receive, send)

    def file_response(
        self, full_path: str | os.PathLike[str], stat_result: os.stat_result, scope: Scope,
        status_code: int = 200,
    ) -> Response:  # fmt: skip
        response = super().file_response(full_path, stat_result, scope, status_code)
        response.headers["Cache-Control"] = STATIC_CACHE
        kind = STATIC_TYPES.get(os.path.splitext(full_path)[1])
        if kind is not None and "content-type" in response.headers:
            response.headers["Content-Type"] = kind
        return response


# -- sign-in ------------------------------------------------------------------------------------
signing = APIRouter(include_in_schema=False)


@signing.get("/login")
async def login_page(request: Request, next: str = "") -> Response:
    settings = settings_of(request)
    base = base_of(request)
    if not tokens_configured(settings):
        return RedirectResponse(base + "/", status_code=303)
    return _login_form(request, safe_next(next or base + "/", base), None, 200)


@signing.post("/login")
async def login(request: Request) -> Response:
    check_origin(request)
    settings = settings_of(request)
    fields = await read_form(request)
    target = safe_next(fields.get("next"), base_of(request))
    token = fields.get("token", "").strip()
    kind = token_kind(token, settings) if token else None
    if kind is None:
        problem = "That token is not one this daemon knows. Paste the value of "
        problem += "SCHEDULER_ADMIN_TOKEN (to act) or SCHEDULER_READ_TOKEN (to look)."
        return _login_form(request, target, problem, 401)
    _, cookie = Signer(settings).new_session(kind, time.time())
    response = RedirectResponse(target, status_code=303)
    set_cookie(request, response, SESSION_COOKIE, cookie)
    return response


@signing.post("/logout")
async def logout(form: Actor) -> Response:
    response = form.view.redirect(form.view.url("/login"), ("ok", "Signed out."))
    response.delete_cookie(SESSION_COOKIE, path=form.view.base)
    return response


def _login_form(request: Request, target: str, problem: str | None, status: int) -> HTMLResponse:
    flash = Signer(settings_of(request)).read_flash(request.cookies.get(FLASH_COOKIE))
    response = page(
        request, "login.html", status, view=None, next=target, problem=problem, flash=flash
    )
    if flash is not None:
        response.delete_cookie(FLASH_COOKIE, path=base_of(request))
    return response


# -- what no page answers -----------------------------------------------------------------------
async def ui_root(request: Request) -> Response:
    return RedirectResponse(base_of(request) + "/", status_code=308)


async def not_found(view: Viewer) -> Response:
    return view.render(
        "error.html", 404, title="Not found", message="There is no console page here."
    )


# -- mounting -----------------------------------------------------------------------------------
def build_app(backend: ApiBackend, base: str = DEFAULT_BASE) -> FastAPI:
    """The daemon's HTTP app: the management API with the console mounted at `base`. The console
    is a client of the API, so it builds on `scheduler.api.app` and never the other way round."""
    return build_api(backend, extend=lambda app: mount(app, base))


def mount(app: FastAPI, base: str = DEFAULT_BASE) -> None:
    """Add the console at `base` (`/ui`) to the API's app: its pages, sign-in, static files,
    error pages and the middleware that puts the security headers on all of them."""
    app.state.console_base = base
    for router in (*(module.router for module in PAGES), signing):
        app.include_router(_under(base, router))
    assets = Assets(directory=HERE / "static")
    app.mount(f"{base}/static", assets, name="console-static")
    assets.mounted = next(r for r in app.routes if isinstance(r, Mount) and r.app is assets)
    app.add_api_route(base, ui_root, methods=["GET"], include_in_schema=False)
    app.add_api_route(
        base + "/{rest:path}", not_found, methods=["GET", "POST"], include_in_schema=False
    )
    app.add_exception_handler(SignInRequired, _sign_in)
    app.add_exception_handler(ConsoleProblem, _problem)
    app.add_middleware(SecurityHeaders, base=base)


def _under(base: str, router: APIRouter) -> APIRouter:
    """`router`'s routes as new routes under `base`, so each route's template (the `route`
    label of `mq_scheduler_api_requests_total`) is the full path, `/ui/schedules/{name}`:
    FastAPI's `include_router(prefix=...)` keeps the included route, and its shorter path."""
    under = APIRouter(prefix=base, include_in_schema=False)
    for route in router.routes:
        assert isinstance(route, APIRoute), route
        under.add_api_route(
            route.path, route.endpoint, methods=sorted(route.methods or ()), name=route.name,
            include_in_schema=False,
        )  # fmt: skip
    return under


async def _sign_in(request: Request, _: Exception) -> Response:
    base = base_of(request)
    if is_fragment(request):
        return Response("sign in first", status_code=401)
    if request.method != "GET":
        return Response("sign in first", status_code=303, headers={"Location": base + "/login"})
    return RedirectResponse(sign_in_url(request), status_code=303)


async def _problem(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ConsoleProblem)
    return page(
        request, "error.html", exc.status, view=None, flash=None, title=exc.title,
        message=exc.message,
    )  # fmt: skip
