"""Images in sheets: `{{ image(column) }}` places a cell's image (a URL, a file id, or a path
next to the sheet, inlined) as an image_url part of the user message; a folder of images
becomes a sheet of their names; `list` output columns. Real files and a real SQLite file;
the engine is the fake (it echoes `[image]` where an image reached it)."""

from __future__ import annotations

import base64
import csv
import io
from pathlib import Path
from typing import Any

import pytest

from app.errors import APIError
from app.sheets.images import ImageCells, folder_images, write_folder_sheet
from app.sheets.requests import (
    OutputColumn,
    RowTemplate,
    SheetSpec,
    parse_columns,
    request_lines,
    response_format,
)
from app.sheets.writing import result_cells
from app.tables import BatchStatus
from tests.fakes import FakeEngine
from tests.images import image_bytes
from tests.unit.helpers import drive, file_lines, services

PNG = image_bytes("PNG")


def template(text: str, columns: list[str], folder: Path | None = None, **kw: Any) -> RowTemplate:
    return RowTemplate(SheetSpec(template=text, model="m", **kw), columns, ImageCells(folder, 1000))


def test_an_image_between_text_becomes_text_and_image_url_parts(tmp_path: Path) -> None:
    t = template("Name {{ name }}: {{ image(photo) }} What is it?", ["name", "photo"])
    (user,) = t.messages(["cat", "https://example.com/cat.png"])
    assert user == {
        "role": "user",
        "content": [
            {"type": "text", "text": "Name cat:"},
            {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}},
            {"type": "text", "text": "What is it?"},
        ],
    }
    # A file id goes as the url (app/images reads it as the owner's file); data: as it is.
    (user,) = t.messages(["x", " file-abc123 "])
    assert user["content"][1]["image_url"]["url"] == "file-abc123"
    (user,) = t.messages(["x", "data:image/png;base64,QUJD"])
    assert user["content"][1]["image_url"]["url"] == "data:image/png;base64,QUJD"
    # Without image() the content stays a string, as before.
    assert template("{{ name }}", ["name"]).messages(["a"]) == [{"role": "user", "content": "a"}]


def test_a_path_is_read_from_the_sheets_folder_and_inlined(tmp_path: Path) -> None:
    (tmp_path / "pics").mkdir()
    (tmp_path / "pics" / "a.jpg").write_bytes(PNG)  # named .jpg, PNG inside: the bytes win
    t = template("{{ image(photo) }}", ["photo"], folder=tmp_path)
    (user,) = t.messages(["pics/a.jpg"])
    (part,) = user["content"]
    assert part["image_url"]["url"] == "data:image/png;base64," + base64.b64encode(PNG).decode()


def test_a_column_named_image_still_places_its_image() -> None:
    t = template("{{ image }} / {{ image(image) }}", ["image"])
    (user,) = t.messages(["https://x/y.png"])
    assert user["content"] == [
        {"type": "text", "text": "https://x/y.png /"},
        {"type": "image_url", "image_url": {"url": "https://x/y.png"}},
    ]


def rows_refused(t: RowTemplate, rows: list[list[str]]) -> str:
    with pytest.raises(APIError) as caught:
        list(request_lines(t, enumerate(rows, start=2)))
    assert caught.value.param == "template"
    return caught.value.message


def test_cells_that_name_no_usable_image_refuse_the_sheet_by_row(tmp_path: Path) -> None:
    (tmp_path / "big.png").write_bytes(b"x" * 1001)
    (tmp_path / "ok.png").write_bytes(PNG[:900] if len(PNG) > 900 else PNG)
    t = template("{{ image(photo) }}", ["photo"], folder=tmp_path)
    message = rows_refused(t, [["ok.png"], ["big.png"]])
    assert message.startswith("Row 3: the image 'big.png' is ")
    assert "larger than the" in message and "(--max-image-bytes 1000)" in message
    assert "Row 2: the image 'gone.png' is not a file in" in rows_refused(t, [["gone.png"]])
    assert "Row 2: the image cell is empty" in rows_refused(t, [[" "]])
    no_folder = template("{{ image(photo) }}", ["photo"])
    assert "no folder to find a file in" in rows_refused(no_folder, [["ok.png"]])
    system = template("{{ photo }}", ["photo"], system="{{ image(photo) }}")
    assert "not the system prompt" in rows_refused(system, [["https://x/y.png"]])
    filtered = template("{{ image(photo) | upper }}", ["photo"])
    assert "with no filter on it" in rows_refused(filtered, [["https://x/y.png"]])


def test_image_is_not_taken_for_an_unknown_column() -> None:
    with pytest.raises(APIError, match="'imag'"):
        template("{{ imag(photo) }}", ["photo"])


def test_a_folder_sheet_lists_its_images_by_name(tmp_path: Path) -> None:
    for name in ("b.JPG", "a.png", "c.webp", "d.gif", "e.jpeg", "notes.txt", ".hidden.png"):
        (tmp_path / name).write_bytes(PNG)
    (tmp_path / "sub.png").mkdir()
    assert folder_images(tmp_path) == ["a.png", "b.JPG", "c.webp", "d.gif", "e.jpeg"]
    dest = tmp_path / "sheet.csv"
    assert write_folder_sheet(tmp_path, dest) == 5
    assert list(csv.reader(dest.open())) == [
        ["file"],
        ["a.png"],
        ["b.JPG"],
        ["c.webp"],
        ["d.gif"],
        ["e.jpeg"],
    ]


def test_columns_in_one_argument_and_the_list_type() -> None:
    columns = parse_columns("caption, objects: list, score:number, label: one of a, b, c")
    assert [(c.name, c.type, c.choices) for c in columns] == [
        ("caption", "text", []),
        ("objects", "list", []),
        ("score", "number", []),
        ("label", "one of", ["a", "b", "c"]),
    ]
    schema = response_format(columns)
    assert schema is not None
    properties = schema["json_schema"]["schema"]["properties"]
    assert properties["objects"] == {"type": "array", "items": {"type": "string"}}
    # A list answer is written to its cell as JSON, as any answer that is not a scalar.
    line = {
        "response": {
            "status_code": 200,
            "body": {
                "choices": [
                    {
                        "message": {"content": '{"caption": "a cat", "objects": ["cat", "sofa"]}'},
                        "finish_reason": "stop",
                    }
                ],
                "usage": {"prompt_tokens": 40, "completion_tokens": 9},
            },
        }
    }
    two = [OutputColumn("caption"), OutputColumn("objects", "list")]
    assert result_cells(line, two) == ["a cat", '["cat", "sofa"]', "", "stop", 40, 9]


def test_a_sheet_of_file_ids_runs_with_each_image_read_as_the_owners_file(tmp_path: Path) -> None:
    engine = FakeEngine()
    svc = services(tmp_path / "data", engine)
    ids = [
        svc.files.store(
            io.BytesIO(image_bytes(fmt)), filename=f"x.{fmt.lower()}", purpose="vision", owner="ann"
        ).id
        for fmt in ("PNG", "WEBP")
    ]
    sheet = "name,image\n" + "".join(f"n{i},{file_id}\n" for i, file_id in enumerate(ids))
    stored = svc.sheets.store(io.BytesIO(sheet.encode()), "photos.csv", "ann")
    spec = SheetSpec(template="Describe {{ name }}. {{ image(image) }}", model="m")
    preview = svc.sheets.preview(stored.id, "ann", spec)
    assert preview.images and preview.requests[0].messages[0]["content"][1] == {
        "type": "image_url",
        "image_url": {"url": ids[0]},
    }
    batch = svc.sheets.start("ann", stored.id, spec)
    done = drive(svc, batch.id)
    assert done.status == BatchStatus.COMPLETED and (done.completed, done.failed) == (2, 0)
    answers = [
        x["response"]["body"]["choices"][0]["message"]["content"]
        for x in file_lines(svc, done.output_file_id)
    ]
    assert answers == ["echo: Describe n0. [image]", "echo: Describe n1. [image]"]
    # The engine got each image as a data URL (WEBP as PNG: the embedded engine's form).
    urls = [
        body["messages"][0]["content"][1]["image_url"]["url"] for _, body, _ in engine.submitted
    ]
    assert [u[: len("data:image/png;base64,")] for u in urls] == ["data:image/png;base64,"] * 2
