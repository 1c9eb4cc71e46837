"""`/v1/responses` over the chat path, the request side: a Responses body -> the chat body
it runs as (responses_answer.py builds the answer).

The request becomes chat messages, sampling fields, a response format and tools, so prefix
cache, grammar and sampling are the chat path's. What the engine cannot honour (stored
responses, background runs, built-in tools) is a 400 that names the parameter. `reasoning`
runs as chat's `reasoning_effort` (engine/reasoning.py); a model that does not reason ignores it.
Responses are not stored: `store` is accepted either way.
"""

from __future__ import annotations

from typing import Any

from app.engine.base import EngineError
from app.engine.llama.jobs.jobs import ResponseRequest
from app.engine.llama.jobs.oai.tools import bad_param
from app.engine.reasoning import responses_effort
from app.engine.tiers import service_tier
from app.errors import missing
from app.wire.endpoints import RESPONSES
from app.wire.image_parts import image_part

#: Fields a Responses body may carry; anything else is refused by name, like OpenAI does.
KNOWN = {
    "model", "input", "instructions", "max_output_tokens", "temperature", "top_p", "text",
    "tools", "tool_choice", "parallel_tool_calls", "store", "metadata", "stream",
    "stream_options", "user", "safety_identifier", "prompt_cache_key", "prompt_cache_retention",
    "truncation", "service_tier", "include", "background", "previous_response_id",
    "conversation", "reasoning", "top_logprobs", "max_tool_calls", "prompt",
    # llama-server's and vLLM's own, as on chat (engine/reasoning.py reads them)
    "thinking_token_budget", "chat_template_kwargs", "reasoning_format",
}  # fmt: skip
#: Those the chat body they run as takes as they are.
_PASSED = ("temperature", "top_p", "parallel_tool_calls", "thinking_token_budget",
           "chat_template_kwargs", "reasoning_format")  # fmt: skip
#: Fields only OpenAI's own stored state or hosted features can serve, and why.
REFUSED = {
    "previous_response_id": "this server does not keep responses; send the earlier turns "
    "(with their function_call and function_call_output items) in 'input'",
    "conversation": "this server does not keep conversations; send the turns in 'input'",
    "prompt": "stored prompt templates are not available here; send 'instructions'",
}
MAX_METADATA_KEYS = 16
#: `include` values taken: batch files written for reasoning models ask for the thought's
#: encrypted form; here a thought is never encrypted, so the item's `encrypted_content` is
#: null and its text is in `content`.
INCLUDABLE = ("reasoning.encrypted_content",)
#: Responses' `reasoning.summary` values (the `openai` SDK's Reasoning type). No summary
#: is written: the thought itself is in the item's `content`, its `summary` stays [].
SUMMARIES = ("auto", "concise", "detailed")
#: Chat parameter names -> the Responses names a user sent, for errors from the chat path.
_RENAMES = (
    ("max_completion_tokens", "max_output_tokens"),
    ("max_tokens", "max_output_tokens"),
    ("response_format", "text.format"),
    ("messages", "input"),
    ("reasoning_effort", "reasoning.effort"),
    (".function.", "."),
)


# -- request -------------------------------------------------------------------------------


def _text(content: Any, param: str, kinds: tuple[str, ...]) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad_param(
            f"{param} must be a string or a list of content parts.", param, "invalid_type"
        )
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in kinds or not isinstance(part.get("text"), str):
            raise bad_param(
                f"{param}[{j}]: only text parts ({', '.join(kinds)}) are supported, got {kind!r}.",
                f"{param}[{j}]",
            )
        texts.append(part["text"])
    return "".join(texts)


def _user_content(content: Any, param: str) -> str | list[dict[str, Any]]:
    """A user message's content: its text, or chat parts when it holds `input_image` parts
    (each one a chat `image_url` part, so the chat path places the image)."""
    if not isinstance(content, list) or not any(
        image_part(RESPONSES, part) is not None for part in content
    ):
        return _text(content, param, ("input_text",))
    parts: list[dict[str, Any]] = []
    for j, part in enumerate(content):
        if (found := image_part(RESPONSES, part)) is not None:
            if found.url is None:
                what = "a file_id" if found.file_id is not None else "no image_url"
                raise bad_param(
                    f"{param}[{j}] has {what}; the embedded engine takes an image as a data "
                    "URL in 'image_url'.",
                    f"{param}[{j}].image_url",
                )
            image: dict[str, Any] = {"url": found.url}
            if found.detail is not None:
                image["detail"] = found.detail
            parts.append({"type": "image_url", "image_url": image})
        elif (
            isinstance(part, dict)
            and part.get("type") == "input_text"
            and isinstance(part.get("text"), str)
        ):
            parts.append({"type": "text", "text": part["text"]})
        else:
            kind = part.get("type") if isinstance(part, dict) else None
            raise bad_param(
                f"{param}[{j}]: only input_text and input_image parts are taken, got {kind!r}.",
                f"{param}[{j}]",
            )
    return parts


def _messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise bad_param("'instructions' must be a string.", "instructions", "invalid_type")
        out.append({"role": "system", "content": instructions})
    items = body.get("input")
    if items is None:
        raise missing("input", cls=EngineError)
    if isinstance(items, str):
        return [*out, {"role": "user", "content": items}]
    if not isinstance(items, list) or not items:
        raise bad_param(
            "'input' must be a string or a non-empty list of items.", "input", "invalid_type"
        )
    out = _items(items, out)
    # A reasoning item with no message after it is a thought alone: an empty answer.
    for message in out:
        if (
            message["role"] == "assistant"
            and message["content"] is None
            and "tool_calls" not in message
        ):
            message["content"] = ""
    return out


def _reasoning_input(item: dict[str, Any], p: str) -> str:
    """An input reasoning item's thought: its `content` texts, else its summary's."""
    for key in ("content", "summary"):
        parts = item.get(key)
        if isinstance(parts, list) and parts:
            texts = [x.get("text") for x in parts if isinstance(x, dict)]
            if all(isinstance(t, str) for t in texts):
                return "".join(t for t in texts if t)
    if isinstance(item.get("summary"), list):
        return ""
    raise bad_param(
        f"{p} is a reasoning item: it needs 'summary' (a list, maybe empty) and may have "
        "'content' [{'type': 'reasoning_text', 'text': ...}].",
        f"{p}.summary",
        "missing_required_parameter",
    )


def _items(items: list[Any], out: list[dict[str, Any]]) -> list[dict[str, Any]]:
    for i, item in enumerate(items):
        p = f"input[{i}]"
        if not isinstance(item, dict):
            raise bad_param(f"{p} must be an object.", p, "invalid_type")
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise bad_param(
                    f"{p}.role {role!r} is not supported; use user, system, developer or assistant.",
                    f"{p}.role",
                )
            content = item.get("content")
            if role == "assistant":
                kinds = ("output_text", "input_text")
                text = _text(content, f"{p}.content", kinds)
                if out and out[-1]["role"] == "assistant" and out[-1]["content"] is None:
                    out[-1]["content"] = text  # after its reasoning item
                else:
                    out.append({"role": role, "content": text})
            else:
                out.append({"role": role, "content": _user_content(content, f"{p}.content")})
        elif kind == "function_call":
            call_id, name, args = item.get("call_id"), item.get("name"), item.get("arguments")
            if not all(isinstance(x, str) for x in (call_id, name, args)):
                raise bad_param(f"{p} needs string 'call_id', 'name' and 'arguments'.", p)
            call = {
                "id": call_id,
                "type": "function",
                "function": {"name": name, "arguments": args},
            }
            if out and out[-1]["role"] == "assistant":
                out[-1].setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "reasoning":
            # An earlier turn's thought: the next assistant turn carries it, and the
            # template decides whether to show it to the model.
            thought = _reasoning_input(item, p)
            out.append({"role": "assistant", "content": None, "reasoning_content": thought})
        elif kind == "function_call_output":
            call_id = item.get("call_id")
            if not isinstance(call_id, str):
                raise bad_param(
                    f"{p}.call_id is required.", f"{p}.call_id", "missing_required_parameter"
                )
            output = _text(item.get("output"), f"{p}.output", ("input_text", "output_text"))
            out.append({"role": "tool", "tool_call_id": call_id, "content": output})
        else:
            raise bad_param(
                f"{p}.type {kind!r} is not supported; input items are messages, "
                "function_call and function_call_output.",
                f"{p}.type",
            )
    return out


def _response_format(text: Any) -> dict[str, Any] | None:
    if text is None:
        return None
    if not isinstance(text, dict):
        raise bad_param("'text' must be an object.", "text", "invalid_type")
    verbosity = text.get("verbosity")
    if verbosity not in (None, "medium"):
        raise bad_param(
            "'text.verbosity' cannot be honoured by this model; omit it.", "text.verbosity"
        )
    fmt = text.get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict):
        raise bad_param(
            "'text.format' must be an object with a 'type'.", "text.format", "invalid_type"
        )
    if fmt.get("type") == "json_schema":
        spec = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
        return {"type": "json_schema", "json_schema": spec}
    return fmt  # text / json_object / anything else: the chat path names what it refuses


def _tools(raw: Any) -> list[dict[str, Any]] | None:
    if raw is None:
        return None
    if not isinstance(raw, list):
        raise bad_param("'tools' must be a list.", "tools", "invalid_type")
    out = []
    for i, tool in enumerate(raw):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind != "function":
            raise bad_param(
                f"tools[{i}].type {kind!r} is not supported: this server runs no built-in tools; "
                "only 'function' tools are.",
                f"tools[{i}].type",
            )
        fn = {k: tool[k] for k in ("name", "description", "parameters", "strict") if k in tool}
        out.append({"type": "function", "function": fn})
    return out


def _tool_choice(choice: Any) -> Any:
    if choice is None or isinstance(choice, str):
        return choice
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind == "function":
        return {"type": "function", "function": {"name": choice.get("name")}}
    if kind == "allowed_tools":
        chosen = choice.get("tools")
        return {
            "type": "allowed_tools",
            "allowed_tools": {
                "mode": choice.get("mode"),
                "tools": [
                    {"type": "function", "function": {"name": t.get("name")}}
                    for t in (chosen if isinstance(chosen, list) else [])
                    if isinstance(t, dict)
                ],
            },
        }
    raise bad_param(
        f"tool_choice type {kind!r} is not supported; use 'none', 'auto', 'required' or "
        "{'type': 'function', 'name': ...}.",
        "tool_choice",
    )


def _refuse_unsupported(body: dict[str, Any]) -> None:
    for key in body:
        if key not in KNOWN:
            raise bad_param(
                f"Unrecognized request argument supplied: '{key}'.", key, "unknown_parameter"
            )
    for key, why in REFUSED.items():
        if body.get(key) is not None:
            raise bad_param(f"'{key}' is not supported: {why}.", key, "unsupported_parameter")
    if body.get("background"):
        raise bad_param(
            "'background' responses are not supported; use the Batch API for work that may "
            "wait, or a normal (optionally streamed) request.",
            "background",
            "unsupported_parameter",
        )
    include = body.get("include")
    if include and (not isinstance(include, list) or set(include) - set(INCLUDABLE)):
        raise bad_param(
            f"'include' may only list {', '.join(INCLUDABLE)}: no other output data is available.",
            "include",
            "unsupported_parameter",
        )
    if body.get("top_logprobs"):
        raise bad_param("'top_logprobs' is not supported on /v1/responses.", "top_logprobs")
    if body.get("truncation") not in (None, "disabled"):
        raise bad_param(
            "'truncation' must be 'disabled': input is never cut to fit; a too-long input "
            "is refused.",
            "truncation",
        )
    service_tier(body.get("service_tier"), cls=EngineError)
    store = body.get("store")
    if store is not None and not isinstance(store, bool):
        raise bad_param("'store' must be true or false.", "store", "invalid_type")
    metadata = body.get("metadata")
    if metadata is not None and (
        not isinstance(metadata, dict)
        or len(metadata) > MAX_METADATA_KEYS
        or not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items())
    ):
        raise bad_param(
            f"'metadata' must be an object of at most {MAX_METADATA_KEYS} string values.",
            "metadata",
        )
    limit = body.get("max_output_tokens")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise bad_param(
            "'max_output_tokens' must be an integer of at least 1.", "max_output_tokens"
        )


def to_chat(body: dict[str, Any]) -> tuple[dict[str, Any], ResponseRequest]:
    """A Responses body as the chat body the engine runs, and what the answer echoes."""
    _refuse_unsupported(body)
    chat: dict[str, Any] = {"model": body.get("model"), "messages": _messages(body)}
    for key in _PASSED:
        if body.get(key) is not None:
            chat[key] = body[key]
    if body.get("max_output_tokens") is not None:
        chat["max_completion_tokens"] = body["max_output_tokens"]
    asked = _reasoning(body.get("reasoning"))
    if asked["effort"] is not None:
        chat["reasoning_effort"] = asked["effort"]
    fmt = _response_format(body.get("text"))
    if fmt is not None:
        chat["response_format"] = fmt
    chat_tools = _tools(body.get("tools"))
    if chat_tools is not None:
        chat["tools"] = chat_tools
    choice = _tool_choice(body.get("tool_choice"))
    if choice is not None:
        chat["tool_choice"] = choice
    text = body.get("text")
    if not isinstance(text, dict):
        text = {}
    echo = {
        "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"),
        "max_tool_calls": body.get("max_tool_calls"),
        "metadata": body.get("metadata") or {},
        "parallel_tool_calls": body.get("parallel_tool_calls") is not False,
        "temperature": body.get("temperature", 1.0),
        "top_p": body.get("top_p", 1.0),
        "text": {"format": text.get("format") or {"type": "text"}, "verbosity": "medium"},
        "tool_choice": body.get("tool_choice") or "auto",
        "tools": [
            {"parameters": None, "strict": None, **t}
            for t in (body.get("tools") or [])
            if isinstance(t, dict)
        ],
        "user": body.get("user"),
        "safety_identifier": body.get("safety_identifier"),
        "prompt_cache_key": body.get("prompt_cache_key"),
    }
    return chat, ResponseRequest(echo, reasoning=asked)


def _reasoning(value: Any) -> dict[str, Any]:
    """The `reasoning` object ({effort, summary}), checked: its effort runs as chat's
    `reasoning_effort` (checked there against reasoning.EFFORTS)."""
    effort = responses_effort(value)
    if value is None:
        return {"effort": None, "summary": None}
    summary = value.get("summary", value.get("generate_summary"))
    if summary is not None and summary not in SUMMARIES:
        raise bad_param(
            f"Invalid value for 'reasoning.summary': {summary!r}. Supported values are: "
            + ", ".join(repr(x) for x in SUMMARIES)
            + ".",
            "reasoning.summary",
        )
    return {"effort": effort, "summary": summary}


def renamed(exc: EngineError) -> EngineError:
    """An error from the chat path, in the Responses parameter names the user sent."""
    message, param = exc.message, exc.param
    for old, new in _RENAMES:
        message = message.replace(f"'{old}'", f"'{new}'")
        if param is not None:
            param = param.replace(old, new) if old.startswith(".") else _rename(param, old, new)
    return EngineError(
        message, status_code=exc.status_code, code=exc.code, param=param, type=exc.type
    )


def _rename(param: str, old: str, new: str) -> str:
    return new + param[len(old) :] if param == old or param.startswith(old + "[") else param
