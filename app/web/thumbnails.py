"""Thumbnails of the images in requests, for the sheet form's preview and the results
explorer: small pictures made with Pillow (app/images' `prepare`, scaled down).

- a data URL: its image, scaled, inline as a small data URL;
- a file id: `/web/files/ID/thumbnail`, made from the owner's file when the browser asks
  (and kept by the browser: files never change);
- an http(s) URL: a link only. The page never fetches a remote URL, and neither does the
  server for a thumbnail.

The explorer's rows read their input lines once: what they show is kept (by input file
and line, both unchanging) in a small bounded map, so that live refreshes read nothing.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from app.images import ImageError, find_images, prepare
from app.images.decode import data_url_bytes
from app.wire.endpoints import CHAT
from app.wire.image_parts import image_part, image_source

#: The longer side of a thumbnail, in pixels (shown at half that, sharp on HiDPI screens).
THUMB_SIDE = 160
#: A data URL's images larger than this are not decoded for a thumbnail.
THUMB_MAX_BYTES = 20 * 1024 * 1024
#: Explorer lines whose images are kept (by input file and line).
ROWS_KEPT = 2048


@dataclass(frozen=True)
class ImageView:
    """One image as the page shows it: `src` for an <img>, or `href` for a link."""

    src: str | None
    href: str | None
    label: str


def thumbnail_bytes(data: bytes) -> tuple[bytes, str]:
    """(bytes, MIME type) of the image scaled to THUMB_SIDE (ImageError if it is none)."""
    image = prepare(data, to_png=True, max_side=THUMB_SIDE)
    return image.data, image.mime


def image_view(url: str) -> ImageView:
    """What the page shows for an image part's URL (see the module's docstring)."""
    source = image_source(url)
    if source == "data":
        try:
            small = prepare(data_url_bytes(url, THUMB_MAX_BYTES), to_png=True, max_side=THUMB_SIDE)
        except ImageError as exc:
            return ImageView(None, None, f"not shown: {exc.message}")
        return ImageView(small.data_url(), None, f"image {small.width} x {small.height}")
    if source == "file":
        return ImageView(f"/web/files/{url}/thumbnail", None, url)
    if source == "url":
        return ImageView(None, url, url)
    return ImageView(None, None, f"not shown: {url[:80]}")


def content_views(content: Any) -> list[dict[str, Any]]:
    """A message's content as the preview shows it: text pieces and image views, in order."""
    if not isinstance(content, list):
        return [{"text": str(content)}]
    out: list[dict[str, Any]] = []
    for part in content:
        if not isinstance(part, dict):
            continue
        if (image := image_part(CHAT, part)) is not None:
            out.append({"image": image_view(str(image.url or ""))})
        elif part.get("type") == "text":
            out.append({"text": str(part.get("text", ""))})
    return out


def line_images(source: dict[str, Any] | None) -> list[ImageView]:
    """The images of one input line (a chat or Responses body), in order."""
    if not isinstance(source, dict) or not isinstance(source.get("body"), dict):
        return []
    try:
        refs = find_images(str(source.get("url", "")), source["body"])
    except ImageError:
        return []
    return [image_view(ref.value) for ref in refs]


class RowImages:
    """The images of explorer lines, kept by (input file, line): bounded, oldest out."""

    def __init__(self, kept: int = ROWS_KEPT) -> None:
        self.kept = kept
        self._lock = threading.Lock()
        self._rows: OrderedDict[tuple[str, int], list[ImageView]] = OrderedDict()

    def get(self, file_id: str, line: int) -> list[ImageView] | None:
        with self._lock:
            hit = self._rows.get((file_id, line))
            if hit is not None:
                self._rows.move_to_end((file_id, line))
            return hit

    def put(self, file_id: str, line: int, views: list[ImageView]) -> None:
        with self._lock:
            self._rows[(file_id, line)] = views
            while len(self._rows) > self.kept:
                self._rows.popitem(last=False)
