"""The one walker of image parts and the one classifier of image URLs, and the surfaces
that read through them: the image resolver (`find_images`), the embedded engine's chat
template and Responses translation, the dashboard's thumbnails and a sheet's image cells
all find the same images and classify a URL the same way."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from app.engine.llama.jobs.oai import responses_request
from app.engine.llama.jobs.oai.chat_template import message_text
from app.engine.llama.jobs.oai.media import Media
from app.images import find_images
from app.sheets.images import ImageCells, names_an_image
from app.web.thumbnails import content_views, image_view
from app.wire.endpoints import CHAT, COMPLETIONS, RESPONSES
from app.wire.image_parts import image_parts, image_source
from tests.images import data_url, image_bytes

PNG = data_url(image_bytes("PNG"))
JPG = data_url(image_bytes("JPEG"), "image/jpeg")


@pytest.mark.parametrize(
    ("url", "source"),
    [
        (PNG, "data"),
        ("DATA" + PNG[4:], "data"),
        ("file-abc_D-9", "file"),
        ("https://example.com/a.png", "url"),
        ("HTTP://example.com/a.png", "url"),
        ("photos/a.png", "path"),
        ("file-abc/../x.png", "path"),
        ("ftp://example.com/a.png", "path"),
    ],
)
def test_a_url_is_classified_once_and_every_surface_agrees(url: str, source: str) -> None:
    assert image_source(url) == source
    (ref,) = find_images(CHAT, chat([{"type": "image_url", "image_url": {"url": url}}]))
    assert ref.source == ("url" if source == "path" else source)  # a request fetches the rest
    view = image_view(url)
    assert (view.src is not None and source in ("data", "file")) or (
        view.href is not None and source == "url"
    ) or (view.src is None and view.href is None and source == "path")  # fmt: skip
    cells = ImageCells(None, 1 << 20)
    if source == "path":
        assert names_an_image(url) == url.endswith(".png")
        with pytest.raises(ValueError, match="neither an http"):
            cells.url(url)
    else:
        assert cells.url(url) == url and names_an_image(url)


def chat(*contents: object) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": c} for c in contents]}


def test_chat_image_parts_are_found_alike_by_every_walker() -> None:
    parts = [
        {"type": "text", "text": "compare "},
        {"type": "image_url", "image_url": {"url": PNG, "detail": "low"}},
        {"type": "input_image", "image_url": "https://x/no.png"},  # not a chat image part
        {"type": "image_url", "image_url": JPG},  # a bare string, as some clients send
    ]
    body = chat(parts)
    walked = [(where, image.url) for where, _, image in image_parts(CHAT, body)]
    assert walked == [("messages[0].content[1]", PNG), ("messages[0].content[3]", JPG)]
    assert [r.value for r in find_images(CHAT, body)] == [PNG, JPG]
    views = [v["image"].label for v in content_views(parts) if "image" in v]
    assert len(views) == 2
    # The chat template places the same two images (the Responses part is not one of them).
    media = Media("<img>")
    with pytest.raises(Exception, match="input_image"):
        message_text(parts, 0, media)
    media = Media("<img>")
    assert message_text([p for p in parts if p["type"] != "input_image"], 0, media) == (
        "compare <img><img>"
    )
    assert len(media.images) == 2
    assert list(image_parts(COMPLETIONS, body)) == []


def test_responses_image_parts_are_found_alike_by_every_walker() -> None:
    content = [
        {"type": "input_text", "text": "what is this?"},
        {"type": "input_image", "image_url": PNG, "detail": "high"},
        {"type": "input_image", "file_id": "file-abc"},
    ]
    body = {"model": "m", "input": [{"role": "user", "content": content}]}
    walked = [(w, i.url, i.file_id) for w, _, i in image_parts(RESPONSES, body)]
    assert walked == [("input[0].content[1]", PNG, None), ("input[0].content[2]", None, "file-abc")]
    assert [(r.param, r.value) for r in find_images(RESPONSES, body)] == [
        ("input[0].content[1].image_url", PNG),
        ("input[0].content[2].file_id", "file-abc"),
    ]
    # The engine takes the data URL and refuses the file id by its place.
    with pytest.raises(Exception) as caught:
        responses_request.to_chat(body)
    assert caught.value.param == "input[0].content[2].image_url"  # type: ignore[attr-defined]
    del content[2]
    chat_body, _ = responses_request.to_chat(body)
    (message,) = chat_body["messages"]
    assert message["content"][1] == {
        "type": "image_url",
        "image_url": {"url": PNG, "detail": "high"},
    }


def test_a_sheet_cell_path_is_found_in_its_folder(tmp_path: Path) -> None:
    (tmp_path / "a.png").write_bytes(image_bytes("PNG"))
    assert image_source("a.png") == "path"
    assert ImageCells(tmp_path, 1 << 20).url("a.png").startswith("data:image/png;base64,")
