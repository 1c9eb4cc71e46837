"""The Files and Batch API as a script calls it over HTTP, for any client with httpx's interface
(Litestar's TestClient, or an httpx.Client on a live server's root), and a waiter for any
`get(batch_id)`: those clients through `batch_getter`, or the openai SDK's `batches.retrieve`.
For the SDK also: a batch created from its lines, and a wait for its first lines to finish."""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import TYPE_CHECKING, Any, TypeVar

from tests.factories import CHAT, jsonl
from tests.waiting import until

if TYPE_CHECKING:
    from litestar.testing import TestClient
    from openai import OpenAI
    from openai.types import Batch

#: The statuses a batch ends in.
FINISHED = ("completed", "failed", "expired", "cancelled")

B = TypeVar("B")

#: The type of tests/integration/conftest.py's make_client fixture.
MakeClient = Callable[..., "TestClient"]


def post_file(
    client: Any,
    data: bytes,
    purpose: str | None = "batch",
    *,
    name: str = "in.jsonl",
    headers: dict[str, str] | None = None,
    **fields: str,
) -> Any:
    """POST /v1/files as multipart (no `purpose` field if None; `fields` are more form fields);
    the response as it came."""
    form = {"purpose": purpose, **fields} if purpose is not None else dict(fields)
    return client.post(
        "/v1/files",
        files={"file": (name, data, "application/jsonl")},
        data=form,
        headers=headers,
    )


def upload(client: Any, data: bytes, purpose: str = "batch", **kw: Any) -> dict[str, Any]:
    """post_file, which must succeed; the File object."""
    r = post_file(client, data, purpose, **kw)
    assert r.status_code == 200, r.text
    return dict(r.json())


def post_batch(
    client: Any,
    file_id: str,
    endpoint: str = CHAT,
    *,
    headers: dict[str, str] | None = None,
    **fields: Any,
) -> Any:
    """POST /v1/batches for a file with a 24h window (`fields` add to the body); the response."""
    body = {"input_file_id": file_id, "endpoint": endpoint, "completion_window": "24h", **fields}
    return client.post("/v1/batches", json=body, headers=headers)


def create_batch(client: Any, file_id: str, endpoint: str = CHAT, **kw: Any) -> dict[str, Any]:
    """post_batch, which must succeed; the Batch object."""
    r = post_batch(client, file_id, endpoint, **kw)
    assert r.status_code == 200, r.text
    return dict(r.json())


def batch_getter(
    client: Any, headers: dict[str, str] | None = None
) -> Callable[[str], dict[str, Any]]:
    """get(batch_id) -> the Batch object from GET /v1/batches/{batch_id}, for wait_for_status."""

    def get(batch_id: str) -> dict[str, Any]:
        r = client.get(f"/v1/batches/{batch_id}", headers=headers)
        assert r.status_code == 200, r.text
        return dict(r.json())

    return get


def status_of(batch: Any) -> str:
    return str(batch["status"] if isinstance(batch, dict) else batch.status)


def wait_for_status(
    get: Callable[[str], B],
    batch_id: str,
    statuses: Collection[str] | Callable[[B], bool] = FINISHED,
    timeout: float = 15,
    *,
    seen: list[str] | None = None,
    poll: float = 0.1,
) -> B:
    """Poll get(batch_id) until the batch's status is one of `statuses` (or, given a function,
    until it says yes to the batch); returns that batch. Each new status is added to `seen`."""
    wanted = statuses if callable(statuses) else (lambda b: status_of(b) in statuses)

    def current() -> B:
        b = get(batch_id)
        if seen is not None and (not seen or seen[-1] != status_of(b)):
            seen.append(status_of(b))
        return b

    if callable(statuses):
        what = f"batch {batch_id} to pass {getattr(statuses, '__name__', statuses)}"
    else:
        what = f"batch {batch_id} to be {' or '.join(statuses)}"
    return until(current, timeout, what, accept=wanted, poll=poll)


def sdk_batch(c: OpenAI, lines: list[dict[str, Any]], window: str = "24h") -> Batch:
    """A chat batch of `lines` created through the openai SDK, its input file uploaded first."""
    f = c.files.create(file=("in.jsonl", jsonl(*lines)), purpose="batch")
    return c.batches.create(
        input_file_id=f.id,
        endpoint=CHAT,
        completion_window=window,  # type: ignore[arg-type]  # the SDK's type says "24h"
    )


def until_lines_completed(c: OpenAI, batch_id: str, n: int, timeout: float = 120) -> None:
    """Until at least `n` of the batch's lines have completed (it is under way, busy)."""
    until(
        lambda: c.batches.retrieve(batch_id).request_counts,
        timeout,
        f"{n} lines of {batch_id} to complete",
        accept=lambda counts: counts is not None and counts.completed >= n,
        poll=0.05,
    )
