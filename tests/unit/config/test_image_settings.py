"""The image settings: flags over BATCHYARD_* variables over defaults, and bad values refused."""

from __future__ import annotations

import pytest

from app.cli import build_parser
from app.config import Settings


def test_the_defaults_are_public_addresses_20_mb_and_10_s() -> None:
    s = Settings.load(environ={})
    assert (s.allow_private_image_urls, s.max_image_bytes, s.image_fetch_timeout) == (
        False,
        20 * 1024 * 1024,
        10.0,
    )


def test_the_environment_sets_them() -> None:
    s = Settings.load(
        environ={
            "BATCHYARD_ALLOW_PRIVATE_IMAGE_URLS": "1",
            "BATCHYARD_MAX_IMAGE_BYTES": "1000000",
            "BATCHYARD_IMAGE_FETCH_TIMEOUT": "2.5",
        }
    )
    assert (s.allow_private_image_urls, s.max_image_bytes, s.image_fetch_timeout) == (
        True,
        1_000_000,
        2.5,
    )


@pytest.mark.parametrize("command", ["serve", "worker"])
def test_the_flags_set_them(command: str) -> None:
    args = build_parser().parse_args(
        [
            command,
            "--allow-private-image-urls",
            "--max-image-bytes",
            "5000",
            "--image-fetch-timeout",
            "0.5",
        ]
    )
    assert (args.allow_private_image_urls, args.max_image_bytes, args.image_fetch_timeout) == (
        True,
        5000,
        0.5,
    )


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("max_image_bytes", 0, "--max-image-bytes"),
        ("image_fetch_timeout", -1.0, "--image-fetch-timeout"),
    ],
)
def test_bad_values_are_refused(field: str, value: object, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        Settings(**{field: value})  # type: ignore[arg-type]
