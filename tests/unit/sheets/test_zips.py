"""A dropped zip as a sheet (app/sheets/zips.py, SheetService.from_zip): a zip of one sheet
and its images becomes that sheet with each image path a file id of purpose `vision`; more
than one sheet, a path not in the zip, or an entry over its cap refuses the zip. Real zips,
real XLSX workbooks and a real SQLite file."""

from __future__ import annotations

import csv
import io
import zipfile
from pathlib import Path

import openpyxl
import pytest

from app.sheets.reading import SheetError, open_sheet
from app.sheets.zips import image_cells, image_names, open_zip, sheet_in_zip, write_sheet
from tests.fakes import FakeEngine
from tests.images import image_bytes
from tests.unit.helpers import services

PNG = image_bytes("PNG")
JPEG = image_bytes("JPEG")


def make_zip(path: Path, entries: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        for name, data in entries.items():
            z.writestr(name, data)
    return path


def csv_bytes(rows: list[list[str]], delimiter: str = ",") -> bytes:
    text = io.StringIO()
    csv.writer(text, delimiter=delimiter).writerows(rows)
    return text.getvalue().encode()


def test_the_one_sheet_is_found_and_copies_and_hidden_files_are_not_sheets(
    tmp_path: Path,
) -> None:
    one = make_zip(
        tmp_path / "one.zip",
        {
            "data/list.csv": b"x\n",
            "__MACOSX/data/._list.csv": b"fork",
            ".hidden/old.xlsx": b"",
            "a.png": PNG,
        },
    )
    with open_zip(one) as archive:
        info = sheet_in_zip(archive)
        assert info is not None and info.filename == "data/list.csv"
        assert image_names(archive) == ["a.png"]
    images = make_zip(tmp_path / "images.zip", {"a.png": PNG, "notes.txt": b"x"})
    with open_zip(images) as archive:
        assert sheet_in_zip(archive) is None
    two = make_zip(tmp_path / "two.zip", {"b.tsv": b"x\n", "a.xlsx": b"", "a.png": PNG})
    with open_zip(two) as archive, pytest.raises(SheetError) as caught:
        sheet_in_zip(archive)
    assert caught.value.message == (
        "The zip holds 2 sheets ('a.xlsx', 'b.tsv'); it may hold one sheet and its images, "
        "or images only."
    )


def test_paths_in_image_columns_resolve_beside_the_sheet_and_other_columns_stay(
    tmp_path: Path,
) -> None:
    sheet = tmp_path / "s.csv"
    sheet.write_bytes(
        csv_bytes(
            [
                ["name", "photo", "note"],
                ["first", "photos/a.png", "see photos/a.png"],
                ["second", "https://example.com/b.png", "a.png"],
                ["third", "./photos/../photos/a.png", "plain"],
                ["fourth", "file-abc123", ""],
                ["fifth", "..\\top.jpg", ""],
                ["sixth", "/top.jpg", ""],
            ]
        )
    )
    images = {"data/photos/a.png", "top.jpg", "data/a.png"}
    cells = image_cells(sheet, "data/s.csv", images, max_rows=100)
    # 'note' holds prose as well as a file name in the zip: not an image column, left as it is.
    assert cells == {
        (None, 2, 1): "data/photos/a.png",
        (None, 4, 1): "data/photos/a.png",
        (None, 6, 1): "top.jpg",
        (None, 7, 1): "top.jpg",
    }


def test_a_path_not_in_the_zip_refuses_it_with_its_row_and_column(tmp_path: Path) -> None:
    sheet = tmp_path / "s.csv"
    sheet.write_bytes(csv_bytes([["photo"], ["photos/a.png"], ["photos/gone.png"]]))
    with pytest.raises(SheetError) as caught:
        image_cells(sheet, "s.csv", {"photos/a.png"}, max_rows=100)
    assert caught.value.code == "image_not_found"
    assert caught.value.message == (
        "Row 3, column 'photo': the image 'photos/gone.png' is not in the zip (a path is "
        "relative to the folder of 's.csv' in the zip)."
    )
    # A column of image paths none of which is in the zip is still an image column.
    sheet.write_bytes(csv_bytes([["photo"], ["pics/a.png"]]))
    with pytest.raises(SheetError, match=r"Row 2, column 'photo': the image 'pics/a\.png'"):
        image_cells(sheet, "s.csv", {"photos/a.png"}, max_rows=100)


def test_a_tsv_comes_back_as_a_csv_of_the_same_rows_by_number(tmp_path: Path) -> None:
    sheet = tmp_path / "s.tsv"
    sheet.write_bytes(b"name\tphoto\nfirst\ta.png\n\n\nthird, with a comma\tb.png\n")
    out = io.BytesIO()
    write_sheet(sheet, "s.tsv", {(None, 2, 1): "file-a", (None, 5, 1): "file-b"}, out)
    back = tmp_path / "back.csv"
    back.write_bytes(out.getvalue())
    with open_sheet(back, "back.csv") as opened:
        assert opened.columns == ["name", "photo"]
        assert list(opened.rows) == [
            (2, ["first", "file-a"]),
            (5, ["third, with a comma", "file-b"]),
        ]


def test_every_sheet_of_a_workbook_has_its_cells_replaced(tmp_path: Path) -> None:
    book = openpyxl.Workbook()
    first = book.active
    assert first is not None
    first.title = "Shop"
    first.append(["item", "photo"])
    first.append(["cup", "img/cup.png"])
    second = book.create_sheet("Garden")
    second.append(["plant", "picture", "height"])
    second.append(["fern", "img/fern.jpg", 1.5])
    second.append(["rose", "img/cup.png", 2])
    path = tmp_path / "b.xlsx"
    book.save(path)
    images = {"img/cup.png", "img/fern.jpg"}
    cells = image_cells(path, "book.xlsx", images, max_rows=100)
    assert cells == {
        ("Shop", 2, 1): "img/cup.png",
        ("Garden", 2, 1): "img/fern.jpg",
        ("Garden", 3, 1): "img/cup.png",
    }
    out = tmp_path / "out.xlsx"
    with open(out, "wb") as fh:
        ids = {"img/cup.png": "file-cup", "img/fern.jpg": "file-fern"}
        write_sheet(path, "book.xlsx", {c: ids[n] for c, n in cells.items()}, fh)
    with open_sheet(out, "out.xlsx", sheet="Garden") as opened:
        assert opened.sheet_names == ["Shop", "Garden"]
        assert opened.columns == ["plant", "picture", "height"]
        assert list(opened.rows) == [
            (2, ["fern", "file-fern", "1.5"]),
            (3, ["rose", "file-cup", "2"]),
        ]


def test_from_zip_stores_each_named_image_once_and_the_sheet_with_their_ids(
    tmp_path: Path,
) -> None:
    svc = services(tmp_path / "data", FakeEngine())
    sheet = csv_bytes([["name", "photo"], ["a", "photos/a.png"], ["b", "photos/b.jpg"]])
    sheet += csv_bytes([["a again", "photos/a.png"], ["web", "https://example.com/c.png"]])
    entries = {"set/list.csv": sheet, "set/photos/a.png": PNG, "set/photos/b.jpg": JPEG}
    entries["set/photos/unused.png"] = PNG
    zip_file = svc.files.store(
        io.BytesIO(make_zip(tmp_path / "z.zip", entries).read_bytes()),
        filename="set.zip",
        purpose="batch",
        owner="alice",
    )
    made = svc.sheets.from_zip(zip_file.id, "alice")
    assert made.filename == "list.csv" and made.purpose == "user_data"
    files = {f.filename: f for f in svc.files.list("alice", limit=100)[0]}
    assert sorted(files) == ["a.png", "b.jpg", "list.csv"]  # the zip is gone, unused unstored
    look = svc.sheets.look(made.id, "alice")
    assert look.columns == ["name", "photo"]
    a, b = files["a.png"].id, files["b.jpg"].id
    assert [cells for _, cells in look.rows] == [
        ["a", a],
        ["b", b],
        ["a again", a],
        ["web", "https://example.com/c.png"],
    ]
    assert svc.storage.path(a).read_bytes() == PNG and files["a.png"].purpose == "vision"


@pytest.mark.parametrize(
    ("entries", "says"),
    [
        (
            {"s.csv": b"photo\nmissing.png\n", "a.png": PNG},
            "Row 2, column 'photo': the image 'missing.png' is not in the zip",
        ),
        (
            {"s.csv": b"photo\na.png\nbig.png\n", "a.png": PNG, "big.png": b"x" * 5000},
            "The image 'big.png' is larger than the 0.00381 MB cap on an image "
            "(--max-image-bytes 4000).",
        ),
        (
            {"s.csv": b"photo\n" + b"a.png\n" * 3000, "a.png": PNG},
            "is larger than the 0.00954 MB cap on a file (BATCHYARD_MAX_FILE_BYTES 10000).",
        ),
        (
            {"s.csv": b"photo\na.png\na.png\na.png\na.png\n", "a.png": PNG},
            "The sheet has more than 3 rows of data (row 5); a batch may have at most 3 requests.",
        ),
    ],
)
def test_a_refused_zip_keeps_nothing_and_says_its_limit(
    tmp_path: Path, entries: dict[str, bytes], says: str
) -> None:
    svc = services(
        tmp_path / "data",
        FakeEngine(),
        max_image_bytes=4000,
        max_file_bytes=10_000,
        max_requests_per_batch=3,
    )
    data = make_zip(tmp_path / "z.zip", entries).read_bytes()
    stored = svc.files.store(io.BytesIO(data), filename="z.zip", purpose="batch", owner="")
    with pytest.raises(SheetError) as caught:
        svc.sheets.from_zip(stored.id, "")
    assert says in caught.value.message
    left, _ = svc.files.list("", limit=100)
    assert left == [] and list(svc.storage.tmp_dir.iterdir()) == []
