"""Errors a user sees, shaped like OpenAI's: {"error": {message, type, param, code}}."""

from __future__ import annotations

import errno
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


#: What says the data dir has no room left: the disk's errnos (full, or over a quota),
#: SQLite's result code SQLITE_FULL and PostgreSQL's SQLSTATE disk_full.
FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
SQLITE_FULL = 13
PG_DISK_FULL = "53100"


def _causes(exc: BaseException) -> list[BaseException]:
    """`exc` and what it wraps: a database driver's error under SQLAlchemy's (`orig`), or an
    exception's `__cause__`."""
    chain: list[BaseException] = []
    e: BaseException | None = exc
    while e is not None and all(e is not c for c in chain):
        chain.append(e)
        orig = getattr(e, "orig", None)
        e = orig if isinstance(orig, BaseException) else e.__cause__
    return chain


def storage_full(exc: BaseException) -> bool:
    """Whether `exc` says the data dir is full: a file write's or the database's."""
    for e in _causes(exc):
        if isinstance(e, OSError) and e.errno in FULL_ERRNOS:
            return True
        code = getattr(e, "sqlite_errorcode", None)
        if isinstance(code, int) and code & 0xFF == SQLITE_FULL:
            return True
        if PG_DISK_FULL in (getattr(e, "sqlstate", None), getattr(e, "pgcode", None)):
            return True
    return False


def storage_failed(exc: BaseException, what: str = "this request's data") -> APIError:
    """The rule "storage full is a 507 that says so": 507 `storage_full` for a full data dir
    (the client may retry later), else 500 `storage_error`, each naming the reason. Every
    endpoint that writes answers a full data dir with this (app/api/errors.py's handler)."""
    full = storage_full(exc)
    inner = _causes(exc)[-1]
    reason = (inner.strerror if isinstance(inner, OSError) else None) or inner
    return APIError(
        507 if full else 500,
        f"The server could not store {what}: {reason}.",
        code="storage_full" if full else "storage_error",
        type="server_error",
    )
