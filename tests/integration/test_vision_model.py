"""The test vision models (bench/vision_model.py) in llama.cpp's own libmtmd: each pair loads,
frames an image as SmolVLM, Gemma 3 or Qwen2-VL does (Qwen2-VL's with M-RoPE positions), and
what the image shows changes the next token's logits.

llama-server's check of the same pair (`--mmproj`, an image request) is in bench/README.md.
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.vision import MMPROJ_FILE, MODEL_FILE, png, vision_model_dir

llama_cpp = pytest.importorskip("llama_cpp")
mtmd = pytest.importorskip("llama_cpp.mtmd_cpp")

RED = png((200, 30, 30))
BLUE_STRIPED = png((20, 60, 220), stripes=8)
IMAGE_CHUNK = 1  # MTMD_INPUT_CHUNK_TYPE_IMAGE


class Mtmd:
    """The text model and its projector, loaded as llama-server loads them."""

    projector = ""

    def __init__(self, folder: Path) -> None:
        llama_cpp.llama_backend_init()
        self.model = llama_cpp.llama_model_load_from_file(
            str(folder / MODEL_FILE).encode(), llama_cpp.llama_model_default_params()
        )
        assert self.model, "the text model did not load"
        params = mtmd.mtmd_context_params_default()
        params.use_gpu = False
        params.n_threads = 2
        params.print_timings = False
        self.ctx = mtmd.mtmd_init_from_file(str(folder / MMPROJ_FILE).encode(), self.model, params)
        assert self.ctx, "the projector did not load"
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(self.model))

    def close(self) -> None:
        mtmd.mtmd_free(self.ctx)
        llama_cpp.llama_model_free(self.model)

    def chunks(self, image: bytes, question: str, system: str = "") -> Any:
        """The chat prompt for `question` about `image`, tokenized into text and image chunks."""
        buf = (ctypes.c_uint8 * len(image)).from_buffer_copy(image)
        bitmap = mtmd.mtmd_helper_bitmap_init_from_buf(self.ctx, buf, len(image), False)
        assert bitmap, "the image did not decode"
        marker = mtmd.mtmd_default_marker().decode()
        if "{image}" not in question:
            question = "{image}" + question
        system = f"<|im_start|>system\n{system}<|im_end|>\n" if system else ""
        prompt = (
            f"{system}<|im_start|>user\n{question.format(image=marker)}<|im_end|>\n"
            "<|im_start|>assistant\n"
        ).encode()
        text = mtmd.mtmd_input_text(prompt, len(prompt), True, True)
        chunks = mtmd.mtmd_input_chunks_init()
        bitmaps = (mtmd.mtmd_bitmap_p_ctypes * 1)(bitmap)
        try:
            assert mtmd.mtmd_tokenize(self.ctx, chunks, ctypes.byref(text), bitmaps, 1) == 0
        finally:
            mtmd.mtmd_bitmap_free(bitmap)
        return chunks

    def next_logits(self, image: bytes, question: str) -> np.ndarray:
        """The next token's logits after the prompt, evaluated in a fresh context."""
        params = llama_cpp.llama_context_default_params()
        params.n_ctx, params.n_batch = 512, 512
        params.n_threads = params.n_threads_batch = 2
        context = llama_cpp.llama_init_from_model(self.model, params)
        chunks = self.chunks(image, question)
        try:
            n_past = llama_cpp.llama_pos(0)
            rc = mtmd.mtmd_helper_eval_chunks(
                self.ctx, context, chunks, 0, 0, 512, True, ctypes.byref(n_past)
            )
            assert rc == 0
            assert n_past.value == mtmd.mtmd_helper_get_n_pos(chunks)
            logits = llama_cpp.llama_get_logits_ith(context, -1)
            return np.ctypeslib.as_array(logits, shape=(self.n_vocab,)).copy()
        finally:
            mtmd.mtmd_input_chunks_free(chunks)
            llama_cpp.llama_free(context)


#: Each projector's image chunks, and the text tokens of the chat prompt in test_framing: the
#: chat frame, the question (6 tokens) and the image's framing tokens.
FRAMING = {
    # <fake><row_1_col_1> tile \n\n<fake><global-img> overview <fake>
    "idefics3": ([16, 16], 21),
    "gemma3": ([16], 17),  # <start_of_image> image <end_of_image>
    "qwen2vl": ([15], 17),  # <|vision_start|> image <|vision_end|>
}


@pytest.fixture(scope="module", params=sorted(FRAMING))
def pair(request: pytest.FixtureRequest) -> Iterator[Mtmd]:
    loaded = Mtmd(vision_model_dir(request.param))
    loaded.projector = request.param
    yield loaded
    loaded.close()


def test_the_pair_is_small(pair: Mtmd) -> None:
    folder = vision_model_dir(pair.projector)
    for name in (MODEL_FILE, MMPROJ_FILE):
        assert (folder / name).stat().st_size < 200_000_000


def test_framing(pair: Mtmd) -> None:
    assert mtmd.mtmd_support_vision(pair.ctx)
    chunks = pair.chunks(RED, "What is in this picture?")
    try:
        n = mtmd.mtmd_input_chunks_size(chunks)
        parts = [mtmd.mtmd_input_chunks_get(chunks, i) for i in range(n)]
        images = [p for p in parts if mtmd.mtmd_input_chunk_get_type(p) == IMAGE_CHUNK]
        tiles, text = FRAMING[pair.projector]
        assert [mtmd.mtmd_input_chunk_get_n_tokens(p) for p in images] == tiles
        assert mtmd.mtmd_helper_get_n_tokens(chunks) == sum(tiles) + text
    finally:
        mtmd.mtmd_input_chunks_free(chunks)


#: Each projector's image chunks for the 160x96 PNG: (nx, ny) and the positions each takes.
#: With M-RoPE (qwen2vl: 32-pixel cells, 5x3) an image's rows share positions, a row's time,
#: row and column ones, and the image advances the prompt by max(nx, ny); the other kinds
#: give each row a position of its own.
PLACES = {
    "idefics3": [((16, 1), 16), ((16, 1), 16)],
    "gemma3": [((16, 1), 16)],
    "qwen2vl": [((5, 3), 5)],
}


def test_image_positions(pair: Mtmd) -> None:
    mrope = bool(mtmd.mtmd_decode_use_mrope(pair.ctx))
    assert mrope == (pair.projector == "qwen2vl")
    chunks = pair.chunks(RED, "What is in this picture?")
    try:
        n = mtmd.mtmd_input_chunks_size(chunks)
        parts = [mtmd.mtmd_input_chunks_get(chunks, i) for i in range(n)]
        images = [p for p in parts if mtmd.mtmd_input_chunk_get_type(p) == IMAGE_CHUNK]
        places = []
        for image in images:
            tokens = mtmd.mtmd_input_chunk_get_tokens_image(image)
            grid = (mtmd.mtmd_image_tokens_get_nx(tokens), mtmd.mtmd_image_tokens_get_ny(tokens))
            places.append((grid, mtmd.mtmd_input_chunk_get_n_pos(image)))
        assert places == PLACES[pair.projector]
        rows = sum(mtmd.mtmd_input_chunk_get_n_tokens(p) for p in images)
        positions = sum(n_pos for _, n_pos in places)
        n_tokens = mtmd.mtmd_helper_get_n_tokens(chunks)
        assert mtmd.mtmd_helper_get_n_pos(chunks) == n_tokens - rows + positions
    finally:
        mtmd.mtmd_input_chunks_free(chunks)


#: llama-server's usage.prompt_tokens for bench/vision_model.py's check request (its
#: `request()`: a text part, then the red PNG) with each projector (bench/README.md).
LLAMA_SERVER_PROMPT_TOKENS = {"idefics3": 74, "gemma3": 54, "qwen2vl": 53}


def test_the_llama_server_check_counts_alike(pair: Mtmd) -> None:
    # llama-server joins the text parts with newlines, none around an image, and renders
    # SmolLM2's template, which adds its default system message.
    system = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
    chunks = pair.chunks(RED, "What colour is this picture?{image}", system)
    try:
        n_tokens = mtmd.mtmd_helper_get_n_tokens(chunks)
        assert n_tokens == LLAMA_SERVER_PROMPT_TOKENS[pair.projector]
    finally:
        mtmd.mtmd_input_chunks_free(chunks)


def test_what_the_image_shows_changes_the_next_token(pair: Mtmd) -> None:
    question = "What colour is this picture?"
    red = pair.next_logits(RED, question)
    again = pair.next_logits(RED, question)
    blue = pair.next_logits(BLUE_STRIPED, question)
    assert np.isfinite(red).all() and np.isfinite(blue).all()
    np.testing.assert_array_equal(red, again)  # the same image: the same logits
    assert np.abs(red - blue).max() > 0.1  # another image: other logits


@pytest.mark.parametrize("projector", ["idefics3", "qwen2vl"])
def test_text_lines_answer_as_the_embedded_model(projector: str) -> None:
    # qwen2vl's text model is SmolLM2 with its Q and K rows reordered for M-RoPE (left in
    # llama's order, it answers this with nothing). Its logits differ a little all the same:
    # llama.cpp's qwen2vl loader takes 0 for the RMS norm's epsilon.
    from app.config import bundled_model_path

    messages = [{"role": "user", "content": "What is 2 + 2? Answer with a number only."}]
    answers = []
    for path in (bundled_model_path(), vision_model_dir(projector) / MODEL_FILE):
        llm = llama_cpp.Llama(str(path), n_ctx=256, n_threads=2, verbose=False)
        try:
            answer = llm.create_chat_completion(messages, max_tokens=48, temperature=0)
        finally:
            llm.close()
        answers.append(answer["choices"][0])
    # The chat template and the end of turn came along: the answer stops by itself.
    assert answers[1]["finish_reason"] == "stop"
    assert answers[1]["message"]["content"] == answers[0]["message"]["content"]
