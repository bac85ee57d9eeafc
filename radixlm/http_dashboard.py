"""The dashboard's static pages, for the server (/dashboard: charts, radix tree, recent requests,
playground) and the router (/dashboard: every worker side by side). A leaf, so that both serve the
same files: they ship in the package (radixlm/dashboard_static/, uPlot vendored with its licence),
no build step and no CDN. The pages hold no data and are open (a browser cannot send a key on
navigation); their data comes from /dashboard/stream, behind the key like every route, which the
page sends as Bearer once the user has entered it."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import FileResponse, Response

STATIC_DIR = Path(__file__).with_name("dashboard_static")
# Every file the pages load, and its type: nothing else in the directory is served.
ASSETS = {
    "dashboard.css": "text/css",
    "common.js": "text/javascript",
    "charts.js": "text/javascript",
    "tree.js": "text/javascript",
    "playground.js": "text/javascript",
    "server.js": "text/javascript",
    "router.js": "text/javascript",
    "uPlot.iife.min.js": "text/javascript",
    "uPlot.min.css": "text/css",
    "uPlot.LICENSE": "text/plain",
}
PAGES = ("server.html", "router.html")
OPEN_PATHS = ("/dashboard", *(f"/dashboard/static/{name}" for name in ASSETS))
# Only the pages' own scripts run; they talk to this origin only.
_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; connect-src 'self'; img-src 'self' data:; "
        "style-src 'self' 'unsafe-inline'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-cache",
}


def dashboard_pages(page: str) -> APIRouter:
    """GET /dashboard (page: server.html or router.html) and its static files."""
    if page not in PAGES:
        raise ValueError(f"page must be one of {', '.join(PAGES)}, got {page!r}")
    router = APIRouter()

    @router.get("/dashboard", include_in_schema=False)
    async def dashboard():
        return FileResponse(STATIC_DIR / page, media_type="text/html", headers=_HEADERS)

    @router.get("/dashboard/static/{name}", include_in_schema=False)
    async def static(name: str):
        if name not in ASSETS:
            return Response(
                f"no dashboard file {name[:100]!r}\n", status_code=404, media_type="text/plain"
            )
        return FileResponse(STATIC_DIR / name, media_type=ASSETS[name], headers=_HEADERS)

    return router
