"""Function tools for chat: the request's `tools`/`tool_choice` -> a plan, a prompt block,
a grammar that makes a call always parse, and the answer's text -> `tool_calls`.

The model is told about the functions in a system block (the embedded model's chat
template has no tool support, so the block is the one format every model gets) and
answers a call as one JSON object `{"name": ..., "arguments": {...}}`:

- `required` or a named function: the grammar allows only such an object, built from the
  functions' JSON schemas (engine/structured.py), so the call parses and holds its schema.
- `auto`: the grammar allows either that object or plain text that does not start with
  `{`. A small model cannot half-write a call: once it opens a `{` the call must parse.
- `none`: no tools in the prompt and no grammar; earlier calls and results still render.

At most one call per answer, which honours `parallel_tool_calls` either way (it permits
several calls, it never demands them).
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

from app.engine import structured
from app.engine.base import EngineError
from app.engine.llama.jobs.jobs import Function, ToolUse
from app.errors import invalid

#: OpenAI's rule for function names.
NAME_RE = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
MAX_TOOLS = 128


def bad_param(message: str, param: str, code: str = "invalid_value") -> EngineError:
    """A 400 naming `param`, as the engine raises it (also for /v1/responses' fields)."""
    return invalid(message, param=param, code=code, cls=EngineError)


def _function(tool: Any, i: int) -> Function:
    param = f"tools[{i}]"
    if not isinstance(tool, dict):
        raise bad_param(f"{param} must be an object.", param, "invalid_type")
    if tool.get("type") != "function":
        raise bad_param(
            f"{param}.type {tool.get('type')!r} is not supported; only 'function' tools are.",
            f"{param}.type",
        )
    fn = tool.get("function")
    if not isinstance(fn, dict):
        raise bad_param(f"{param}.function must be an object.", f"{param}.function", "invalid_type")
    name = fn.get("name")
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise bad_param(
            f"{param}.function.name must be 1-64 letters, digits, '_' or '-'.",
            f"{param}.function.name",
        )
    description = fn.get("description")
    if description is not None and not isinstance(description, str):
        raise bad_param(
            f"{param}.function.description must be a string.",
            f"{param}.function.description",
            "invalid_type",
        )
    parameters = fn.get("parameters")
    if parameters is not None and not isinstance(parameters, dict):
        raise bad_param(
            f"{param}.function.parameters must be a JSON schema object.",
            f"{param}.function.parameters",
            "invalid_type",
        )
    strict = fn.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise bad_param(
            f"{param}.function.strict must be true or false.",
            f"{param}.function.strict",
            "invalid_type",
        )
    return Function(name, description, parameters, strict is True)


def _named(value: Any, names: list[str], param: str) -> str:
    fn = value.get("function") if isinstance(value, dict) else None
    name = fn.get("name") if isinstance(fn, dict) else None
    if not isinstance(name, str):
        raise bad_param(f"{param} must name a function: {{'function': {{'name': ...}}}}.", param)
    if name not in names:
        raise bad_param(f"{param} names the function {name!r}, which is not among 'tools'.", param)
    return name


def parse_tools(body: dict[str, Any]) -> ToolUse | None:
    """Read and check `tools`, `tool_choice` and `parallel_tool_calls` of a chat body."""
    for legacy in ("functions", "function_call"):
        if body.get(legacy) is not None:
            raise bad_param(
                f"'{legacy}' is deprecated and not supported; use 'tools' and 'tool_choice'.",
                legacy,
            )
    parallel = body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise bad_param(
            "'parallel_tool_calls' must be true or false.", "parallel_tool_calls", "invalid_type"
        )
    tools = body.get("tools")
    choice = body.get("tool_choice")
    if tools is None or tools == []:
        if choice not in (None, "none", "auto"):
            raise bad_param("'tool_choice' needs 'tools' to choose from.", "tool_choice")
        return None
    if not isinstance(tools, list):
        raise bad_param("'tools' must be a list.", "tools", "invalid_type")
    if len(tools) > MAX_TOOLS:
        raise bad_param(f"'tools' takes at most {MAX_TOOLS} functions, got {len(tools)}.", "tools")
    functions = [_function(t, i) for i, t in enumerate(tools)]
    names = [f.name for f in functions]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise bad_param(f"tools[{i}]: the function name {name!r} appears twice.", f"tools[{i}]")
    plan = ToolUse(functions, allowed=list(names), parallel=parallel is not False)
    if choice is None or choice in ("auto", "required", "none"):
        plan.choice = choice or "auto"
    elif isinstance(choice, dict) and choice.get("type") == "function":
        plan.choice = "required"
        plan.named = _named(choice, names, "tool_choice")
        plan.allowed = [plan.named]
    elif isinstance(choice, dict) and choice.get("type") == "allowed_tools":
        spec = choice.get("allowed_tools")
        mode = spec.get("mode") if isinstance(spec, dict) else None
        chosen = spec.get("tools") if isinstance(spec, dict) else None
        if mode not in ("auto", "required") or not isinstance(chosen, list) or not chosen:
            raise bad_param(
                "tool_choice allowed_tools needs {'mode': 'auto'|'required', 'tools': [...]}.",
                "tool_choice",
            )
        plan.choice = mode
        plan.allowed = [_named(t, names, "tool_choice.allowed_tools.tools") for t in chosen]
    else:
        raise bad_param(
            "'tool_choice' must be 'none', 'auto', 'required' or {'type': 'function', "
            "'function': {'name': ...}}.",
            "tool_choice",
        )
    return plan


# -- the prompt ----------------------------------------------------------------------------


def call_text(name: str, arguments: Any) -> str:
    """A call as the model writes it (and as earlier calls are shown to it)."""
    return json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)


def system_block(plan: ToolUse) -> str:
    """The functions and the call format, for the system message."""
    lines = ["You can call these functions, each described in JSON:"]
    for f in plan.functions:
        spec: dict[str, Any] = {"name": f.name}
        if f.description:
            spec["description"] = f.description
        spec["parameters"] = f.parameters or {"type": "object", "properties": {}}
        lines.append(json.dumps(spec, ensure_ascii=False))
    lines.append(
        "To call a function, reply with only one JSON object: "
        '{"name": <function name>, "arguments": <the arguments as a JSON object>}.'
    )
    if plan.named:
        lines.append(f"You must call the function {plan.named} now.")
    elif plan.choice == "required":
        lines.append("You must call one of these functions now: " + ", ".join(plan.allowed) + ".")
    else:
        lines.append("If no function is needed, answer in plain text.")
    return "\n".join(lines)


def with_tools(messages: list[dict[str, str]], plan: ToolUse | None) -> list[dict[str, str]]:
    """Messages (already plain) with the tools block in the system message, when active."""
    if plan is None or not plan.active:
        return messages
    block = system_block(plan)
    if messages and messages[0]["role"] == "system":
        first = messages[0]
        text = f"{first['content']}\n\n{block}" if first["content"] else block
        return [{"role": "system", "content": text}, *messages[1:]]
    return [{"role": "system", "content": block}, *messages]


def assistant_calls_text(tool_calls: Any, index: int) -> tuple[str, dict[str, str]]:
    """An assistant turn's `tool_calls` as the text the model would have written, and the
    call ids it used (id -> function name), for the tool results that follow."""
    param = f"messages[{index}].tool_calls"
    if not isinstance(tool_calls, list):
        raise bad_param(f"{param} must be a list.", param, "invalid_type")
    lines, ids = [], {}
    for j, call in enumerate(tool_calls):
        fn = call.get("function") if isinstance(call, dict) else None
        name = fn.get("name") if isinstance(fn, dict) else None
        args = fn.get("arguments") if isinstance(fn, dict) else None
        if not isinstance(name, str) or not isinstance(args, str):
            raise bad_param(
                f"{param}[{j}] must be {{'id', 'type': 'function', 'function': "
                "{'name': str, 'arguments': str}}.",
                f"{param}[{j}]",
            )
        try:
            parsed = json.loads(args) if args.strip() else {}
        except ValueError:
            parsed = args  # shown as written; the model sees what it was given
        lines.append(call_text(name, parsed))
        if isinstance(call.get("id"), str):
            ids[call["id"]] = name
    return "\n".join(lines), ids


def tool_result_text(name: str | None, content: str) -> str:
    """A `role: tool` message as a user turn, for templates without a tool role."""
    who = f"The function {name}" if name else "The function"
    return f"{who} returned: {content}"


# -- the grammar ---------------------------------------------------------------------------


def _call_schema(plan: ToolUse) -> dict[str, Any]:
    by_name = {f.name: f for f in plan.functions}
    options = [
        {
            "type": "object",
            "properties": {
                "name": {"const": name},
                "arguments": by_name[name].parameters or {"type": "object"},
            },
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for name in plan.allowed
    ]
    # The names are distinct constants, so anyOf is as exclusive as oneOf.
    return options[0] if len(options) == 1 else {"anyOf": options}


def grammar(plan: ToolUse | None) -> str | None:
    """The grammar of this turn's answer: a call (required, named), a call or text (auto),
    or None. A keyword the engine cannot hold is refused when every allowed function is
    `strict`, and left out otherwise (engine/structured.py)."""
    if plan is None or not plan.active:
        return None
    by_name = {f.name: f for f in plan.functions}
    strict = all(by_name[name].strict for name in plan.allowed)
    return structured.call_grammar(
        _call_schema(plan), strict=strict, or_text=plan.choice != "required"
    )


# -- the answer ----------------------------------------------------------------------------


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


def answer_kind(text: str) -> str | None:
    """What an answer held back while tools are active shows itself to be: "call" when it
    opens with `{` (the grammar then makes it one), "text" when it opens with anything
    else, None while it is only white space so far."""
    head = text.lstrip()
    if not head:
        return None
    return "call" if head.startswith("{") else "text"


def parse_calls(text: str, plan: ToolUse) -> list[dict[str, Any]] | None:
    """The answer as chat `tool_calls`, or None when it is text (or a cut-off call)."""
    s = text.strip()
    if not s.startswith("{"):
        return None
    try:
        obj = json.loads(s)
    except ValueError:
        return None
    if not isinstance(obj, dict):
        return None
    name = obj.get("name")
    args = obj.get("arguments", obj.get("parameters"))
    if name not in plan.allowed or not isinstance(args, dict):
        return None
    return [
        {
            "id": new_call_id(),
            "type": "function",
            "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)},
        }
    ]


def calls_of(plan: ToolUse | None, index: int, text: str) -> list[dict[str, Any]] | None:
    """One choice's parsed calls, parsed once so the stream and the final body agree on ids."""
    if plan is None or not plan.active:
        return None
    if index not in plan.calls:
        plan.calls[index] = parse_calls(text, plan)
    return plan.calls[index]
