"""A thinking model's answers on the dashboard, over the real app and SQLite (the fake
engine's canned thinking answers, tests/fakes.py `ThinkingEngine`): the sheet form keeps the
thought in a column when asked, the batch page counts its reasoning tokens, and the explorer
shows a line's thought folded above its answer."""

from __future__ import annotations

import csv
import io
import re

from tests.fakes import ThinkingEngine
from tests.http_helpers import MakeClient, batch_getter, wait_for_status


def test_a_sheet_of_a_thinking_model_on_the_dashboard(make_client: MakeClient) -> None:
    client = make_client(ThinkingEngine())
    form = client.post(
        "/web/upload",
        files={"file": ("reviews.csv", b"review\ngreat stuff\nmeh\n", "text/csv")},
        data={"purpose": "user_data"},
    )
    assert 'name="keep_reasoning" type="checkbox"' in form.text
    file_id = re.search(r"/web/sheets/(file-\w+)/start", form.text).group(1)  # type: ignore[union-attr]
    fields = {
        "template": "{{ review }}",
        "model": "fake-model",
        "col_name": "label",
        "col_type": "text",
        "keep_reasoning": "on",
    }
    started = client.post(f"/web/sheets/{file_id}/start", data=fields)
    batch_id = re.search(r"/batches/(batch_\w+)", started.text).group(1)  # type: ignore[union-attr]
    done = wait_for_status(batch_getter(client), batch_id)
    assert done["usage"]["output_tokens_details"] == {"reasoning_tokens": 10}

    page = client.get(f"/batches/{batch_id}").text
    tokens = re.search(r'id="batch-tokens">(.*?)</dd>', page, re.S).group(1)  # type: ignore[union-attr]
    assert "10 of them reasoning" in re.sub(r"<[^>]+>", "", tokens)

    line = client.get(f"/web/batches/{batch_id}/lines/2").text
    thought = re.search(r'<details class="thought" id="line-thought">(.*?)</details>', line, re.S)
    assert thought and "Let me see." in thought.group(1) and "5 tokens" in thought.group(1)
    assert line.index('id="line-thought"') < line.index('id="line-answer"')
    answer = re.search(r'id="line-answer">(.*?)</div>', line, re.S).group(1)  # type: ignore[union-attr]
    assert "answer" in answer and "Let me see" not in answer

    sheet = client.get(f"/batches/{batch_id}/sheet/csv").content.decode("utf-8-sig")
    rows = list(csv.DictReader(io.StringIO(sheet)))
    assert [(r["label"], r["reasoning"]) for r in rows] == [
        ("answer", 'Let me see. {"label": "thought"}')
    ] * 2
