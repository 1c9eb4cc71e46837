"""The encoded-image store's bookkeeping with a stand-in projector: each chunk encoded once
however many requests pin it, rows kept by bytes and never while pinned, a failed encode
told to every request of it, and the projector unloaded while no image is needed."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from app.engine.base import EngineError
from app.engine.llama.binding.vision import ImageChunk, ImageStore
from tests.waiting import until

ROWS = 4
WIDTH = 8  # one chunk's rows: 4 x 8 float32 = 128 bytes


class Eyes:
    """Encodes a chunk into rows of its number; 'bad' chunks fail."""

    n_embd = WIDTH

    def __init__(self) -> None:
        self.encoded: list[Any] = []
        self.loaded = True
        self.gate = threading.Event()
        self.gate.set()

    def encode(self, chunk: Any, n_tokens: int) -> np.ndarray:
        self.gate.wait(10)
        self.loaded = True
        self.encoded.append(chunk)
        if chunk == "bad":
            raise EngineError("no", status_code=500, code="image_encode_failed")
        return np.full(n_tokens * WIDTH, float(len(self.encoded)), dtype=np.float32)

    def unload(self) -> bool:
        self.loaded = False
        return True


def part(key: str, full: Any = None) -> ImageChunk:
    return ImageChunk(key=key, first=-1, n_tokens=ROWS, full=full or key)


def store(eyes: Eyes, **kw: Any) -> ImageStore:
    # Chunks here are strings: the store frees a real chunk's handle, not these.
    return ImageStore(eyes, free_chunk=lambda chunk: None, **kw)  # type: ignore[arg-type]


def ready(s: ImageStore, key: str) -> Any:
    entry = s.take(key)
    if entry is not None:
        s.release([key])
    return entry


def test_a_chunk_pinned_by_several_requests_is_encoded_once() -> None:
    eyes = Eyes()
    eyes.gate.clear()  # all three pins land before the first encode
    s = store(eyes)
    try:
        pins = [s.pin([part("a")], priority=1) for _ in range(3)]
        eyes.gate.set()
        until(lambda: ready(s, "a"), timeout=10)
        assert eyes.encoded == ["a"] and s.encodes == 1 and pins == [["a"]] * 3
        s.pin([part("a")], priority=1)  # later, encoded already: no encode
        assert s.encodes == 1
    finally:
        s.close()


def test_rows_past_the_bound_go_least_recent_first_and_never_while_pinned() -> None:
    eyes = Eyes()
    s = store(eyes, limit_bytes=2 * ROWS * WIDTH * 4)  # room for two chunks' rows
    try:
        held = s.pin([part("a")], priority=1)
        for key in ("b", "c", "d"):
            keys = s.pin([part(key)], priority=1)
            until(lambda key=key: ready(s, key), timeout=10)
            s.release(keys)
        assert ready(s, "a") is not None  # pinned: kept past the bound
        assert ready(s, "b") is None and ready(s, "c") is None and ready(s, "d") is not None
        s.release(held)
        assert s.cached_bytes <= 2 * ROWS * WIDTH * 4
    finally:
        s.close()


def test_priority_online_chunks_are_encoded_first() -> None:
    eyes = Eyes()
    eyes.gate.clear()
    s = store(eyes)
    try:
        s.pin([part("first")], priority=1)
        until(lambda: s._work == [], timeout=10)  # the encoder holds "first" at the gate
        s.pin([part("batch")], priority=1)
        s.pin([part("online")], priority=0)
        eyes.gate.set()
        until(lambda: len(eyes.encoded) == 3, timeout=10)
        assert eyes.encoded == ["first", "online", "batch"]
    finally:
        s.close()


def test_a_chunk_no_request_wants_any_more_is_not_encoded() -> None:
    eyes = Eyes()
    eyes.gate.clear()
    s = store(eyes)
    try:
        s.pin([part("first")], priority=1)
        until(lambda: s._work == [], timeout=10)
        s.release(s.pin([part("gone")], priority=1))  # its request was cancelled
        eyes.gate.set()
        until(lambda: s._work == [] and eyes.encoded == ["first"], timeout=10)
        assert ready(s, "gone") is None
    finally:
        s.close()


def test_a_failed_encode_reaches_its_requests_and_is_tried_again_later() -> None:
    eyes = Eyes()
    s = store(eyes)
    try:
        keys = s.pin([part("x", full="bad")], priority=1)
        until(lambda: ready(s, "x"), timeout=10)
        entry = ready(s, "x")
        assert entry.error is not None and entry.error.code == "image_encode_failed"
        s.release(keys)  # the failure is forgotten with its last request
        s.pin([part("x", full="good")], priority=1)
        until(lambda: ready(s, "x") and ready(s, "x").rows is not None, timeout=10)
        assert eyes.encoded == ["bad", "good"]
    finally:
        s.close()


def test_the_projector_unloads_once_no_image_is_needed_for_its_idle_time() -> None:
    eyes = Eyes()
    s = store(eyes, idle_seconds=0.2)
    try:
        keys = s.pin([part("a")], priority=1)
        until(lambda: ready(s, "a"), timeout=10)
        threading.Event().wait(0.5)
        assert eyes.loaded  # still pinned: in use
        s.release(keys)
        until(lambda: not eyes.loaded, timeout=10)
        assert ready(s, "a") is not None  # the rows outlive the projector
    finally:
        s.close()
