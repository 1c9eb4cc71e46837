"""Images in batch lines, end to end: a live `batchyard serve` whose --models-dir holds the
test vision pair (tests/vision.py: SmolLM2 with a random-weight SmolVLM projector) as
`vision`, the official openai SDK as the client.

One chat batch carries an image in every form a user sends one there: data URLs of PNG,
JPEG, WEBP and GIF, and an http URL served on loopback (the server runs with
--allow-private-image-urls); beside them a repeated image, a line whose image is not an
image, and a text line; a Responses batch carries the id of a file uploaded with purpose
`vision`. Every good line completes, the bad one fails alone,
two images give the same question different first tokens, and a repeated image reports
cached prompt tokens. Then: the same batch for the text-only default model fails its image
lines at validation, a server without the flag refuses the loopback URL line by line, and a
node killed with SIGKILL mid-batch loses and repeats no line once started again.
"""

from __future__ import annotations

import base64
import http.server
import io
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from PIL import Image

from tests.factories import batch_line, jsonl, jsonl_lines
from tests.http_helpers import wait_for_status
from tests.live import OUTPUT, LiveServer, start_server, stop_server
from tests.vision import MMPROJ_FILE, MODEL_FILE, png, qwen2vl_vision_model, vision_model  # noqa: F401
from tests.waiting import until

pytestmark = pytest.mark.slow

MODEL = "vision"
QUESTION = "What colour is this picture?"
SERVER_ARGS = ["--parallel", "4", "--ctx-size", "1024", "--threads", "2", "--no-discover"]


def encoded(color: tuple[int, int, int], fmt: str, size: tuple[int, int] = (96, 64)) -> bytes:
    """An image of `color` in `fmt` (Pillow's format name)."""
    out = io.BytesIO()
    Image.new("RGB", size, color).save(out, fmt)
    return out.getvalue()


def data_url(data: bytes, mime: str) -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def line(cid: str, image: dict[str, Any] | None, *, model: str = MODEL) -> dict[str, Any]:
    """A chat line asking QUESTION of one image part (`image`: the part's image_url)."""
    content: list[dict[str, Any]] = [{"type": "text", "text": QUESTION}]
    if image is not None:
        content.append({"type": "image_url", "image_url": image})
    return batch_line(
        cid, content, model=model, max_tokens=2, temperature=0, logprobs=True, top_logprobs=5
    )


def respond(cid: str, image: dict[str, Any]) -> dict[str, Any]:
    """A Responses line asking QUESTION of one input_image part (`image`: its source)."""
    content = [{"type": "input_text", "text": QUESTION}, {"type": "input_image", **image}]
    return {
        "custom_id": cid,
        "method": "POST",
        "url": "/v1/responses",
        "body": {
            "model": MODEL,
            "input": [{"role": "user", "content": content}],
            "max_output_tokens": 2,
        },
    }


class ImageHost:
    """A real HTTP server on 127.0.0.1 serving one JPEG at /photo.jpg, counting its GETs."""

    def __init__(self, body: bytes) -> None:
        host = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # (http.server's name)
                host.gets += 1
                self.send_response(200)
                self.send_header("Content-Type", "image/jpeg")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.gets = 0
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/photo.jpg"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory: pytest.TempPathFactory, vision_model: Path) -> Path:  # noqa: F811
    root = tmp_path_factory.mktemp("vision-models")
    (root / MODEL).mkdir()
    for name in (MODEL_FILE, MMPROJ_FILE):
        (root / MODEL / name).symlink_to(vision_model / name)
    return root


@pytest.fixture(scope="module")
def photo() -> Iterator[ImageHost]:
    host = ImageHost(encoded((250, 200, 20), "JPEG"))
    yield host
    host.close()


def serve(data: Path, models_dir: Path, log: str, *extra: str) -> LiveServer:
    args = [*SERVER_ARGS, "--models-dir", str(models_dir), *extra]
    return start_server(data, OUTPUT / log, args=args, timeout=180)


def run_batch(sdk: openai.OpenAI, lines: list[dict[str, Any]], timeout: float = 300) -> Any:
    f = sdk.files.create(file=("in.jsonl", jsonl(*lines)), purpose="batch")
    b = sdk.batches.create(
        input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    return wait_for_status(sdk.batches.retrieve, b.id, timeout=timeout, poll=0.5)


def by_id(sdk: openai.OpenAI, file_id: str | None) -> dict[str, dict[str, Any]]:
    if not file_id:
        return {}
    return {x["custom_id"]: x["response"] for x in jsonl_lines(sdk.files.content(file_id).text)}


def first_token(answer: dict[str, Any]) -> dict[str, float]:
    first = answer["body"]["choices"][0]["logprobs"]["content"][0]
    return {t["token"]: round(t["logprob"], 4) for t in first["top_logprobs"]}


def test_a_batch_of_image_lines_in_every_form(
    tmp_path: Path, models_dir: Path, photo: ImageHost
) -> None:
    server = serve(tmp_path / "data", models_dir, "image-batches.log", "--allow-private-image-urls")
    try:
        sdk = openai.OpenAI(base_url=server.api, api_key="unused", max_retries=0)
        cards = {m.id: m for m in sdk.models.list().data}
        assert (cards[MODEL].model_extra or {})["input_modalities"] == ["text", "image"]
        uploaded = sdk.files.create(
            file=("striped.png", png((20, 160, 60), stripes=4)), purpose="vision"
        )
        red = data_url(encoded((220, 30, 30), "PNG"), "image/png")
        lines = [
            line("png", {"url": red, "detail": "low"}),
            line("jpeg", {"url": data_url(encoded((30, 30, 220), "JPEG"), "image/jpeg")}),
            line("webp", {"url": data_url(encoded((30, 200, 30), "WEBP"), "image/webp")}),
            line("gif", {"url": data_url(encoded((200, 30, 200), "GIF"), "image/gif")}),
            line("http", {"url": photo.url}),
            line("http-again", {"url": photo.url}),
            line("png-again", {"url": red}),
            line("png-third", {"url": red}),
            line("broken", {"url": data_url(b"not an image at all", "image/png")}),
            line("text", None),
        ]
        done = run_batch(sdk, lines)
        assert done.status == "completed", done
        assert done.request_counts is not None
        assert (done.request_counts.completed, done.request_counts.failed) == (9, 1)
        out, errors = by_id(sdk, done.output_file_id), by_id(sdk, done.error_file_id)
        assert sorted(errors) == ["broken"]
        error = errors["broken"]["body"]["error"]
        assert (errors["broken"]["status_code"], error["code"]) == (400, "invalid_image")
        assert error["param"] == "messages[0].content[1].image_url.url"
        assert {a["body"]["model"] for a in out.values()} == {MODEL}
        # The image is in the computation: two images, two different first tokens' odds.
        assert first_token(out["png"]) != first_token(out["jpeg"])
        assert first_token(out["png"]) == first_token(out["png-again"])
        # Image tokens are counted: each image line's prompt is longer than the text line's.
        text_tokens = out["text"]["body"]["usage"]["prompt_tokens"]
        for cid in ("png", "jpeg", "webp", "gif", "http"):
            assert out[cid]["body"]["usage"]["prompt_tokens"] > text_tokens + 16, cid
        # A repeated image is reused: its cells are cached prompt tokens.
        cached = [
            out[cid]["body"]["usage"]["prompt_tokens_details"]["cached_tokens"]
            for cid in ("png-again", "png-third")
        ]
        assert max(cached) > 16, cached
        assert photo.gets == 1  # one fetch per distinct URL within a batch
        assert done.usage is not None and done.usage.input_tokens > 10 * text_tokens

        # Responses lines: an uploaded file's id, and a data URL, as input_image parts.
        responses = [
            respond("by-id", {"file_id": uploaded.id}),
            respond("by-url", {"image_url": red}),
        ]
        f = sdk.files.create(file=("in.jsonl", jsonl(*responses)), purpose="batch")
        b = sdk.batches.create(
            input_file_id=f.id, endpoint="/v1/responses", completion_window="24h"
        )
        answered = wait_for_status(sdk.batches.retrieve, b.id, timeout=300, poll=0.5)
        assert answered.request_counts is not None
        assert (answered.request_counts.completed, answered.request_counts.failed) == (2, 0)
        for cid, answer in by_id(sdk, answered.output_file_id).items():
            assert answer["body"]["usage"]["input_tokens"] > text_tokens + 16, cid

        # The same image line for the text-only default model fails at validation, alone.
        mixed = [line("img", {"url": red}, model="SmolLM2-135M-Instruct.Q4_1")]
        mixed.append(line("txt", None, model="SmolLM2-135M-Instruct.Q4_1"))
        refused = run_batch(sdk, mixed)
        assert refused.status == "completed", refused
        assert refused.request_counts is not None and refused.request_counts.failed == 1
        code = by_id(sdk, refused.error_file_id)["img"]["body"]["error"]["code"]
        assert code == "model_takes_no_images"
    finally:
        stop_server(server)


def test_a_loopback_url_is_refused_by_default_line_by_line(
    tmp_path: Path, models_dir: Path, photo: ImageHost
) -> None:
    server = serve(tmp_path / "data", models_dir, "image-refused.log")
    try:
        sdk = openai.OpenAI(base_url=server.api, api_key="unused", max_retries=0)
        red = data_url(encoded((220, 30, 30), "PNG"), "image/png")
        done = run_batch(sdk, [line("near", {"url": photo.url}), line("inline", {"url": red})])
        assert done.status == "completed", done
        errors = by_id(sdk, done.error_file_id)
        assert sorted(errors) == ["near"]
        error = errors["near"]["body"]["error"]
        assert error["code"] == "image_url_refused"
        assert "--allow-private-image-urls" in error["message"]
        assert sorted(by_id(sdk, done.output_file_id)) == ["inline"]
    finally:
        stop_server(server)


KILLED_LINES = 24


def test_a_node_killed_mid_batch_of_images_loses_and_repeats_nothing(
    tmp_path: Path, models_dir: Path
) -> None:
    data = tmp_path / "data"
    # Lines the killed node held come back when its lease lapses: 5 s, not the default 30.
    server = serve(data, models_dir, "image-killed.log", "--lease-seconds", "5")
    again = None
    try:
        sdk = openai.OpenAI(base_url=server.api, api_key="unused", max_retries=0)
        lines = []
        for i in range(KILLED_LINES):
            image = data_url(encoded((10 * i, 255 - 10 * i, 90), "PNG"), "image/png")
            body_line = line(f"k{i}", {"url": image})
            body_line["body"]["max_tokens"] = 8
            lines.append(body_line)
        f = sdk.files.create(file=("in.jsonl", jsonl(*lines)), purpose="batch")
        batch_id = sdk.batches.create(
            input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h"
        ).id

        def done() -> int:
            counts = sdk.batches.retrieve(batch_id).request_counts
            return counts.completed + counts.failed if counts else 0

        until(lambda: done() >= 3, 240, "three image lines done")
        server.process.send_signal(signal.SIGKILL)
        server.process.wait(10)
        again = serve(data, models_dir, "image-killed-again.log", "--lease-seconds", "5")
        sdk = openai.OpenAI(base_url=again.api, api_key="unused", max_retries=0)
        final = wait_for_status(sdk.batches.retrieve, batch_id, timeout=400, poll=0.5)
        assert final.status == "completed", final
        assert final.request_counts is not None
        assert (final.request_counts.completed, final.request_counts.failed) == (KILLED_LINES, 0)
        out = jsonl_lines(sdk.files.content(final.output_file_id or "").text)
        assert sorted(o["custom_id"] for o in out) == sorted(f"k{i}" for i in range(KILLED_LINES))
    finally:
        stop_server(server)
        if again is not None:
            stop_server(again)


def test_a_qwen2vl_model_answers_image_lines_where_its_positions_say(
    tmp_path: Path,
    qwen2vl_vision_model: Path,  # noqa: F811
) -> None:
    """An M-RoPE model (the qwen2vl test pair, as `qwen-vision`) through the SDK: its image
    lines complete and see their images, a repeated image's cells are reused, and usage
    counts an image's rows (12 for these 96x64 images), not the fewer positions they take."""
    root = tmp_path / "models"
    (root / "qwen-vision").mkdir(parents=True)
    for name in (MODEL_FILE, MMPROJ_FILE):
        (root / "qwen-vision" / name).symlink_to(qwen2vl_vision_model / name)
    server = serve(tmp_path / "data", root, "image-qwen2vl.log")
    try:
        sdk = openai.OpenAI(base_url=server.api, api_key="unused", max_retries=0)
        cards = {m.id: m for m in sdk.models.list().data}
        assert (cards["qwen-vision"].model_extra or {})["input_modalities"] == ["text", "image"]
        red = {"url": data_url(encoded((220, 30, 30), "PNG"), "image/png")}
        blue = {"url": data_url(encoded((30, 30, 220), "JPEG"), "image/jpeg")}
        lines = [
            line("red", red, model="qwen-vision"),
            line("blue", blue, model="qwen-vision"),
            line("text", None, model="qwen-vision"),
        ]
        done = run_batch(sdk, lines)
        assert done.status == "completed" and done.request_counts is not None, done
        assert (done.request_counts.completed, done.request_counts.failed) == (3, 0)
        out = by_id(sdk, done.output_file_id)
        # The repeated image in a batch of its own, after the first: in the same wave as "red"
        # it could be admitted before red's cells were there to reuse.
        again = run_batch(sdk, [line("red-again", red, model="qwen-vision")])
        assert again.status == "completed", again
        out.update(by_id(sdk, again.output_file_id))
        assert first_token(out["red"]) != first_token(out["blue"])
        assert first_token(out["red"]) == first_token(out["red-again"])
        usage = {cid: out[cid]["body"]["usage"] for cid in out}
        text_tokens = usage["text"]["prompt_tokens"]
        # The image's rows and its two framing tokens, <|vision_start|> and <|vision_end|>.
        assert usage["red"]["prompt_tokens"] == text_tokens + 12 + 2
        cached = usage["red-again"]["prompt_tokens_details"]["cached_tokens"]
        assert cached > 12, usage["red-again"]
    finally:
        stop_server(server)
