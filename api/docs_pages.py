"""The interactive API docs (`/docs`, Swagger UI; `/redoc`, ReDoc) from files this install
holds, not from a CDN: mmq's users run air-gapped GPU hosts, where FastAPI's own pages
(which load their scripts from jsDelivr) stay blank.

The scripts and styles are the `fastapi-offline` package's (MIT: Swagger UI, ReDoc and a
favicon in its `static` folder), served at `ASSETS`; the pages are FastAPI's own
(`get_swagger_ui_html`, `get_redoc_html`) pointed at them.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.openapi.docs import (
    get_redoc_html,
    get_swagger_ui_html,
    get_swagger_ui_oauth2_redirect_html,
)
from fastapi.staticfiles import StaticFiles
from starlette.responses import HTMLResponse

DOCS = "/docs"
REDOC = "/redoc"
ASSETS = "/docs/assets"
OAUTH2_REDIRECT = "/docs/oauth2-redirect"


def assets_dir() -> Path:
    """The folder of Swagger UI's and ReDoc's files in the installed `fastapi-offline`."""
    return Path(str(resources.files("fastapi_offline") / "static"))


def install(app: FastAPI) -> None:
    """Serve `/docs` and `/redoc` on `app`, made with `docs_url=None, redoc_url=None`."""
    app.mount(ASSETS, StaticFiles(directory=assets_dir()), name="docs-assets")

    def root(request: Request) -> str:
        return str(request.scope.get("root_path", ""))

    @app.get(DOCS, include_in_schema=False)
    async def swagger_ui(request: Request) -> HTMLResponse:
        base = root(request)
        return get_swagger_ui_html(
            openapi_url=f"{base}{app.openapi_url}",
            title=f"{app.title} - Swagger UI",
            oauth2_redirect_url=f"{base}{OAUTH2_REDIRECT}",
            swagger_js_url=f"{base}{ASSETS}/swagger-ui-bundle.js",
            swagger_css_url=f"{base}{ASSETS}/swagger-ui.css",
            swagger_favicon_url=f"{base}{ASSETS}/favicon.png",
        )

    @app.get(OAUTH2_REDIRECT, include_in_schema=False)
    async def swagger_ui_redirect() -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()

    @app.get(REDOC, include_in_schema=False)
    async def redoc(request: Request) -> HTMLResponse:
        base = root(request)
        return get_redoc_html(
            openapi_url=f"{base}{app.openapi_url}",
            title=f"{app.title} - ReDoc",
            redoc_js_url=f"{base}{ASSETS}/redoc.standalone.js",
            redoc_favicon_url=f"{base}{ASSETS}/favicon.png",
            with_google_fonts=False,
        )
