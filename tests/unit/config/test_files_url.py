"""--files-url: empty (the data dir) or s3://BUCKET/PREFIX; anything else is refused at start."""

from __future__ import annotations

import pytest

from app.config.settings import Settings
from app.files.bucket import Location


def test_an_s3_url_names_the_bucket_and_a_prefix() -> None:
    assert Settings(files_url="s3://bkt/a/b/").files_url == "s3://bkt/a/b/"
    assert Location.parse("s3://bkt/a/b/") == Location("bkt", "a/b/")
    assert Location.parse("s3://bkt") == Location("bkt", "")


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("/mnt/files", "--files-url must be s3://BUCKET/PREFIX"),
        ("s3:///prefix", "--files-url s3:// needs a bucket"),
    ],
)
def test_a_files_url_that_is_not_a_bucket_is_refused(url: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Settings(files_url=url)


def test_the_env_variable_sets_it() -> None:
    loaded = Settings.load({}, environ={"BATCHYARD_FILES_URL": "s3://bkt/p"})
    assert loaded.files_url == "s3://bkt/p"
