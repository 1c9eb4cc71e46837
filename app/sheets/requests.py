"""A sheet's rows as batch request lines: the template, the output columns, the body.

The template renders in Jinja2's `SandboxedEnvironment`, with the row's columns as its
only names (`{{ review }}`, or `{{ row["first name"] }}` for a name that is not a word).
A name that is not a column is refused before anything is written. Output columns become
a `response_format` JSON schema, which the engine enforces with a grammar.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from jinja2 import StrictUndefined, TemplateSyntaxError, meta
from jinja2.sandbox import SandboxedEnvironment

from app.errors import APIError, invalid

#: The kinds an output column may be, as the form and `--columns` name them.
COLUMN_TYPES = ("text", "number", "boolean", "one of")
#: Output columns in one sheet batch.
MAX_OUTPUT_COLUMNS = 20
#: Characters in a template or a system prompt.
MAX_TEMPLATE_CHARS = 32_767
#: The name a template may use for the whole row (for column names that are not words).
ROW_NAME = "row"
ENDPOINT = "/v1/chat/completions"
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_ ]{0,63}$")


@dataclass
class OutputColumn:
    name: str
    type: str = "text"
    choices: list[str] = field(default_factory=list)

    def schema(self) -> dict[str, Any]:
        if self.type == "number":
            return {"type": "number"}
        if self.type == "boolean":
            return {"type": "boolean"}
        if self.type == "one of":
            return {"type": "string", "enum": list(self.choices)}
        return {"type": "string"}


@dataclass
class SheetSpec:
    """What a sheet batch was made of: kept with the batch, for its download."""

    template: str
    system: str = ""
    model: str = ""
    max_tokens: int | None = None
    temperature: float | None = None
    output_columns: list[OutputColumn] = field(default_factory=list)
    #: The workbook's sheet (XLSX); None for a CSV or the first sheet.
    sheet: str | None = None

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> SheetSpec:
        raw = json.loads(text)
        raw["output_columns"] = [OutputColumn(**c) for c in raw.get("output_columns", [])]
        return cls(**raw)


def parse_column(text: str) -> OutputColumn:
    """'label:one of positive,negative' / 'score:number' / 'summary' (text) -> a column."""
    name, _, kind = text.partition(":")
    kind = kind.strip()
    if kind.lower().startswith("one of"):
        choices = [c.strip() for c in kind[len("one of") :].split(",") if c.strip()]
        return OutputColumn(name.strip(), "one of", choices)
    return OutputColumn(name.strip(), kind.lower() or "text")


def check_output_columns(columns: list[OutputColumn], sheet_columns: list[str]) -> None:
    if len(columns) > MAX_OUTPUT_COLUMNS:
        raise invalid(
            f"A sheet batch may have at most {MAX_OUTPUT_COLUMNS} output columns; got {len(columns)}.",
            param="output_columns",
        )
    seen: set[str] = set()
    for c in columns:
        if not _NAME.match(c.name):
            raise invalid(
                f"Output column name '{c.name}' must start with a letter and hold only letters, "
                "digits, spaces and '_' (64 characters at most).",
                param="output_columns",
            )
        if c.name in seen or c.name in sheet_columns:
            raise invalid(
                f"Output column '{c.name}' is named twice, or the sheet has a column of that name.",
                param="output_columns",
            )
        seen.add(c.name)
        if c.type not in COLUMN_TYPES:
            raise invalid(
                f"Output column '{c.name}' has type '{c.type}'; the types are: "
                f"{', '.join(COLUMN_TYPES)}.",
                param="output_columns",
            )
        if c.type == "one of" and not c.choices:
            raise invalid(
                f"Output column '{c.name}' is 'one of' a list, but the list is empty: "
                f"write '{c.name}:one of a,b,c'.",
                param="output_columns",
            )


def response_format(columns: list[OutputColumn]) -> dict[str, Any] | None:
    if not columns:
        return None
    return {
        "type": "json_schema",
        "json_schema": {
            "name": "row",
            "strict": True,
            "schema": {
                "type": "object",
                "properties": {c.name: c.schema() for c in columns},
                "required": [c.name for c in columns],
                "additionalProperties": False,
            },
        },
    }


class RowTemplate:
    """The spec's template and system prompt, compiled and checked against the columns."""

    def __init__(self, spec: SheetSpec, columns: list[str]) -> None:
        for param, text in (("template", spec.template), ("system", spec.system)):
            if len(text) > MAX_TEMPLATE_CHARS:
                raise invalid(
                    f"The {param} has {len(text)} characters; it may have at most "
                    f"{MAX_TEMPLATE_CHARS}.",
                    param=param,
                )
        if not spec.template.strip():
            raise invalid(
                "The template is empty: write the prompt, with {{ column }}.", param="template"
            )
        env = SandboxedEnvironment(undefined=StrictUndefined, autoescape=False)
        self.columns = columns
        #: The columns the templates name (every column when they take the whole `row`).
        self.names: set[str] = set()
        self.user = self._compile(env, spec.template, "template")
        self.system = self._compile(env, spec.system, "system") if spec.system.strip() else None
        self.spec = spec
        self.response_format = response_format(spec.output_columns)

    def _compile(self, env: SandboxedEnvironment, text: str, param: str) -> Any:
        try:
            names = meta.find_undeclared_variables(env.parse(text))
            compiled = env.from_string(text)
        except TemplateSyntaxError as exc:
            raise invalid(
                f"The {param} cannot be read: {exc.message} (line {exc.lineno}).", param=param
            ) from None
        self.names |= set(self.columns) if ROW_NAME in names else names
        unknown = sorted(n for n in names if n not in self.columns and n != ROW_NAME)
        if unknown:
            raise APIError(
                400,
                f"The {param} names {', '.join(repr(n) for n in unknown)}, which the sheet "
                f"has no column for. Its columns: {', '.join(self.columns)}.",
                param=param,
                code="unknown_column",
            )
        return compiled

    def messages(self, cells: list[str]) -> list[dict[str, str]]:
        values = dict(zip(self.columns, cells, strict=True))
        context = {**values, ROW_NAME: values}
        out = []
        if self.system is not None:
            out.append({"role": "system", "content": self.system.render(context)})
        out.append({"role": "user", "content": self.user.render(context)})
        return out

    def body(self, cells: list[str]) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.spec.model, "messages": self.messages(cells)}
        if self.spec.max_tokens is not None:
            body["max_tokens"] = self.spec.max_tokens
        if self.spec.temperature is not None:
            body["temperature"] = self.spec.temperature
        if self.response_format is not None:
            body["response_format"] = self.response_format
        return body

    def line(self, number: int, cells: list[str]) -> dict[str, Any]:
        return {
            "custom_id": str(number),
            "method": "POST",
            "url": ENDPOINT,
            "body": self.body(cells),
        }


def request_lines(template: RowTemplate, rows: Iterable[tuple[int, list[str]]]) -> Iterator[bytes]:
    """One JSONL request line per row; a row the template cannot render is refused by number."""
    for number, cells in rows:
        try:
            line = template.line(number, cells)
        except APIError:
            raise
        except Exception as exc:  # the sandbox refused something, or a filter failed
            raise invalid(
                f"Row {number}: the template cannot be rendered: {exc}.", param="template"
            ) from None
        yield json.dumps(line, ensure_ascii=False).encode("utf-8") + b"\n"


def estimate_tokens(text: str) -> int:
    """About four characters a token: the estimate when no tokenizer is at hand."""
    return math.ceil(len(text) / 4)


def estimate_sheet_tokens(template: RowTemplate, rows: int, chars: dict[str, int]) -> int:
    """The input tokens of a whole sheet from its row count and each column's characters:
    the template's own text once a row, and each column it names once (about four
    characters a token), without rendering every row again."""
    try:
        fixed = sum(len(m["content"]) for m in template.messages([""] * len(template.columns)))
    except Exception:  # a filter that needs a value (int, a loop over it): text alone
        fixed = len(template.spec.template) + len(template.spec.system)
    named = sum(chars.get(name, 0) for name in template.names)
    return math.ceil((rows * fixed + named) / 4)
