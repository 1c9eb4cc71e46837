"""The API docs at /schema, rendered by Swagger UI from files vendored under static/vendor.

Litestar's render plugins load their JS and CSS (and a favicon) from a CDN by default;
pointing them at /static keeps the docs working offline.
"""

from __future__ import annotations

from litestar.openapi import OpenAPIConfig
from litestar.openapi.plugins import SwaggerRenderPlugin

VENDOR = "/static/vendor/swagger-ui"


def openapi_config(title: str, version: str) -> OpenAPIConfig:
    """Swagger UI at /schema (and /schema/swagger); the JSON stays at /schema/openapi.json."""
    swagger = SwaggerRenderPlugin(
        js_url=f"{VENDOR}/swagger-ui-bundle.js",
        css_url=f"{VENDOR}/swagger-ui.css",
        standalone_preset_js_url=f"{VENDOR}/swagger-ui-standalone-preset.js",
        favicon=f"<link rel='icon' type='image/png' href='{VENDOR}/favicon-32x32.png'>",
        path="/swagger",
    )
    return OpenAPIConfig(title=title, version=version, path="/schema", render_plugins=[swagger])
