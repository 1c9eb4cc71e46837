"""Shared wire pieces: error bodies, cursor pages, and schema documentation helpers."""

from __future__ import annotations

from typing import Any, Generic, Literal, TypeVar

import msgspec
from msgspec import Meta, Struct

T = TypeVar("T")
Name = TypeVar("Name", bound=str)


def doc(description: str | None = None, **schema: Any) -> Meta:
    """Documentation for /schema only: `schema` sets OpenAPI keywords msgspec does not check."""
    extra: dict[str, Any] = {"extra": schema} if schema else {}
    if description:
        extra["description"] = description
    return Meta(extra_json_schema=extra)


# -- errors ----------------------------------------------------------------------------------


class ErrorObject(Struct, kw_only=True):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorBody(Struct, kw_only=True):
    """Every error batchyard answers with: {"error": {message, type, param, code}}."""

    error: ErrorObject


# -- pages -----------------------------------------------------------------------------------


class CursorPage(Struct, Generic[T], kw_only=True):
    """OpenAI's cursor page (`SyncCursorPage` in the SDK): pass `last_id` as `after`."""

    object: Literal["list"] = "list"
    data: list[T]
    first_id: str | None = None
    last_id: str | None = None
    has_more: bool


def cursor_page(data: list[Any], has_more: bool) -> CursorPage[Any]:
    return CursorPage(
        data=data,
        first_id=data[0].id if data else None,
        last_id=data[-1].id if data else None,
        has_more=has_more,
    )


def to_builtins(obj: Struct) -> dict[str, Any]:
    """A Struct as plain JSON values (for templates and anything that reads it as a dict)."""
    built: dict[str, Any] = msgspec.to_builtins(obj)
    return built


def one_of(value: str, names: tuple[Name, ...]) -> Name:
    """`value` as one of a Literal's `names` (a status or purpose read from a table's str).

    A stored value outside the wire's list is a bug in what wrote it, so it fails loudly here
    rather than reaching a client that validates the enum.
    """
    for name in names:
        if value == name:
            return name
    raise ValueError(f"{value!r} is not one of {', '.join(names)}")
