"""A zip dropped on the dashboard as a sheet: a zip of images, or a zip of one sheet and the
images it names.

A zip of images only: each image is stored as a file of purpose `vision`, and the zip
becomes a sheet of one row per image, its name and its file id (the column
`{{ image(image) }}` places).

A zip that holds one sheet (.csv, .tsv or .xlsx by name) besides images: that sheet is the
one the form opens. In its image columns, a cell that is a path, relative to the sheet's
folder in the zip, names one of the zip's images: that image is stored once as a file of
purpose `vision` and the cell becomes its file id (URLs and file ids stay as they are). An
image column is one whose cells all name images (file ids, URLs, paths ending in an image's
suffix; empty cells aside); in it, a path that is not in the zip refuses the zip, with its
row. Other columns are left as they are: a column of text that mentions `a.png` stays text. A CSV or TSV comes back
as a CSV of the same columns and rows (blank rows kept, so each row keeps its number); an
XLSX keeps all its sheets, each cell its value (a formula's as last calculated), so the
form's sheet choice still works.

Entries are read by their declared sizes, never past the cap (--max-image-bytes an image,
the server's max_file_bytes the sheet), so that a zip that inflates far past its size is
refused at the first entry too large. Entries in hidden folders or macOS's `__MACOSX/`
copies, folders, and files that are neither images nor sheets by name are left out.
Images are taken in name order.
"""

from __future__ import annotations

import csv
import io
import posixpath
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from app.sheets.images import IMAGE_SUFFIXES, megabytes, names_an_image
from app.sheets.reading import SHEET_SUFFIXES, SheetError, open_sheet

#: The columns of a zip's sheet.
NAME_COLUMN = "name"
IMAGE_COLUMN = "image"

#: A cell of a zip's sheet: (the workbook's sheet, or None for a CSV; row number; column index).
Cell = tuple[str | None, int, int]


def is_zip(filename: str) -> bool:
    return filename.lower().endswith(".zip")


@contextmanager
def open_zip(path: Path) -> Iterator[zipfile.ZipFile]:
    """The zip at `path`; SheetError for a file that is not one."""
    try:
        archive = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as exc:
        raise SheetError(f"The file is not a zip that can be read: {exc}.") from None
    with archive:
        yield archive


def _shown(info: zipfile.ZipInfo) -> bool:
    """Not a folder, nor in a hidden folder or macOS's __MACOSX/ copies."""
    parts = PurePosixPath(info.filename).parts
    return not info.is_dir() and not any(p.startswith((".", "__MACOSX")) for p in parts)


def _is_image(info: zipfile.ZipInfo) -> bool:
    return _shown(info) and PurePosixPath(info.filename).suffix.lower() in IMAGE_SUFFIXES


def sheet_in_zip(archive: zipfile.ZipFile) -> zipfile.ZipInfo | None:
    """The zip's one sheet, None for a zip of images; SheetError for more than one."""
    sheets = [
        i
        for i in archive.infolist()
        if _shown(i) and PurePosixPath(i.filename).suffix.lower() in SHEET_SUFFIXES
    ]
    if len(sheets) > 1:
        names = ", ".join(f"'{i.filename}'" for i in sorted(sheets, key=lambda i: i.filename))
        raise SheetError(
            f"The zip holds {len(sheets)} sheets ({names}); it may hold one sheet and its "
            "images, or images only."
        )
    return sheets[0] if sheets else None


def image_names(archive: zipfile.ZipFile) -> list[str]:
    """The names of the zip's images, in name order."""
    return sorted(i.filename for i in archive.infolist() if _is_image(i))


def images_in_zip(
    archive: zipfile.ZipFile, *, max_bytes: int, max_images: int
) -> Iterator[tuple[str, bytes]]:
    """(name in the zip, bytes) of each image entry, by name; SheetError for one image over
    `max_bytes`, more than `max_images` of them, or none."""
    names = image_names(archive)
    if not names:
        raise SheetError(
            f"The zip holds no images ({', '.join(IMAGE_SUFFIXES)} files by their names)."
        )
    check_image_count(len(names), max_images, "The zip holds")
    for name in names:
        yield name, read_image(archive, name, max_bytes=max_bytes)


def check_image_count(count: int, max_images: int, says: str) -> None:
    if count > max_images:
        raise SheetError(
            f"{says} {count} images; a batch may have at most {max_images} requests "
            "(BATCHYARD_MAX_REQUESTS_PER_BATCH)."
        )


def read_image(archive: zipfile.ZipFile, name: str, *, max_bytes: int) -> bytes:
    """The bytes of the image entry `name`, refused past `max_bytes` (declared or read)."""
    info = archive.getinfo(name)
    too_big = SheetError(
        f"The image '{name}' is larger than the {megabytes(max_bytes)} cap on an image "
        f"(--max-image-bytes {max_bytes})."
    )
    if info.file_size > max_bytes:
        raise too_big
    try:
        with archive.open(info) as member:
            data = member.read(max_bytes + 1)
    except (zipfile.BadZipFile, OSError, NotImplementedError) as exc:
        raise SheetError(f"The image '{name}' cannot be read: {exc}.") from None
    if len(data) > max_bytes:
        raise too_big
    return data


def extract_sheet(
    archive: zipfile.ZipFile, info: zipfile.ZipInfo, dest: Path, *, max_bytes: int
) -> None:
    """Write the sheet entry's bytes to `dest`, refused past `max_bytes` (declared or read)."""
    too_big = SheetError(
        f"The sheet '{info.filename}' is larger than the {megabytes(max_bytes)} cap on a "
        f"file (BATCHYARD_MAX_FILE_BYTES {max_bytes})."
    )
    if info.file_size > max_bytes:
        raise too_big
    written = 0
    try:
        with archive.open(info) as member, open(dest, "wb") as out:
            while chunk := member.read(1 << 20):
                written += len(chunk)
                if written > max_bytes:
                    raise too_big
                out.write(chunk)
    except (zipfile.BadZipFile, OSError, NotImplementedError) as exc:
        raise SheetError(f"The sheet '{info.filename}' cannot be read: {exc}.") from None


def _in_zip(folder: PurePosixPath, value: str, images: set[str]) -> str | None:
    """The image entry a cell's path names, relative to the sheet's folder (or the zip's
    top with a leading '/'; '\\' taken for '/'), or None."""
    path = value.replace("\\", "/")
    joined = path.lstrip("/") if path.startswith("/") else posixpath.join(str(folder), path)
    name = posixpath.normpath(joined)
    return name if name in images else None


def image_cells(local: Path, name: str, images: set[str], *, max_rows: int) -> dict[Cell, str]:
    """The cells of the sheet `name` (read from `local`) that name an image of the zip
    (`images`, by entry name), with that entry; every sheet of a workbook. SheetError for a
    path in an image column that is not in the zip (the first, by row) or a limit broken."""
    folder = PurePosixPath(name).parent
    with open_sheet(local, name) as first:
        sheets: list[str | None] = list(first.sheet_names) or [None]
    found: dict[Cell, str] = {}
    for sheet in sheets:
        with open_sheet(local, name, sheet=sheet, max_rows=max_rows) as opened:
            width = len(opened.columns)
            all_images = [True] * width
            paths: list[tuple[int, int, str, str | None]] = []
            for number, cells in opened.rows:
                for i, cell in enumerate(cells):
                    value = cell.strip()
                    if not value:
                        continue
                    if not names_an_image(value):
                        all_images[i] = False
                    elif not names_an_image(value, paths=False):  # a path
                        paths.append((number, i, value, _in_zip(folder, value, images)))
            for number, i, value, entry in paths:
                if not all_images[i]:
                    continue
                if entry is None:
                    where = f"Sheet '{sheet}', row" if len(sheets) > 1 else "Row"
                    raise SheetError(
                        f"{where} {number}, column '{opened.columns[i]}': the image "
                        f"'{value[:200]}' is not in the zip (a path is relative to the folder "
                        f"of '{name}' in the zip).",
                        code="image_not_found",
                    )
                found[(sheet, number, i)] = entry
    return found


def sheet_name(name: str) -> str:
    """The file name of the zip's sheet once its cells are replaced (a CSV or TSV is
    written back as CSV)."""
    base = PurePosixPath(name)
    return base.name if base.suffix.lower() == ".xlsx" else f"{base.stem}.csv"


def write_sheet(local: Path, name: str, ids: dict[Cell, str], dest: BinaryIO) -> None:
    """The sheet at `local` (named `name`) to `dest`, each cell in `ids` replaced by its
    file id: an XLSX as an XLSX, a CSV or TSV as a CSV of the same rows, by number."""
    if name.lower().endswith(".xlsx"):
        import openpyxl

        with open(local, "rb") as fh:
            book = openpyxl.load_workbook(fh, data_only=True)
        for (sheet, row, column), file_id in ids.items():
            book[sheet or book.sheetnames[0]].cell(row=row, column=column + 1).value = file_id
        book.save(dest)
        book.close()
        return
    text = io.TextIOWrapper(dest, encoding="utf-8", newline="")
    with open_sheet(local, name) as opened:
        w = csv.writer(text)
        w.writerow(opened.columns)
        last = 1
        for number, cells in opened.rows:
            w.writerows([[]] * (number - last - 1))  # blank rows keep the rows' numbers
            w.writerow([ids.get((None, number, i), c) for i, c in enumerate(cells)])
            last = number
    text.flush()
    text.detach()


def sheet_of_images(rows: list[tuple[str, str]]) -> bytes:
    """A CSV of (name, file id) rows under the NAME_COLUMN and IMAGE_COLUMN header."""
    text = io.StringIO()
    w = csv.writer(text)
    w.writerow([NAME_COLUMN, IMAGE_COLUMN])
    w.writerows(rows)
    return text.getvalue().encode("utf-8")
