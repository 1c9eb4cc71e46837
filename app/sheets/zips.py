"""A zip of images as a sheet: each image stored as a file of purpose `vision`, and a sheet
of one row per image, its name and its file id (the column `{{ image(image) }}` places).

The zip's entries are read by their declared sizes, never past --max-image-bytes each, so
that a zip that inflates far past its size is refused at the first entry too large; entries
that are not PNG, JPEG, WEBP or GIF by name (folders, macOS's `__MACOSX/` copies, notes) are
left out. Images are taken in name order.
"""

from __future__ import annotations

import csv
import io
import zipfile
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

from app.sheets.images import IMAGE_SUFFIXES, megabytes
from app.sheets.reading import SheetError

#: The columns of a zip's sheet.
NAME_COLUMN = "name"
IMAGE_COLUMN = "image"


def is_zip(filename: str) -> bool:
    return filename.lower().endswith(".zip")


def images_in_zip(path: Path, *, max_bytes: int, max_images: int) -> Iterator[tuple[str, bytes]]:
    """(name in the zip, bytes) of each image entry, by name; SheetError for a file that is
    not a zip, one image over `max_bytes`, more than `max_images` of them, or none."""
    try:
        archive = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as exc:
        raise SheetError(f"The file is not a zip that can be read: {exc}.") from None
    with archive:
        entries = sorted((i for i in archive.infolist() if _is_image(i)), key=lambda i: i.filename)
        if not entries:
            raise SheetError(
                f"The zip holds no images ({', '.join(IMAGE_SUFFIXES)} files by their names)."
            )
        if len(entries) > max_images:
            raise SheetError(
                f"The zip holds {len(entries)} images; a batch may have at most {max_images} "
                "requests."
            )
        for info in entries:
            too_big = SheetError(
                f"The image '{info.filename}' is larger than the {megabytes(max_bytes)} cap on "
                f"an image (--max-image-bytes {max_bytes})."
            )
            if info.file_size > max_bytes:
                raise too_big
            try:
                with archive.open(info) as member:
                    data = member.read(max_bytes + 1)
            except (zipfile.BadZipFile, OSError, NotImplementedError) as exc:
                raise SheetError(f"The image '{info.filename}' cannot be read: {exc}.") from None
            if len(data) > max_bytes:
                raise too_big
            yield info.filename, data


def _is_image(info: zipfile.ZipInfo) -> bool:
    path = PurePosixPath(info.filename)
    hidden = any(part.startswith((".", "__MACOSX")) for part in path.parts)
    return not info.is_dir() and not hidden and path.suffix.lower() in IMAGE_SUFFIXES


def sheet_of_images(rows: list[tuple[str, str]]) -> bytes:
    """A CSV of (name, file id) rows under the NAME_COLUMN and IMAGE_COLUMN header."""
    text = io.StringIO()
    w = csv.writer(text)
    w.writerow([NAME_COLUMN, IMAGE_COLUMN])
    w.writerows(rows)
    return text.getvalue().encode("utf-8")
