"""Which storage holds file bytes: the data dir, or a bucket (`--files-url s3://...`)."""

from __future__ import annotations

from app.config.settings import Settings
from app.files.storage import Storage


def open_storage(settings: Settings) -> Storage:
    """The storage `settings` name; the S3 client is imported only when a bucket is used."""
    if not settings.files_url:
        return Storage(settings.data_path)
    from app.files.bucket import Location, make_client
    from app.files.s3 import S3Storage

    client = make_client(settings.s3_endpoint or None)
    return S3Storage(settings.data_path, client, Location.parse(settings.files_url))


def files_problem(settings: Settings) -> str | None:
    """Why the files location cannot be used, or None (the data dir is checked on its own)."""
    if not settings.files_url:
        return None
    from app.files.bucket import bucket_problem
    from app.files.s3 import S3Storage

    try:
        storage = open_storage(settings)
    except ValueError as exc:
        return f"--s3-endpoint {settings.s3_endpoint!r} is not usable: {exc}."
    assert isinstance(storage, S3Storage)
    return bucket_problem(storage.bucket, settings.s3_endpoint or None)
