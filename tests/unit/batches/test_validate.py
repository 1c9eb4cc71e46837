"""The JSONL validator: offsets, blank lines, CRLF, limits, and OpenAI's error codes."""

from __future__ import annotations

import io
import json

from app.batches.lifecycle import validate as v
from tests.factories import CHAT, batch_line


def line(cid: str, url: str = CHAT) -> bytes:
    """One batch line's bytes, without its line break (the tests place their own)."""
    return json.dumps(batch_line(cid, "hi", url=url)).encode()


def run(data: bytes, **kw: int) -> v.Validation:
    return v.validate_jsonl(io.BytesIO(data), CHAT, **kw)


def test_offsets_point_at_each_line_crlf_and_blank_lines() -> None:
    data = line("a") + b"\r\n\r\n   \n" + line("b") + b"\r\n" + line("c")
    r = run(data)
    assert r.ok and r.model == "m"
    assert [(x.number, x.custom_id) for x in r.lines] == [(1, "a"), (4, "b"), (5, "c")]
    for x in r.lines:
        obj = json.loads(data[x.offset : x.offset + x.length])
        assert obj["custom_id"] == x.custom_id


def test_bom_is_skipped() -> None:
    data = b"\xef\xbb\xbf" + line("a") + b"\n"
    r = run(data)
    assert (
        r.ok
        and json.loads(data[r.lines[0].offset : r.lines[0].offset + r.lines[0].length])["custom_id"]
        == "a"
    )


def test_empty_file_and_only_blank_lines() -> None:
    for data in (b"", b"\n\n  \r\n"):
        r = run(data)
        assert not r.ok and [e.code for e in r.errors] == ["empty_file"]


def test_too_many_requests_names_the_limit() -> None:
    r = run(b"\n".join(line(str(i)) for i in range(4)), max_requests=3)
    assert not r.ok
    assert (
        r.errors[-1].code == "too_many_requests"
        and r.errors[-1].line == 4
        and "at most 3" in r.errors[-1].message
    )


def test_invalid_utf8_and_deep_nesting_are_line_errors() -> None:
    data = (
        line("a") + b"\n" + b'{"custom_id": "\xff\xfe"}\n' + b"[" * 100_000 + b"]" * 100_000 + b"\n"
    )
    r = run(data)
    assert [(e.line, e.code) for e in r.errors] == [
        (2, "invalid_encoding"),
        (3, "invalid_json_line"),
    ]


def test_what_the_runner_cannot_read_again_is_refused_here() -> None:
    """NaN and a lone surrogate: Python's json takes them, the runner's decoder (msgspec)
    does not; validation uses the runner's, so such a line is refused before it runs."""
    nan = line("a").replace(b'"model": "m"', b'"model": "m", "temperature": NaN')
    surrogate = line("b").replace(b'"hi"', b'"\\ud800"')
    assert b"NaN" in nan and b"\\ud800" in surrogate
    r = run(line("ok") + b"\n" + nan + b"\n" + surrogate + b"\n")
    assert [(e.line, e.code) for e in r.errors] == [
        (2, "invalid_json_line"),
        (3, "invalid_json_line"),
    ]


def test_a_line_past_the_limit_is_reported_without_being_kept(monkeypatch) -> None:
    monkeypatch.setattr(v, "MAX_LINE_BYTES", 1000)
    data = line("a") + b"\n" + b'{"x": "' + b"y" * 5000 + b'"}\n' + line("b") + b"\n"
    chunks = list(v.raw_lines(io.BytesIO(data), chunk_size=256))
    assert [c[2] for c in chunks] == [False, True, False]
    r = v.validate_lines(iter(chunks), CHAT)
    assert [(e.line, e.code) for e in r.errors] == [(2, "line_too_long")]
    assert [x.custom_id for x in r.lines] == ["a", "b"]
    third = r.lines[1]
    assert json.loads(data[third.offset : third.offset + third.length])["custom_id"] == "b"


def test_errors_are_capped_with_a_summary() -> None:
    r = run(b"\n".join(b"nope" for _ in range(v.MAX_REPORTED_ERRORS + 5)))
    shown = r.reported_errors()
    assert len(shown) == v.MAX_REPORTED_ERRORS + 1
    assert shown[-1]["code"] == "too_many_errors" and "5 more" in shown[-1]["message"]


EMB = "/v1/embeddings"


def test_first_endpoint_is_the_first_lines_url_if_known() -> None:
    """One rule for the dashboard's preview and `batchyard run`; the cases where the
    preview (which scanned for the first known url) and `run` (which took the first line's
    url whatever it was, and stopped at a bad first line) used to disagree come first."""

    def first(data: bytes) -> str:
        return v.first_endpoint(io.BytesIO(data))

    # An unknown url first: the preview said embeddings, `run` said /v1/moderations.
    assert first(line("a", url="/v1/moderations") + b"\n" + line("b", url=EMB)) == CHAT
    # A first line that is not JSON, or not an object: the preview read on to line 2.
    assert first(b"not json\n" + line("b", url=EMB)) == CHAT
    assert first(b"[1, 2]\n" + line("b", url=EMB)) == CHAT
    # Where they agreed, and still do.
    assert first(b"\xef\xbb\xbf" + line("a", url=EMB) + b"\r\n") == EMB
    assert first(b"\n  \r\n" + line("a", url=EMB)) == EMB
    assert first(line("a", url="/v1/completions")) == "/v1/completions"
    assert first(line("a")) == CHAT
    assert first(b"") == CHAT
    assert first(b'{"url": 5}\n' + line("b", url=EMB)) == CHAT


def test_a_schema_the_grammar_cannot_hold_is_refused_with_its_line() -> None:
    def with_schema(cid: str, schema: dict[str, object], strict: bool) -> bytes:
        obj = batch_line(cid, "hi")
        fmt = {"name": "r", "schema": schema, "strict": strict}
        obj["body"]["response_format"] = {"type": "json_schema", "json_schema": fmt}
        return json.dumps(obj).encode()

    unique = {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}
    bounded = {"type": "integer", "minimum": 1, "maximum": 5}
    data = b"\n".join(
        [
            with_schema("held", bounded, True),
            with_schema("refused", unique, True),
            with_schema("best effort", unique, False),  # strict false: left out, as OpenAI
        ]
    )
    r = run(data)
    assert [(e.line, e.code, e.param) for e in r.errors] == [
        (2, "unsupported_schema", "body.response_format")
    ]
    assert "uniqueItems" in r.errors[0].message
