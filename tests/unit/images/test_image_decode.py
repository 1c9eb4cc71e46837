"""Decoding with Pillow: PNG, JPEG, WEBP and GIF (its first frame) taken, other formats and
bytes that are no image refused; the embedded engine's form keeps PNG and JPEG and makes
WEBP and GIF PNG; `inline` keeps every format; large images are scaled down on request."""

from __future__ import annotations

import base64
import io

import pytest
from PIL import Image as PIL

from app.images import ImageError, prepare
from app.images.decode import data_url_bytes
from tests.images import FORMATS, image_bytes

MIME = {"PNG": "image/png", "JPEG": "image/jpeg", "WEBP": "image/webp", "GIF": "image/gif"}


@pytest.mark.parametrize("fmt", FORMATS)
def test_the_embedded_form_is_png_or_jpeg(fmt: str) -> None:
    raw = image_bytes(fmt, (12, 8))
    image = prepare(raw, to_png=True)
    assert image.mime == ("image/jpeg" if fmt == "JPEG" else "image/png")
    assert (image.width, image.height) == (12, 8)
    if fmt in ("PNG", "JPEG"):
        assert image.data == raw  # kept byte for byte
    out = PIL.open(io.BytesIO(image.data))
    assert out.format == ("JPEG" if fmt == "JPEG" else "PNG")
    assert out.size == (12, 8)
    assert image.data_url().startswith(f"data:{image.mime};base64,")
    assert len(image.id) == 64  # sha256 of the bytes


def test_a_gif_gives_its_first_frame() -> None:
    image = prepare(image_bytes("GIF"), to_png=True)
    out = PIL.open(io.BytesIO(image.data)).convert("RGB")
    r, _g, b = out.getpixel((0, 0))  # type: ignore[misc]
    assert r > 150 and b < 100  # the red first frame, not the blue second


@pytest.mark.parametrize("fmt", FORMATS)
def test_inline_keeps_each_format_as_it_is(fmt: str) -> None:
    raw = image_bytes(fmt)
    image = prepare(raw, to_png=False)
    assert (image.mime, image.data) == (MIME[fmt], raw)


def test_the_same_bytes_have_the_same_id_and_others_another() -> None:
    a = prepare(image_bytes("PNG", color=(1, 2, 3)), to_png=True)
    b = prepare(image_bytes("PNG", color=(1, 2, 3)), to_png=True)
    c = prepare(image_bytes("PNG", color=(3, 2, 1)), to_png=True)
    assert a.id == b.id != c.id


@pytest.mark.parametrize("fmt", ["BMP", "TIFF", "ICO"])
def test_other_formats_are_refused_by_name(fmt: str) -> None:
    with pytest.raises(ImageError) as caught:
        prepare(image_bytes(fmt), to_png=True)
    assert caught.value.code == "invalid_image_format"
    assert fmt in caught.value.message and "PNG, JPEG, WEBP and GIF" in caught.value.message


def test_bytes_that_are_no_image_are_refused() -> None:
    with pytest.raises(ImageError) as caught:
        prepare(b"%PDF-1.4 not an image at all", to_png=True)
    assert caught.value.code == "invalid_image"


@pytest.mark.parametrize("fmt", FORMATS)
def test_an_image_cut_anywhere_is_refused(fmt: str) -> None:
    # Cut inside its header too: Pillow raises a plain OSError there, which was a 500.
    raw = image_bytes(fmt, (200, 200))
    with pytest.raises(ImageError) as caught:
        prepare(raw[: len(raw) // 2], to_png=True)
    assert caught.value.code == "invalid_image"
    for end in sorted({*range(64), len(raw) - 1}):
        for to_png in (True, False):
            try:
                prepare(raw[:end], to_png=to_png, max_side=32)
            except ImageError as exc:
                assert exc.code in ("invalid_image", "invalid_image_format"), (end, exc)


@pytest.mark.parametrize(
    ("fmt", "to_png", "mime"),
    [
        ("PNG", True, "image/png"),
        ("JPEG", True, "image/jpeg"),
        ("WEBP", True, "image/png"),
        ("WEBP", False, "image/webp"),
        ("GIF", False, "image/png"),
    ],
)
def test_a_large_image_is_scaled_to_the_longest_side(fmt: str, to_png: bool, mime: str) -> None:
    image = prepare(image_bytes(fmt, (400, 100)), to_png=to_png, max_side=64)
    assert (image.mime, image.width, image.height) == (mime, 64, 16)
    assert PIL.open(io.BytesIO(image.data)).size == (64, 16)


def test_a_small_image_is_not_scaled() -> None:
    raw = image_bytes("PNG", (40, 30))
    assert prepare(raw, to_png=True, max_side=64).data == raw


def test_a_data_url_gives_its_bytes_and_its_size_is_capped() -> None:
    raw = image_bytes("PNG")
    url = "data:image/png;base64," + base64.b64encode(raw).decode()
    assert data_url_bytes(url, 1 << 20) == raw
    with pytest.raises(ImageError) as caught:
        data_url_bytes(url, 10)
    assert caught.value.code == "image_too_large"
    assert "--max-image-bytes 10" in caught.value.message


@pytest.mark.parametrize("url", ["data:image/png,rawbytes", "data:image/png;base64,@@@@", "data:"])
def test_a_data_url_that_is_not_base64_is_refused(url: str) -> None:
    with pytest.raises(ImageError) as caught:
        data_url_bytes(url, 1 << 20)
    assert caught.value.code == "invalid_image"
