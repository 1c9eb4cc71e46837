"""The dashboard's look at an uploaded file before a batch is made of it.

The endpoint is read from the first request line's `url`; the whole file is then checked
by the same validator the batch runner uses (`app.batches.validate.validate_jsonl`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from app.batches.validate import raw_lines, validate_jsonl
from app.engine.base import CHAT, ENDPOINTS
from app.files import FileService

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


def guess_endpoint(path: Any) -> str:
    """The `url` of the first line that names a known endpoint; chat completions otherwise."""
    with open(path, "rb") as fh:
        for _offset, raw, too_long in raw_lines(fh):
            if too_long or not raw.strip():
                continue
            try:
                url = json.loads(raw).get("url")
            except (ValueError, AttributeError):
                continue
            if url in ENDPOINTS:
                return url
    return CHAT


def preview_file(files: FileService, file_id: str, owner: str) -> Preview:
    row, path = files.content_path(file_id, owner)
    endpoint = guess_endpoint(path)
    with open(path, "rb") as fh:
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
