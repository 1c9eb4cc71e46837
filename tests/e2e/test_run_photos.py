"""`batchyard run` on images, end to end through the CLI on the real engine and the test
vision pair (tests/vision.py, put beside each other as `vision.gguf` and
`mmproj-vision.gguf`, as LM Studio and the hub name a model's projector):

- a folder of photos becomes one line per image, sorted by name, and comes back as a sheet
  of file names and answer columns, a `list` column among them;
- a sheet whose column names images next to it places them with `{{ image(photo) }}`;
- a cell naming a file over --max-image-bytes refuses the sheet, saying the cap.
"""

from __future__ import annotations

import base64
import csv
import io
import json
import sqlite3
from pathlib import Path

import pytest

from tests.factories import jsonl_lines
from tests.live import batchyard
from tests.vision import MMPROJ_FILE, MODEL_FILE, png, vision_model  # noqa: F401

pytestmark = pytest.mark.slow

SMALL = ("--parallel", "3", "--ctx-size", "1024", "--threads", "2", "--temperature", "0")
COLOURS = {"b-blue.png": (20, 40, 220), "a-red.png": (220, 30, 30), "c-green.png": (30, 200, 40)}


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory, vision_model: Path) -> Path:  # noqa: F811
    root = tmp_path_factory.mktemp("vision-beside")
    (root / "vision.gguf").symlink_to(vision_model / MODEL_FILE)
    (root / "mmproj-vision.gguf").symlink_to(vision_model / MMPROJ_FILE)
    return root / "vision.gguf"


def photos(folder: Path) -> Path:
    folder.mkdir()
    for name, colour in COLOURS.items():
        (folder / name).write_bytes(png(colour, stripes=4 if "red" in name else 0))
    (folder / "notes.txt").write_text("not a photo")
    return folder


def read_csv(path: Path) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(path.read_text(encoding="utf-8-sig"))))


def input_lines(state: Path) -> list[dict[str, object]]:
    with sqlite3.connect(state / "batchyard.db") as db:
        ((input_file,),) = db.execute("select input_file_id from batch")
    return jsonl_lines((state / "files" / input_file).read_text())


def test_a_folder_of_photos_to_a_sheet_of_captions(tmp_path: Path, model: Path) -> None:
    folder = photos(tmp_path / "photos")
    out = tmp_path / "captions.csv"
    # The model by its catalog name, from a models folder, as an Ollama user names theirs.
    done = batchyard(
        "run", str(folder), "--models-dir", str(model.parent), "--no-discover",
        "--model", "vision",
        "--prompt", "Describe this photo.", "--columns", "caption, objects: list",
        "--max-tokens", "96", "-o", str(out), *SMALL, timeout=300,
    )  # fmt: skip

    assert done.returncode in (0, 3), done.stderr
    assert "model vision on CPU" in done.stderr and "progress: 3/3 lines" in done.stderr
    rows = read_csv(out)
    assert list(rows[0]) == [
        "file", "caption", "objects", "error", "finish_reason", "prompt_tokens", "completion_tokens",
    ]  # fmt: skip
    assert [r["file"] for r in rows] == ["a-red.png", "b-blue.png", "c-green.png"]
    # Each line carried its own photo, inlined, after the prompt's text.
    lines = input_lines(out.with_name("captions.csv.batchyard-state"))
    for line, row in zip(lines, rows, strict=True):
        assert line["body"]["model"] == "vision"  # type: ignore[index]
        text, image = line["body"]["messages"][-1]["content"]  # type: ignore[index]
        assert text == {"type": "text", "text": "Describe this photo."}
        expected = base64.b64encode((folder / row["file"]).read_bytes()).decode()
        assert image["image_url"]["url"] == f"data:image/png;base64,{expected}"
    # The image's positions are in the prompt, the same for each same-sized photo.
    assert len({r["prompt_tokens"] for r in rows}) == 1 and int(rows[0]["prompt_tokens"]) > 32
    # The random projector's answers may run on (a list item said again and again): a row
    # cut at max_tokens says so and keeps the answer's text; a finished row has its columns.
    for r in rows:
        if r["finish_reason"] == "stop":
            assert r["error"] == ""
            objects = json.loads(r["objects"])  # a list column's cell: its JSON array
            assert isinstance(objects, list) and all(isinstance(o, str) for o in objects)
        else:
            assert r["finish_reason"] == "length", r
            assert r["error"].startswith("the answer was cut at max_tokens"), r
            assert '"caption"' in r["error"], r  # the answer's own text, in the schema's shape
    # Three photos, three different answers: the model saw each one.
    assert len({(r["caption"], r["objects"], r["error"]) for r in rows}) == 3


def test_a_sheet_places_the_images_its_column_names(tmp_path: Path, model: Path) -> None:
    photos(tmp_path / "pics")
    sheet = tmp_path / "list.csv"
    sheet.write_text("name,photo\nred,pics/a-red.png\ngreen,pics/c-green.png\n")
    out = tmp_path / "answers.xlsx"
    done = batchyard(
        "run", str(sheet), "--model", str(model),
        "--prompt", "This is {{ name }}: {{ image(photo) }} Say what you see.",
        "--max-tokens", "8", "-o", str(out), *SMALL, timeout=300,
    )  # fmt: skip

    assert done.returncode == 0, done.stderr
    assert "2 rows succeeded, 0 failed" in done.stderr
    (first, _) = input_lines(out.with_name("answers.xlsx.batchyard-state"))
    kinds = [p["type"] for p in first["body"]["messages"][-1]["content"]]  # type: ignore[index]
    assert kinds == ["text", "image_url", "text"]

    big = tmp_path / "big.csv"
    big.write_text("photo\npics/b-blue.png\n")
    refused = batchyard(
        "run", str(big), "--model", str(model), "--prompt", "{{ image(photo) }}",
        "--max-image-bytes", "100", "-o", str(tmp_path / "big-out.csv"), *SMALL, timeout=300,
    )  # fmt: skip
    assert refused.returncode == 1, refused.stderr
    assert "Row 2: the image 'pics/b-blue.png' is " in refused.stderr
    assert "(--max-image-bytes 100)" in refused.stderr
