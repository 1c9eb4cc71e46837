"""Errors a user sees, shaped like OpenAI's: {"error": {message, type, param, code}}."""

from __future__ import annotations

from typing import Any, TypeVar


class APIError(Exception):
    def __init__(
        self,
        status_code: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        type: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.message = message
        self.param = param
        self.code = code
        self.type = type or _default_type(status_code)

    def to_body(self) -> dict[str, Any]:
        return error_body(self.message, type=self.type, param=self.param, code=self.code)


def error_body(
    message: str, *, type: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def _default_type(status_code: int) -> str:
    if status_code == 401:
        return "authentication_error"
    if status_code == 403:
        return "permission_error"
    if status_code == 404:
        return "invalid_request_error"
    if status_code == 429:
        return "rate_limit_error"
    if status_code >= 500:
        return "server_error"
    return "invalid_request_error"


E = TypeVar("E", bound=APIError)


def invalid(
    message: str,
    *,
    param: str | None,
    code: str | None = "invalid_value",
    cls: type[E] = APIError,  # type: ignore[assignment]
) -> E:
    """400 for a parameter with a wrong value or type. Keyword-only, so that the message
    and the parameter's name cannot be swapped; the engine passes cls=EngineError."""
    return cls(status_code=400, message=message, param=param, code=code)


def missing(param: str, *, cls: type[E] = APIError) -> E:  # type: ignore[assignment]
    """400 for a required parameter that was not sent, in OpenAI's words."""
    return invalid(
        f"Missing required parameter: '{param}'.",
        param=param,
        code="missing_required_parameter",
        cls=cls,
    )


def not_found(
    what: str, ident: str, *, param: str | None = None, code: str | None = None
) -> APIError:
    """404 for an id that does not exist (or belongs to another owner: the same answer)."""
    return APIError(404, f"No such {what}: '{ident}'", param=param, code=code)
