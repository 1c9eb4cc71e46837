"""A sheet's rows as batch request lines: the template, the output columns, the body.

The template renders in Jinja2's `SandboxedEnvironment`, with the row's columns as its
only names (`{{ review }}`, or `{{ row["first name"] }}` for a name that is not a word).
A name that is not a column is refused before anything is written. `{{ image(column) }}`
places the image a cell names (app/sheets/images.py): the user message then has text and
`image_url` parts, in the template's order. Output columns become a `response_format`
JSON schema, which the engine enforces with a grammar.
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
from app.sheets.images import ImageCellError, ImageCells

#: The kinds an output column may be, as the form and `--columns` name them. A `list` is a
#: JSON array of strings (written to a sheet's cell as that JSON, as any non-scalar answer).
COLUMN_TYPES = ("text", "number", "boolean", "one of", "list")
#: Output columns in one sheet batch.
MAX_OUTPUT_COLUMNS = 20
#: Characters in a template or a system prompt.
MAX_TEMPLATE_CHARS = 32_767
#: The name a template may use for the whole row (for column names that are not words).
ROW_NAME = "row"
#: The template's function that places a cell's image: `{{ image(photo) }}`.
IMAGE_NAME = "image"
ENDPOINT = "/v1/chat/completions"
#: The column a thinking model's thought goes in, when a sheet keeps it (`keep_reasoning`).
REASONING = "reasoning"
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_ ]{0,63}$")
#: Where `image()` left an image in the rendered text (NULs: not what a cell holds).
_MARK = "\x00image:{}\x00"
_MARKS = re.compile("\x00image:(\\d+)\x00")


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
        if self.type == "list":
            return {"type": "array", "items": {"type": "string"}}
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
    #: Where image cells' relative paths are found: the sheet's folder under `batchyard
    #: run`; None on the dashboard (a sheet uploaded there has no folder).
    folder: str | None = None
    #: Add a `reasoning` column with a thinking model's thought (the answer's columns are
    #: filled from its answer alone either way).
    keep_reasoning: bool = False

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


def parse_columns(text: str) -> list[OutputColumn]:
    """'caption, objects: list, score: number' -> three columns. A 'one of' list takes the
    pieces after it that have no ':' as more choices ('label: one of a, b, c'), so it goes
    last, or in a --columns of its own."""
    columns: list[OutputColumn] = []
    for piece in (p.strip() for p in text.split(",")):
        if not piece:
            continue
        if ":" not in piece and columns and columns[-1].type == "one of":
            columns[-1].choices.append(piece)
        else:
            columns.append(parse_column(piece))
    return columns


def check_output_columns(
    columns: list[OutputColumn], sheet_columns: list[str], keep_reasoning: bool = False
) -> None:
    if keep_reasoning and REASONING in (*sheet_columns, *(c.name for c in columns)):
        raise invalid(
            f"The thought goes in a column named '{REASONING}', and the sheet or an output "
            "column already has one: rename that column, or leave the thought out.",
            param="keep_reasoning",
        )
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

    def __init__(
        self, spec: SheetSpec, columns: list[str], images: ImageCells | None = None
    ) -> None:
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
        self.images = images or ImageCells(None, 0)
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
        if IMAGE_NAME not in self.columns:
            names.discard(IMAGE_NAME)  # the function, not a column
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

    def messages(self, cells: list[str]) -> list[dict[str, Any]]:
        """The row's messages: the user's content a string, or text and image_url parts
        where the template placed images (ImageCellError for a cell that names none)."""
        values = dict(zip(self.columns, cells, strict=True))
        out: list[dict[str, Any]] = []
        if self.system is not None:
            refused = _Images(None)
            out.append({"role": "system", "content": self.system.render(_context(values, refused))})
        placed = _Images(self.images)
        text = self.user.render(_context(values, placed))
        out.append({"role": "user", "content": placed.content(text)})
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


class _Images:
    """`image()` for one render: each call keeps the cell's URL and leaves a mark in the
    text, which `content` then splits into text and image_url parts."""

    def __init__(self, cells: ImageCells | None) -> None:
        self.cells = cells
        self.urls: list[str] = []

    def __call__(self, cell: object) -> str:
        if self.cells is None:
            raise ImageCellError("images go in the prompt template, not the system prompt")
        self.urls.append(self.cells.url(cell))
        return _MARK.format(len(self.urls) - 1)

    def content(self, text: str) -> str | list[dict[str, Any]]:
        if not self.urls:
            return text
        pieces = _MARKS.split(text)  # text, index, text, index, ..., text
        if len(pieces) != 2 * len(self.urls) + 1:
            raise ImageCellError("write each image as {{ image(column) }}, with no filter on it")
        parts: list[dict[str, Any]] = []
        for i, piece in enumerate(pieces):
            if i % 2:
                parts.append({"type": "image_url", "image_url": {"url": self.urls[int(piece)]}})
            elif piece.strip():
                parts.append({"type": "text", "text": piece.strip()})
        return parts


class _ImageColumn(str):
    """A column named `image`: its cell's text, and still the function that places an
    image, so that `{{ image(image) }}` works."""

    place: _Images

    def __call__(self, cell: object) -> str:
        return self.place(cell)


def _context(values: dict[str, str], images: _Images) -> dict[str, Any]:
    context: dict[str, Any] = {**values, ROW_NAME: values, IMAGE_NAME: images}
    if IMAGE_NAME in values:
        column = _ImageColumn(values[IMAGE_NAME])
        column.place = images
        context[IMAGE_NAME] = column
    return context


def content_text(content: Any) -> str:
    """A message's text: its content string, or its text parts joined."""
    if isinstance(content, list):
        return "\n".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return str(content or "")


def request_lines(template: RowTemplate, rows: Iterable[tuple[int, list[str]]]) -> Iterator[bytes]:
    """One JSONL request line per row; a row the template cannot render is refused by number."""
    for number, cells in rows:
        try:
            line = template.line(number, cells)
        except APIError:
            raise
        except ImageCellError as exc:
            raise invalid(f"Row {number}: {exc}.", param="template") from None
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
        blank = [""] * len(template.columns)
        fixed = sum(len(content_text(m["content"])) for m in template.messages(blank))
    except Exception:  # a filter that needs a value (int, a loop over it): text alone
        fixed = len(template.spec.template) + len(template.spec.system)
    named = sum(chars.get(name, 0) for name in template.names)
    return math.ceil((rows * fixed + named) / 4)
