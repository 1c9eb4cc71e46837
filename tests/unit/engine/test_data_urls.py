"""The one data-URL parser, and the two surfaces that read through it (the image resolver's
`data_url_bytes` and the embedded engine's `image_bytes`): what either takes, the other
takes, and a malformed URL fails both with the same code."""

from __future__ import annotations

import base64

import pytest

from app.engine.base import EngineError
from app.engine.data_urls import DataURLError, parse_data_url
from app.engine.llama.jobs.oai.media import image_bytes
from app.images.decode import data_url_bytes
from app.images.errors import ImageError

RAW = b"\x89PNG not really"
B64 = base64.b64encode(RAW).decode()


@pytest.mark.parametrize(
    "url",
    [
        f"data:image/png;base64,{B64}",
        f"DATA:Image/PNG;BASE64,{B64}",  # letter case
        f"data:image/png;name=a.png;base64,{B64[:8]}\n{B64[8:]}",  # a parameter, wrapped lines
    ],
)
def test_both_surfaces_take_what_the_parser_takes(url: str) -> None:
    assert parse_data_url(url).data == RAW and parse_data_url(url).media_type == "image/png"
    assert data_url_bytes(url, 1 << 20) == RAW
    assert image_bytes(url, "p") == RAW


@pytest.mark.parametrize(
    "url",
    [
        "data:image/png,rawbytes",  # not base64
        "data:image/png;base64,@@@@",  # not valid base64
        "data:image/png;base64,",  # empty
        "data:",
    ],
)
def test_a_malformed_data_url_fails_both_surfaces_with_one_code(url: str) -> None:
    with pytest.raises(DataURLError) as parsed:
        parse_data_url(url)
    with pytest.raises(ImageError) as resolved:
        data_url_bytes(url, 1 << 20)
    with pytest.raises(EngineError) as engine:
        image_bytes(url, "p")
    assert parsed.value.code == resolved.value.code == engine.value.code == "invalid_image"
    assert engine.value.message == f"p: {resolved.value.message}"


def test_the_limit_counts_the_decoded_bytes() -> None:
    url = f"data:image/png;base64,{B64}"
    assert parse_data_url(url, len(RAW)).data == RAW
    with pytest.raises(DataURLError) as caught:
        parse_data_url(url, len(RAW) - 1)
    assert caught.value.code == "image_too_large"
