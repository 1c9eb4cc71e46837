"""Tables: File (bytes on disk), Batch, Request (one line of a batch), Upload and UploadPart
(a file sent in parts), WebhookDelivery (one event to one endpoint), Node and NodeModel (the
nodes on one database and the model names each serves), SheetBatch (what a batch made from
a sheet was made of).

A change here needs an Alembic revision too (app/migrations/README.md); a test fails
when the two disagree.
"""

from __future__ import annotations

import secrets
import time

from sqlalchemy import BigInteger, Column, Index, Text
from sqlmodel import Field, SQLModel


def now() -> int:
    return int(time.time())


def now_ns() -> int:
    return time.time_ns()


ID_ALPHABET = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
ID_LENGTH = 24
#: Random bytes below 248 (= 4 x 62) map to a character each, 4 bytes to every character:
#: uniform, like 24 draws of a character. Bytes 248-255 are dropped and drawn again.
_ID_BYTES = bytes(ord(ID_ALPHABET[b % 62]) for b in range(248)) + bytes(8)
_ID_DROP = bytes(range(248, 256))


def new_ids(prefix: str, n: int) -> list[str]:
    """`n` OpenAI-style ids: a prefix and 24 random url-safe characters each.

    One read of the system's randomness for all of them, turned into characters by one
    bytes.translate: a batch's 50,000 lines get their ids in about 20 ms instead of 200.
    """
    want = n * ID_LENGTH
    chars = b""
    while len(chars) < want:
        more = want - len(chars)
        chars += secrets.token_bytes(more + more // 16 + 8).translate(_ID_BYTES, _ID_DROP)
    text = chars[:want].decode("ascii")
    return [prefix + text[i : i + ID_LENGTH] for i in range(0, want, ID_LENGTH)]


def new_id(prefix: str) -> str:
    """An OpenAI-style id: a prefix and 24 random url-safe characters (see new_ids)."""
    return new_ids(prefix, 1)[0]


class File(SQLModel, table=True):
    id: str = Field(primary_key=True)
    owner: str = Field(default="", index=True)
    filename: str
    purpose: str = Field(index=True)
    bytes: int = Field(sa_type=BigInteger)
    sha256: str = ""
    created_at: int = Field(default_factory=now, sa_type=BigInteger)
    # Orders lists and cursors: created_at has only whole seconds.
    created_ns: int = Field(default_factory=now_ns, index=True, sa_type=BigInteger)
    expires_at: int | None = Field(default=None, sa_type=BigInteger)
    # Set when the owner deleted the file while a running batch still read it: the file is
    # gone from the API at once, and its row and bytes go when no batch needs them.
    deleted_at: int | None = Field(default=None, index=True, sa_type=BigInteger)


class BatchStatus:
    VALIDATING = "validating"
    FAILED = "failed"
    IN_PROGRESS = "in_progress"
    FINALIZING = "finalizing"
    COMPLETED = "completed"
    EXPIRED = "expired"
    CANCELLING = "cancelling"
    CANCELLED = "cancelled"

    ACTIVE = (VALIDATING, IN_PROGRESS, FINALIZING, CANCELLING)
    #: What a cancel (and the completion window) can still stop.
    CANCELLABLE = (VALIDATING, IN_PROGRESS)
    FINISHED = (FAILED, COMPLETED, EXPIRED, CANCELLED)


class Batch(SQLModel, table=True):
    id: str = Field(primary_key=True)
    owner: str = Field(default="", index=True)
    endpoint: str
    input_file_id: str = Field(index=True)
    completion_window: str = "24h"
    status: str = Field(default=BatchStatus.VALIDATING, index=True)
    #: The `model` its lines name, as written.
    model: str | None = None
    #: Where its lines run, resolved once at validation (app/batches/lifecycle/validate.py): the id of
    #: the catalog model or the upstream's model name that `model` means, or "" for a name
    #: nothing known means (the default model's lines). None: not resolved yet (a batch
    #: from before routes, or still validating).
    route: str | None = None
    metadata_json: str | None = Field(default=None, sa_column=Column("metadata", Text))
    errors_json: str | None = Field(default=None, sa_column=Column("errors", Text))
    output_file_id: str | None = None
    error_file_id: str | None = None
    # Seconds after creation the output and error files expire; None keeps them.
    output_expires_after: int | None = None

    created_at: int = Field(default_factory=now, sa_type=BigInteger)
    created_ns: int = Field(default_factory=now_ns, index=True, sa_type=BigInteger)
    expires_at: int | None = Field(default=None, sa_type=BigInteger)
    in_progress_at: int | None = Field(default=None, sa_type=BigInteger)
    finalizing_at: int | None = Field(default=None, sa_type=BigInteger)
    completed_at: int | None = Field(default=None, sa_type=BigInteger)
    failed_at: int | None = Field(default=None, sa_type=BigInteger)
    expired_at: int | None = Field(default=None, sa_type=BigInteger)
    cancelling_at: int | None = Field(default=None, sa_type=BigInteger)
    cancelled_at: int | None = Field(default=None, sa_type=BigInteger)

    # Counters move in the same transaction as the Request row they count.
    total: int = 0
    completed: int = 0
    failed: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    # The sum of the lines' usage.prompt_tokens_details.cached_tokens (prefix-cache hits).
    cached_tokens: int = 0
    # The sum of the lines' reasoning tokens (a thinking model's thought, within
    # output_tokens): chat's usage.completion_tokens_details, Responses' output_tokens_details.
    reasoning_tokens: int = 0


class RequestStatus:
    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"  # never ran: the batch was cancelled first
    EXPIRED = "expired"  # never finished inside the completion window

    DONE = (SUCCEEDED, FAILED, CANCELLED, EXPIRED)


class Request(SQLModel, table=True):
    """One line of a batch's input file, found by (offset, length), and its result."""

    __table_args__ = (
        Index("ix_request_batch_status_line", "batch_id", "status", "line"),
        Index("ix_request_batch_line", "batch_id", "line", unique=True),
    )

    id: str = Field(primary_key=True)
    batch_id: str = Field(foreign_key="batch.id", ondelete="CASCADE")
    line: int  # 1-based line number in the input file
    custom_id: str
    offset: int = Field(sa_type=BigInteger)
    length: int
    status: str = RequestStatus.PENDING
    attempts: int = 0
    claimed_by: str | None = None
    claimed_at: int | None = Field(default=None, sa_type=BigInteger)
    lease_until: float | None = None
    finished_at: int | None = Field(default=None, sa_type=BigInteger)
    status_code: int | None = None
    request_id: str | None = None
    # The response body (success) or {"error": ...} body (failure), as JSON text.
    body_json: str | None = Field(default=None, sa_column=Column("body", Text))
    # Set when the line never produced a response (expired): {"code", "message"}.
    error_json: str | None = Field(default=None, sa_column=Column("error", Text))
    prompt_tokens: int = 0
    completion_tokens: int = 0
    # Prompt tokens the engine took from its prefix cache (usage.prompt_tokens_details).
    cached_tokens: int = 0


class UploadStatus:
    PENDING = "pending"
    COMPLETED = "completed"
    CANCELLED = "cancelled"
    EXPIRED = "expired"


class Upload(SQLModel, table=True):
    """A file sent in parts (POST /v1/uploads); completing it makes a File."""

    id: str = Field(primary_key=True)
    owner: str = Field(default="", index=True)
    filename: str
    purpose: str
    bytes: int = Field(sa_type=BigInteger)  # what the parts must add up to
    mime_type: str
    status: str = Field(default=UploadStatus.PENDING, index=True)
    created_at: int = Field(default_factory=now, sa_type=BigInteger)
    # An unfinished upload expires (default: 1 hour).
    expires_at: int = Field(index=True, sa_type=BigInteger)
    # The File's own expiry policy (create's expires_after), in seconds from its creation.
    file_expires_after: int | None = None
    file_id: str | None = None


class UploadPart(SQLModel, table=True):
    """One part of an upload; its bytes live at data_dir/uploads/<upload id>/<part id>."""

    id: str = Field(primary_key=True)
    upload_id: str = Field(foreign_key="upload.id", ondelete="CASCADE", index=True)
    bytes: int = Field(sa_type=BigInteger)
    created_at: int = Field(default_factory=now, sa_type=BigInteger)


class DeliveryStatus:
    PENDING = "pending"  # waiting for its next attempt
    DELIVERED = "delivered"  # an attempt got a 2xx
    FAILED = "failed"  # retries ran past the retry window


class WebhookDelivery(SQLModel, table=True):
    """One event (a batch reached a final status) to one endpoint, and its attempts so far.

    The body is stored as sent, so every retry carries the same event id and the same bytes.
    """

    id: str = Field(primary_key=True)
    event_id: str = Field(index=True)
    event_type: str
    batch_id: str = Field(index=True)
    owner: str = Field(default="", index=True)
    url: str
    payload_json: str = Field(sa_column=Column("payload", Text, nullable=False))
    status: str = Field(default=DeliveryStatus.PENDING, index=True)
    attempts: int = 0
    created_at: int = Field(default_factory=now, sa_type=BigInteger)
    created_ns: int = Field(default_factory=now_ns, sa_type=BigInteger)
    next_attempt_at: float | None = Field(default=None, index=True)
    last_attempt_at: int | None = Field(default=None, sa_type=BigInteger)
    last_status_code: int | None = None
    last_error: str | None = None
    delivered_at: int | None = Field(default=None, sa_type=BigInteger)


class Node(SQLModel, table=True):
    """A node on the shared database (a runner: `batchyard serve` or `worker`), by the id its
    claims carry (Request.claimed_by). It renews its lease while it lives, as it renews its
    lines' leases; its model names count for the other nodes until the lease runs out
    (app/batches/nodes.py)."""

    id: str = Field(primary_key=True)
    started_at: int = Field(default_factory=now, sa_type=BigInteger)
    lease_until: float


class NodeModel(SQLModel, table=True):
    """One name a node's model catalog resolves, and the id of the model it means there."""

    node_id: str = Field(primary_key=True, foreign_key="node.id", ondelete="CASCADE")
    name: str = Field(primary_key=True)
    model_id: str


class SheetBatch(SQLModel, table=True):
    """A batch made from a sheet (app/sheets/): the stored sheet and the spec (template,
    output columns, model) that its download joins the answers back with."""

    batch_id: str = Field(primary_key=True, foreign_key="batch.id", ondelete="CASCADE")
    owner: str = Field(default="", index=True)
    #: The uploaded sheet, as a File of purpose user_data.
    sheet_file_id: str
    filename: str
    #: app.sheets.requests.SheetSpec as JSON.
    spec_json: str = Field(sa_column=Column("spec", Text, nullable=False))
    created_at: int = Field(default_factory=now, sa_type=BigInteger)
