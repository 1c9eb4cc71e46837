"""GET /metrics, GET /health's starting / ready, and the per-request log lines."""

from __future__ import annotations

import re
import threading
from pathlib import Path

import httpx
import pytest
from litestar.testing import TestClient

import app.engine.llama.loading as llama
from app.catalog import Entry
from app.config import Settings
from app.engine.llama.engine import LlamaEngine
from app.server import create_app
from tests.factories import batch_line, jsonl
from tests.http_helpers import batch_getter, create_batch, upload, wait_for_status
from tests.live import LiveServer
from tests.metrics import parse, scrape, value
from tests.waiting import until


def run_batch(server: LiveServer, n: int) -> dict:
    lines = [batch_line(f"m-{i}", "Hi", model="x", max_tokens=4) for i in range(n)]
    with server.http() as http:
        f = upload(http, jsonl(*lines), name="m.jsonl")
        b = create_batch(http, f["id"])
        return wait_for_status(batch_getter(http), b["id"], ("completed", "failed"), 180)


def test_metrics_report_lines_tokens_slots_batches_and_latency(live_server: LiveServer) -> None:
    batch = run_batch(live_server, 2)
    assert batch["status"] == "completed"
    assert httpx.get(live_server.url + "/no/such/page").status_code == 404

    r = httpx.get(live_server.url + "/metrics")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
    types, samples = parse(r.text)
    assert types["batchyard_http_request_duration_seconds"] == "histogram"
    assert types["batchyard_tokens_total"] == "counter"
    assert types["batchyard_queue_depth"] == "gauge"
    names = {n for n, _, _ in samples}
    for family in (
        "batchyard_active_slots",
        "batchyard_tokens_per_second",
        "batchyard_queue_depth",
    ):
        assert family in names

    assert value(samples, "batchyard_ready") == 1
    assert value(samples, "batchyard_slots") == 4  # the live server runs --parallel 4
    assert value(samples, "batchyard_batches", status="completed") >= 1
    assert value(samples, "batchyard_batches", status="cancelled") >= 0
    assert value(samples, "batchyard_batch_lines", status="succeeded") >= 2
    # Which node answered: the same id in /health, /metrics and the lines' claims.
    node = httpx.get(live_server.url + "/health").json()["node"]
    assert node and value(samples, "batchyard_node_in_flight", node=node) >= 0
    assert any(n == "batchyard_info" and labels.get("node") == node for n, labels, _ in samples)
    assert (
        value(samples, "batchyard_tokens_total", direction="in") >= batch["usage"]["input_tokens"]
    )
    assert (
        value(samples, "batchyard_tokens_total", direction="out")
        >= batch["usage"]["output_tokens"]
        > 0
    )
    assert value(samples, "batchyard_engine_requests_total", outcome="succeeded") >= 2

    # The batch polls went to one route template, whatever the batch id.
    route = "/v1/batches/{batch_id}"
    polls = [
        (lab, v)
        for n, lab, v in samples
        if n == "batchyard_http_request_duration_seconds_bucket"
        and lab["route"].startswith(route)
        and lab["method"] == "GET"
    ]
    assert polls, [lab["route"] for n, lab, _ in samples if n.startswith("batchyard_http")]
    counts = [v for _, v in polls]
    assert counts == sorted(counts) and polls[-1][0]["le"] == "+Inf"
    route_label = polls[0][0]["route"]
    assert (
        counts[-1]
        == value(
            samples,
            "batchyard_http_request_duration_seconds_count",
            method="GET",
            route=route_label,
        )
        >= 1
    )
    assert (
        value(
            samples,
            "batchyard_http_requests_total",
            method="GET",
            route="(unmatched)",
            status="404",
        )
        >= 1
    )

    # One log line per request, and the batch's transitions.
    log = live_server.log()
    assert re.search(rf"method=GET path=/v1/batches/{batch['id']} status=200 ms=\d+\.\d", log)
    assert "method=GET path=/no/such/page status=404" in log
    assert f"batch={batch['id']} status=in_progress total=" in log
    assert f"batch={batch['id']} status=finalizing" in log
    assert re.search(rf"batch={batch['id']} status=completed completed=\d+ failed=0", log)


def test_metrics_report_the_default_model_loaded_and_the_memory_budget(
    live_server: LiveServer,
) -> None:
    run_batch(live_server, 1)
    samples = scrape(live_server.url)
    default = httpx.get(live_server.api + "/models").json()["data"][0]["id"]
    assert value(samples, "batchyard_model_loaded", model=default) == 1
    assert value(samples, "batchyard_model_loads_total", model=default) >= 1
    assert value(samples, "batchyard_model_load_seconds", model=default) > 0
    reserved = value(samples, "batchyard_models_memory_bytes")
    assert 0 < reserved <= value(samples, "batchyard_models_memory_budget_bytes")


@pytest.fixture
def slow_model_load(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """The real model, but its load waits until the test lets it go on."""
    go_on = threading.Event()
    real = llama.load_engine

    def load(settings: Settings, entry: Entry | None = None) -> LlamaEngine:
        assert go_on.wait(60)
        return real(settings, entry)

    monkeypatch.setattr(llama, "load_engine", load)
    return go_on


def test_health_says_starting_until_the_model_is_loaded(
    tmp_path: Path, slow_model_load: threading.Event
) -> None:
    settings = Settings(data_dir=str(tmp_path / "data"), parallel=1, ctx_size=256)
    with TestClient(create_app(settings)) as client:
        r = client.get("/health")
        assert r.status_code == 503
        assert r.json()["status"] == "starting"
        assert "batchyard_ready 0" in client.get("/metrics").text
        slow_model_load.set()
        r = until(
            lambda: client.get("/health"),
            60,
            "/health to stop saying starting",
            accept=lambda r: r.status_code == 200 or r.json()["status"] != "starting",
            poll=0.1,
        )
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["status"] == "ready"
        assert body["database"] == "sqlite" and body["node"].count("-") >= 1
        assert body["model"] == "SmolLM2-135M-Instruct.Q4_1"
        assert "batchyard_ready 1" in client.get("/metrics").text


def test_health_says_failed_for_a_model_that_cannot_load(tmp_path: Path) -> None:
    settings = Settings(data_dir=str(tmp_path / "data"), model=str(tmp_path / "missing.gguf"))
    with TestClient(create_app(settings)) as client:
        r = until(
            lambda: client.get("/health"),
            30,
            "/health to stop saying starting",
            accept=lambda r: r.json()["status"] != "starting",
        )
        assert r.status_code == 503
        assert r.json()["status"] == "failed"
        assert "missing.gguf" in r.json()["error"]
