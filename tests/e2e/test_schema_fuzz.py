"""The API against its own /schema: schemathesis generates requests from the OpenAPI
document of a live server and checks that none gets a 5xx and that every answer matches
the schema declared for its status.

A server of its own (the real model), so the fuzzed uploads never show up in the other
tests' listings. The generation endpoints are left out: each of their examples would run
the model. Each operation gets valid and invalid data, and the operations on one object
also get the ids of a real file and a real, finished batch, so their success bodies are
checked too. The example count is bounded so the whole run takes seconds.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import response_schema_conformance

from tests.factories import batch_line, jsonl
from tests.live import OUTPUT, LiveServer, start_server, stop_server
from tests.waiting import until

#: Operations that would run the model for every example.
GENERATION = r"^/v1/(chat/completions|completions|embeddings|responses)$"
EXAMPLES = 25
CHECKS = [not_a_server_error, response_schema_conformance]


@pytest.fixture(scope="module")
def fuzz_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    server = start_server(
        tmp_path_factory.mktemp("fuzz-data"), OUTPUT / "fuzz-server.log", args=["--parallel", "1"]
    )
    yield server
    stop_server(server)


@pytest.fixture(scope="module")
def api_schema(fuzz_server: LiveServer) -> Any:
    return schemathesis.openapi.from_url(fuzz_server.url + "/schema/openapi.json").exclude(
        path_regex=GENERATION
    )


@pytest.fixture(scope="module")
def known_ids(fuzz_server: LiveServer) -> dict[str, str]:
    """A real input file, a finished batch of one line and a pending upload, made the way
    a user would."""
    api = fuzz_server.api
    up = httpx.post(
        f"{api}/files",
        files={"file": ("in.jsonl", jsonl(batch_line("a", "Hi.", max_tokens=2)))},
        data={"purpose": "batch"},
    )
    assert up.status_code == 200, up.text
    made = httpx.post(
        f"{api}/batches",
        json={
            "input_file_id": up.json()["id"],
            "endpoint": "/v1/chat/completions",
            "completion_window": "24h",
            "metadata": {"from": "fuzz"},
        },
    )
    assert made.status_code == 200, made.text
    batch_id = made.json()["id"]
    b = until(
        lambda: httpx.get(f"{api}/batches/{batch_id}").json(),
        120,
        f"batch {batch_id} to complete",
        accept=lambda b: b["status"] == "completed",
        poll=0.2,
    )
    pending = httpx.post(
        f"{api}/uploads",
        json={"bytes": 64, "filename": "u.bin", "mime_type": "text/plain", "purpose": "user_data"},
    )
    assert pending.status_code == 200, pending.text
    return {
        "file_id": b["output_file_id"],
        "batch_id": batch_id,
        "upload_id": pending.json()["id"],
    }


def fuzz(operation: Any, mode: GenerationMode, **path_parameters: str) -> str | None:
    """Run one operation's examples; the first failure (shrunk by hypothesis), or None."""

    @given(case=operation.as_strategy(mode, path_parameters=path_parameters or None))
    @settings(
        max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck)
    )
    def conforms(case: Any) -> None:
        case.call_and_validate(checks=CHECKS)

    try:
        conforms()
    except Unsatisfiable:
        # No invalid value exists (a lone string path parameter, or no parameters at all).
        assert mode is GenerationMode.NEGATIVE
    except Exception as exc:  # every operation runs; all that fail are reported together
        known = f" with {path_parameters}" if path_parameters else ""
        return f"{operation.method.upper()} {operation.path} ({mode.value}{known}): {exc}"
    return None


def test_api_matches_its_schema(api_schema: Any, known_ids: dict[str, str]) -> None:
    """Each operation in turn (schemathesis' pytest plugin is not used: it lags pytest)."""
    failures = []
    for result in api_schema.get_all_operations():
        operation = result.ok()
        runs = [
            fuzz(operation, mode) for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
        ]
        ids = {k: v for k, v in known_ids.items() if "{" + k + "}" in operation.path}
        if ids:
            runs.append(fuzz(operation, GenerationMode.POSITIVE, **ids))
        failures += [f for f in runs if f]
    assert not failures, "\n\n".join(failures)


def test_the_schema_names_every_api_route(api_schema: Any) -> None:
    """The fuzz above covers the whole API surface but generation, with no operation lost."""
    ops = {(r.ok().method.upper(), r.ok().path) for r in api_schema.get_all_operations()}
    assert ops == {
        ("POST", "/v1/files"),
        ("GET", "/v1/files"),
        ("GET", "/v1/files/{file_id}"),
        ("DELETE", "/v1/files/{file_id}"),
        ("GET", "/v1/files/{file_id}/content"),
        ("POST", "/v1/batches"),
        ("GET", "/v1/batches"),
        ("GET", "/v1/batches/{batch_id}"),
        ("POST", "/v1/batches/{batch_id}/cancel"),
        ("POST", "/v1/uploads"),
        ("POST", "/v1/uploads/{upload_id}/parts"),
        ("POST", "/v1/uploads/{upload_id}/complete"),
        ("POST", "/v1/uploads/{upload_id}/cancel"),
        ("GET", "/v1/models"),
        ("GET", "/v1/models/{model_id}"),
        ("GET", "/health"),
    }
