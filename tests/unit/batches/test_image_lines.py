"""Batch lines with images through the real runner (a real SQLite file; the fake engine
records what it was handed): a bad image fails its own line with its code and the rest
run; good images reach the engine as PNG or JPEG data URLs; a URL is fetched once per batch;
a line whose images are still being read is cancelled with its batch."""

from __future__ import annotations

import io
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.services import Services
from app.wire.endpoints import CHAT
from tests.factories import batch_line
from tests.fakes import FakeEngine, HangingEngine
from tests.images import ImageServer, data_url, decoded, image_bytes
from tests.unit.helpers import batch, drive, file_lines, make_batch, request_rows, services


@pytest.fixture
def server() -> Iterator[ImageServer]:
    s = ImageServer(files={"a.gif": image_bytes("GIF"), "b.jpg": image_bytes("JPEG")}, slow=30)
    yield s
    s.close()


def image_line(cid: str, url: str, text: str = "Describe the image.") -> dict[str, Any]:
    """A chat line: an image in the first user message, the question in the last."""
    line = batch_line(cid, text)
    line["body"]["messages"] = [
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]},
        {"role": "user", "content": text},
    ]
    return line


def errors_by_id(svc: Services, file_id: str | None) -> dict[str, dict[str, Any]]:
    return {
        x["custom_id"]: {"status": x["response"]["status_code"], **x["response"]["body"]["error"]}
        for x in file_lines(svc, file_id)
    }


def handed_urls(engine: FakeEngine) -> dict[str, str]:
    """The image URL each line (by its question) reached the engine with."""
    out = {}
    for endpoint, body, _ in engine.submitted:
        assert endpoint == CHAT
        first = body["messages"][0]["content"]
        if isinstance(first, list):
            out[body["messages"][-1]["content"]] = first[0]["image_url"]["url"]
    return out


def test_a_bad_image_fails_only_its_line(tmp_path: Path, server: ImageServer) -> None:
    engine = FakeEngine(n_slots=4)
    svc = services(tmp_path, engine, max_image_bytes=64 * 1024)
    lines = [
        batch_line("text", "just text"),
        image_line("png", data_url(image_bytes("PNG")), "q png"),
        image_line("webp", data_url(image_bytes("WEBP"), "image/webp"), "q webp"),
        image_line("not-an-image", data_url(b"GIF89a but not really"), "q bad"),
        image_line("bmp", data_url(image_bytes("BMP"), "image/bmp"), "q bmp"),
        image_line("huge", data_url(b"\0" * 100_000), "q huge"),
        image_line("loopback", server.url("a.gif"), "q loopback"),
        image_line("ftp", "ftp://example.com/a.png", "q ftp"),
    ]
    bid = make_batch(svc, lines)
    b = drive(svc, bid)
    assert b.status == "completed"
    assert (b.total, b.completed, b.failed) == (8, 3, 5)
    errors = errors_by_id(svc, b.error_file_id)
    assert {cid: (e["status"], e["code"]) for cid, e in errors.items()} == {
        "not-an-image": (400, "invalid_image"),
        "bmp": (400, "invalid_image_format"),
        "huge": (400, "image_too_large"),
        "loopback": (400, "image_url_refused"),
        "ftp": (400, "image_url_refused"),
    }
    assert errors["loopback"]["param"] == "messages[0].content[0].image_url.url"
    assert "--allow-private-image-urls" in errors["loopback"]["message"]
    assert "--max-image-bytes 65536" in errors["huge"]["message"]
    assert server.asked["/a.gif"] == 0
    assert sorted(x["custom_id"] for x in file_lines(svc, b.output_file_id)) == [
        "png",
        "text",
        "webp",
    ]
    urls = handed_urls(engine)
    assert sorted(urls) == ["q png", "q webp"]  # the bad lines never reached the engine
    assert decoded(urls["q png"])[0] == "image/png"
    assert decoded(urls["q webp"])[0] == "image/png"  # WEBP as PNG for the embedded engine


def test_responses_lines_read_file_ids_as_the_batch_owners(tmp_path: Path) -> None:
    engine = FakeEngine(n_slots=2)
    svc = services(tmp_path, engine)
    mine = svc.files.store(
        io.BytesIO(image_bytes("GIF")), filename="g.gif", purpose="vision", owner="ann"
    )
    theirs = svc.files.store(
        io.BytesIO(image_bytes("PNG")), filename="p.png", purpose="vision", owner="bob"
    )

    def line(cid: str, file_id: str) -> dict[str, Any]:
        content = [{"type": "input_image", "file_id": file_id}]
        body = {"model": "m", "input": [{"role": "user", "content": content}]}
        return {"custom_id": cid, "method": "POST", "url": "/v1/responses", "body": body}

    from tests.factories import jsonl

    data = jsonl(line("mine", mine.id), line("theirs", theirs.id))
    partial = svc.storage.begin_write(len(data) + 1)
    partial.write(data)
    f = svc.files.create(partial=partial, filename="in.jsonl", purpose="batch", owner="ann")
    bid = svc.batches.create("ann", f.id, "/v1/responses").id
    # The fake engine answers no Responses body: the test watches what reaches it and the
    # line that fails before it does.
    deadline = time.time() + 20
    while not (engine.submitted and batch(svc, bid).failed == 1):
        assert time.time() < deadline, batch(svc, bid)
        svc.runner.step()
        time.sleep(0.01)
    rows = {r.custom_id: r for r in request_rows(svc, bid)}
    assert rows["theirs"].status_code == 400
    error = json.loads(rows["theirs"].body_json or "{}")["error"]
    assert error["code"] == "invalid_image_file"
    assert error["param"] == "input[0].content[0].file_id"
    (handed,) = [body for _, body, _ in engine.submitted]
    part = handed["input"][0]["content"][0]
    assert "file_id" not in part and decoded(part["image_url"])[0] == "image/png"


def test_a_url_is_fetched_once_for_the_whole_batch(tmp_path: Path, server: ImageServer) -> None:
    engine = FakeEngine(n_slots=4)
    svc = services(tmp_path, engine, allow_private_image_urls=True)
    lines = [image_line(f"l{i}", server.url("b.jpg"), f"q {i}") for i in range(10)]
    lines.append(image_line("gone", server.url("nothing.png"), "q gone"))
    lines.append(image_line("gone-again", server.url("nothing.png"), "q gone again"))
    b = drive(svc, make_batch(svc, lines))
    assert (b.completed, b.failed) == (10, 2)
    assert server.asked["/b.jpg"] == 1 and server.asked["/nothing.png"] == 1
    assert {decoded(u)[0] for u in handed_urls(engine).values()} == {"image/jpeg"}
    codes = {e["code"] for e in errors_by_id(svc, b.error_file_id).values()}
    assert codes == {"image_fetch_failed"}


def test_a_fetch_over_the_time_cap_fails_its_line(tmp_path: Path, server: ImageServer) -> None:
    svc = services(tmp_path, FakeEngine(), allow_private_image_urls=True, image_fetch_timeout=0.5)
    lines = [image_line("slow", server.url("slow")), batch_line("text", "just text")]
    b = drive(svc, make_batch(svc, lines))
    assert (b.completed, b.failed) == (1, 1)
    (err,) = errors_by_id(svc, b.error_file_id).values()
    assert err["code"] == "image_fetch_failed" and "--image-fetch-timeout 0.5" in err["message"]


def test_cancel_reaches_lines_reading_images_and_lines_in_the_engine(
    tmp_path: Path, server: ImageServer
) -> None:
    engine = HangingEngine(n_slots=2)
    svc = services(tmp_path, engine, allow_private_image_urls=True, image_fetch_timeout=30)
    lines = [
        image_line("fetching", server.url("slow")),  # the fetch takes 30 s
        image_line("hanging", data_url(image_bytes("PNG")), "HANG here"),
    ]
    bid = make_batch(svc, lines)
    svc.runner._validate_next()
    svc.runner.step()
    from tests.waiting import until

    until(lambda: engine.hanging, 10, "the image line to reach the engine")
    svc.batches.cancel(bid, "")
    b = drive(svc, bid, timeout=10)  # not the 30 s the fetch would take
    assert b.status == "cancelled"
    assert engine.cancelled == 1
    assert batch(svc, bid).completed == 0
