"""`/docs`: the OpenAPI document rendered by Swagger UI, served from files vendored in
`gateway/api_docs/static/` (not a CDN), so the page works where the gateway has no internet
access. Mounted by the app factory only when `api_docs_enabled` is true."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import FileResponse, HTMLResponse, Response

from tenancy.errors import NotFound

STATIC_DIR = Path(__file__).parent / "static"
FILES = {"swagger-ui-bundle.js": "text/javascript", "swagger-ui.css": "text/css"}


def docs_router(openapi_url: str) -> APIRouter:
    router = APIRouter(tags=["documentation"])

    @router.get("/docs", response_class=HTMLResponse, summary="This API, rendered (Swagger UI)")
    async def docs() -> Response:
        return get_swagger_ui_html(
            openapi_url=openapi_url,
            title="loragate gateway API",
            swagger_js_url="/docs/static/swagger-ui-bundle.js",
            swagger_css_url="/docs/static/swagger-ui.css",
            swagger_favicon_url="data:,",
        )

    @router.get("/docs/static/{name}", summary="Swagger UI's script and style")
    async def static(name: str) -> Response:
        media_type = FILES.get(name)
        if media_type is None:  # only the listed files: no path from the request reaches the disk
            raise NotFound("File")
        return FileResponse(
            STATIC_DIR / name, media_type=media_type, headers={"cache-control": "max-age=86400"}
        )

    return router
