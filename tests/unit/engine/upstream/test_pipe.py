"""The frames between a node and its upstream client process (app/engine/upstream/pipe.py)."""

from __future__ import annotations

import os
import threading

from app.engine.upstream.pipe import FrameReader, frame, write_all


def test_frames_split_anywhere_come_out_whole_and_in_order() -> None:
    messages = [
        ["s", 1, "/v1/chat/completions", 1, False, b'{"model":"m"}', False],
        ["r", 1, b'{"id":"x"}' * 1000],
        ["t", {"up": True, "cards": [{"id": "m"}], "error": None}],
    ]
    data = b"".join(frame(m) for m in messages)
    for cut in (1, 3, 4, 5, 17, len(data) - 1):
        reader = FrameReader()
        assert reader.feed(data[:cut]) + reader.feed(data[cut:]) == messages
    reader = FrameReader()
    out = []
    for i in range(len(data)):  # one byte at a time
        out += reader.feed(data[i : i + 1])
    assert out == messages


def test_a_write_larger_than_the_pipe_arrives_whole() -> None:
    read, write = os.pipe()
    big = frame(["r", 7, b"x" * (3 << 20)])

    def writer() -> None:  # writes while this side reads, then closes its end
        write_all(write, big)
        os.close(write)

    t = threading.Thread(target=writer)
    t.start()
    got = b""
    while chunk := os.read(read, 1 << 20):
        got += chunk
    t.join()
    os.close(read)
    assert FrameReader().feed(got) == [["r", 7, b"x" * (3 << 20)]]
