"""A second upstream kind, for the tests of the kinds' table: a gateway that serves OpenAI
models under its own paths (`/openai/...`), takes its key as `api-key`, wraps each request
as `{"deployment", "request"}` and each answer as `{"result"}`, and lists its models as
`{"models": [{"name", "created_at"}]}`. Its streams are OpenAI's server-sent events."""

from __future__ import annotations

from typing import Any

from app.config.upstreams import UpstreamSpec
from app.engine.upstream.kinds.openai import OpenAIKind
from app.runtime import jsoncodec


class GatewayKind(OpenAIKind):
    models_path = "/models"

    def headers(self, spec: UpstreamSpec) -> dict[str, str]:
        return {"Content-Type": "application/json", "api-key": spec.key}

    def path(self, endpoint: str) -> str:
        return "/openai" + endpoint.removeprefix("/v1")

    def encode(self, endpoint: str, body: dict[str, Any]) -> bytes:
        return jsoncodec.dumps_bytes({"deployment": body.get("model"), "request": body})

    def answer(self, endpoint: str, content: bytes) -> dict[str, Any]:
        result = jsoncodec.loads(content).get("result")
        if not isinstance(result, dict):
            raise ValueError("the gateway answered without a result")
        return result

    def models(self, content: bytes) -> list[dict[str, Any]]:
        listed = jsoncodec.loads(content).get("models")
        if not isinstance(listed, list):
            raise ValueError("the gateway listed no models")
        return [
            {"id": m["name"], "created": m["created_at"], "owned_by": "gateway"} for m in listed
        ]


KIND = GatewayKind()
