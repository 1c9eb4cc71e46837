"""The API's OpenAPI document at /schema, and what Litestar cannot infer for it.

- Swagger UI is served from files vendored under static/vendor (Litestar's render plugins
  load from a CDN by default), so the docs work offline.
- `EngineBodyPlugin` shows the Struct named by `EngineBody` for an inference body that
  the handler passes to the engine as sent.
- `MultipartUpload` documents `POST /v1/files`, whose body is read as a stream (so it has
  no `data` parameter for Litestar to describe).
- `ERRORS` documents the OpenAI-shaped error bodies in place of Litestar's own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from litestar.openapi import OpenAPIConfig
from litestar.openapi.datastructures import ResponseSpec
from litestar.openapi.plugins import SwaggerRenderPlugin
from litestar.openapi.spec import OpenAPIMediaType, OpenAPIType, Operation, RequestBody, Schema
from litestar.plugins import OpenAPISchemaPlugin
from litestar.typing import FieldDefinition

from app.wire.common import ErrorBody
from app.wire.files import EXPIRES_MAX, EXPIRES_MIN, UPLOAD_PURPOSES
from app.wire.inference import EngineBody

if TYPE_CHECKING:
    from litestar._openapi.schema_generation import SchemaCreator
    from litestar.openapi.spec import Reference

VENDOR = "/static/vendor/swagger-ui"

_ERROR_TEXT = {
    400: "A parameter is missing or has a wrong value; `param` names it.",
    401: "No API key, or an unknown one (only when the server has keys).",
    404: "No such object for this owner; `param` names the id.",
    413: "The upload is larger than the server's limit.",
    503: "The model is still loading, or failed to load.",
    507: "The server's disk is full.",
}


def errors(*statuses: int) -> dict[int, ResponseSpec]:
    """OpenAI-shaped error responses for /schema: 400 and 401 always, plus `statuses`."""
    return {
        status: ResponseSpec(ErrorBody, description=_ERROR_TEXT[status])
        for status in sorted({400, 401, *statuses})
    }


class EngineBodyPlugin(OpenAPISchemaPlugin):
    """Document `Annotated[dict[str, Any], EngineBody(Params)]` as `Params`."""

    def is_plugin_supported_field(self, field_definition: FieldDefinition) -> bool:
        return any(isinstance(m, EngineBody) for m in field_definition.metadata)

    # Litestar's protocol says Schema, but its own SchemaCreator answers Schema | Reference
    # (a Struct becomes a $ref), and returning that is what Litestar does with it.
    def to_openapi_schema(  # type: ignore[override]
        self, field_definition: FieldDefinition, schema_creator: SchemaCreator
    ) -> Schema | Reference:
        marker = next(m for m in field_definition.metadata if isinstance(m, EngineBody))
        return schema_creator.for_field_definition(FieldDefinition.from_annotation(marker.params))


def _text(description: str, **extra: Any) -> Schema:
    return Schema(type=OpenAPIType.STRING, description=description, **extra)


@dataclass
class MultipartUpload(Operation):
    """The request body of `POST /v1/files`, as the SDK sends it."""

    def __post_init__(self) -> None:
        form = Schema(
            type=OpenAPIType.OBJECT,
            required=["file", "purpose"],
            properties={
                "file": _text("The file's bytes.", format="binary"),
                "purpose": _text(
                    "What the file is for; 'batch' for a batch input file.",
                    enum=list(UPLOAD_PURPOSES),
                ),
                "expires_after[anchor]": _text("Only 'created_at'.", enum=["created_at"]),
                "expires_after[seconds]": Schema(
                    type=OpenAPIType.INTEGER,
                    minimum=EXPIRES_MIN,
                    maximum=EXPIRES_MAX,
                    description="Seconds after creation the file expires (1 hour to 30 days).",
                ),
            },
        )
        self.request_body = RequestBody(
            required=True, content={"multipart/form-data": OpenAPIMediaType(schema=form)}
        )


@dataclass
class UploadPartForm(Operation):
    """The request body of `POST /v1/uploads/{upload_id}/parts`, as the SDK sends it."""

    def __post_init__(self) -> None:
        form = Schema(
            type=OpenAPIType.OBJECT,
            required=["data"],
            properties={"data": _text("The part's bytes (at most 64 MB).", format="binary")},
        )
        self.request_body = RequestBody(
            required=True, content={"multipart/form-data": OpenAPIMediaType(schema=form)}
        )


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
