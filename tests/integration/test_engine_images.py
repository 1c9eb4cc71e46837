"""The real LlamaEngine with a projector, on the test vision pair (tests/vision.py): images
enter the computation, are encoded once, are reused from the prefix cache, are counted in
usage, and run beside text lines; a model without a projector refuses them."""

from __future__ import annotations

import base64
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.config import Settings
from app.engine.base import EngineError, Priority
from app.engine.llama.binding import vision
from app.engine.llama.engine import LlamaEngine
from app.engine.llama.loading import load_engine
from app.wire.endpoints import CHAT, RESPONSES
from tests.live import free_port
from tests.vision import png, vision_model  # noqa: F401  (the fixture)
from tests.waiting import until

SLOTS = 4
CTX = 512
QUESTION = "What is in this picture?"


def url(raw: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(raw).decode()


def ask(raw: bytes, text: str = QUESTION, **extra: Any) -> dict[str, Any]:
    return {
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": text},
                    {"type": "image_url", "image_url": {"url": url(raw), "detail": "auto"}},
                ],
            }
        ],
        "max_tokens": 4,
        "temperature": 0,
        **extra,
    }


@pytest.fixture(scope="module")
def engine(vision_model: Path) -> Iterator[LlamaEngine]:  # noqa: F811
    eng = load_engine(
        Settings(model=str(vision_model / "model.gguf"), parallel=SLOTS, ctx_size=CTX),
        projector=vision_model / "mmproj.gguf",
    )
    yield eng
    eng.close()


def run(engine: LlamaEngine, body: dict[str, Any], **kw: Any) -> dict[str, Any]:
    return engine.submit(CHAT, body, **kw).result(timeout=120)


def first_logprob(answer: dict[str, Any]) -> dict[str, float]:
    top = answer["choices"][0]["logprobs"]["content"][0]["top_logprobs"]
    return {t["token"]: t["logprob"] for t in top}


def test_the_model_says_it_takes_images_and_what_its_projector_took(
    engine: LlamaEngine,
) -> None:
    assert engine.info.takes_images
    assert engine.projector_bytes is not None and engine.projector_bytes > 0


def test_two_images_give_different_first_token_logprobs_for_the_same_text(
    engine: LlamaEngine,
) -> None:
    extra = {"logprobs": True, "top_logprobs": 5, "max_tokens": 1}
    red = run(engine, ask(png((200, 30, 30)), **extra))
    blue = run(engine, ask(png((30, 30, 200), stripes=4), **extra))
    again = run(engine, ask(png((200, 30, 30)), **extra))
    assert first_logprob(red) != first_logprob(blue)
    assert first_logprob(again) == pytest.approx(first_logprob(red), abs=1e-3)


def test_a_repeated_image_is_encoded_once_and_its_cells_are_reused(
    engine: LlamaEngine,
) -> None:
    image = png((10, 160, 90), stripes=7)
    before = engine.images_encoded
    first = run(engine, ask(image))
    chunks = engine.images_encoded - before
    assert chunks > 0  # this model cuts an image into a tile and its overview
    second = run(engine, ask(image))
    assert engine.images_encoded - before == chunks  # the cached rows served it
    assert engine.stats().images_encoded == engine.images_encoded
    n = first["usage"]["prompt_tokens"]
    assert second["usage"]["prompt_tokens"] == n
    # Every prompt token but the last came from the first request's cells, image included.
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] == n - 1
    # Other text after the same image: still no encode.
    run(engine, ask(image, text="Describe it."))
    assert engine.images_encoded - before == chunks


def test_prompt_tokens_count_the_image_rows_like_llama_server(engine: LlamaEngine) -> None:
    body = ask(png((120, 120, 0)))
    text_only = {"messages": [{"role": "user", "content": QUESTION}], "max_tokens": 4}
    answer = run(engine, body)
    n = answer["usage"]["prompt_tokens"]
    assert n == engine.prompt_tokens(CHAT, body)
    # One image of this model: two chunks of 16 embedding rows, and the framing tokens
    # libmtmd writes around them; the rest is the same text as without the image.
    assert n - engine.prompt_tokens(CHAT, text_only) >= 32


def test_a_responses_input_image_is_seen_and_counted_as_in_chat(engine: LlamaEngine) -> None:
    image = png((90, 20, 160))
    chat = run(engine, ask(image))
    body = {
        "model": "m",
        "input": [
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": QUESTION},
                    {"type": "input_image", "image_url": url(image), "detail": "low"},
                ],
            }
        ],
        "max_output_tokens": 4,
        "temperature": 0,
    }
    response = engine.submit(RESPONSES, body).result(timeout=120)
    assert response["status"] == "incomplete"  # it ran to max_output_tokens
    assert response["usage"]["input_tokens"] == chat["usage"]["prompt_tokens"]


def test_image_and_text_lines_run_together_and_all_complete(engine: LlamaEngine) -> None:
    images = [png((40 * i, 255 - 40 * i, 100), stripes=3 + i) for i in range(4)]
    futures = []
    for i in range(4):
        futures.append(engine.submit(CHAT, ask(images[i]), priority=Priority.BATCH))
        text = {"messages": [{"role": "user", "content": f"Count to {i + 3}."}], "max_tokens": 8}
        futures.append(engine.submit(CHAT, text, priority=Priority.BATCH))
    answers = [f.result(timeout=300) for f in futures]
    assert all(a["choices"][0]["finish_reason"] in ("stop", "length") for a in answers)
    image_tokens = [a["usage"]["prompt_tokens"] for a in answers[0::2]]
    text_tokens = [a["usage"]["prompt_tokens"] for a in answers[1::2]]
    assert len(set(image_tokens)) == 1 and min(image_tokens) > max(text_tokens) + 30


def test_n_choices_share_the_image_prompt(engine: LlamaEngine) -> None:
    answer = run(engine, ask(png((5, 5, 5)), n=2, temperature=1.0, seed=3))
    assert [c["index"] for c in answer["choices"]] == [0, 1]


def test_an_undecodable_image_fails_its_request_alone(engine: LlamaEngine) -> None:
    with pytest.raises(EngineError) as caught:
        run(engine, ask(b"\x89PNG\r\n\x1a\nnot really"))
    assert caught.value.status_code == 400 and caught.value.code == "invalid_image"
    assert run(engine, ask(png((1, 2, 3))))["choices"][0]["finish_reason"]


def test_a_model_without_a_projector_refuses_image_parts(vision_model: Path) -> None:  # noqa: F811
    eng = load_engine(Settings(model=str(vision_model / "model.gguf"), parallel=1, ctx_size=256))
    try:
        assert not eng.info.takes_images
        with pytest.raises(EngineError) as caught:
            eng.submit(CHAT, ask(png((9, 9, 9)))).result(timeout=60)
        error = caught.value
        assert error.status_code == 400 and error.code == "model_takes_no_images"
        assert f"model {eng.info.id} takes no images" in error.message
        text = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
        assert eng.submit(CHAT, text).result(timeout=60)["choices"]
    finally:
        eng.close()


def test_batch_lines_sharing_an_image_encode_it_once_and_fork_its_cells(
    engine: LlamaEngine,
) -> None:
    images = [png((250, 250, 10 * i), stripes=9 + i) for i in range(2)]
    before = engine.images_encoded
    futures = [
        engine.submit(
            CHAT,
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "image_url", "image_url": {"url": url(images[i % 2])}},
                            {"type": "text", "text": f"Line {i}: what colour is it?"},
                        ],
                    }
                ],
                "max_tokens": 2,
            },
            priority=Priority.BATCH,
        )
        for i in range(8)
    ]
    answers = [f.result(timeout=300) for f in futures]
    assert engine.images_encoded - before == 2 * 2  # two images of two chunks each
    cached = [a["usage"]["prompt_tokens_details"]["cached_tokens"] for a in answers]
    # Lines after the first of each image start from cells that hold the image (32 rows).
    assert sum(1 for c in cached if c > 32) >= 4


@pytest.mark.slow  # starts llama-server, where bench/build_llama_server.sh built it
def test_prompt_tokens_match_llama_servers_for_the_same_requests(
    engine: LlamaEngine,
    vision_model: Path,  # noqa: F811
) -> None:
    bodies = [
        ask(png((200, 30, 30))),
        {
            "messages": [
                {"role": "system", "content": "Be brief."},
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "image_url",
                            "image_url": {"url": url(png((1, 2, 3), (640, 480)))},
                        },
                        {"type": "text", "text": "and"},
                        {
                            "type": "image_url",
                            "image_url": {"url": url(png((9, 9, 3), (300, 300)))},
                        },
                    ],
                },
            ],
            "max_tokens": 1,
        },
    ]
    root = Path(__file__).resolve().parents[2]
    built = subprocess.run(
        ["bash", str(root / "bench" / "build_llama_server.sh"), sys.executable, "--no-build"],
        cwd=root,
        capture_output=True,
        text=True,
    )
    if built.returncode != 0:
        pytest.skip(
            "llama-server is not built on this machine, and building it takes minutes: "
            "`bash bench/build_llama_server.sh` builds it once, then this test runs"
        )
    port = free_port()
    server = subprocess.Popen(
        [
            str(Path(built.stdout.strip()) / "llama-server"),
            *("-m", str(vision_model / "model.gguf")),
            *("--mmproj", str(vision_model / "mmproj.gguf")),
            *("-c", "2048", "-np", "1", "--port", str(port)),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        until(lambda: _answers(base + "/health"), timeout=120)
        for body in bodies:
            theirs = httpx.post(base + "/v1/chat/completions", json=body, timeout=120).json()
            ours = run(engine, body)
            assert ours["usage"]["prompt_tokens"] == theirs["usage"]["prompt_tokens"]
    finally:
        server.terminate()
        server.wait(timeout=30)


def _answers(address: str) -> bool:
    try:
        return httpx.get(address, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def test_a_projector_that_fails_to_load_leaves_the_text_model_and_says_why(
    vision_model: Path,  # noqa: F811
) -> None:
    not_a_projector = vision_model / "model.gguf"
    eng = load_engine(
        Settings(model=str(vision_model / "model.gguf"), parallel=1, ctx_size=256),
        projector=not_a_projector,
    )
    try:
        assert not eng.info.takes_images
        with pytest.raises(EngineError) as caught:
            eng.submit(CHAT, ask(png((9, 9, 9)))).result(timeout=60)
        assert caught.value.code == "model_takes_no_images"
        assert "its projector could not be loaded" in caught.value.message
        text = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
        assert eng.submit(CHAT, text).result(timeout=60)["choices"]
    finally:
        eng.close()


def test_the_projector_unloads_while_no_image_comes_and_loads_again_for_one(
    engine: LlamaEngine,
) -> None:
    store, projector = engine._images, engine._projector
    assert store is not None and projector is not None
    seen = png((77, 7, 177), stripes=6)
    extra = {"logprobs": True, "top_logprobs": 5, "max_tokens": 1}
    before = first_logprob(run(engine, ask(seen, **extra)))
    store.idle_seconds = 0.3
    try:
        store.release([])  # wakes the encoder, which times the idleness
        until(lambda: not projector.loaded, timeout=30)
        loads, encoded = projector.loads, engine.images_encoded
        # An image line loads it again (libmtmd cuts the prompt), but an image seen before
        # is not encoded again: its rows stayed.
        assert first_logprob(run(engine, ask(seen, **extra))) == pytest.approx(before, abs=1e-3)
        assert projector.loaded and projector.loads == loads + 1
        assert engine.images_encoded == encoded
    finally:
        store.idle_seconds = vision.PROJECTOR_IDLE
