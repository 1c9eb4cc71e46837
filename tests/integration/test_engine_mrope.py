"""The real LlamaEngine on an M-RoPE vision pair (tests/vision.py's `qwen2vl`: Qwen2-VL's
projector, whose images sit on a grid of positions and take fewer positions than rows).

The reference is libmtmd's own path: the same rendered prompt and image, tokenized by
mtmd_tokenize and evaluated by mtmd_helper_eval_chunks in a fresh llama.cpp context, places
every row and every token after the image where llama-server places them. The engine's
first-token logprobs must be that context's, for one request alone, for several decoded in
one batch of rows, after a prefix-cache reuse of the image's cells, and with two images.
"""

from __future__ import annotations

import base64
import ctypes
import math
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import llama_cpp as lc
import pytest
from llama_cpp import mtmd_cpp as mtmd

from app.config import Settings
from app.engine.llama.engine import LlamaEngine
from app.engine.llama.loading import load_engine
from app.wire.endpoints import CHAT
from tests.vision import png, qwen2vl_vision_model  # noqa: F401  (the fixture)

SLOTS = 4
CTX = 512
TOP = 5
#: Logprob difference allowed against the reference: the same weights and positions, other
#: batch shapes (llama.cpp's sums run in another order). A row placed one position off moves
#: the first token's logprobs by more than this (checked by hand against the engine before
#: M-RoPE: 0.3 and more).
TOLERANCE = 0.02


def url(raw: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(raw).decode()


def ask(*images: bytes, text: str = "What is in this picture?") -> dict[str, Any]:
    parts: list[dict[str, Any]] = [{"type": "text", "text": text}]
    parts += [{"type": "image_url", "image_url": {"url": url(raw)}} for raw in images]
    return {
        "messages": [{"role": "user", "content": parts}],
        "max_tokens": 1,
        "temperature": 0,
        "logprobs": True,
        "top_logprobs": TOP,
    }


class Spy:
    """What the engine's projector was asked to tokenize: the rendered prompt, its images."""

    def __init__(self, engine: LlamaEngine) -> None:
        projector = engine._projector
        assert projector is not None
        self.seen: list[tuple[str, list[bytes]]] = []
        self._tokenize = projector.tokenize

        def tokenize(text: str, images: list[bytes]) -> Any:
            self.seen.append((text, list(images)))
            return self._tokenize(text, images)

        projector.tokenize = tokenize  # type: ignore[method-assign]


@pytest.fixture(scope="module")
def pair(qwen2vl_vision_model: Path) -> Path:  # noqa: F811
    return qwen2vl_vision_model


@pytest.fixture(scope="module")
def engine(pair: Path) -> Iterator[LlamaEngine]:
    eng = load_engine(
        Settings(model=str(pair / "model.gguf"), parallel=SLOTS, ctx_size=CTX, kv_cache_type="f16"),
        projector=pair / "mmproj.gguf",
    )
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def spy(engine: LlamaEngine) -> Spy:
    return Spy(engine)


class Reference:
    """libmtmd's own evaluation of a prompt with images, in a context of its own."""

    def __init__(self, pair: Path) -> None:
        params = lc.llama_model_default_params()
        params.n_gpu_layers = 0
        self.model = lc.llama_model_load_from_file(str(pair / "model.gguf").encode(), params)
        self.vocab = lc.llama_model_get_vocab(self.model)
        mp = mtmd.mtmd_context_params_default()
        mp.use_gpu = False
        mp.print_timings = False
        self.mctx = mtmd.mtmd_init_from_file(str(pair / "mmproj.gguf").encode(), self.model, mp)
        assert self.mctx and mtmd.mtmd_decode_use_mrope(self.mctx)

    def first_logprobs(self, text: str, images: list[bytes]) -> tuple[dict[str, float], int]:
        """The top logprobs after the prompt, and the positions it took (n_past)."""
        cp = lc.llama_context_default_params()
        cp.n_ctx, cp.n_batch, cp.n_ubatch = CTX, CTX, CTX
        lctx = lc.llama_init_from_model(self.model, cp)
        chunks = mtmd.mtmd_input_chunks_init()
        bitmaps = []
        try:
            for raw in images:
                buf = (ctypes.c_uint8 * len(raw)).from_buffer_copy(raw)
                bitmaps.append(
                    mtmd.mtmd_helper_bitmap_init_from_buf(self.mctx, buf, len(raw), False)
                )
            data = text.encode()
            inp = mtmd.mtmd_input_text(data, len(data), False, True)
            arr = (mtmd.mtmd_bitmap_p_ctypes * len(bitmaps))(*bitmaps)
            assert mtmd.mtmd_tokenize(self.mctx, chunks, ctypes.byref(inp), arr, len(bitmaps)) == 0
            n_past = lc.llama_pos(0)
            rc = mtmd.mtmd_helper_eval_chunks(
                self.mctx, lctx, chunks, 0, 0, CTX, True, ctypes.byref(n_past)
            )
            assert rc == 0
            n_vocab = lc.llama_vocab_n_tokens(self.vocab)
            logits = lc.llama_get_logits_ith(lctx, -1)
            values = [logits[i] for i in range(n_vocab)]
        finally:
            mtmd.mtmd_input_chunks_free(chunks)
            for bitmap in bitmaps:
                mtmd.mtmd_bitmap_free(bitmap)
            lc.llama_free(lctx)
        top = max(values)
        norm = top + math.log(sum(math.exp(v - top) for v in values))
        best = sorted(range(n_vocab), key=lambda i: -values[i])[:TOP]
        return {self.piece(i): values[i] - norm for i in best}, n_past.value

    def piece(self, token: int) -> str:
        buf = ctypes.create_string_buffer(64)
        n = lc.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, False)
        return buf.raw[:n].decode("utf-8", "replace")

    def free(self) -> None:
        mtmd.mtmd_free(self.mctx)
        lc.llama_model_free(self.model)


@pytest.fixture(scope="module")
def reference(pair: Path) -> Iterator[Reference]:
    ref = Reference(pair)
    yield ref
    ref.free()


def logprobs(answer: dict[str, Any]) -> dict[str, float]:
    top = answer["choices"][0]["logprobs"]["content"][0]["top_logprobs"]
    return {t["token"]: t["logprob"] for t in top}


def assert_like(ours: dict[str, float], theirs: dict[str, float]) -> None:
    best = max(theirs, key=lambda t: theirs[t])
    assert max(ours, key=lambda t: ours[t]) == best, (ours, theirs)
    for token, value in theirs.items():
        if token in ours:
            assert abs(ours[token] - value) < TOLERANCE, (token, ours, theirs)


def check(engine: LlamaEngine, spy: Spy, reference: Reference, body: dict[str, Any]) -> Any:
    """Run `body` on the engine; its first-token logprobs are the reference's. Returns the
    answer."""
    before = len(spy.seen)
    answer = engine.submit(CHAT, body).result(timeout=120)
    text, images = spy.seen[before]
    theirs, _ = reference.first_logprobs(text, images)
    assert_like(logprobs(answer), theirs)
    return answer


def test_the_projector_loads_and_places_images_on_m_rope_positions(engine: LlamaEngine) -> None:
    assert engine._projector is not None and engine._projector.mrope
    assert engine.info.takes_images


def test_an_image_line_sees_what_libmtmd_places(
    engine: LlamaEngine, spy: Spy, reference: Reference
) -> None:
    raw = png((200, 30, 30))
    answer = check(engine, spy, reference, ask(raw))
    text, images = spy.seen[-1]
    _, n_past = reference.first_logprobs(text, images)
    # Usage counts the image's rows (15 here), as llama-server does, not its positions (5).
    assert answer["usage"]["prompt_tokens"] == n_past + 10


def test_lines_decoded_together_each_see_their_own_image(
    engine: LlamaEngine, spy: Spy, reference: Reference
) -> None:
    bodies = [
        ask(png(c, (160 + 32 * i, 96)))
        for i, c in enumerate([(9, 90, 200), (240, 240, 0), (0, 0, 0)])
    ]
    before = len(spy.seen)
    futures: list[Future[Any]] = [engine.submit(CHAT, b) for b in bodies]
    answers = [f.result(timeout=120) for f in futures]
    seen = spy.seen[before:]
    by_image = {images[0]: text for text, images in seen}
    for body, answer in zip(bodies, answers, strict=True):
        raw = base64.b64decode(body["messages"][0]["content"][1]["image_url"]["url"].split(",")[1])
        theirs, _ = reference.first_logprobs(by_image[raw], [raw])
        assert_like(logprobs(answer), theirs)


def test_a_repeated_image_reuses_its_cells_and_the_text_after_it_lands_in_place(
    engine: LlamaEngine, spy: Spy, reference: Reference
) -> None:
    raw = png((30, 160, 90), stripes=3)
    check(engine, spy, reference, ask(raw, text="Describe it."))
    again = check(engine, spy, reference, ask(raw, text="Describe it."))
    # The image's rows came from the cache: the positions after them were counted right.
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] > 15


def test_two_images_in_one_prompt(engine: LlamaEngine, spy: Spy, reference: Reference) -> None:
    check(engine, spy, reference, ask(png((250, 120, 0)), png((0, 120, 250), (96, 160))))
