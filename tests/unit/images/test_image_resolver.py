"""The resolver: every image of a body read and put in its engine's form (the embedded
engine's PNG/JPEG data URLs, an upstream's pass, inline or png), file ids read as their
owner's, each distinct URL fetched once per batch, and the engine a body routes to found
through the registry."""

from __future__ import annotations

import io
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from app.config import Settings
from app.config.upstreams import parse_engine_spec
from app.engine.registry import EngineRegistry
from app.engine.upstream.engine import UpstreamEngine
from app.images import EMBEDDED_TARGET, ImageError, ImageResolver, ImageTarget, target_for
from app.services import Services
from app.wire.endpoints import CHAT, RESPONSES
from tests.fakes import FakeEngine
from tests.images import ImageServer, data_url, decoded, image_bytes
from tests.unit.helpers import services

ALLOW = Settings(allow_private_image_urls=True, image_fetch_timeout=5.0)


@pytest.fixture
def server() -> Iterator[ImageServer]:
    s = ImageServer(
        files={
            "a.webp": image_bytes("WEBP", color=(1, 200, 1)),
            "b.png": image_bytes("PNG"),
            "c.gif": image_bytes("GIF"),
        }
    )
    yield s
    s.close()


def chat(*urls: str) -> dict[str, Any]:
    parts = [{"type": "text", "text": "what is in these?"}]
    parts += [{"type": "image_url", "image_url": {"url": u, "detail": "low"}} for u in urls]
    return {"model": "m", "messages": [{"role": "user", "content": parts}]}


def urls_of(body: dict[str, Any]) -> list[str]:
    return [p["image_url"]["url"] for p in body["messages"][0]["content"][1:]]


def test_the_embedded_form_from_data_urls_and_fetched_urls(server: ImageServer) -> None:
    resolver = ImageResolver(ALLOW, None)
    body = chat(
        data_url(image_bytes("WEBP"), "image/webp"),
        data_url(image_bytes("JPEG"), "image/jpeg"),
        server.url("c.gif"),
        server.url("b.png"),
    )
    resolved = resolver.resolve(CHAT, body, target=EMBEDDED_TARGET)
    mimes = [decoded(u)[0] for u in urls_of(resolved.body)]
    assert mimes == ["image/png", "image/jpeg", "image/png", "image/png"]
    assert [i.mime for i in resolved.images] == mimes
    assert resolved.images[3].data == image_bytes("PNG")  # PNG kept byte for byte
    assert resolved.body["messages"][0]["content"][1]["image_url"]["detail"] == "low"
    assert urls_of(body)[2] == server.url("c.gif")  # the caller's body is left as it was


@pytest.mark.parametrize(
    ("mode", "want"),
    [
        # (the data URL's, the file's, the fetched URL's MIME type; None: the URL as it was)
        ("pass", ["image/webp", "image/gif", None]),
        ("inline", ["image/webp", "image/gif", "image/webp"]),
        ("png", ["image/png", "image/png", "image/png"]),
    ],
)
def test_each_upstream_mode(
    tmp_path: Path, server: ImageServer, mode: str, want: list[str | None]
) -> None:
    svc = services(tmp_path, FakeEngine(), allow_private_image_urls=True)
    gif = svc.files.store(
        io.BytesIO(image_bytes("GIF")), filename="c.gif", purpose="vision", owner=""
    )
    body = {
        "model": "m",
        "input": [
            {
                "role": "user",
                "content": [
                    {
                        "type": "input_image",
                        "image_url": data_url(image_bytes("WEBP"), "image/webp"),
                    },
                    {"type": "input_image", "file_id": gif.id, "detail": "high"},
                    {"type": "input_image", "image_url": server.url("a.webp")},
                ],
            }
        ],
    }
    resolved = svc.runner.images.resolve(RESPONSES, body, target=ImageTarget(mode), owner="")
    parts = resolved.body["input"][0]["content"]
    got = [
        decoded(p["image_url"])[0] if p["image_url"].startswith("data:") else None for p in parts
    ]
    assert got == want
    assert "file_id" not in parts[1] and parts[1]["detail"] == "high"
    if mode == "pass":
        assert parts[2]["image_url"] == server.url("a.webp") and server.asked["/a.webp"] == 0
    else:
        assert server.asked["/a.webp"] == 1


def test_image_max_side_scales_before_sending() -> None:
    resolver = ImageResolver(Settings(), None)
    body = chat(data_url(image_bytes("PNG", (300, 150))))
    resolved = resolver.resolve(CHAT, body, target=ImageTarget("inline", max_side=100))
    assert decoded(urls_of(resolved.body)[0])[1].size == (100, 50)


def test_low_detail_is_seen_at_most_512_pixels_a_side() -> None:
    """OpenAI's `detail: "low"` gives the model a low-resolution version: the embedded form
    is scaled to 512 pixels on its longer side; `high` and `auto` keep every pixel."""
    resolver = ImageResolver(Settings(), None)
    raw = data_url(image_bytes("PNG", (1024, 640)))
    sizes = {}
    for detail in ("low", "high", "auto"):
        body = chat(raw)
        body["messages"][0]["content"][1]["image_url"]["detail"] = detail
        sizes[detail] = decoded(urls_of(resolver.resolve(CHAT, body).body)[0])[1].size
    assert sizes == {"low": (512, 320), "high": (1024, 640), "auto": (1024, 640)}
    # An upstream's own bound below 512 still holds.
    body = chat(raw)
    small = resolver.resolve(CHAT, body, target=ImageTarget("inline", max_side=100))
    assert decoded(urls_of(small.body)[0])[1].size == (100, 63)


def test_each_distinct_url_is_fetched_once_per_batch(server: ImageServer) -> None:
    resolver = ImageResolver(ALLOW, None)
    bodies = [chat(server.url("a.webp"), server.url("b.png")) for _ in range(12)]
    with ThreadPoolExecutor(6) as pool:  # lines resolved at once wait for the one fetch
        list(pool.map(lambda b: resolver.resolve(CHAT, b, scope="batch_1"), bodies))
    assert (server.asked["/a.webp"], server.asked["/b.png"], resolver.fetches) == (1, 1, 2)
    resolver.resolve(CHAT, chat(server.url("a.webp")), scope="batch_2")
    assert server.asked["/a.webp"] == 2  # another batch fetches it again


def test_a_failed_fetch_is_remembered_for_the_batch(server: ImageServer) -> None:
    resolver = ImageResolver(ALLOW, None)
    for _ in range(3):
        with pytest.raises(ImageError) as caught:
            resolver.resolve(CHAT, chat(server.url("missing.png")), scope="batch_1")
        assert caught.value.code == "image_fetch_failed"
        assert caught.value.param == "messages[0].content[1].image_url.url"
    assert server.asked["/missing.png"] == 1


def test_the_url_cache_is_bounded_by_bytes(server: ImageServer) -> None:
    small = len(image_bytes("PNG")) + 10
    resolver = ImageResolver(ALLOW, None, cache_bytes=small)
    resolver.resolve(CHAT, chat(server.url("b.png")), scope="b")
    resolver.resolve(CHAT, chat(server.url("a.webp")), scope="b")  # pushes b.png out
    resolver.resolve(CHAT, chat(server.url("b.png")), scope="b")
    assert server.asked["/b.png"] == 2


def test_the_first_bad_image_fails_the_body_at_its_param() -> None:
    resolver = ImageResolver(Settings(), None)
    body = chat(data_url(image_bytes("PNG")), data_url(image_bytes("BMP"), "image/bmp"))
    with pytest.raises(ImageError) as caught:
        resolver.resolve(CHAT, body)
    err = caught.value
    assert (err.code, err.param) == ("invalid_image_format", "messages[0].content[2].image_url.url")
    assert err.to_body()["error"]["type"] == "invalid_request_error"


def test_data_url_over_the_size_cap(tmp_path: Path) -> None:
    resolver = ImageResolver(Settings(max_image_bytes=1000), None)
    with pytest.raises(ImageError) as caught:
        resolver.resolve(
            CHAT, chat(data_url(image_bytes("PNG", (400, 400), (1, 2, 3)) + b"\0" * 2000))
        )
    assert (
        caught.value.code == "image_too_large" and "--max-image-bytes 1000" in caught.value.message
    )


@pytest.fixture
def svc(tmp_path: Path) -> Services:
    return services(tmp_path, FakeEngine())


def file_body(file_id: str) -> dict[str, Any]:
    return {
        "model": "m",
        "input": [{"role": "user", "content": [{"type": "input_image", "file_id": file_id}]}],
    }


@pytest.mark.parametrize("purpose", ["vision", "user_data"])
def test_a_file_id_of_the_owners_is_read(svc: Services, purpose: str) -> None:
    f = svc.files.store(
        io.BytesIO(image_bytes("WEBP")), filename="x.webp", purpose=purpose, owner="ann"
    )
    resolved = svc.runner.images.resolve(RESPONSES, file_body(f.id), owner="ann")
    mime, img = decoded(resolved.body["input"][0]["content"][0]["image_url"])
    assert (mime, img.size) == ("image/png", (12, 8))


def test_a_chat_url_that_is_a_file_id_is_read_as_the_owners_file(svc: Services) -> None:
    f = svc.files.store(
        io.BytesIO(image_bytes("GIF")), filename="x.gif", purpose="vision", owner="ann"
    )
    resolved = svc.runner.images.resolve(CHAT, chat(f.id), owner="ann")
    (url,) = urls_of(resolved.body)
    mime, img = decoded(url)
    assert (mime, img.size) == ("image/png", (12, 8))
    with pytest.raises(ImageError) as caught:
        svc.runner.images.resolve(CHAT, chat(f.id), owner="bob")
    assert (caught.value.code, caught.value.param) == (
        "invalid_image_file",
        "messages[0].content[1].image_url.url",
    )


def test_a_file_id_of_another_owner_or_purpose_is_refused(svc: Services) -> None:
    f = svc.files.store(
        io.BytesIO(image_bytes("PNG")), filename="x.png", purpose="vision", owner="ann"
    )
    with pytest.raises(ImageError) as caught:
        svc.runner.images.resolve(RESPONSES, file_body(f.id), owner="bob")
    assert (caught.value.code, caught.value.param) == (
        "invalid_image_file",
        "input[0].content[0].file_id",
    )
    g = svc.files.store(
        io.BytesIO(image_bytes("PNG")), filename="x.png", purpose="batch", owner="ann"
    )
    with pytest.raises(ImageError) as caught:
        svc.runner.images.resolve(RESPONSES, file_body(g.id), owner="ann")
    assert (
        caught.value.code == "invalid_image_file"
        and "'vision' or 'user_data'" in caught.value.message
    )


def test_the_target_follows_the_registrys_route() -> None:
    pass_up = UpstreamEngine(parse_engine_spec("vllm=openai:http://127.0.0.1:1/v1,models=big"))
    inline_up = UpstreamEngine(
        parse_engine_spec(
            "o=openai:http://127.0.0.1:1/v1,models=gem,images=inline,image_max_side=512"
        )
    )
    registry = EngineRegistry(FakeEngine(), [pass_up, inline_up], owns_embedded=False)
    assert target_for(registry, "big") == ImageTarget("pass")
    assert target_for(registry, "gem") == ImageTarget("inline", 512)
    assert target_for(registry, "fake-model") == EMBEDDED_TARGET
    assert target_for(FakeEngine(), "anything") == EMBEDDED_TARGET


def test_ollama_and_lm_studio_ports_default_to_data_urls() -> None:
    assert parse_engine_spec("o=openai:http://h:11434/v1").image_mode == "inline"
    assert parse_engine_spec("l=openai:http://h:1234/v1").image_mode == "png"
    assert parse_engine_spec("v=openai:http://h:8000/v1").image_mode == "pass"
    assert parse_engine_spec("o=openai:http://h:11434/v1,images=pass").image_mode == "pass"
