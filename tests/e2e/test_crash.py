"""Crash and resume: `kill -9` a live server mid-batch, start it again, lose no line (half
of them structured: a JSON schema's grammar).

A real `batchyard serve` on the real default model, killed with SIGKILL while the batch is
in progress, then started again on the same data dir. The SQLite file is read directly
before and after to prove what the user cannot see from the API alone: lines finished
before the kill were not run again (attempts stay 1, same request id).
"""

from __future__ import annotations

import json
import signal
import sqlite3
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest

from tests.factories import batch_line, jsonl, jsonl_lines
from tests.http_helpers import FINISHED, batch_getter, create_batch, upload, wait_for_status
from tests.live import OUTPUT, LiveServer, start_server, stop_server

pytestmark = pytest.mark.slow

#: At the kill some are done, a room of 8 held by the dead server, and a few still waiting.
LINES = 16
#: The structured lines' answer: three numbers, each below 100.
COUNTING: dict[str, Any] = {
    "type": "json_schema",
    "json_schema": {
        "name": "numbers",
        "strict": True,
        "schema": {
            "type": "object",
            "properties": {
                "numbers": {
                    "type": "array",
                    "items": {"type": "integer", "minimum": 0, "maximum": 99},
                    "minItems": 3,
                    "maxItems": 3,
                }
            },
            "required": ["numbers"],
            "additionalProperties": False,
        },
    },
}
ENV = {"BATCHYARD_LEASE_SECONDS": "3"}


def rows(data_dir: Path, batch_id: str) -> dict[str, dict[str, Any]]:
    """The batch's Request rows by custom_id, read straight from the SQLite file."""
    con = sqlite3.connect(data_dir / "batchyard.db")
    con.row_factory = sqlite3.Row
    try:
        found = con.execute(
            "SELECT custom_id, status, attempts, request_id, body FROM request WHERE batch_id = ?",
            (batch_id,),
        ).fetchall()
    finally:
        con.close()
    return {r["custom_id"]: dict(r) for r in found}


def kill9(server: LiveServer) -> None:
    server.process.send_signal(signal.SIGKILL)
    server.process.wait(10)


def file_lines(http: httpx.Client, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    r = http.get(f"/v1/files/{file_id}/content")
    assert r.status_code == 200, r.text
    return jsonl_lines(r.text)


def test_kill_during_in_progress_resumes_without_running_lines_twice(tmp_path: Path) -> None:
    data = tmp_path / "data"
    log = OUTPUT / "crash-in-progress.log"
    server = start_server(data, log, env=ENV)
    try:
        # Every other line structured (a grammar, forced tokens): those resume as well.
        lines = [
            batch_line(f"line-{i:02d}", f"Count from {i} to {i + 9}.", max_tokens=16, temperature=0)
            if i % 2
            else batch_line(
                f"line-{i:02d}",
                f"Give the numbers from {i} to {i + 2}.",
                max_tokens=24,
                temperature=0,
                response_format=COUNTING,
            )
            for i in range(LINES)
        ]
        with server.http() as http:
            f = upload(http, jsonl(*lines), name="crash.jsonl")
            batch_id = str(create_batch(http, f["id"])["id"])
            # Kill once some lines are done but most are not.
            before = wait_for_status(
                batch_getter(http),
                batch_id,
                lambda b: b["status"] == "in_progress" and b["request_counts"]["completed"] >= 4,
                timeout=240,
            )
        kill9(server)
    finally:
        stop_server(server)

    at_kill = rows(data, batch_id)
    done_at_kill = {c: r for c, r in at_kill.items() if r["status"] in ("succeeded", "failed")}
    running_at_kill = {c for c, r in at_kill.items() if r["status"] == "running"}
    assert len(at_kill) == LINES
    assert len(done_at_kill) >= before["request_counts"]["completed"] >= 4
    assert len(done_at_kill) < LINES, "the batch finished before the kill; nothing was tested"
    assert all(r["attempts"] == 1 for r in done_at_kill.values())

    server = start_server(data, log, env=ENV)
    try:
        with server.http() as http:
            final = wait_for_status(batch_getter(http), batch_id, FINISHED, timeout=300)
            output = file_lines(http, final["output_file_id"])
            errors = file_lines(http, final["error_file_id"])
    finally:
        stop_server(server)

    after = rows(data, batch_id)
    seen = [o["custom_id"] for o in output + errors]
    structured = {x["custom_id"] for x in lines if "response_format" in x["body"]}
    duplicates = len(seen) - len(set(seen))
    rerun = [c for c in done_at_kill if after[c]["attempts"] != 1]
    print(
        f"crash counts: {LINES} lines; {len(done_at_kill)} done before the kill "
        f"({len(running_at_kill)} running); {LINES - len(done_at_kill)} run after restart; "
        f"duplicates {duplicates}; finished lines re-run {len(rerun)}"
    )
    assert final["status"] == "completed", final
    assert duplicates == 0
    assert sorted(seen) == sorted(x["custom_id"] for x in lines)
    counts = final["request_counts"]
    assert counts == {"total": LINES, "completed": len(output), "failed": len(errors)}
    assert all(o["response"]["status_code"] == 200 for o in output)
    # Lines finished before the kill were not run again: same attempt, same result.
    assert rerun == []
    for cid, r in done_at_kill.items():
        assert after[cid]["request_id"] == r["request_id"]
        assert after[cid]["body"] == r["body"]
    by_id = {o["custom_id"]: o for o in output}
    for cid, r in done_at_kill.items():
        if r["status"] == "succeeded":
            assert by_id[cid]["response"]["request_id"] == r["request_id"]
    # Lines cut off by the kill ran again on the claim that took over their lease.
    for cid in running_at_kill:
        assert after[cid]["attempts"] == 2, (cid, after[cid])
    # The engine ran each unfinished line once more and no finished one.
    assert sum(r["attempts"] for r in after.values()) == LINES + len(running_at_kill)
    for o in output:
        if o["custom_id"] in structured:
            content = o["response"]["body"]["choices"][0]["message"]["content"]
            jsonschema.validate(json.loads(content), COUNTING["json_schema"]["schema"])
    usage = final["usage"]
    assert usage["output_tokens"] == sum(
        o["response"]["body"]["usage"]["completion_tokens"] for o in output
    )
