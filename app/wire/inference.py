"""Models, health, and the inference bodies: described here, validated by the engine."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal

from msgspec import Struct

from app.wire.common import doc

# -- models ----------------------------------------------------------------------------------


class Model(Struct, kw_only=True):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "batchyard"


class CatalogModel(Model, kw_only=True):
    """A model of the embedded catalog: OpenAI's fields, then what loading it takes
    (extra fields, which OpenAI's SDK keeps as they are on its `Model`)."""

    source: str  # default, model, models-dir, ollama, lmstudio, hf
    size_bytes: int
    quantization: str
    architecture: str
    context_length: int
    estimated_memory_bytes: int | None  # the projector's share too, where it has one
    #: ["text", "image"] for a model with a multimodal projector, else ["text"].
    input_modalities: list[str]
    projector: str | None  # the projector's file name
    estimated_projector_bytes: int | None  # its weights and image-encoding buffer
    #: A thinking model (its chat template writes a thought): its answers carry
    #: `reasoning_content` apart from `content`. An upstream's models have no such field
    #: (batchyard does not know whether they reason).
    reasoning: bool


class ModelPage(Struct, kw_only=True):
    """`/v1/models`: OpenAI's plain page (`SyncPage[Model]` in the SDK), no cursor."""

    object: Literal["list"] = "list"
    data: list[Model]


class EngineHealth(Struct, kw_only=True):
    """One engine on `/health`: the embedded one, or an upstream and whether it answers."""

    name: str
    kind: str
    up: bool
    models: list[str]


HealthStatus = Literal["ready", "starting", "failed"]


class Health(Struct, kw_only=True):
    """`/health`: ready with the model's figures, or starting / failed with the reason."""

    status: HealthStatus
    #: Which node answered: its id (node name and a per-process suffix), as in claims.
    node: str | None = None
    database: Literal["sqlite", "postgresql"] | None = None
    error: str | None = None
    model: str | None = None
    backend: str | None = None
    slots: int | None = None
    ctx_per_slot: int | None = None
    n_gpu_layers: int | None = None
    #: llama.cpp's extra CPU buffer types: "on (why)" or "off (why)".
    cpu_buffers: str | None = None
    #: The command that fixes the llama.cpp build (`batchyard engine build ...`), if any.
    advice: str | None = None
    #: Why a GPU build of llama.cpp runs on the CPU (a CUDA build, no GPU in sight), if so.
    gpu_fallback: str | None = None
    engines: list[EngineHealth] | None = None


# -- inference: described here, validated by the engine ---------------------------------------


@dataclass(frozen=True)
class EngineBody:
    """Marks a `data: dict` the engine validates; /schema shows `params` for it."""

    params: type[Struct]


#: msgspec allows one array type per union, so the token forms are told in words.
PROMPT_DOC = doc("A string, a list of strings, a list of token ids, or a list of token id lists.")


class FunctionCall(Struct, kw_only=True):
    name: str
    arguments: Annotated[str, doc("The arguments as a JSON object, in a string.")]


class ChatCompletionMessageToolCall(Struct, kw_only=True):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatCompletionMessageParam(Struct, kw_only=True):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[ChatCompletionMessageToolCall] | None = None
    tool_call_id: Annotated[str | None, doc("For `role: tool`: the call this result answers.")] = (
        None
    )


class FunctionDefinition(Struct, kw_only=True):
    name: str
    description: str | None = None
    parameters: Annotated[dict[str, Any] | None, doc("A JSON schema object.")] = None
    strict: bool | None = None


class ChatCompletionToolParam(Struct, kw_only=True):
    type: Literal["function"]
    function: FunctionDefinition


#: One of "none", "auto", "required", or {"type": "function", "function": {"name": ...}}.
#: What a chat or Responses body may ask for, online or in a batch line; what each runs at
#: and what its answer names is app/engine/tiers.py's.
ServiceTier = Literal["auto", "default", "flex"]
SERVICE_TIER_DOC = doc(
    "`flex` runs at batch priority, behind online requests and among the batch lines the "
    "engine holds: answered when its turn comes. `auto` and `default` run as online requests "
    "do. The answer names the tier it ran at (`default` or `flex`)."
)
TOOL_CHOICE_DOC = doc(
    "'none', 'auto', 'required', {'type': 'function', 'function': {'name': ...}} or "
    "{'type': 'allowed_tools', 'allowed_tools': {'mode': ..., 'tools': [...]}}. A required or "
    "named call is constrained by a grammar from the functions' schemas, so it always parses."
)


class StreamOptions(Struct, kw_only=True):
    include_usage: bool | None = None


class ResponseFormat(Struct, kw_only=True):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: dict[str, Any] | None = None


class SamplingParams(Struct, kw_only=True):
    """The sampling fields chat and text completions share."""

    model: str
    max_tokens: int | None = None
    n: Annotated[int | None, doc(minimum=1)] = None
    temperature: Annotated[float | None, doc(minimum=0, maximum=2)] = None
    top_p: Annotated[float | None, doc(minimum=0, maximum=1)] = None
    stop: str | list[str] | None = None
    seed: int | None = None
    presence_penalty: Annotated[float | None, doc(minimum=-2, maximum=2)] = None
    frequency_penalty: Annotated[float | None, doc(minimum=-2, maximum=2)] = None
    logit_bias: dict[str, float] | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    user: str | None = None


class ChatCompletionCreateParams(SamplingParams, kw_only=True):
    messages: list[ChatCompletionMessageParam]
    max_completion_tokens: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    response_format: ResponseFormat | None = None
    tools: list[ChatCompletionToolParam] | None = None
    tool_choice: Annotated[str | dict[str, Any] | None, TOOL_CHOICE_DOC] = None
    parallel_tool_calls: Annotated[
        bool | None, doc("Accepted either way: an answer holds at most one call.")
    ] = None
    service_tier: Annotated[ServiceTier | None, SERVICE_TIER_DOC] = None


class CompletionCreateParams(SamplingParams, kw_only=True):
    prompt: Annotated[str | list[Any], PROMPT_DOC]
    echo: bool | None = None
    logprobs: int | None = None
    suffix: str | None = None


class EmbeddingCreateParams(Struct, kw_only=True):
    model: str
    input: Annotated[str | list[Any], PROMPT_DOC]
    encoding_format: Literal["float", "base64"] | None = None
    dimensions: int | None = None
    user: str | None = None


class PromptTokensDetails(Struct, kw_only=True):
    cached_tokens: int | None = None


class CompletionUsage(Struct, kw_only=True):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None


class TopLogprob(Struct, kw_only=True):
    token: str
    logprob: float
    bytes: list[int] | None = None


class ChatCompletionTokenLogprob(Struct, kw_only=True):
    token: str
    logprob: float
    bytes: list[int] | None = None
    top_logprobs: list[TopLogprob]


class ChoiceLogprobs(Struct, kw_only=True):
    content: list[ChatCompletionTokenLogprob] | None = None
    refusal: list[ChatCompletionTokenLogprob] | None = None


class ChatCompletionMessage(Struct, kw_only=True):
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    refusal: str | None = None
    tool_calls: list[ChatCompletionMessageToolCall] | None = None


FinishReason = Literal["stop", "length", "tool_calls", "content_filter"]


class ChatCompletionChoice(Struct, kw_only=True):
    index: int
    message: ChatCompletionMessage
    logprobs: ChoiceLogprobs | None = None
    finish_reason: FinishReason


class ChatCompletion(Struct, kw_only=True):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatCompletionChoice]
    usage: CompletionUsage | None = None
    system_fingerprint: str | None = None
    service_tier: Literal["default", "flex"] | None = None


class ChoiceDeltaToolCall(Struct, kw_only=True):
    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: FunctionCall | None = None


class ChoiceDelta(Struct, kw_only=True):
    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[ChoiceDeltaToolCall] | None = None


class ChatCompletionChunkChoice(Struct, kw_only=True):
    index: int
    delta: ChoiceDelta
    logprobs: ChoiceLogprobs | None = None
    finish_reason: FinishReason | None = None


class ChatCompletionChunk(Struct, kw_only=True):
    """One `data:` event of a streamed chat completion; with `stream_options.include_usage`
    the last one before `[DONE]` has `choices: []` and the `usage`."""

    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatCompletionChunkChoice]
    usage: CompletionUsage | None = None
    system_fingerprint: str | None = None
    service_tier: Literal["default", "flex"] | None = None


class CompletionLogprobs(Struct, kw_only=True):
    text_offset: list[int] | None = None
    token_logprobs: list[float] | None = None
    tokens: list[str] | None = None
    top_logprobs: list[dict[str, float]] | None = None


class CompletionChoice(Struct, kw_only=True):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: FinishReason | None = None


class Completion(Struct, kw_only=True):
    """A text completion, and (with `stream`) each of its chunks."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: CompletionUsage | None = None
    system_fingerprint: str | None = None


class Embedding(Struct, kw_only=True):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str


class EmbeddingUsage(Struct, kw_only=True):
    prompt_tokens: int
    total_tokens: int


class CreateEmbeddingResponse(Struct, kw_only=True):
    object: Literal["list"] = "list"
    data: list[Embedding]
    model: str
    usage: EmbeddingUsage


# -- responses: described here, translated onto the chat path by the engine -----------------


class ResponseTextConfig(Struct, kw_only=True):
    format: Annotated[
        dict[str, Any] | None,
        doc(
            "{'type': 'text'}, {'type': 'json_object'} or {'type': 'json_schema', 'name', 'schema'}"
        ),
    ] = None
    verbosity: Literal["medium"] | None = None


class FunctionTool(Struct, kw_only=True):
    type: Literal["function"]
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


INPUT_DOC = doc(
    "A string, or a list of items: messages ({'role', 'content'}), 'function_call' and "
    "'function_call_output' items (the turns of a tool conversation)."
)


class ResponseCreateParams(Struct, kw_only=True):
    """`/v1/responses`. Anything not listed here is refused by name; so are
    `previous_response_id`, `conversation`, `prompt`, `background: true`, `reasoning`,
    `include`, built-in tools, and `truncation: auto`."""

    model: str
    input: Annotated[str | list[dict[str, Any]], INPUT_DOC]
    instructions: str | None = None
    max_output_tokens: Annotated[int | None, doc(minimum=1)] = None
    temperature: Annotated[float | None, doc(minimum=0, maximum=2)] = None
    top_p: Annotated[float | None, doc(minimum=0, maximum=1)] = None
    text: ResponseTextConfig | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: Annotated[str | dict[str, Any] | None, TOOL_CHOICE_DOC] = None
    parallel_tool_calls: bool | None = None
    store: Annotated[bool | None, doc("Accepted either way; responses are never stored.")] = None
    metadata: dict[str, str] | None = None
    stream: bool | None = None
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    truncation: Literal["disabled"] | None = None
    service_tier: Annotated[ServiceTier | None, SERVICE_TIER_DOC] = None
    max_tool_calls: int | None = None


class InputTokensDetails(Struct, kw_only=True):
    cached_tokens: Annotated[int, doc("Prompt tokens served from the prefix cache.")]
    cache_write_tokens: int = 0


class OutputTokensDetails(Struct, kw_only=True):
    reasoning_tokens: int = 0


class ResponseUsage(Struct, kw_only=True):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int


class Response(Struct, kw_only=True):
    """A model response; `output` holds a `message` item or `function_call` items."""

    id: str
    object: Literal["response"] = "response"
    created_at: int
    status: Literal["completed", "incomplete", "in_progress"]
    completed_at: int | None = None
    error: dict[str, Any] | None = None
    incomplete_details: dict[str, Any] | None = None
    model: str
    output: list[dict[str, Any]]
    instructions: str | None = None
    max_output_tokens: int | None = None
    parallel_tool_calls: bool
    temperature: float | None = None
    top_p: float | None = None
    text: dict[str, Any] | None = None
    tool_choice: str | dict[str, Any]
    tools: list[dict[str, Any]]
    usage: ResponseUsage | None = None
    metadata: dict[str, str] | None = None
    service_tier: Literal["default", "flex"] | None = None
