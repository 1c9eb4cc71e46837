"""Images to upstream engines, each in the form its `images=` says: a real front
`batchyard serve --no-embedded` with three `--engine` upstreams (pass, inline, png) in front of
a double that records what each receives and forwards it to a real upstream `batchyard
serve`; the openai SDK as the client; an image server on 127.0.0.1, allowed with
--allow-private-image-urls.

The upstream's embedded model reads no images, so an image line's answer is the upstream's
own error: what these tests check is what reached the upstream, and that a bad image never
left the front.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from openai import OpenAI

from tests.factories import batch_line, jsonl, jsonl_lines
from tests.http_helpers import FINISHED, wait_for_status
from tests.images import ImageServer, data_url, decoded, image_bytes
from tests.live import OUTPUT, LiveServer, start_server, stop_server
from tests.upstream_double import FlakyUpstream, upstream_model_args

MODES = ("pass", "inline", "png")


@dataclass
class Setup:
    front: LiveServer
    double: FlakyUpstream
    images: ImageServer

    def client(self) -> OpenAI:
        return OpenAI(base_url=self.front.api, api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    root = tmp_path_factory.mktemp("upstream-images")
    upstream = start_server(
        root / "upstream",
        OUTPUT / "upstream-images-upstream.log",
        args=[*upstream_model_args(root), "--parallel", "2"],
    )
    double = FlakyUpstream(upstream.url)
    images = ImageServer(files={"g.gif": image_bytes("GIF", (200, 100))})
    engines = []
    for mode in MODES:
        spec = f"{mode}=openai:{double.api},models=img-{mode},images={mode}"
        engines += ["--engine", spec + (",image_max_side=64" if mode == "png" else "")]
    try:
        front = start_server(
            root / "front",
            OUTPUT / "upstream-images-front.log",
            args=["--no-embedded", "--allow-private-image-urls", *engines],
        )
    except Exception:
        images.close()
        double.close()
        stop_server(upstream)
        raise
    yield Setup(front, double, images)
    stop_server(front)
    images.close()
    double.close()
    stop_server(upstream)


def chat_line(cid: str, model: str, url: str) -> dict[str, Any]:
    content: list[dict[str, Any]] = [
        {"type": "text", "text": "What is in the image?"},
        {"type": "image_url", "image_url": {"url": url, "detail": "low"}},
    ]
    return batch_line(cid, content, model=model, max_tokens=4)


def run(c: OpenAI, lines: list[dict[str, Any]], endpoint: str) -> dict[str, dict[str, Any]]:
    """Run a batch; each line's response (status_code and body) by custom_id."""
    f = c.files.create(file=("in.jsonl", jsonl(*lines)), purpose="batch")
    b = c.batches.create(input_file_id=f.id, endpoint=endpoint, completion_window="24h")  # type: ignore[arg-type]
    b = wait_for_status(c.batches.retrieve, b.id, FINISHED, 240, poll=0.3)
    assert b.status == "completed", b.errors
    out = c.files.content(b.output_file_id).text if b.output_file_id else ""
    err = c.files.content(b.error_file_id).text if b.error_file_id else ""
    return {x["custom_id"]: x["response"] for x in jsonl_lines(out) + jsonl_lines(err)}


def received(double: FlakyUpstream) -> dict[str, list[Any]]:
    """The image references each model's requests carried when they reached the upstream."""
    out: dict[str, list[Any]] = {}
    for arrival in double.arrivals:
        body = json.loads(arrival.body)
        refs = out.setdefault(body["model"], [])
        for message in body.get("messages", []):
            for part in message["content"] if isinstance(message["content"], list) else []:
                if part.get("type") == "image_url":
                    refs.append(part["image_url"])
        for item in body.get("input", []) if isinstance(body.get("input"), list) else []:
            for part in item.get("content", []):
                if part.get("type") == "input_image":
                    refs.append({k: v for k, v in part.items() if k != "type"})
    return out


def test_each_upstream_gets_images_in_its_own_form(setup: Setup) -> None:
    c = setup.client()
    setup.double.plan()
    webp = data_url(image_bytes("WEBP", (120, 80)), "image/webp")
    gif_url = setup.images.url("g.gif")
    for mode in MODES:  # a batch names one model: one batch per upstream
        lines = [
            chat_line(f"{mode}-webp", f"img-{mode}", webp),
            chat_line(f"{mode}-url", f"img-{mode}", gif_url),
            chat_line(f"{mode}-url-again", f"img-{mode}", gif_url),
            chat_line(f"{mode}-bmp", f"img-{mode}", data_url(image_bytes("BMP"))),
        ]
        bad = run(c, lines, "/v1/chat/completions")[f"{mode}-bmp"]
        assert bad["status_code"] == 400
        assert bad["body"]["error"]["code"] == "invalid_image_format"
    got = received(setup.double)
    forms = {
        model: [
            (decoded(r["url"])[0], decoded(r["url"])[1].size)
            if r["url"].startswith("data:")
            else r["url"]
            for r in refs
        ]
        for model, refs in got.items()
    }
    assert sorted(forms) == ["img-inline", "img-pass", "img-png"]
    assert sorted(forms["img-pass"], key=str) == sorted(
        [("image/webp", (120, 80)), gif_url, gif_url], key=str
    )  # the URL left for the upstream to fetch
    assert sorted(forms["img-inline"], key=str) == sorted(
        [("image/webp", (120, 80)), ("image/gif", (200, 100)), ("image/gif", (200, 100))],
        key=str,
    )
    assert sorted(forms["img-png"], key=str) == sorted(
        [("image/png", (64, 43)), ("image/png", (64, 32)), ("image/png", (64, 32))], key=str
    )  # PNG, and scaled to image_max_side=64
    assert all(r.get("detail") == "low" for refs in got.values() for r in refs)
    # fetched once by each batch that fetches (inline's and png's), never for `pass`
    assert setup.images.asked["/g.gif"] == 2


def test_a_file_id_reaches_a_pass_upstream_as_a_data_url(setup: Setup) -> None:
    c = setup.client()
    setup.double.plan()
    f = c.files.create(file=("cat.jpg", image_bytes("JPEG", (30, 20))), purpose="vision")
    body = {
        "model": "img-pass",
        "max_output_tokens": 4,
        "input": [
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "What is in the image?"},
                    {"type": "input_image", "file_id": f.id, "detail": "auto"},
                ],
            }
        ],
    }
    line = {"custom_id": "file", "method": "POST", "url": "/v1/responses", "body": body}
    run(c, [line], "/v1/responses")
    (ref,) = received(setup.double)["img-pass"]
    assert "file_id" not in ref and ref["detail"] == "auto"
    mime, img = decoded(ref["image_url"])
    assert (mime, img.size) == ("image/jpeg", (30, 20))
