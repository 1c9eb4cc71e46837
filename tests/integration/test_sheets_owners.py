"""A sheet batch through the dashboard's routes on the real app and SQLite (the fake engine):
each owner sees and downloads only their own sheet, and the batch underneath is the API's."""

from __future__ import annotations

import csv
import io
import re
from typing import Any

from litestar.testing import TestClient

from tests.factories import jsonl_lines
from tests.http_helpers import MakeClient, batch_getter, wait_for_status
from tests.integration.test_auth import ALICE, BOB, bearer, keys  # noqa: F401 (fixture)


def login(client: TestClient, key: str) -> None:
    r = client.post("/login", data={"api_key": key, "next": "/"}, follow_redirects=False)
    assert r.status_code == 303


def test_a_sheet_batch_is_its_owners_alone(make_client: MakeClient, keys: dict[str, Any]) -> None:  # noqa: F811
    client = make_client(**keys)
    login(client, ALICE)
    sheet = b"q,n\nhello,1\nFAIL here,2\n=2+3,3\n"
    form = client.post(
        "/web/upload",
        files={"file": ("qs.csv", sheet, "text/csv")},
        data={"purpose": "user_data"},
    )
    assert form.status_code == 200 and 'id="sheet-columns"' in form.text, form.text
    file_id = re.search(r"/web/sheets/(file-\w+)/start", form.text).group(1)  # type: ignore[union-attr]
    fields = {"template": "Q: {{ q }}", "model": "fake-model", "max_tokens": "4", "col_name": ""}
    preview = client.post(f"/web/sheets/{file_id}/preview", data=fields)
    assert "3 rows" in preview.text and "Q: hello" in preview.text
    started = client.post(f"/web/sheets/{file_id}/start", data=fields)
    assert started.headers["hx-retarget"] == "#upload-zone"
    batch_id = re.search(r"/batches/(batch_\w+)", started.text).group(1)  # type: ignore[union-attr]

    # The batch and its input file are the API's, for the same owner.
    done = wait_for_status(batch_getter(client, bearer(ALICE)), batch_id)
    assert done["status"] == "completed" and done["metadata"] == {"sheet": "qs.csv"}
    assert done["request_counts"] == {"total": 3, "completed": 2, "failed": 1}
    body = client.get(f"/v1/files/{done['input_file_id']}/content", headers=bearer(ALICE)).text
    assert [line["custom_id"] for line in jsonl_lines(body)] == ["2", "3", "4"]

    card = client.get(f"/web/batches/{batch_id}/sheet")
    assert 'id="download-sheet-csv"' in card.text and "hx-trigger" not in card.text
    got = client.get(f"/batches/{batch_id}/sheet/csv")
    assert got.status_code == 200 and f"qs.{batch_id}.csv" in got.headers["content-disposition"]
    rows = list(csv.DictReader(io.StringIO(got.content.decode("utf-8-sig"))))
    assert [r["n"] for r in rows] == ["1", "2", "3"]
    assert rows[0]["answer"] == "echo: Q: hello" and rows[0]["error"] == ""
    assert rows[1]["answer"] == "" and "longer than the context" in rows[1]["error"]
    assert rows[2]["q"] == "'=2+3" and rows[2]["answer"] == "echo: Q: =2+3"
    xlsx = client.get(f"/batches/{batch_id}/sheet/xlsx")
    assert xlsx.status_code == 200 and xlsx.content[:2] == b"PK"

    # Another owner: nothing of alice's sheet, its form, its batch or its download.
    client.post("/logout")
    login(client, BOB)
    assert client.get(f"/batches/{batch_id}/sheet/csv").status_code == 404
    assert "No such batch" in client.get(f"/web/batches/{batch_id}/sheet").text
    assert 'id="sheet-columns"' not in client.get(f"/web/sheets/{file_id}/form").text
    refused = client.post(f"/web/sheets/{file_id}/start", data=fields)
    assert "hx-retarget" not in refused.headers and "batch_" not in refused.text
