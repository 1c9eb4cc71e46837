"""A sheet answered by a thinking model: its columns filled from the answer (`content`),
never from the thought (`reasoning_content`), which `keep_reasoning` adds as a column of
its own; the batch's usage sums the lines' reasoning tokens. The engine is the fake
(tests/fakes.py `ThinkingEngine`: a canned thinking answer)."""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

import pytest

from app.errors import APIError
from app.services import Services
from app.sheets.requests import OutputColumn, SheetSpec
from app.sheets.writing import result_cells
from app.tables import BatchStatus
from app.wire.batches import batch_object
from tests.fakes import ThinkingEngine
from tests.unit.helpers import drive, services

SHEET = b"id,review\n1,great stuff\n2,FAIL too long\n3,meh\n"
ADDED = ["label", "reasoning", "error", "finish_reason", "prompt_tokens", "completion_tokens"]


def run_sheet(svc: Services, spec: SheetSpec) -> tuple[Any, list[dict[str, str]]]:
    stored = svc.sheets.store(io.BytesIO(SHEET), "reviews.csv", "")
    done = drive(svc, svc.sheets.start("", stored.id, spec).id)
    out = io.BytesIO()
    svc.sheets.export(done.id, "", "csv", out)
    return done, list(csv.DictReader(io.StringIO(out.getvalue().decode("utf-8-sig"))))


def test_the_columns_come_from_the_answer_and_the_thought_has_its_own(tmp_path: Path) -> None:
    svc = services(tmp_path / "data", ThinkingEngine())
    label = [OutputColumn("label")]
    spec = SheetSpec(template="{{ review }}", model="m", output_columns=label, keep_reasoning=True)
    done, rows = run_sheet(svc, spec)

    assert done.status == BatchStatus.COMPLETED and (done.completed, done.failed) == (2, 1)
    assert list(rows[0]) == ["id", "review", *ADDED]
    assert [r["label"] for r in rows] == ["answer", "", "answer"]
    assert rows[0]["reasoning"] == 'Let me see. {"label": "thought"}'
    assert rows[1]["reasoning"] == "" and "longer than the context" in rows[1]["error"]
    # The batch's usage: each succeeded line's 5 reasoning tokens, within its output tokens.
    assert done.reasoning_tokens == 2 * ThinkingEngine.THOUGHT_TOKENS
    usage = batch_object(done).usage
    assert usage.output_tokens_details.reasoning_tokens == 10 < usage.output_tokens

    # Without keep_reasoning the thought is nowhere in the sheet.
    done, rows = run_sheet(svc, SheetSpec(template="{{ review }}", model="m"))
    assert "reasoning" not in rows[0] and rows[0]["answer"] == "echo: great stuff"
    assert not any("Let me see" in cell for row in rows for cell in row.values())


def test_a_reasoning_column_already_there_is_refused_by_name(tmp_path: Path) -> None:
    svc = services(tmp_path / "data", ThinkingEngine())
    stored = svc.sheets.store(io.BytesIO(b"id,reasoning\n1,x\n"), "r.csv", "")
    spec = SheetSpec(template="{{ reasoning }}", model="m", keep_reasoning=True)
    with pytest.raises(APIError) as refused:
        svc.sheets.start("", stored.id, spec)
    assert refused.value.param == "keep_reasoning"
    assert svc.batches.list("", limit=10)[0] == []


def test_a_thought_that_took_every_token_says_so() -> None:
    line = {
        "custom_id": "2",
        "response": {
            "status_code": 200,
            "body": {
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": "", "reasoning_content": "Hm"},
                        "finish_reason": "length",
                    }
                ],
                "usage": {"prompt_tokens": 7, "completion_tokens": 16},
            },
        },
    }
    cells = result_cells(line, [OutputColumn("label")], keep_reasoning=True)
    assert cells[:2] == ["", "Hm"] and cells[3:] == ["length", 7, 16]
    assert "the thought took every one of max_tokens" in cells[2]


def test_batchyard_run_takes_keep_reasoning_for_a_sheet_alone(tmp_path: Path) -> None:
    from app.cli import build_parser
    from app.cli.running import sheet_spec

    def spec(name: str) -> Any:
        argv = ["run", str(tmp_path / name), "-o", "out.csv", "--prompt", "q", "--keep-reasoning"]
        return sheet_spec(build_parser().parse_args(argv))

    assert spec("qs.csv").keep_reasoning is True
    assert "--keep-reasoning are for a sheet" in spec("in.jsonl")
