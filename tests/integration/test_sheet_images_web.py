"""Images on the dashboard, on the real app and SQLite (the fake engine, which echoes
`[image]` where an image reached it): a dropped zip of images becomes a sheet of file ids
(a zip of a sheet and its images, that sheet with its paths as file ids), its preview shows
thumbnails made by the server, the batch runs, and the results explorer shows each line's
images beside its answer; a remote URL is only ever a link."""

from __future__ import annotations

import io
import re
import zipfile
from typing import Any

from litestar.testing import TestClient
from PIL import Image

from tests.http_helpers import MakeClient, batch_getter, wait_for_status
from tests.images import data_url, image_bytes
from tests.integration.test_auth import ALICE, BOB, bearer, keys  # noqa: F401 (fixture)
from tests.integration.test_sheets_owners import login


def photos_zip() -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("b.webp", image_bytes("WEBP", (400, 300), (20, 40, 220)))
        z.writestr("a.png", image_bytes("PNG", (400, 300), (220, 30, 30)))
        z.writestr("__MACOSX/._a.png", b"resource fork")
        z.writestr("notes.txt", b"not an image")
        z.writestr("sub/c.jpg", image_bytes("JPEG", (300, 400), (30, 200, 40)))
    return buf.getvalue()


def test_a_zip_of_images_to_a_batch_with_thumbnails(
    make_client: MakeClient,
    keys: dict[str, Any],  # noqa: F811
) -> None:
    client = make_client(**keys)
    login(client, ALICE)
    form = client.post(
        "/web/upload",
        files={"file": ("photos.zip", photos_zip(), "application/zip")},
        data={"purpose": "batch"},
    )
    assert form.status_code == 200 and 'id="sheet-columns"' in form.text, form.text
    assert "photos.csv" in form.text and "{{ image(image) }}" in form.text, form.text
    sheet_id = re.search(r"/web/sheets/(file-\w+)/start", form.text).group(1)  # type: ignore[union-attr]
    files = client.get("/v1/files", headers=bearer(ALICE)).json()["data"]
    by_name = {f["filename"]: f for f in files}
    # The zip is gone; its images are files of purpose vision, in name order in the sheet.
    assert sorted(by_name) == ["a.png", "b.webp", "c.jpg", "photos.csv"]
    assert {by_name[n]["purpose"] for n in ("a.png", "b.webp", "c.jpg")} == {"vision"}
    image_ids = [by_name[n]["id"] for n in ("a.png", "b.webp", "c.jpg")]
    assert re.findall(r"file-\w+", form.text.split('id="sheet-columns"')[1])[:3] == image_ids

    fields = {
        "template": "Describe {{ name }}. {{ image(image) }}",
        "model": "fake-model",
        "max_tokens": "4",
        "col_name": "",
    }
    preview = client.post(f"/web/sheets/{sheet_id}/preview", data=fields)
    assert "3 rows" in preview.text and "Describe a.png." in preview.text
    thumbs = re.findall(r'<img class="thumb" src="([^"]+)"', preview.text)
    assert thumbs == [f"/web/files/{i}/thumbnail" for i in image_ids]
    small = client.get(thumbs[0])
    assert small.status_code == 200 and small.headers["content-type"] == "image/png"
    assert Image.open(io.BytesIO(small.content)).size == (160, 120)

    started = client.post(f"/web/sheets/{sheet_id}/start", data=fields)
    batch_id = re.search(r"/batches/(batch_\w+)", started.text).group(1)  # type: ignore[union-attr]
    done = wait_for_status(batch_getter(client, bearer(ALICE)), batch_id)
    assert done["request_counts"] == {"total": 3, "completed": 3, "failed": 0}

    lines = client.get(f"/web/batches/{batch_id}/lines")
    rows = re.findall(r'<tr class="line-row.*?</tr>', lines.text, flags=re.S)
    assert len(rows) == 3 and '<th scope="col">Images</th>' in lines.text
    for row, file_id, name in zip(rows, image_ids, ("a.png", "b.webp", "sub/c.jpg"), strict=True):
        assert f'src="/web/files/{file_id}/thumbnail"' in row
        assert f"echo: Describe {name}. [image]" in row
    detail = client.get(f"/web/batches/{batch_id}/lines/1")
    assert (
        'id="line-images"' in detail.text and f"/web/files/{image_ids[0]}/thumbnail" in detail.text
    )

    # Another owner sees no thumbnail of alice's.
    client.post("/logout")
    login(client, BOB)
    assert client.get(thumbs[0]).status_code == 404


def test_data_urls_become_inline_thumbnails_and_remote_urls_stay_links(
    client: TestClient,
) -> None:
    big = data_url(image_bytes("PNG", (640, 480), (1, 2, 3)))
    sheet = f'photo\n"{big}"\nhttps://example.com/cat.jpg\n'.encode()  # a comma: quoted
    form = client.post(
        "/web/upload", files={"file": ("links.csv", sheet, "text/csv")}, data={"purpose": "batch"}
    )
    sheet_id = re.search(r"/web/sheets/(file-\w+)/start", form.text).group(1)  # type: ignore[union-attr]
    preview = client.post(
        f"/web/sheets/{sheet_id}/preview",
        data={"template": "{{ image(photo) }}", "model": "fake-model", "col_name": ""},
    )
    (inline,) = re.findall(r'<img class="thumb" src="(data:image/png;base64,[^"]+)"', preview.text)
    assert len(inline) < len(big) // 4
    assert 'href="https://example.com/cat.jpg"' in preview.text
    assert '<img class="thumb" src="https://' not in preview.text


def test_a_zip_with_no_images_or_an_image_over_the_cap_is_refused(
    make_client: MakeClient,
) -> None:
    client = make_client(max_image_bytes=1000)
    empty = io.BytesIO()
    with zipfile.ZipFile(empty, "w") as z:
        z.writestr("notes.txt", b"x")
    form = client.post(
        "/web/upload", files={"file": ("e.zip", empty.getvalue())}, data={"purpose": "batch"}
    )
    assert "The zip holds no images" in form.text
    form = client.post(
        "/web/upload", files={"file": ("p.zip", photos_zip())}, data={"purpose": "batch"}
    )
    assert "The image &#39;a.png&#39; is larger than the" in form.text
    assert "(--max-image-bytes 1000)" in form.text
    assert client.get("/v1/files").json()["data"] == []  # nothing of either zip is kept


RED = image_bytes("PNG", (40, 30), (220, 30, 30))
BLUE = image_bytes("PNG", (40, 30), (20, 40, 220))


def survey_zip(photo_cells: list[str]) -> bytes:
    """A zip of a sheet in a folder, its image column paths relative to it, and the PNGs."""
    rows = "".join(f"item {i},{cell}\n" for i, cell in enumerate(photo_cells, start=1))
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("survey/answers.csv", "Item name,photo\n" + rows)
        z.writestr("__MACOSX/survey/._answers.csv", b"resource fork")
        z.writestr("survey/photos/a.png", RED)
        z.writestr("survey/photos/b.png", BLUE)
    return buf.getvalue()


def test_a_zip_of_a_sheet_and_its_images_runs_the_sheet_with_the_images(
    make_client: MakeClient,
    keys: dict[str, Any],  # noqa: F811
) -> None:
    client = make_client(**keys)
    login(client, ALICE)
    cells = ["photos/a.png", "https://example.com/c.png", "./photos/b.png", "photos/a.png"]
    form = client.post(
        "/web/upload",
        files={"file": ("survey.zip", survey_zip(cells), "application/zip")},
        data={"purpose": "batch"},
    )
    # The zip's own sheet opens, its columns as the user named them.
    assert "<h2>answers.csv</h2>" in form.text and "{{ image(photo) }}" in form.text, form.text
    assert "<code>Item name</code>" in form.text
    sheet_id = re.search(r"/web/sheets/(file-\w+)/start", form.text).group(1)  # type: ignore[union-attr]
    files = client.get("/v1/files", headers=bearer(ALICE)).json()["data"]
    by_name = {f["filename"]: f for f in files}
    assert sorted(by_name) == ["a.png", "answers.csv", "b.png"]  # each image stored once
    red, blue = by_name["a.png"]["id"], by_name["b.png"]["id"]
    assert {by_name["a.png"]["purpose"], by_name["b.png"]["purpose"]} == {"vision"}
    for file_id, data in ((red, RED), (blue, BLUE)):
        content = client.get(f"/v1/files/{file_id}/content", headers=bearer(ALICE))
        assert content.content == data

    fields = {
        "template": "Describe {{ row['Item name'] }}. {{ image(photo) }}",
        "model": "fake-model",
        "max_tokens": "4",
        "col_name": "",
    }
    preview = client.post(f"/web/sheets/{sheet_id}/preview", data=fields)
    assert "4 rows" in preview.text and "Describe item 1." in preview.text, preview.text
    thumbs = re.findall(r'<img class="thumb" src="([^"]+)"', preview.text)
    assert thumbs == [f"/web/files/{red}/thumbnail", f"/web/files/{blue}/thumbnail"]
    assert 'href="https://example.com/c.png"' in preview.text  # a URL stays a URL

    # Without the URL's row (not fetched here), every line gets its image from the zip.
    fields["template"] = "Describe {{ row['Item name'] }}. {% if 'http' not in photo %}"
    fields["template"] += "{{ image(photo) }}{% endif %}"
    started = client.post(f"/web/sheets/{sheet_id}/start", data=fields)
    batch_id = re.search(r"/batches/(batch_\w+)", started.text).group(1)  # type: ignore[union-attr]
    done = wait_for_status(batch_getter(client, bearer(ALICE)), batch_id)
    assert done["request_counts"] == {"total": 4, "completed": 4, "failed": 0}
    lines = client.get(f"/web/batches/{batch_id}/lines")
    rows = re.findall(r'<tr class="line-row.*?</tr>', lines.text, flags=re.S)
    assert [re.search(r"echo: [^<]*", r).group(0).strip() for r in rows] == [  # type: ignore[union-attr]
        "echo: Describe item 1. [image]",
        "echo: Describe item 2.",
        "echo: Describe item 3. [image]",
        "echo: Describe item 4. [image]",
    ]
    assert [re.findall(r"/web/files/(file-\w+)/thumbnail", r) for r in rows] == [
        [red],
        [],
        [blue],
        [red],
    ]


def test_a_zip_whose_sheet_names_an_image_it_lacks_or_two_sheets_is_refused(
    client: TestClient,
) -> None:
    form = client.post(
        "/web/upload",
        files={"file": ("survey.zip", survey_zip(["photos/a.png", "photos/c.png"]))},
        data={"purpose": "batch"},
    )
    assert (
        "Row 3, column &#39;photo&#39;: the image &#39;photos/c.png&#39; is not in the zip (a "
        "path is relative to the folder of &#39;survey/answers.csv&#39; in the zip)."
    ) in form.text, form.text
    two = io.BytesIO()
    with zipfile.ZipFile(two, "w") as z:
        z.writestr("a.csv", "photo\na.png\n")
        z.writestr("b/b.xlsx", b"")
        z.writestr("a.png", RED)
    form = client.post(
        "/web/upload", files={"file": ("two.zip", two.getvalue())}, data={"purpose": "batch"}
    )
    assert "The zip holds 2 sheets (&#39;a.csv&#39;, &#39;b/b.xlsx&#39;)" in form.text
    assert client.get("/v1/files").json()["data"] == []  # nothing of either zip is kept
