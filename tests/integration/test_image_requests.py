"""Online requests with images, through the real app (the fake engine records what it is
handed): a bad image is the request's 400, OpenAI-shaped, naming its param; a good one
reaches the engine as a PNG or JPEG data URL; files for images upload with purpose vision
or user_data."""

from __future__ import annotations

from typing import Any

import pytest
from litestar.testing import TestClient

from tests.fakes import FakeEngine
from tests.http_helpers import MakeClient, upload
from tests.images import data_url, decoded, image_bytes


def ask(url: str) -> dict[str, Any]:
    return {
        "model": "m",
        "max_tokens": 4,
        "messages": [
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]},
            {"role": "user", "content": "What is in the image?"},
        ],
    }


def error_of(r: Any, status: int = 400) -> dict[str, Any]:
    assert r.status_code == status, r.text
    err: dict[str, Any] = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    return err


def test_a_good_image_reaches_the_engine_as_a_png_data_url(
    make_client: MakeClient, engine: FakeEngine
) -> None:
    client = make_client(engine)
    r = client.post("/v1/chat/completions", json=ask(data_url(image_bytes("GIF"), "image/gif")))
    assert r.status_code == 200, r.text
    ((_, body, _),) = engine.submitted
    mime, img = decoded(body["messages"][0]["content"][0]["image_url"]["url"])
    assert (mime, img.size) == ("image/png", (12, 8))


@pytest.mark.parametrize(
    ("url", "code"),
    [
        (data_url(b"not an image"), "invalid_image"),
        (data_url(image_bytes("BMP"), "image/bmp"), "invalid_image_format"),
        ("http://127.0.0.1:9/cat.png", "image_url_refused"),
        ("http://169.254.169.254/latest/meta-data", "image_url_refused"),
    ],
)
def test_a_bad_image_is_a_400_naming_its_part(
    client: TestClient, engine: FakeEngine, url: str, code: str
) -> None:
    err = error_of(client.post("/v1/chat/completions", json=ask(url)))
    assert (err["code"], err["type"]) == (code, "invalid_request_error")
    assert err["param"] == "messages[0].content[0].image_url.url"
    assert engine.submitted == []


def test_responses_refuse_another_owners_or_a_missing_file(client: TestClient) -> None:
    batch_file = upload(client, b'{"a": 1}\n', "batch")
    for file_id, says in ((batch_file["id"], "purpose 'batch'"), ("file-nope", "No such file")):
        body = {
            "model": "m",
            "input": [{"role": "user", "content": [{"type": "input_image", "file_id": file_id}]}],
        }
        err = error_of(client.post("/v1/responses", json=body))
        assert err["code"] == "invalid_image_file" and says in err["message"]
        assert err["param"] == "input[0].content[0].file_id"


@pytest.mark.parametrize("purpose", ["vision", "user_data"])
def test_image_files_upload_with_the_sdks_purposes(client: TestClient, purpose: str) -> None:
    f = upload(client, image_bytes("PNG"), purpose, name="cat.png")
    assert f["purpose"] == purpose
