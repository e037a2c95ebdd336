"""The web console at `/ui`: static pages (Preact and htm, vendored in `api/console/`)
that talk to the public API with the caller's key, like any other client."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, FastAPI
from fastapi.responses import FileResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles

CONSOLE_DIR = Path(__file__).resolve().parents[1] / "console"

HEADERS = {
    "Cache-Control": "no-cache",
    # Scripts and styles from here only; images and audio may come from storage's signed
    # URLs (another host with S3) or be made in the page (data:, blob:).
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; connect-src 'self'; "
        "img-src 'self' data: blob: http: https:; media-src 'self' data: blob: http: https:; "
        "frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
}

router = APIRouter(include_in_schema=False)


@router.get("/ui")
async def console() -> FileResponse:
    return FileResponse(CONSOLE_DIR / "index.html", headers=HEADERS)


@router.get("/ui/")
async def console_slash() -> RedirectResponse:
    return RedirectResponse("/ui", status_code=308)


def mount(app: FastAPI) -> None:
    """The router and the console's files (`/ui/static/...`)."""
    app.include_router(router)
    app.mount("/ui/static", StaticFiles(directory=CONSOLE_DIR), name="console")
