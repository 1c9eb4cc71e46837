"""The dashboard's "Run with": a batch input file with one model written into every line.

The dashboard's New batch card offers the catalog's models; the one chosen is written into
each line's `body.model` of a copy of the uploaded file, stored through the same file
service as `POST /v1/files` (a normal File, listed by `GET /v1/files`), and the batch runs
on that copy. The upload itself is left as it was: a File's bytes never change under its
id, and another batch may use it. A line that is not a JSON object with a `body` object is
copied as it is, so that validation reports it with its line number as it would have.
"""

from __future__ import annotations

from pathlib import PurePosixPath

from app.files.service import FileService, too_large
from app.files.storage import TooLarge
from app.runtime import jsoncodec
from app.tables import File


def with_model(files: FileService, file_id: str, owner: str, model: str) -> File:
    """A new File holding `file_id`'s lines with `body.model` set to `model`."""
    source = files.content(file_id, owner)
    limit = files.limit_for("batch")
    partial = files.storage.begin_write(limit)
    try:
        with files.storage.open_file(source.id) as fh:
            for raw in fh:
                partial.write(_restamped(raw, model))
    except TooLarge:  # the longer name took the file past the limit
        partial.discard()
        raise too_large("batch", limit) from None
    except BaseException:
        partial.discard()
        raise
    stem = PurePosixPath(source.filename).stem or "input"
    return files.create(
        partial=partial,
        filename=f"{stem} ({model.replace('/', '_')}).jsonl",
        purpose="batch",
        owner=owner,
    )


def _restamped(raw: bytes, model: str) -> bytes:
    """One input line with `model` in its body, or the line as it was (see module doc)."""
    line = raw.strip()
    if not line:
        return raw
    try:
        request = jsoncodec.loads(line)
    except ValueError:
        return raw
    if not isinstance(request, dict) or not isinstance(request.get("body"), dict):
        return raw
    request["body"]["model"] = model
    return jsoncodec.dumps_bytes(request) + b"\n"


__all__ = ["with_model"]
