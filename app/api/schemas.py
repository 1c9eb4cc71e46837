"""The wire: every body the API takes or sends, as msgspec Structs named as openai-python
names its types, and the builders that make them from the tables.

The request Structs carry the JSON types; rules with their own messages (a known
endpoint, metadata limits, expiry ranges) stay in the services and are documented here
through `doc(...)`, so /schema says what is refused without msgspec's terser wording
replacing batchyard's. The inference bodies are validated by the engine, which names each
parameter and its limit; their Structs only describe them (see `EngineBody`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Annotated, Any, Generic, Literal, TypeVar

import msgspec
from msgspec import Meta, Struct
from msgspec import json as msgspec_json

from app import models
from app.engine.base import ENDPOINTS, ModelInfo

T = TypeVar("T")


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


# -- files -----------------------------------------------------------------------------------

FilePurpose = Literal[
    "assistants",
    "assistants_output",
    "batch",
    "batch_output",
    "fine-tune",
    "fine-tune-results",
    "vision",
    "user_data",
    "evals",
]


class FileObject(Struct, kw_only=True):
    id: str
    object: Literal["file"] = "file"
    bytes: int
    created_at: int
    expires_at: int | None = None
    filename: str
    purpose: FilePurpose
    status: Literal["uploaded", "processed", "error"] = "processed"
    status_details: str | None = None


class FileDeleted(Struct, kw_only=True):
    id: str
    object: Literal["file"] = "file"
    deleted: bool


def file_object(row: models.File) -> FileObject:
    return FileObject(
        id=row.id,
        bytes=row.bytes,
        created_at=row.created_at,
        expires_at=row.expires_at,
        filename=row.filename,
        purpose=row.purpose,  # type: ignore[arg-type]
    )


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


# -- batches ---------------------------------------------------------------------------------


class OutputExpiresAfter(Struct, kw_only=True):
    anchor: Annotated[
        str, doc("Only 'created_at': the output file's creation.", enum=["created_at"])
    ]
    seconds: Annotated[int, doc("From 1 hour to 30 days.", minimum=3600, maximum=30 * 24 * 3600)]


class BatchCreateParams(Struct, kw_only=True):
    input_file_id: Annotated[str, doc("The id of a file uploaded with purpose 'batch'.")]
    endpoint: Annotated[str, doc(enum=list(ENDPOINTS))]
    completion_window: Annotated[str, doc(enum=["24h"])] = "24h"
    metadata: Annotated[
        dict[str, str] | None,
        doc("At most 16 pairs; keys up to 64 characters, values up to 512.", max_properties=16),
    ] = None
    output_expires_after: OutputExpiresAfter | None = None


class BatchRequestCounts(Struct, kw_only=True):
    completed: int
    failed: int
    total: int


class BatchError(Struct, kw_only=True):
    code: str | None = None
    line: int | None = None
    message: str | None = None
    param: str | None = None


class Errors(Struct, kw_only=True):
    data: list[BatchError] | None = None
    object: str | None = "list"


class InputTokensDetails(Struct, kw_only=True):
    cached_tokens: int


class OutputTokensDetails(Struct, kw_only=True):
    reasoning_tokens: int


class BatchUsage(Struct, kw_only=True):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int


BatchStatusName = Literal[
    "validating",
    "failed",
    "in_progress",
    "finalizing",
    "completed",
    "expired",
    "cancelling",
    "cancelled",
]


class Batch(Struct, kw_only=True):
    """`openai.types.Batch`, every field present (null where it does not apply yet)."""

    id: str
    object: Literal["batch"] = "batch"
    endpoint: str
    model: str | None = None
    errors: Errors | None = None
    input_file_id: str
    completion_window: str
    status: BatchStatusName
    output_file_id: str | None = None
    error_file_id: str | None = None
    created_at: int
    in_progress_at: int | None = None
    expires_at: int | None = None
    finalizing_at: int | None = None
    completed_at: int | None = None
    failed_at: int | None = None
    expired_at: int | None = None
    cancelling_at: int | None = None
    cancelled_at: int | None = None
    request_counts: BatchRequestCounts
    usage: BatchUsage
    metadata: dict[str, str] | None = None


def batch_object(row: models.Batch) -> Batch:
    errors = json.loads(row.errors_json) if row.errors_json else None
    return Batch(
        id=row.id,
        endpoint=row.endpoint,
        model=row.model,
        errors=Errors(data=[BatchError(**e) for e in errors]) if errors else None,
        input_file_id=row.input_file_id,
        completion_window=row.completion_window,
        status=row.status,  # type: ignore[arg-type]
        output_file_id=row.output_file_id,
        error_file_id=row.error_file_id,
        created_at=row.created_at,
        in_progress_at=row.in_progress_at,
        expires_at=row.expires_at,
        finalizing_at=row.finalizing_at,
        completed_at=row.completed_at,
        failed_at=row.failed_at,
        expired_at=row.expired_at,
        cancelling_at=row.cancelling_at,
        cancelled_at=row.cancelled_at,
        request_counts=BatchRequestCounts(
            completed=row.completed, failed=row.failed, total=row.total
        ),
        usage=BatchUsage(
            input_tokens=row.input_tokens,
            input_tokens_details=InputTokensDetails(cached_tokens=0),
            output_tokens=row.output_tokens,
            output_tokens_details=OutputTokensDetails(reasoning_tokens=0),
            total_tokens=row.input_tokens + row.output_tokens,
        ),
        metadata=json.loads(row.metadata_json) if row.metadata_json else None,
    )


def to_builtins(obj: Struct) -> dict[str, Any]:
    """A Struct as plain JSON values (for templates and anything that reads it as a dict)."""
    return msgspec.to_builtins(obj)  # type: ignore[no-any-return]


# -- batch output lines ----------------------------------------------------------------------


class BatchResponse(Struct, kw_only=True):
    status_code: int | None
    request_id: str | None
    body: Any


class BatchLineError(Struct, kw_only=True):
    code: str
    message: str


class BatchOutputLine(Struct, kw_only=True):
    """One line of a batch's output or error file (vLLM's `BatchRequestOutput`)."""

    id: str
    custom_id: str
    response: BatchResponse | None
    error: BatchLineError | None


def batch_output_line(r: models.Request) -> BatchOutputLine:
    if r.status == models.RequestStatus.EXPIRED:
        error = json.loads(r.error_json) if r.error_json else None
        return BatchOutputLine(
            id=r.id,
            custom_id=r.custom_id,
            response=None,
            error=BatchLineError(**error) if error else None,
        )
    return BatchOutputLine(
        id=r.id,
        custom_id=r.custom_id,
        response=BatchResponse(
            status_code=r.status_code,
            request_id=r.request_id,
            body=json.loads(r.body_json) if r.body_json else None,
        ),
        error=None,
    )


def encode_line(line: BatchOutputLine) -> bytes:
    return msgspec_json.encode(line) + b"\n"


# -- models ----------------------------------------------------------------------------------


class Model(Struct, kw_only=True):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "batchyard"


class ModelPage(Struct, kw_only=True):
    """`/v1/models`: OpenAI's plain page (`SyncPage[Model]` in the SDK), no cursor."""

    object: Literal["list"] = "list"
    data: list[Model]


def model_card(info: ModelInfo) -> Model:
    return Model(id=info.id, created=info.created)


class Health(Struct, kw_only=True):
    """`/health`: ready with the model's figures, or starting / failed with the reason."""

    status: Literal["ready", "starting", "failed"]
    error: str | None = None
    model: str | None = None
    backend: str | None = None
    slots: int | None = None
    ctx_per_slot: int | None = None
    n_gpu_layers: int | None = None


# -- inference: described here, validated by the engine ---------------------------------------


@dataclass(frozen=True)
class EngineBody:
    """Marks a `data: dict` the engine validates; /schema shows `params` for it."""

    params: type[Struct]


#: msgspec allows one array type per union, so the token forms are told in words.
PROMPT_DOC = doc("A string, a list of strings, a list of token ids, or a list of token id lists.")


class ChatCompletionMessageParam(Struct, kw_only=True):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None


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


FinishReason = Literal["stop", "length", "content_filter"]


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


class ChoiceDelta(Struct, kw_only=True):
    role: Literal["assistant"] | None = None
    content: str | None = None


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
