"""A sheet's image cells as chat image URLs, and a folder of images as a sheet.

A cell that `{{ image(column) }}` places holds one of:
- an http(s) URL or a `data:` URL: sent as it is (the server fetches a URL by its rules);
- a Files API id (`file-...`): sent as the chat part's `image_url.url`, read from the
  owner's files when the line runs (app/images);
- a path, relative to the sheet's folder: the file is read and inlined as a data URL, at
  most --max-image-bytes of it. A sheet uploaded to the dashboard has no folder, so it may
  hold URLs and file ids only; in a zip dropped with its images, its paths are replaced by
  the images' file ids first (app/sheets/zips.py).

A file that is not an image still goes (as a data URL of its bytes) and fails its own line
when it runs; a path that names no file, or a file over the cap, refuses the sheet, with
the row's number, before anything is written.
"""

from __future__ import annotations

import base64
import csv
from dataclasses import dataclass
from pathlib import Path

from app.wire.image_parts import image_source

#: The endings of the image files a folder's sheet lists (and their MIME types).
IMAGE_SUFFIXES = {
    ".png": "image/png",
    ".jpg": "image/jpeg",
    ".jpeg": "image/jpeg",
    ".webp": "image/webp",
    ".gif": "image/gif",
}
#: The column of a folder's sheet: each image's name, relative to the folder.
FOLDER_COLUMN = "file"
#: The first bytes of each format, for a file whose name does not say what it is.
_MAGIC = (
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
)


class ImageCellError(ValueError):
    """An image cell that cannot become a URL (the message names the cell, not the row)."""


def mime_of(data: bytes, name: str) -> str:
    """The image's MIME type by its first bytes, else by its name's ending."""
    for magic, mime in _MAGIC:
        if data.startswith(magic):
            return mime
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    return IMAGE_SUFFIXES.get(Path(name).suffix.lower(), "application/octet-stream")


def megabytes(n: int) -> str:
    return f"{n / (1024 * 1024):.3g} MB"


@dataclass(frozen=True)
class ImageCells:
    """How one sheet's image cells become URLs: `folder` is where relative paths are found
    (None: the sheet has none), `max_bytes` the cap on a file inlined."""

    folder: Path | None
    max_bytes: int

    def url(self, cell: object) -> str:
        value = str(cell).strip()
        if not value:
            raise ImageCellError("the image cell is empty")
        if image_source(value) != "path":  # a data URL, a file id or an http(s) URL
            return value
        return self._inline(value)

    def _inline(self, value: str) -> str:
        if self.folder is None:
            raise ImageCellError(
                f"the image '{value[:200]}' is neither an http(s) URL nor a file id, and a "
                "sheet uploaded here has no folder to find a file in: give URLs or file ids, "
                "or upload a zip of the sheet and its images (paths in a column of images "
                "only become file ids)"
            )
        path = self.folder / value
        try:
            size = path.stat().st_size
            if not path.is_file():
                raise IsADirectoryError(value)
        except OSError:
            raise ImageCellError(f"the image '{value}' is not a file in {self.folder}") from None
        if size > self.max_bytes:
            raise ImageCellError(
                f"the image '{value}' is {megabytes(size)}, larger than the "
                f"{megabytes(self.max_bytes)} cap on an image (--max-image-bytes {self.max_bytes})"
            )
        data = path.read_bytes()
        return f"data:{mime_of(data, value)};base64,{base64.b64encode(data).decode('ascii')}"


def names_an_image(cell: str, *, paths: bool = True) -> bool:
    """Whether a cell looks like what `image()` takes: a file id, an image's data URL, an
    http(s) URL, or (with `paths`) a path ending in an image's suffix."""
    value = cell.strip()
    source = image_source(value)
    if source in ("file", "url") or (source == "data" and value[:11].lower() == "data:image/"):
        return True
    path = value.split("?", 1)[0].split("#", 1)[0]
    return paths and Path(path).suffix.lower() in IMAGE_SUFFIXES


def image_column(columns: list[str], rows: list[list[str]]) -> str | None:
    """The first column whose cells (in `rows`, the first of the sheet) all name images:
    by file id or URL first, else by a path (a column of file names is a path's column
    only when no column holds ids or URLs)."""
    for paths in (False, True):
        for i, name in enumerate(columns):
            cells = [r[i] for r in rows if i < len(r) and r[i].strip()]
            if cells and all(names_an_image(c, paths=paths) for c in cells):
                return name
    return None


def folder_images(folder: Path) -> list[str]:
    """The image files directly in `folder`, by name (PNG, JPEG, WEBP, GIF by their ending;
    hidden files left out)."""
    return sorted(
        p.name
        for p in folder.iterdir()
        if p.suffix.lower() in IMAGE_SUFFIXES and not p.name.startswith(".") and p.is_file()
    )


def write_folder_sheet(folder: Path, dest: Path) -> int:
    """A CSV sheet of the folder's images, one row each (column FOLDER_COLUMN); the count."""
    names = folder_images(folder)
    with open(dest, "w", encoding="utf-8", newline="") as fh:
        w = csv.writer(fh)
        w.writerow([FOLDER_COLUMN])
        w.writerows([name] for name in names)
    return len(names)
