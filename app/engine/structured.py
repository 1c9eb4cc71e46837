"""Structured answers: the grammar a JSON schema, `json_object` or a tool call compiles to,
checked before anything runs. llguidance (the engine OpenAI's own structured outputs run on)
compiles and holds it; engine/llama/binding/grammars.py masks each step's logits with it.

Pure: no model and no llama_cpp, so a batch's validation (batches/lifecycle/validate.py) refuses a
schema the engine cannot hold, with the line's number, before the batch starts.

- `strict: true` (and every sheet's columns, every tool with `strict: true`): a keyword
  llguidance cannot hold (`not`, `if`, `uniqueItems`, an unknown `format`, ...) is a 400;
  nothing is silently dropped.
- `strict: false` (OpenAI's default for `response_format` and tools): OpenAI then follows the
  schema on a best-effort basis. batchyard still holds every keyword it can, and leaves out
  (llguidance's `lenient`) only those it cannot.

The JSON is written with fixed separators (`", "` and `": "`, as json.dumps writes it): a
key and its punctuation are then the only continuation, fed as forced tokens (no step each).
"""

from __future__ import annotations

import json
import re
from typing import Any

from app.engine.base import EngineError
from app.errors import invalid

#: How every structured answer spells its JSON (llguidance's JsonCompileOptions).
JSON_OPTIONS: dict[str, Any] = {
    "whitespace_flexible": False,
    "item_separator": ", ",
    "key_separator": ": ",
}
#: `auto` tools: plain text that is not a call opens with anything but `{` or white space
#: (which would let the model put off the choice); a `{` commits to a call that parses.
_CALL_OR_TEXT = "start: call | text\ncall: %json {schema}\ntext: /[^{{ \\t\\r\\n](?s:.*)/\n"


#: Keywords whose values are data, not schemas: left as they are.
_DATA_KEYWORDS = frozenset({"enum", "const", "default", "examples"})
#: Keywords whose values map names to schemas.
_MAP_KEYWORDS = frozenset({"properties", "patternProperties", "$defs", "definitions"})


def closed(schema: Any) -> Any:
    """The schema with `additionalProperties: false` on every object that lists its
    `properties` and says nothing of others: the answer holds the named properties only, as
    llama.cpp's grammar made it and OpenAI's strict mode requires (JSON Schema's own default,
    any other property, lets a small model ramble on in keys it invents)."""
    if isinstance(schema, list):
        return [closed(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in _MAP_KEYWORDS and isinstance(value, dict):
            out[key] = {name: closed(sub) for name, sub in value.items()}
        else:
            out[key] = value if key in _DATA_KEYWORDS else closed(value)
    if isinstance(schema.get("properties"), dict) and "additionalProperties" not in schema:
        out["additionalProperties"] = False
    return out


def _compile(schema: dict[str, Any], *, strict: bool, param: str, what: str) -> str:
    from llguidance import LLMatcher

    options: Any = dict(JSON_OPTIONS, lenient=not strict)
    try:
        grammar: str = LLMatcher.grammar_from_json_schema(closed(schema), overrides=options)
    except ValueError as exc:
        raise invalid(f"{what} is not a JSON schema: {exc}", param=param, cls=EngineError) from None
    error = LLMatcher.validate_grammar(grammar)
    if error:
        hint = " (with 'strict': false, what cannot be held is left out)" if strict else ""
        raise invalid(
            f"{what} cannot be enforced: {error}{hint}.",
            param=param,
            code="unsupported_schema",
            cls=EngineError,
        )
    return grammar


def json_schema_grammar(spec: Any, param: str = "response_format") -> str:
    """The grammar of `response_format: {"type": "json_schema", "json_schema": spec}`."""
    schema = spec.get("schema") if isinstance(spec, dict) else None
    if not isinstance(schema, dict):
        raise invalid(
            "response_format json_schema needs 'json_schema': {'name': ..., 'schema': {...}}.",
            param=param,
            cls=EngineError,
        )
    return _compile(schema, strict=spec.get("strict") is True, param=param, what="The schema")


def json_object_grammar() -> str:
    """`json_object`: any JSON object."""
    return _compile({"type": "object"}, strict=True, param="response_format", what="JSON")


def _embedded(schema: dict[str, Any], strict: bool) -> str:
    """A schema as a Lark grammar's `%json {...}` part, with the answers' JSON options."""
    options = dict(JSON_OPTIONS, lenient=not strict)
    return json.dumps(dict(closed(schema), **{"x-guidance": options}))


def after_thought(
    grammar: str, start: Tag, end: Tag, *, opened: bool, direct: Tag | None = None
) -> str:
    """`grammar` (any compiled one: a schema, json_object, a tool call) for the answer after a
    thought written freely. `opened`: the output starts inside the thought (its template
    opened it) and runs to `end`; else the model may open one with `start`, or answer at once
    (after `direct`, gpt-oss's final channel header). White space may follow the closing tag.
    The thought is free text; only the answer is held. Each tag is its text, and the Lark
    expression of its tokens where the model's vocabulary holds it as special tokens (None:
    plain text; binding/grammars.py's `tag`)."""
    top = json.loads(grammar)
    subs = top["grammars"]
    subs[0]["name"] = "answer0"
    if end[1] is not None:
        thought = f"thought: /(?s:.*)/ {end[1]}\n"
    else:
        # Lark's regex ends at a slash: the tag's own is escaped.
        closing = re.escape(end[0]).replace("/", "\\/")
        thought = f"thought[lazy]: /(?s:.*){closing}/\n"
    answer = "thought /[ \\t\\r\\n]*/ @answer0"
    if opened:
        lark = f"start: {answer}\n"
    else:
        at_once = f"{_expr(direct)} @answer0" if direct is not None else "@answer0"
        lark = f"start: {at_once} | {_expr(start)} {answer}\n"
    top["grammars"] = [{"name": "thought", "lark_grammar": lark + thought}, *subs]
    return json.dumps(top)


#: A tag for after_thought: its text, and its tokens as a Lark expression (None: plain text).
Tag = tuple[str, "str | None"]


def _expr(tag: Tag) -> str:
    return tag[1] if tag[1] is not None else json.dumps(tag[0])


def call_grammar(call_schema: dict[str, Any], *, strict: bool, or_text: bool) -> str:
    """A tool call's grammar: the call object (required, named) or, with `or_text` (auto),
    the call or plain text."""
    grammar = _compile(call_schema, strict=strict, param="tools", what="The functions' parameters")
    if not or_text:
        return grammar
    from llguidance import LLMatcher

    lark = _CALL_OR_TEXT.format(schema=_embedded(call_schema, strict))
    text: str = LLMatcher.grammar_from_lark(lark)
    return text


def _response_format(fmt: Any, param: str) -> None:
    if not isinstance(fmt, dict):
        return
    if fmt.get("type") == "json_schema":
        # Chat nests the schema in `json_schema`; Responses' text.format holds it flat.
        json_schema_grammar(fmt.get("json_schema", fmt), param)


def _tool_schemas(tools: Any) -> list[tuple[dict[str, Any], bool, str]]:
    out: list[tuple[dict[str, Any], bool, str]] = []
    for i, tool in enumerate(tools if isinstance(tools, list) else []):
        if not isinstance(tool, dict):
            continue
        inner = tool.get("function")
        fn: dict[str, Any] = inner if isinstance(inner, dict) else tool
        params = fn.get("parameters")
        if isinstance(params, dict):
            out.append((params, fn.get("strict") is True, f"tools[{i}]"))
    return out


def body_schema_error(body: Any) -> EngineError | None:
    """Why a request body's schemas (response_format, Responses' text.format, its tools'
    parameters) cannot be held, or None: what a batch line is checked for up front."""
    if not isinstance(body, dict):
        return None
    try:
        _response_format(body.get("response_format"), "response_format")
        text = body.get("text")
        if isinstance(text, dict):
            _response_format(text.get("format"), "text.format")
        for schema, strict, param in _tool_schemas(body.get("tools")):
            _compile(schema, strict=strict, param=param, what=f"{param}'s parameters")
    except EngineError as exc:
        return exc
    return None
