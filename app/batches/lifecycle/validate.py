"""Input JSONL -> the batch's lines, or every bad line with OpenAI's error codes.

Reads the file as a stream of raw lines, so a 200 MB input never sits in memory whole;
each good line is kept as (offset, length) into the file, not as a copy. Then the batch's
model (`ModelRules`): a name nothing knows fails under --strict-models (`model_not_found`,
each line), a model that cannot fit the memory budget alone fails the batch
(`model_too_large`), and an image line for a model that takes no images fails alone
(`model_takes_no_images`; the batch, under --strict-models).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, BinaryIO

from app.catalog import DEFAULT_ROUTE, Catalog, Entry, lookup
from app.catalog.budget import gib
from app.engine.reasoning import body_error as reasoning_error
from app.engine.structured import body_schema_error
from app.images import has_images
from app.runtime import jsoncodec
from app.wire.endpoints import CHAT, ENDPOINTS

#: A line longer than this is refused on its own (OpenAI's per-request body limit is in MB).
MAX_LINE_BYTES = 32 * 1024 * 1024
#: How many line errors a failed batch reports; more are summed up in one last entry.
MAX_REPORTED_ERRORS = 1000


@dataclass
class Line:
    number: int  # 1-based
    offset: int
    length: int
    custom_id: str
    #: Its body holds an image (a chat `image_url` or a Responses `input_image` part).
    images: bool = False


@dataclass
class LineError:
    code: str
    message: str
    line: int | None = None
    param: str | None = None

    def to_openai(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "param": self.param, "line": self.line}


@dataclass
class Validation:
    lines: list[Line] = field(default_factory=list)
    errors: list[LineError] = field(default_factory=list)
    model: str | None = None

    @property
    def ok(self) -> bool:
        return not self.errors and bool(self.lines)

    def reported_errors(self) -> list[dict[str, Any]]:
        shown = [e.to_openai() for e in self.errors[:MAX_REPORTED_ERRORS]]
        extra = len(self.errors) - MAX_REPORTED_ERRORS
        if extra > 0:
            shown.append(
                LineError(
                    "too_many_errors",
                    f"{extra} more lines have errors; fix the ones above and retry.",
                ).to_openai()
            )
        return shown


def raw_lines(stream: BinaryIO, chunk_size: int = 1 << 20) -> Iterator[tuple[int, bytes, bool]]:
    """Yield (offset, line bytes without the newline, too_long) for each line of a stream.

    A line past MAX_LINE_BYTES is not kept in memory: it is skipped up to its newline and
    reported once with too_long set.
    """
    buf = b""
    buf_start = 0  # file offset of buf[0]
    dropping = False
    drop_start = 0
    while chunk := stream.read(chunk_size):
        buf += chunk
        pos = 0
        while (nl := buf.find(b"\n", pos)) >= 0:
            if dropping:
                yield drop_start, b"", True
                dropping = False
            elif nl - pos > MAX_LINE_BYTES:
                # Over the cap but ended inside the chunk that crossed it.
                yield buf_start + pos, b"", True
            else:
                yield buf_start + pos, buf[pos:nl], False
            pos = nl + 1
        buf_start += pos
        buf = buf[pos:]
        if len(buf) > MAX_LINE_BYTES:
            if not dropping:
                dropping, drop_start = True, buf_start
            buf_start += len(buf)
            buf = b""
    if dropping:
        yield drop_start, b"", True
    elif buf:
        yield buf_start, buf, len(buf) > MAX_LINE_BYTES


def first_endpoint(stream: BinaryIO) -> str:
    """The endpoint a batch file is for: the first non-blank line's `url` if it names a
    known endpoint, chat completions otherwise (validation then reports each line that
    does not match). A byte-order mark before the first line is skipped, as validation does.
    """
    for number, (_offset, raw, too_long) in enumerate(raw_lines(stream), start=1):
        if number == 1 and raw.startswith(b"\xef\xbb\xbf"):
            raw = raw[3:]
        if too_long:
            break
        if not raw.strip():
            continue
        try:
            url = json.loads(raw).get("url")
        except (ValueError, AttributeError, RecursionError):
            break
        return url if url in ENDPOINTS else CHAT
    return CHAT


#: The id a model name means (`ModelRules.model_ids`), or None for a name nothing knows.
ModelIds = Callable[[str], str | None]


def validate_jsonl(
    stream: BinaryIO,
    endpoint: str,
    *,
    max_requests: int = 50_000,
    model_ids: ModelIds | None = None,
) -> Validation:
    return validate_lines(
        raw_lines(stream), endpoint, max_requests=max_requests, model_ids=model_ids
    )


def validate_lines(
    lines: Iterable[tuple[int, bytes, bool]],
    endpoint: str,
    *,
    max_requests: int = 50_000,
    model_ids: ModelIds | None = None,
) -> Validation:
    """The batch's lines, or its errors. `model_ids` tells which names mean one model
    (`same_model`); without it (the dashboard's preview) names are compared by
    `app.catalog.lookup`'s rule alone."""
    result = Validation()
    rules = _LineRules(endpoint, result, model_ids)
    requests = 0
    for number, (offset, raw, too_long) in enumerate(lines, start=1):
        read = rules.read(number, offset, raw, too_long)
        if read is None:
            continue  # a blank line
        if isinstance(read, LineError):
            result.errors.append(read)
            continue
        requests += 1
        if requests > max_requests:
            result.errors.append(
                LineError(
                    "too_many_requests",
                    f"A batch may hold at most {max_requests} requests; this file has more "
                    f"(line {number} is request {requests}).",
                    line=number,
                )
            )
            break
        result.lines.append(read)
    if not result.lines and not result.errors:
        result.errors.append(
            LineError("empty_file", "The batch input file is empty: it holds no requests.")
        )
    return result


@dataclass
class _Decoded:
    """A line's JSON object and the span of its bytes in the file (no BOM, no CR)."""

    obj: dict[str, Any]
    offset: int
    length: int


def _decode(number: int, offset: int, raw: bytes, too_long: bool) -> _Decoded | LineError | None:
    """A raw line's bytes as a JSON object, or why they are not one; None for a blank line."""
    if too_long:
        return LineError(
            "line_too_long",
            f"This line is longer than the limit of {MAX_LINE_BYTES} bytes.",
            line=number,
        )
    # Byte-order mark on the first line: an editor's habit, harmless; skip it.
    start = offset
    if number == 1 and raw.startswith(b"\xef\xbb\xbf"):
        raw = raw[3:]
        start += 3
    length = len(raw)
    if raw.endswith(b"\r"):
        raw = raw[:-1]
        length -= 1
    if raw.strip() == b"":
        return None
    try:
        # msgspec, as the runner decodes the line again: what passes here runs there
        # (the standard library's json also took NaN and lone surrogates), at about half
        # the cost a line (bench/fleet.py's 50,000 lines: 0.30 -> 0.15 s).
        obj = jsoncodec.loads(raw)
    except (ValueError, RecursionError):
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            return LineError(
                "invalid_encoding",
                f"This line is not valid UTF-8 (byte {exc.start} of the line).",
                line=number,
            )
        return LineError(
            "invalid_json_line", "This line is not parseable as valid JSON.", line=number
        )
    if not isinstance(obj, dict):
        return LineError("invalid_json_line", "Each line must be a JSON object.", line=number)
    return _Decoded(obj, start, length)


class _LineRules:
    """The request rules, line by line, with what the lines before established: the
    custom_ids seen (and where), and the batch's model (the first line to name a valid
    one sets it, `result.model`)."""

    def __init__(self, endpoint: str, result: Validation, model_ids: ModelIds | None) -> None:
        self.endpoint = endpoint
        self.result = result
        self.seen_ids: dict[str, int] = {}
        self.model_ids = model_ids
        #: Names judged against the batch's model already (a batch repeats one or two).
        self.same: dict[str, bool] = {}

    def read(self, number: int, offset: int, raw: bytes, too_long: bool) -> Line | LineError | None:
        """One raw line as a batch line, or its error; None for a blank line."""
        decoded = _decode(number, offset, raw, too_long)
        if decoded is None or isinstance(decoded, LineError):
            return decoded
        obj = decoded.obj
        error = (
            self._id_error(obj, number)
            or _target_error(obj, number, self.endpoint)
            or self._model_error(obj["body"], number)
            or _stream_error(obj["body"], number)
            or _body_error(obj["body"], number)
        )
        if error is not None:
            return error
        return Line(
            number=number,
            offset=decoded.offset,
            length=decoded.length,
            custom_id=obj["custom_id"],
            images=has_images(self.endpoint, obj["body"]),
        )

    def _id_error(self, obj: dict[str, Any], number: int) -> LineError | None:
        """custom_id: present, a non-empty string, not used before. A good one is kept as
        seen, whatever the rules after it say of this line."""
        custom_id = obj.get("custom_id")
        if custom_id is None:
            return LineError(
                "missing_required_parameter",
                "Missing required parameter: 'custom_id'.",
                line=number,
                param="custom_id",
            )
        if not isinstance(custom_id, str) or not custom_id:
            return LineError(
                "invalid_custom_id",
                "custom_id must be a non-empty string.",
                line=number,
                param="custom_id",
            )
        if custom_id in self.seen_ids:
            return LineError(
                "duplicate_custom_id",
                f"The custom_id '{custom_id}' is a duplicate of line {self.seen_ids[custom_id]}. "
                "The custom_id parameter must be unique for each request in a batch.",
                line=number,
                param="custom_id",
            )
        self.seen_ids[custom_id] = number
        return None

    def _model_error(self, body: dict[str, Any], number: int) -> LineError | None:
        """body.model: the batch's model (the first valid one named sets it); a line may
        spell it another way (`gemma3`, `gemma3:latest`, `Gemma3`) that means one model."""
        model = body["model"]
        result = self.result
        if result.model is None:
            result.model = model
        elif model != result.model and not self._same(model, result.model):
            first = result.lines[0].number if result.lines else number
            return LineError(
                "mismatched_model",
                f"All requests in a batch must name the same model: line {first} names "
                f"'{result.model}', this line names '{model}'.",
                line=number,
                param="body.model",
            )
        return None

    def _same(self, model: str, first: str) -> bool:
        if model not in self.same:
            self.same[model] = same_model(model, first, self.model_ids)
        return self.same[model]


def same_model(a: str, b: str, model_ids: ModelIds | None = None) -> bool:
    """Whether two names of a batch's lines mean one model: both resolve to one id
    (`model_ids`), or, where neither means a known model, one is the other by
    `app.catalog.lookup`'s rule (`foo` and `Foo:latest`: the default model's lines)."""
    if model_ids is not None:
        a_id, b_id = model_ids(a), model_ids(b)
        if a_id is not None or b_id is not None:
            return a_id == b_id
    return lookup({a: a}, b) is not None or lookup({b: b}, a) is not None


def _target_error(obj: dict[str, Any], number: int, endpoint: str) -> LineError | None:
    """method POST, the batch's url, a body object that names a model."""
    if obj.get("method") != "POST":
        return LineError(
            "invalid_method",
            "The method for this request must be 'POST'.",
            line=number,
            param="method",
        )
    url = obj.get("url")
    if url != endpoint:
        return LineError(
            "invalid_url",
            f"The URL for this request does not match the batch's endpoint: expected '{endpoint}', "
            f"got {json.dumps(url)}.",
            line=number,
            param="url",
        )
    body = obj.get("body")
    if not isinstance(body, dict):
        return LineError(
            "invalid_request",
            "The body of this request must be a JSON object.",
            line=number,
            param="body",
        )
    model = body.get("model")
    if not isinstance(model, str) or not model:
        return LineError(
            "missing_required_parameter",
            "Missing required parameter: 'body.model'.",
            line=number,
            param="body.model",
        )
    return None


def _stream_error(body: dict[str, Any], number: int) -> LineError | None:
    """No streaming in a batch."""
    if body.get("stream"):
        return LineError(
            "invalid_request",
            "Streaming ('stream': true) is not supported in a batch.",
            line=number,
            param="body.stream",
        )
    return None


def _body_error(body: dict[str, Any], number: int) -> LineError | None:
    """A schema (response_format, text.format, a tool's parameters) whose keywords the
    grammar cannot hold under `strict` (engine/structured.py), or a reasoning control out of
    range (engine/reasoning.py): refused here, not at run time."""
    error = body_schema_error(body) or reasoning_error(body)
    if error is None:
        return None
    param = f"body.{error.param}" if error.param else "body"
    return LineError(error.code or "invalid_value", error.message, line=number, param=param)


# -- the batch's model ------------------------------------------------------------------


@dataclass
class Routed:
    """Where a batch's lines run, or why they cannot."""

    #: The id of the model they run on (a catalog entry's id, or an upstream's name of its
    #: model), or "" for a name nothing known means: the default model's lines.
    route: str
    #: Errors that fail the batch.
    errors: list[LineError] = field(default_factory=list)
    #: Lines that fail alone, at validation, while the others run (an image line for a
    #: model that takes no images, without --strict-models).
    refused: list[LineError] = field(default_factory=list)


@dataclass
class ModelRules:
    """How validation judges the model a batch names, as the node knows models now.

    `route()` is the one place a line's model name is read: once, at validation, into the
    route its batch keeps (`Batch.route`), which the claims, the model pool's demand, the
    projection, the batch page, /metrics and the line itself when it runs use and nothing
    else (`model_ids()` reads each line's name the same way, to tell the spellings of one
    model from another model). A name is known when this node's engines serve it
    (`serving`: every name they serve, by `app.catalog.lookup`'s rule), or
    another live node publishes it (`elsewhere()`: name -> id, read by the same rules). A
    name nothing knows runs on the default model, or with `strict` (--strict-models)
    fails every line as `model_not_found`. The model that would run the batch here must fit
    `budget()` (bytes) alone, or the batch fails as `model_too_large`; a model another node
    publishes fits that node's budget (it publishes only those).
    """

    catalog: Catalog
    elsewhere: Callable[[], Mapping[str, str]]
    budget: Callable[[], int]
    strict: bool = False
    #: This node's engines: the id that serves a name here and its catalog entry (None for
    #: an upstream's model), or None; by default this node's catalog alone.
    serving: Callable[[str], tuple[str, Entry | None] | None] | None = None
    #: The catalog's entries are what runs here (the embedded engine is the pool of them),
    #: so an entry without a projector refuses image lines at validation. False for a lone
    #: engine (a test's), which answers an image it cannot take when the line runs.
    pooled: bool = True

    def route(self, model: str | None, lines: list[Line]) -> Routed:
        """The route of a batch whose lines name `model`, with its errors (none when it may
        run)."""
        if model is None:
            return self._on_default(model, lines)
        here = self._here(model)
        budget = self.budget()
        if here is not None and (here[1] is None or not _needs_more(here[1], budget)):
            return self._sees(Routed(here[0]), model, here[1], lines)
        there = lookup(self.elsewhere(), model)
        if there is not None:
            return Routed(there)  # another node serves it
        if here is None:
            return self._on_default(model, lines)
        entry = here[1]
        assert entry is not None and entry.estimate is not None
        return Routed(here[0], [_too_large(f"The model '{model}'", entry, budget)])

    def _sees(self, routed: Routed, model: str, entry: Entry | None, lines: list[Line]) -> Routed:
        """The image lines of a model of this catalog that has no projector: each fails at
        validation, or with `strict` the whole batch does. (An upstream's or another node's
        model answers an image it cannot take with its own error when the line runs.)"""
        if entry is None or entry.takes_images or not self.pooled:
            return routed
        refused = [
            LineError(
                "model_takes_no_images",
                f"The model '{model}' takes no images (it has no multimodal projector), and "
                f"line {line.number} holds one. GET /v1/models lists the models whose "
                'input_modalities include "image".',
                line=line.number,
                param="body.model",
            )
            for line in lines
            if line.images
        ]
        if self.strict:
            routed.errors += refused
        else:
            routed.refused += refused
        return routed

    def model_ids(self) -> ModelIds:
        """The id each name means, as `route` reads it (this node's engines, else another
        node's; None for a name nothing knows), for one batch's validation: other nodes'
        names are read once, and each name is resolved once."""
        elsewhere: list[Mapping[str, str]] = []
        ids: dict[str, str | None] = {}

        def model_id(name: str) -> str | None:
            if name not in ids:
                here = self._here(name)
                if here is not None:
                    ids[name] = here[0]
                else:
                    if not elsewhere:
                        elsewhere.append(self.elsewhere())
                    ids[name] = lookup(elsewhere[0], name)
            return ids[name]

        return model_id

    def _here(self, model: str) -> tuple[str, Entry | None] | None:
        if self.serving is not None:
            return self.serving(model)
        entry = self.catalog.resolve(model)
        return (entry.id, entry) if entry is not None else None

    def _on_default(self, model: str | None, lines: list[Line]) -> Routed:
        """A batch whose lines name no known model: the default model's, unless strict."""
        if model is not None and self.strict:
            return Routed(DEFAULT_ROUTE, [_not_found(model, line.number) for line in lines])
        entry = self.catalog.default()
        budget = self.budget()
        if model is None or not _needs_more(entry, budget):
            return self._sees(Routed(DEFAULT_ROUTE), model or entry.id, entry, lines)
        what = f"The model '{model}' names no model here and runs on the default model "
        what += f"'{entry.id}', which"
        return Routed(DEFAULT_ROUTE, [_too_large(what, entry, budget)])


def _too_large(what: str, entry: Entry, budget: int) -> LineError:
    assert entry.estimate is not None
    return LineError(
        "model_too_large",
        f"{what} needs {gib(entry.estimate.total)}, the budget is {gib(budget)} "
        "(--models-memory, by default the free memory less 1 GiB): it cannot be loaded.",
        param="body.model",
    )


def _needs_more(entry: Entry, budget: int) -> bool:
    """The model's estimate alone exceeds the budget (no estimate: its file is unreadable,
    and its lines fail with that reason when they run)."""
    return entry.estimate is not None and entry.estimate.total > budget


def _not_found(model: str, number: int) -> LineError:
    return LineError(
        "model_not_found",
        f"The model '{model}' does not exist: no model of this server's nodes or upstreams "
        "has that name (--strict-models). GET /v1/models lists them.",
        line=number,
        param="body.model",
    )
