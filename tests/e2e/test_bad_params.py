"""Out-of-range numbers in a batch line fail that line alone, with a 400 in the error file.

Against the live server on the real model: the engine's own parameter checks, end to end.
"""

from __future__ import annotations

import io

from openai import OpenAI

from tests.factories import batch_line, jsonl, jsonl_lines
from tests.http_helpers import FINISHED, wait_for_status
from tests.live import LiveServer

#: Each line asks the same; the bad ones change one parameter.
GOOD = {"max_tokens": 4, "temperature": 0}
BAD = {
    "neg-max-tokens": ({"max_tokens": -1}, "max_tokens"),
    "zero-max-tokens": ({"max_tokens": 0}, "max_tokens"),
    "text-max-tokens": ({"max_tokens": "ten"}, "max_tokens"),
    # The live server's slots hold 1024 tokens: this completion cannot fit.
    "beyond-context": ({"max_tokens": 5000}, "max_tokens"),
    "hot": ({"temperature": 5}, "temperature"),
    "many": ({"n": 1000}, "n"),
    "top-p": ({"top_p": 2}, "top_p"),
    "huge-bias": ({"logit_bias": {"1": 500}}, "logit_bias"),
    "stop-list": ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
}


def test_out_of_range_numbers_fail_their_line_alone(live_server: LiveServer) -> None:
    client = OpenAI(api_key="unused", base_url=live_server.api, max_retries=0)
    lines = [batch_line("fine", "Say yes.", **GOOD)] + [
        batch_line(cid, "Say yes.", **{**GOOD, **params}) for cid, (params, _) in BAD.items()
    ]
    buf = io.BytesIO(jsonl(*lines))
    buf.name = "bad-params.jsonl"
    f = client.files.create(file=buf, purpose="batch")
    b = client.batches.create(
        input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    b = wait_for_status(client.batches.retrieve, b.id, FINISHED, 180)
    assert b.status == "completed", b
    assert b.request_counts is not None
    assert (b.request_counts.total, b.request_counts.completed, b.request_counts.failed) == (
        len(lines),
        1,
        len(BAD),
    )
    out = jsonl_lines(client.files.content(b.output_file_id).text)
    assert [o["custom_id"] for o in out] == ["fine"]
    assert out[0]["response"]["body"]["choices"][0]["message"]["content"]
    errors = {e["custom_id"]: e for e in jsonl_lines(client.files.content(b.error_file_id).text)}
    assert set(errors) == set(BAD)
    for cid, (_, param) in BAD.items():
        resp = errors[cid]["response"]
        assert resp["status_code"] == 400, (cid, resp)
        err = resp["body"]["error"]
        assert err["type"] == "invalid_request_error" and err["param"] == param, (cid, err)
        expected = (
            ("context_length_exceeded",)
            if cid == "beyond-context"
            else ("invalid_value", "invalid_type")
        )
        assert err["code"] in expected and err["message"], (cid, err)
    assert (
        "1024 tokens per slot" in errors["beyond-context"]["response"]["body"]["error"]["message"]
    )
    # The server is fine afterwards.
    assert client.models.list().data
