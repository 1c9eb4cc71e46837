"""The JSONL validator against arbitrary bytes: it never raises, and accounts for every line."""

from __future__ import annotations

import io
import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.batches.lifecycle.validate import MAX_LINE_BYTES, raw_lines, validate_jsonl
from tests.factories import CHAT, batch_line


def good_line(cid: str) -> bytes:
    """A valid line's bytes, any non-ASCII id as UTF-8 (not escaped), without a line break."""
    return json.dumps(batch_line(cid, cid), ensure_ascii=False).encode()


# Lines drawn from a mix: valid requests, near misses, JSON of other shapes, raw noise.
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)
line_bytes = st.one_of(
    st.text(min_size=1, max_size=12).map(good_line),
    st.text(max_size=6).map(lambda c: good_line(c).replace(b'"POST"', b'"GET"')),
    json_values.map(lambda v: json.dumps(v).encode()),
    st.binary(max_size=40),
    st.sampled_from([b"", b"\r", b" ", b"\xef\xbb\xbf", b"{", b"\xff", b"[[[[[[", b"\x00"]),
)
files = st.lists(line_bytes, max_size=25).flatmap(
    lambda ls: st.sampled_from([b"\n", b"\r\n"]).map(lambda sep: sep.join(ls))
)


def check(data: bytes, chunk_size: int = 1 << 20) -> None:
    stream = io.BytesIO(data)
    stream.read = lambda n=-1, _r=stream.read: _r(min(n, chunk_size) if n > 0 else chunk_size)  # type: ignore[method-assign]
    result = validate_jsonl(stream, CHAT)
    n_lines = sum(1 for _ in raw_lines(io.BytesIO(data)))
    for e in result.errors:
        assert e.line is None or 1 <= e.line <= n_lines
        assert e.code and e.message
    for e in result.errors:
        if e.line is None:
            assert e.code == "empty_file" and not result.lines
    numbers = [x.number for x in result.lines] + [e.line for e in result.errors if e.line]
    assert len(numbers) == len(set(numbers)), "a line is both accepted and reported, or twice"
    ids = [x.custom_id for x in result.lines]
    assert len(ids) == len(set(ids))
    for accepted in result.lines:
        assert 1 <= accepted.number <= n_lines
        assert accepted.offset >= 0 and accepted.offset + accepted.length <= len(data)
        obj = json.loads(data[accepted.offset : accepted.offset + accepted.length].decode("utf-8"))
        assert isinstance(obj, dict) and obj["custom_id"] == accepted.custom_id
        assert obj["url"] == CHAT and isinstance(obj["body"], dict)
    # Lines neither accepted nor reported are blank.
    raw = list(raw_lines(io.BytesIO(data)))
    for number, (_, text, _) in enumerate(raw, start=1):
        if number not in numbers:
            assert text.replace(b"\xef\xbb\xbf", b"", 1 if number == 1 else 0).strip() == b""
    assert result.ok == (bool(result.lines) and not result.errors)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(files)
def test_structured_noise(data: bytes) -> None:
    check(data)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=400), st.integers(min_value=1, max_value=64))
def test_raw_bytes_in_small_chunks(data: bytes, chunk: int) -> None:
    check(data, chunk_size=chunk)


@given(st.lists(st.text(min_size=1, max_size=10), min_size=1, max_size=20, unique=True))
def test_valid_files_are_accepted_whole(ids: list[str]) -> None:
    data = b"\n".join(good_line(c) for c in ids) + b"\n"
    result = validate_jsonl(io.BytesIO(data), CHAT)
    assert result.ok and [x.custom_id for x in result.lines] == ids
    assert [x.number for x in result.lines] == list(range(1, len(ids) + 1))


def test_a_line_over_the_cap_is_reported_not_kept() -> None:
    data = (
        good_line("a")
        + b"\n"
        + b'{"x": "'
        + b"a" * (MAX_LINE_BYTES + 10)
        + b'"}\n'
        + good_line("c")
    )
    result = validate_jsonl(io.BytesIO(data), CHAT)
    assert [(e.line, e.code) for e in result.errors] == [(2, "line_too_long")]
    assert [(x.number, x.custom_id) for x in result.lines] == [(1, "a"), (3, "c")]
    third = result.lines[1]
    assert json.loads(data[third.offset : third.offset + third.length])["custom_id"] == "c"
