"""Finding the images of a body: chat `image_url` parts in any message, Responses
`input_image` parts with `image_url` or `file_id`, each with its param, and the way each is
pointed at another URL."""

from __future__ import annotations

import pytest

from app.images import ImageError, find_images, has_images
from app.wire.endpoints import CHAT, COMPLETIONS, EMBEDDINGS, RESPONSES


def chat(*contents: object) -> dict[str, object]:
    return {"model": "m", "messages": [{"role": "user", "content": c} for c in contents]}


def test_chat_images_in_any_user_message_with_their_params_and_detail() -> None:
    body = chat(
        "plain text",
        [
            {"type": "text", "text": "what is this?"},
            {
                "type": "image_url",
                "image_url": {"url": "https://example.com/a.png", "detail": "low"},
            },
        ],
        [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}],
    )
    found = find_images(CHAT, body)
    assert [(r.param, r.source, r.value, r.detail) for r in found] == [
        ("messages[1].content[1].image_url.url", "url", "https://example.com/a.png", "low"),
        ("messages[2].content[0].image_url.url", "data", "data:image/png;base64,AAAA", None),
    ]


def test_pointing_a_chat_part_elsewhere_keeps_its_detail() -> None:
    body = chat([{"type": "image_url", "image_url": {"url": "https://x/a.png", "detail": "high"}}])
    (ref,) = find_images(CHAT, body)
    ref.point_to("data:image/png;base64,QUJD")
    assert body["messages"][0]["content"][0] == {  # type: ignore[index]
        "type": "image_url",
        "image_url": {"url": "data:image/png;base64,QUJD", "detail": "high"},
    }


def test_a_bare_string_image_url_is_found_and_becomes_openais_object() -> None:
    body = chat([{"type": "image_url", "image_url": "https://x/a.png"}])
    (ref,) = find_images(CHAT, body)
    assert ref.param == "messages[0].content[0].image_url"
    ref.point_to("data:image/png;base64,QUJD")
    assert body["messages"][0]["content"][0]["image_url"] == {"url": "data:image/png;base64,QUJD"}  # type: ignore[index]


def test_responses_images_by_url_and_by_file_id() -> None:
    body = {
        "model": "m",
        "input": [
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "compare"},
                    {"type": "input_image", "image_url": "https://x/a.jpg", "detail": "auto"},
                    {"type": "input_image", "file_id": "file-abc"},
                ],
            }
        ],
    }
    found = find_images(RESPONSES, body)
    assert [(r.param, r.source, r.value, r.detail) for r in found] == [
        ("input[0].content[1].image_url", "url", "https://x/a.jpg", "auto"),
        ("input[0].content[2].file_id", "file", "file-abc", None),
    ]
    found[1].point_to("data:image/png;base64,QUJD")
    assert body["input"][0]["content"][2] == {  # type: ignore[index]
        "type": "input_image",
        "image_url": "data:image/png;base64,QUJD",
    }


def test_a_string_input_and_text_only_bodies_have_no_images() -> None:
    assert find_images(RESPONSES, {"model": "m", "input": "hello"}) == []
    assert find_images(CHAT, chat("hello", [{"type": "text", "text": "hi"}])) == []
    assert find_images(COMPLETIONS, {"prompt": "data:image/png;base64,AAAA"}) == []
    assert find_images(EMBEDDINGS, {"input": ["x"]}) == []
    assert not has_images(CHAT, chat("hello"))


@pytest.mark.parametrize(
    ("endpoint", "body", "param"),
    [
        (
            CHAT,
            chat([{"type": "image_url", "image_url": {"detail": "low"}}]),
            "messages[0].content[0].image_url.url",
        ),
        (CHAT, chat([{"type": "image_url"}]), "messages[0].content[0].image_url"),
        (
            RESPONSES,
            {"input": [{"role": "user", "content": [{"type": "input_image", "detail": "low"}]}]},
            "input[0].content[0]",
        ),
    ],
)
def test_an_image_part_that_names_no_image_is_refused_at_its_param(
    endpoint: str, body: dict[str, object], param: str
) -> None:
    assert has_images(endpoint, body)
    with pytest.raises(ImageError) as caught:
        find_images(endpoint, body)
    assert (caught.value.status_code, caught.value.code, caught.value.param) == (
        400,
        "invalid_image",
        param,
    )


def test_a_chat_url_that_is_a_file_id_names_that_file() -> None:
    body = chat(
        [
            {"type": "image_url", "image_url": {"url": "file-abc123_X"}},
            {"type": "image_url", "image_url": {"url": "https://x/file-abc.png"}},
            {"type": "image_url", "image_url": {"url": "file-abc/../x.png"}},
        ]
    )
    assert [(r.source, r.value) for r in find_images(CHAT, body)] == [
        ("file", "file-abc123_X"),
        ("url", "https://x/file-abc.png"),
        ("url", "file-abc/../x.png"),
    ]
