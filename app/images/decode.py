"""An image's bytes, checked and made into what an engine takes: decoded with Pillow (PNG,
JPEG, WEBP, GIF's first frame; anything else refused), converted to PNG where the target
refuses the format, and scaled down when it is larger than a bound.

`Image` is the result: the bytes an engine gets, their MIME type, and the image's id, the
sha256 of those bytes (the embedded engine keys its cache of encoded images by it).
"""

from __future__ import annotations

import base64
import hashlib
import io
import warnings
from dataclasses import dataclass, field
from functools import cached_property

from PIL import Image as PIL

from app.engine.data_urls import DataURLError, parse_data_url
from app.images.errors import IMAGE_TOO_LARGE, INVALID_IMAGE, INVALID_IMAGE_FORMAT, ImageError

#: The formats accepted, as Pillow names them, and their MIME types (OpenAI's list).
MIME_TYPES = {"PNG": "image/png", "JPEG": "image/jpeg", "WEBP": "image/webp", "GIF": "image/gif"}
#: What every engine takes as it is: the rest become PNG for the embedded engine and `png`.
KEPT = ("PNG", "JPEG")
#: The most pixels decoded: Pillow's own bound against decompression bombs (89.5 MP).
MAX_PIXELS = PIL.MAX_IMAGE_PIXELS or 89_478_485


@dataclass(frozen=True)
class Image:
    """An image as an engine gets it."""

    data: bytes = field(repr=False)
    mime: str  # image/png, image/jpeg (and, where the target keeps them, image/webp, image/gif)
    width: int
    height: int

    @cached_property
    def id(self) -> str:
        """The sha256 of the bytes, in hex: the same image has the same id everywhere."""
        return hashlib.sha256(self.data).hexdigest()

    def data_url(self) -> str:
        return f"data:{self.mime};base64,{base64.b64encode(self.data).decode('ascii')}"


def megabytes(n: int) -> str:
    return f"{n / (1024 * 1024):g} MB"


def too_large(what: str, limit: int) -> ImageError:
    return ImageError(
        f"{what} is larger than the {megabytes(limit)} limit on an image "
        f"(--max-image-bytes {limit}).",
        code=IMAGE_TOO_LARGE,
    )


def data_url_bytes(url: str, limit: int) -> bytes:
    """The bytes of a base64 data URL (app/engine/data_urls.py parses it); ImageError if it
    is not one, or its bytes are over `limit`."""
    try:
        return parse_data_url(url, limit).data
    except DataURLError as exc:
        if exc.code == IMAGE_TOO_LARGE:
            raise too_large("The image in the data URL", limit) from None
        raise ImageError(exc.message, code=exc.code) from None


def prepare(data: bytes, *, to_png: bool, max_side: int = 0) -> Image:
    """Decode `data` and give the image an engine takes: PNG and JPEG as they are; WEBP and
    GIF as they are, or (`to_png`) as PNG of their first frame; scaled so that its longer
    side is at most `max_side` pixels when that is set (0: any size). ImageError when the
    bytes are not an image, or not one of the four formats."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", PIL.DecompressionBombWarning)
            img = PIL.open(io.BytesIO(data))
    except (PIL.DecompressionBombError, PIL.DecompressionBombWarning):
        raise _too_many_pixels() from None
    except (OSError, SyntaxError, ValueError, EOFError):
        # Not an image (UnidentifiedImageError is an OSError), or one cut short inside its
        # header: Pillow reads the header on open and raises a plain OSError there.
        raise ImageError(
            "The image could not be decoded: its bytes are not a PNG, JPEG, WEBP or GIF image.",
            code=INVALID_IMAGE,
        ) from None
    with img:
        fmt = img.format or ""
        if fmt not in MIME_TYPES:
            raise ImageError(
                f"The image is {fmt or 'of an unknown format'}; batchyard takes PNG, JPEG, "
                "WEBP and GIF.",
                code=INVALID_IMAGE_FORMAT,
            )
        width, height = img.size
        if width * height > MAX_PIXELS:
            raise _too_many_pixels(width, height)
        try:
            img.seek(0)  # GIF (and animated WEBP): the first frame
            img.load()
        except (OSError, SyntaxError, ValueError, EOFError) as exc:
            raise ImageError(
                f"The {fmt} image could not be decoded: {exc}.", code=INVALID_IMAGE
            ) from None
        scale = max_side > 0 and max(width, height) > max_side
        if not scale and (fmt in KEPT or not to_png):
            return Image(data, MIME_TYPES[fmt], width, height)
        frame = img.copy()
    if scale:
        frame.thumbnail((max_side, max_side), PIL.Resampling.LANCZOS)
    # JPEG stays JPEG (a photo as PNG is several times larger); a scaled WEBP stays WEBP
    # where the target takes it; the rest is PNG (a GIF's frame too: no palette to redo).
    keep = fmt == "JPEG" or (fmt == "WEBP" and not to_png)
    return _encode(frame, fmt if keep else "PNG")


def _encode(frame: PIL.Image, fmt: str) -> Image:
    if fmt == "JPEG" and frame.mode not in ("RGB", "L"):
        frame = frame.convert("RGB")
    if fmt == "PNG" and frame.mode not in ("1", "L", "LA", "P", "RGB", "RGBA", "I", "I;16"):
        frame = frame.convert("RGBA")
    buf = io.BytesIO()
    options = {"quality": 90} if fmt in ("JPEG", "WEBP") else {}
    frame.save(buf, format=fmt, **options)
    return Image(buf.getvalue(), MIME_TYPES[fmt], frame.width, frame.height)


def _too_many_pixels(width: int = 0, height: int = 0) -> ImageError:
    size = f" ({width} x {height})" if width else ""
    return ImageError(
        f"The image has more pixels{size} than batchyard decodes ({MAX_PIXELS:,}).",
        code=IMAGE_TOO_LARGE,
    )
