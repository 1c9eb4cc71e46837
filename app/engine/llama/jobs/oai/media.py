"""Images in OpenAI bodies, the parts that need no llama.cpp: the bytes of a data URL the
engine takes, the images a chat prompt collects in order, and the ids an image takes in a prompt's token list.

A prompt with images is one list of ints, as a text prompt is: text tokens (ids >= 0) and,
for each image chunk libmtmd cuts it into, one negative id per embedding row. The ids come
from the hash of the image's bytes (and the chunk's place among that image's chunks) and
the row's offset, so the prefix cache compares images as it compares text: two prompts that
hold the same image after the same text share that image's cells, and different images
never match. vision.py turns the ids back into the image they stand for.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from app.engine.base import EngineError
from app.engine.data_urls import DataURLError, is_data_url, parse_data_url

#: Media types the embedded engine decodes itself (llama.cpp's stb_image). The server turns
#: WEBP into PNG before a line reaches the engine; the others are here for direct callers.
MEDIA_TYPES = ("image/png", "image/jpeg", "image/jpg", "image/gif", "image/bmp")
#: Bits of an image id that hold the row's offset within its chunk (up to 65,536 rows).
OFFSET_BITS = 16
_OFFSET_MASK = (1 << OFFSET_BITS) - 1
#: Bits of an image id taken from the hash: with the offset, ids stay within 2**56.
HASH_BITS = 40


def bad_image(message: str, param: str, code: str = "invalid_image") -> EngineError:
    """A 400 about one image of a request."""
    return EngineError(message, status_code=400, code=code, param=param)


def takes_no_images(model: str, param: str, why: str | None = None) -> EngineError:
    """The 400 for an image sent to a model loaded without a projector (`why`: the reason
    its projector could not be loaded, when it has one)."""
    reason = (
        f"its projector could not be loaded: {why}"
        if why
        else ("it was loaded without a multimodal projector")
    )
    return EngineError(
        f"model {model} takes no images ({reason}); send text only, or use a vision model.",
        status_code=400,
        code="model_takes_no_images",
        param=param,
    )


def image_bytes(url: object, param: str) -> bytes:
    """The bytes of a base64 data URL (app/engine/data_urls.py parses it) of a type the
    engine decodes; a 400 naming `param` for anything else."""
    if not isinstance(url, str):
        raise bad_image(f"{param} must be a string URL.", param, "invalid_type")
    if not is_data_url(url):
        raise bad_image(
            f"{param}: the embedded engine takes images as data URLs "
            "(data:image/png;base64,... or data:image/jpeg;base64,...).",
            param,
            "invalid_image_url",
        )
    try:
        parsed = parse_data_url(url)
    except DataURLError as exc:
        raise bad_image(f"{param}: {exc.message}", param, exc.code) from None
    if parsed.media_type not in MEDIA_TYPES:
        raise bad_image(
            f"{param}: images of type {parsed.media_type or 'unknown'} are not taken here; "
            "send PNG or JPEG.",
            param,
            "invalid_image_format",
        )
    return parsed.data


@dataclass
class Media:
    """The images of one chat prompt, in the order their markers appear in its text."""

    marker: str  # the text libmtmd replaces with an image (mtmd_default_marker)
    images: list[bytes] = field(default_factory=list)

    def add(self, url: object, param: str) -> str:
        """Take one image part's URL; returns the text that stands for it in the prompt."""
        self.images.append(image_bytes(url, param))
        return self.marker


def image_key(raw: bytes) -> str:
    """The id of an image: the sha256 of its bytes, in hex."""
    return hashlib.sha256(raw).hexdigest()


def image_ids(key: str, ordinal: int, n_tokens: int) -> list[int]:
    """The token ids of one image chunk: chunk `ordinal` of the image whose bytes hash to
    `key`, `n_tokens` embedding rows. All negative, so never a vocabulary token."""
    if not 0 < n_tokens <= _OFFSET_MASK + 1:
        raise ValueError(f"an image chunk of {n_tokens} rows")
    digest = hashlib.sha256(f"{key}/{ordinal}".encode()).digest()
    base = int.from_bytes(digest[: HASH_BITS // 8], "big") << OFFSET_BITS
    return [-(1 + base + k) for k in range(n_tokens)]


def offset(token: int) -> int:
    """Which row of its image chunk an image id stands for."""
    return (-token - 1) & _OFFSET_MASK


def whole_images(tokens: list[int], keep: int) -> int:
    """`keep` moved back to the start of the image it would cut (a prefix of `tokens` to
    reuse ends at a chunk's edge: an image's cells are decoded whole)."""
    if 0 < keep < len(tokens) and tokens[keep] < 0:
        return keep - offset(tokens[keep])
    return keep


def text_run(tokens: list[int], limit: int) -> int:
    """How many of the first `limit` tokens come before the first image id."""
    for i in range(min(limit, len(tokens))):
        if tokens[i] < 0:
            return i
    return min(limit, len(tokens))
