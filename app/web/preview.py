"""The dashboard's look at an uploaded file before a batch is made of it.

The endpoint is read from the first request line's `url` by the same rule `batchyard run`
uses (`first_endpoint`); the whole file is then checked by the same validator the batch
runner uses (`validate_jsonl`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from app.batches.lifecycle.validate import first_endpoint, validate_jsonl
from app.files.service import FileService

#: Line errors the preview lists on the page; the count says how many more there are.
SHOWN_ERRORS = 50


@dataclass
class Preview:
    file_id: str
    filename: str
    bytes: int
    endpoint: str
    lines: int = 0
    model: str | None = None
    errors: list[dict[str, Any]] = field(default_factory=list)
    error_count: int = 0

    @property
    def ok(self) -> bool:
        return self.error_count == 0 and self.lines > 0


def preview_file(files: FileService, file_id: str, owner: str) -> Preview:
    row = files.content(file_id, owner)
    # Opened twice rather than rewound: a bucket's object is read as a stream.
    with files.storage.open_file(row.id) as fh:
        endpoint = first_endpoint(fh)
    with files.storage.open_file(row.id) as fh:
        result = validate_jsonl(fh, endpoint, max_requests=files.settings.max_requests_per_batch)
    return Preview(
        file_id=row.id,
        filename=row.filename,
        bytes=row.bytes,
        endpoint=endpoint,
        lines=len(result.lines),
        model=result.model,
        errors=[e.to_openai() for e in result.errors[:SHOWN_ERRORS]],
        error_count=len(result.errors),
    )
