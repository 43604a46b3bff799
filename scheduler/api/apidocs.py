"""`/docs`: Swagger UI from the `swagger-ui-py` package, never a CDN, under a strict CSP.

FastAPI's own `/docs` loads unpinned scripts from a CDN on the API's origin (where an admin
types a token into "Authorize" and the console keeps its CSRF token) and renders a blank page
offline. Here the page, its start script and the bundle's assets are all served by the daemon;
the Content-Security-Policy allows nothing else (no other origin, no inline script), so the
page works offline and a script from elsewhere cannot run on it.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from fastapi import APIRouter, HTTPException
from fastapi.responses import FileResponse, HTMLResponse, Response


def _assets() -> Path:
    spec = importlib.util.find_spec("swagger_ui")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("swagger-ui-py is not installed (it serves /docs)")
    return Path(next(iter(spec.submodule_search_locations))) / "static"


ASSETS = _assets()
SERVED = {  # the only files of the bundle the page needs
    "swagger-ui-bundle.js": "text/javascript",
    "swagger-ui.css": "text/css",
    "favicon-32x32.png": "image/png",
}
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; font-src 'self'; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'"
)
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-cache",
}
PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>mq-scheduler API</title>
<link rel="stylesheet" href="/docs/assets/swagger-ui.css">
<link rel="icon" href="/docs/assets/favicon-32x32.png">
</head>
<body>
<div id="swagger-ui"></div>
<script src="/docs/assets/swagger-ui-bundle.js"></script>
<script src="/docs/start.js"></script>
</body>
</html>
"""
START = """window.addEventListener("load", function () {
  window.ui = SwaggerUIBundle({
    url: "/openapi.json",
    dom_id: "#swagger-ui",
    deepLinking: true,
    layout: "BaseLayout",
    presets: [SwaggerUIBundle.presets.apis],
    validatorUrl: null,
    showExtensions: true
  });
});
"""

router = APIRouter(include_in_schema=False)


@router.get("/docs")
async def docs_page() -> Response:
    return HTMLResponse(PAGE, headers=HEADERS)


@router.get("/docs/start.js")
async def docs_start() -> Response:
    return Response(START, media_type="text/javascript", headers=HEADERS)


@router.get("/docs/assets/{name}")
async def docs_asset(name: str) -> Response:
    if name not in SERVED:
        raise HTTPException(404, f"no such asset: {name}")
    headers = {**HEADERS, "Cache-Control": "public, max-age=86400"}
    return FileResponse(ASSETS / name, media_type=SERVED[name], headers=headers)
