"""Chat messages -> one prompt string through the model's own GGUF chat template."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from app.engine import reasoning
from app.engine.base import EngineError
from app.engine.llama.jobs.jobs import ToolUse
from app.engine.llama.jobs.oai import tools
from app.engine.llama.jobs.oai.media import Media, takes_no_images
from app.wire.endpoints import CHAT
from app.wire.image_parts import image_part

if TYPE_CHECKING:
    from llama_cpp.llama_types import ChatCompletionRequestMessage

# llama.cpp falls back to ChatML when a model ships no template; so do we.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

ROLES = ("system", "developer", "user", "assistant", "tool")


def message_text(
    content: Any, index: int, media: Media | None = None, model: tuple[str, str | None] = ("", None)
) -> str:
    """A message's content as plain text: a string, or a list of {"type": "text"} parts and
    {"type": "image_url"} parts. Each image goes into `media`, and its marker into the text;
    without `media` (a model that takes no images) an image part is a 400."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for j, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            if (image := image_part(CHAT, part)) is not None:
                param = f"messages[{index}].content[{j}].image_url"
                if media is None:
                    raise takes_no_images(model[0] or "this model", param, model[1])
                texts.append(media.add(image.url, f"{param}.url"))
                continue
            if kind != "text" or not isinstance(part.get("text"), str):
                raise EngineError(
                    f"messages[{index}].content: only text and image_url parts are supported, "
                    f"got {kind!r}.",
                    param=f"messages[{index}].content",
                    code="invalid_value",
                )
            texts.append(part["text"])
        return "".join(texts)
    raise EngineError(
        f"messages[{index}].content must be a string or a list of text parts.",
        param=f"messages[{index}].content",
        code="invalid_type",
    )


def normalise_messages(
    messages: Any, media: Media | None = None, model: tuple[str, str | None] = ("", None)
) -> list[dict[str, str]]:
    """Check the roles and flatten each content to a string, as chat templates expect.

    An assistant turn's `tool_calls` become the call text the model writes, and a `tool`
    message a user turn saying what the function returned (tools.py), so every
    template, with tool support or without, renders a conversation with tool calls.
    Images go into `media`; `model` is the model's name, and why it has no projector if
    one failed to load: the words of the error for an image it cannot take.
    """
    if not isinstance(messages, list) or not messages:
        raise EngineError(
            "'messages' must be a non-empty list.", param="messages", code="invalid_value"
        )
    out = []
    call_names: dict[str, str] = {}
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise EngineError(
                f"messages[{i}] must be an object.", param=f"messages[{i}]", code="invalid_type"
            )
        role = message.get("role")
        if role not in ROLES:
            raise EngineError(
                f"messages[{i}].role {role!r} is not supported; use one of {', '.join(ROLES)}.",
                param=f"messages[{i}].role",
                code="invalid_value",
            )
        content = message_text(message.get("content"), i, media, model)
        if role == "assistant" and message.get("tool_calls"):
            calls, ids = tools.assistant_calls_text(message["tool_calls"], i)
            call_names.update(ids)
            content = f"{content}\n{calls}" if content else calls
        elif role == "tool":
            call_id = message.get("tool_call_id")
            if not isinstance(call_id, str):
                raise EngineError(
                    f"messages[{i}].tool_call_id is required for a tool message.",
                    param=f"messages[{i}].tool_call_id",
                    code="missing_required_parameter",
                )
            role, content = "user", tools.tool_result_text(call_names.get(call_id), content)
        # Templates know "system"; OpenAI's newer "developer" role means the same thing.
        entry = {"role": "system" if role == "developer" else role, "content": content}
        thought = _earlier_thought(message, i) if role == "assistant" else None
        if thought is not None:
            entry["reasoning_content"] = thought
        out.append(entry)
    return out


def _earlier_thought(message: dict[str, Any], index: int) -> str | None:
    """An earlier assistant turn's thought (`reasoning_content`, as llama-server and SGLang
    send it, or `reasoning`, as vLLM and Ollama do): the template decides whether to render
    it (Qwen3's renders the last turns' thoughts, most drop them)."""
    for key in ("reasoning_content", "reasoning"):
        value = message.get(key)
        if value is None:
            continue
        if not isinstance(value, str):
            raise EngineError(
                f"messages[{index}].{key} must be a string.",
                param=f"messages[{index}].{key}",
                code="invalid_type",
            )
        return value
    return None


def formatter_messages(messages: list[dict[str, str]]) -> list[ChatCompletionRequestMessage]:
    """Plain messages (roles system, user, assistant) as llama_cpp's formatter types them; an
    assistant turn keeps its thought in `reasoning_content` for the templates that read it."""
    out: list[ChatCompletionRequestMessage] = []
    for message in messages:
        role, content = message["role"], message["content"]
        if role == "system":
            out.append({"role": "system", "content": content})
        elif role == "assistant":
            turn: Any = {"role": "assistant", "content": content}
            if "reasoning_content" in message:
                turn["reasoning_content"] = message["reasoning_content"]
            out.append(turn)
        else:
            out.append({"role": "user", "content": content})
    return out


class ChatTemplate:
    """The GGUF's `tokenizer.chat_template`, rendered like transformers does it."""

    def __init__(self, template: str | None, bos_token: str, eos_token: str) -> None:
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        self.has_template = bool(template)
        #: The model's name, and why its projector failed to load if it did: the words of
        #: the error for an image it cannot take.
        self.model_id = "this model"
        self.no_projector_why: str | None = None
        self.eos_token = eos_token
        self._formatter = Jinja2ChatFormatter(
            template=template or CHATML_TEMPLATE,
            eos_token=eos_token,
            bos_token=bos_token,
            add_generation_prompt=True,
        )
        #: How the model writes a thought (None: it does not reason), read off the template
        #: as llama.cpp's common/chat reads it.
        self.thinking = reasoning.detect(template, self._probe())

    def _probe(self) -> str:
        """What the template renders for one user message: whether it opens the thought."""
        try:
            return self._formatter(messages=[{"role": "user", "content": "x"}]).prompt
        except Exception:  # a template that wants more than one message: no probe
            return ""

    def render(
        self,
        messages: Any,
        plan: ToolUse | None = None,
        media: Media | None = None,
        model: str = "",
        kwargs: dict[str, Any] | None = None,
    ) -> str:
        """The prompt text, ending with the assistant's generation prompt; with the
        functions of an active tool `plan` in its system message. Images go into `media`
        (their markers into the text); without it, an image is refused, naming `model`
        (the id the request was answered as; "": `model_id`). `kwargs` are the template's
        variables (reasoning.Controls.template_kwargs)."""
        who = (model or self.model_id, self.no_projector_why)
        normalised = tools.with_tools(normalise_messages(messages, media, who), plan)
        try:
            return self._formatter(messages=formatter_messages(normalised), **(kwargs or {})).prompt
        except Exception as exc:  # a template's raise_exception(), e.g. roles out of order
            raise EngineError(
                f"The model's chat template rejected the messages: {exc}",
                param="messages",
                code="invalid_value",
            ) from None

    def stop_strings(self) -> list[str]:
        """Text that ends a turn even if the model writes it out instead of its EOG token."""
        return [self.eos_token] if self.eos_token else []
