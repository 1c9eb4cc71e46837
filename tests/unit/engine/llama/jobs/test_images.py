"""Images in bodies, without a projector: data URLs, the ids an image takes in a prompt, the
prefix rules around them, and what prepare makes of an image part (a stand-in projector)."""

from __future__ import annotations

import base64
import itertools
from dataclasses import dataclass
from typing import Any

import pytest

from app.engine.base import EngineError, Priority
from app.engine.llama.jobs.jobs import Job
from app.engine.llama.jobs.oai import media, responses_request
from app.engine.llama.jobs.oai.chat_template import ChatTemplate
from app.engine.llama.jobs.prepare import Preparer
from app.wire.endpoints import CHAT, RESPONSES

PNG = b"\x89PNG\r\n\x1a\n" + b"pixels"
ROWS = 4  # embedding rows the stand-in projector gives each image


def data_url(raw: bytes, kind: str = "png") -> str:
    return f"data:image/{kind};base64,{base64.b64encode(raw).decode()}"


class Letters:
    n_vocab = 300
    bos = 1

    def tokenize(self, text: str, *, add_special: bool, parse_special: bool = True) -> list[int]:
        return [ord(c) % 250 + 2 for c in text]

    def piece(self, token: int, special: bool = False) -> bytes:
        return chr(token - 2).encode()


@dataclass(eq=False)
class Chunk:
    key: str
    first: int
    n_tokens: int
    freed: bool = False

    def free(self) -> None:
        self.freed = True


class Eyes:
    """libmtmd's tokenize in miniature: text around each marker, ROWS ids per image."""

    marker = "<__media__>"

    def __init__(self) -> None:
        self.chunks: list[Chunk] = []

    def tokenize(self, text: str, images: list[bytes]) -> tuple[list[int], list[Any]]:
        pieces = text.split(self.marker)
        assert len(pieces) == len(images) + 1
        tokens = Letters().tokenize(pieces[0], add_special=False)
        chunks = []
        for raw, after in zip(images, pieces[1:], strict=True):
            key = media.image_key(raw)
            ids = media.image_ids(key, 0, ROWS)
            chunks.append(Chunk(f"{key}/0", ids[0], ROWS))
            tokens += ids + Letters().tokenize(after, add_special=False)
        self.chunks += chunks
        return tokens, chunks


def preparer(eyes: Eyes | None, ctx: int = 512) -> Preparer:
    template = ChatTemplate(None, "", "")
    template.model_id = "tiny-text"
    return Preparer(Letters(), template, ctx_per_slot=ctx, n_slots=4, embedding_dim=8, vision=eyes)


def ask(*images: bytes, text: str = "What is this?") -> dict[str, Any]:
    parts: list[dict[str, Any]] = [{"type": "text", "text": text}]
    parts += [
        {"type": "image_url", "image_url": {"url": data_url(i), "detail": "low"}} for i in images
    ]
    return {"messages": [{"role": "user", "content": parts}], "max_tokens": 4}


def test_a_data_url_gives_its_bytes_and_anything_else_a_400_naming_the_part() -> None:
    assert media.image_bytes(data_url(PNG), "p") == PNG
    assert media.image_bytes(data_url(PNG, "jpeg"), "p") == PNG
    for url, code in [
        ("https://example.com/cat.png", "invalid_image_url"),
        ("data:image/png,rawbytes", "invalid_image"),  # malformed: the parser's code
        (data_url(PNG, "webp"), "invalid_image_format"),
        ("data:image/png;base64,!!!", "invalid_image"),
        ("data:image/png;base64,", "invalid_image"),
        (None, "invalid_type"),
    ]:
        with pytest.raises(EngineError) as caught:
            media.image_bytes(url, "messages[0].content[1].image_url.url")
        assert caught.value.status_code == 400 and caught.value.code == code
        assert caught.value.param == "messages[0].content[1].image_url.url"


def test_image_ids_are_negative_distinct_per_image_and_know_their_offset() -> None:
    a, b = media.image_ids("aa", 0, 300), media.image_ids("bb", 0, 300)
    assert all(t < 0 for t in a + b) and not set(a) & set(b)
    assert media.image_ids("aa", 0, 300) == a  # the same bytes, the same ids
    assert not set(media.image_ids("aa", 1, 300)) & set(a)  # another chunk of the image
    assert [media.offset(t) for t in a[:3]] == [0, 1, 2] and media.offset(a[-1]) == 299


def test_a_reused_prefix_never_cuts_an_image_and_text_runs_stop_before_one() -> None:
    ids = media.image_ids("aa", 0, 10)
    prompt = [5, 6, *ids, 7, 8]
    assert media.whole_images(prompt, 2) == 2  # just before the image
    assert media.whole_images(prompt, 7) == 2  # inside: back to its start
    assert media.whole_images(prompt, 12) == 12  # just after
    assert media.text_run(prompt, 100) == 2
    assert media.text_run(prompt[12:], 100) == 2 and media.text_run(prompt, 1) == 1


def test_an_image_part_becomes_its_rows_ids_and_counts_as_prompt_tokens() -> None:
    eyes = Eyes()
    job = Job(CHAT, ask(PNG), Priority.BATCH, None)
    preparer(eyes).prepare(job, itertools.count())
    (prompt,) = job.prompts
    image = [t for t in prompt if t < 0]
    assert len(image) == ROWS and job.images == {image[0]: f"{media.image_key(PNG)}/0"}
    assert "What is this?<__media__>" in job.prompt_texts[0]
    assert prompt[-1] >= 0  # the generation prompt follows the image
    assert job.image_chunks == eyes.chunks


def test_two_images_in_order_and_the_same_image_twice_share_ids() -> None:
    job = Job(CHAT, ask(PNG, b"other", PNG), Priority.BATCH, None)
    preparer(Eyes()).prepare(job, itertools.count())
    runs: list[list[int]] = []
    for t in job.prompts[0]:
        if t < 0:
            if media.offset(t) == 0:
                runs.append([])
            runs[-1].append(t)
    assert len(runs) == 3 and runs[0] == runs[2] != runs[1]


def test_a_model_without_a_projector_refuses_an_image_naming_the_model_and_part() -> None:
    job = Job(CHAT, ask(PNG), Priority.BATCH, None)
    with pytest.raises(EngineError) as caught:
        preparer(None).prepare(job, itertools.count())
    error = caught.value
    assert error.status_code == 400 and error.code == "model_takes_no_images"
    assert "model tiny-text takes no images" in error.message
    assert error.param == "messages[0].content[1].image_url"


def test_a_refused_request_frees_the_chunks_it_cut() -> None:
    eyes = Eyes()
    job = Job(CHAT, ask(PNG, text="x" * 100), Priority.BATCH, None)
    with pytest.raises(EngineError) as caught:
        preparer(eyes, ctx=64).prepare(job, itertools.count())
    assert caught.value.code == "context_length_exceeded"
    assert eyes.chunks and all(c.freed for c in eyes.chunks) and not job.image_chunks


def test_a_responses_input_image_runs_as_a_chat_image_part() -> None:
    body = {
        "model": "m",
        "input": [
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "Describe"},
                    {"type": "input_image", "image_url": data_url(PNG), "detail": "high"},
                ],
            }
        ],
    }
    chat, _ = responses_request.to_chat(body)
    assert chat["messages"][0]["content"] == [
        {"type": "text", "text": "Describe"},
        {"type": "image_url", "image_url": {"url": data_url(PNG), "detail": "high"}},
    ]
    job = Job(RESPONSES, body, Priority.BATCH, None)
    preparer(Eyes()).prepare(job, itertools.count())
    assert sum(1 for t in job.prompts[0] if t < 0) == ROWS


def test_a_responses_file_id_must_be_resolved_before_the_engine() -> None:
    body = {
        "model": "m",
        "input": [{"role": "user", "content": [{"type": "input_image", "file_id": "file-1"}]}],
    }
    with pytest.raises(EngineError) as caught:
        responses_request.to_chat(body)
    assert caught.value.param == "input[0].content[0].image_url"
    assert "file_id" in caught.value.message
