"""The Models page, its load and unload buttons, "Run with" on the New batch card, a batch
page naming its model, and the models' lines in /metrics: over the real app and SQLite,
with a stand-in for the pool's dashboard surface (tests/pool_double.py) for the figures,
and the real pool on SmolLM2 for the buttons' refusal of an unload with a request in
flight."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from litestar.testing import TestClient

from app.config import Settings, bundled_model_path
from app.engine.pool.pool import ModelPool
from app.wire.endpoints import CHAT
from tests.catalogs import DictCatalog
from tests.catalogs import entry as file_entry
from tests.factories import batch_line, chat_body, jsonl, jsonl_lines
from tests.fakes import FakeEngine, HangingEngine
from tests.http_helpers import MakeClient, upload
from tests.metrics import parse, value
from tests.pool_double import MiB, PoolDouble, entry, model_view
from tests.waiting import until

SMOL = "smollm2-135m-instruct"
#: SmolLM2's end-of-text, im_start and im_end tokens: banned, the model writes to max_tokens.
NO_END = {"0": -100, "1": -100, "2": -100}
GEMMA = "gemma3:270m"


def pool(engine: FakeEngine | None = None) -> PoolDouble:
    return PoolDouble(
        [
            model_view(
                entry(SMOL, is_default=True, source="default"),
                "loaded",
                in_flight=2,
                waiting=5,
                loads=1,
                last_used=1.0,
                measured_bytes=150 * MiB,
                load_seconds=1.25,
            ),
            model_view(
                entry(GEMMA, names=("gemma3:270m:latest", "gpt-4o-mini"), source="ollama"),
                "on disk",
            ),
            model_view(entry("broken", error="not a GGUF file: bad magic"), "on disk"),
        ],
        budget=2048 * MiB,
        engine=engine,
    )


def row(html: str, model: str) -> str:
    found = re.search(rf'<tr data-model="{re.escape(model)}">(.*?)</tr>', html, re.S)
    assert found, f"no row for {model}"
    return found.group(1)


def cell(html: str, model: str, col: str) -> str:
    found = re.search(rf'data-col="{col}">(.*?)</td>', row(html, model), re.S)
    assert found, f"no {col} for {model}"
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", found.group(1))).strip()


def state_becomes(client: TestClient, model: str, state: str, seconds: float) -> None:
    """Wait for the Models table to show `model` in `state`."""
    until(
        lambda: cell(client.get("/web/models").text, model, "state"),
        seconds,
        f"{model} {state}",
        accept=lambda s: s == state,
    )


def test_the_models_page_lists_every_model_with_its_facts_and_state(
    make_client: MakeClient,
) -> None:
    client = make_client(pool())
    page = client.get("/models")
    assert page.status_code == 200
    html = page.text
    assert '<a href="/models" aria-current="page">Models</a>' in html

    smol = row(html, SMOL)
    assert "default" in smol and "100.0 MB" in smol and "Q4_K_M" in smol
    assert cell(html, SMOL, "context") == "2,048 / 8,192"
    assert cell(html, SMOL, "memory") == "~160.0 MB measured 150.0 MB (-6%)"
    assert cell(html, SMOL, "state") == "loaded 2 in flight"
    assert cell(html, SMOL, "waiting") == "5"
    assert cell(html, SMOL, "loads") == "1 · 1.2 s"
    assert "<time" in smol  # last used
    assert 'aria-label="Unload smollm2-135m-instruct"' in smol and ">Load<" not in smol

    gemma = row(html, GEMMA)
    assert "ollama" in gemma and "gpt-4o-mini" in gemma  # its aliases
    assert cell(html, GEMMA, "state") == "on disk"
    assert cell(html, GEMMA, "loads") == "0"
    assert 'aria-label="Load gemma3:270m"' in gemma and "Unload" not in gemma

    broken = row(html, "broken")
    assert "not a GGUF file: bad magic" in broken and "Load" not in broken
    # What the loaded models reserve against the budget.
    assert re.search(r'id="models-reserved">150.0 MB<.*id="models-budget">2.0 GB<', html, re.S)


def test_a_model_with_a_projector_says_it_takes_images_and_its_share_of_memory(
    make_client: MakeClient,
) -> None:
    vision = "gemma3:4b"
    models = PoolDouble(
        [
            model_view(entry(SMOL, is_default=True, source="default"), "idle"),
            model_view(entry(vision, source="ollama", projector=139 * MiB), "on disk"),
        ]
    )
    client = make_client(models)
    html = client.get("/models").text
    seeing = row(html, vision)
    assert re.search(r'data-col="images" title="Takes images: its projector is '
                     r'/models/mmproj-gemma3-4b.gguf">images<', seeing)  # fmt: skip
    assert cell(html, vision, "memory") == "~160.0 MB incl. 139.0 MB projector"
    assert 'data-col="images"' not in row(html, SMOL)
    assert cell(html, SMOL, "memory") == "~160.0 MB"


def test_a_thinking_model_is_marked_on_the_page_and_on_v1_models(make_client: MakeClient) -> None:
    thinking = "qwen3:0.6b"
    models = PoolDouble(
        [
            model_view(entry(SMOL, is_default=True, source="default"), "idle"),
            model_view(entry(thinking, chat_template="<think>{{ m }}</think>"), "on disk"),
        ]
    )
    client = make_client(models)
    html = client.get("/models").text
    assert 'data-col="reasoning"' in row(html, thinking)
    assert 'data-col="reasoning"' not in row(html, SMOL)
    cards = {m["id"]: m for m in client.get("/v1/models").json()["data"]}
    assert cards[thinking]["reasoning"] is True and cards[SMOL]["reasoning"] is False


def test_the_buttons_load_and_unload_and_an_unload_with_lines_in_flight_is_refused(
    make_client: MakeClient,
) -> None:
    models = pool()
    client = make_client(models)

    loaded = client.post("/web/models/load", data={"model": GEMMA})
    assert loaded.status_code == 200
    assert loaded.headers["hx-trigger"] == "models-changed"
    assert f"Loading {GEMMA}" in loaded.text and "alert" not in loaded.text
    table = client.get("/web/models").text
    assert cell(table, GEMMA, "state") == "idle" and cell(table, GEMMA, "loads") == "1 · 0.5 s"
    assert 'aria-label="Unload gemma3:270m"' in row(table, GEMMA)

    busy = client.post("/web/models/unload", data={"model": SMOL})
    assert busy.status_code == 200
    assert 'role="alert"' in busy.text
    assert f"The model &#39;{SMOL}&#39; has 2 requests in flight" in busy.text
    assert cell(client.get("/web/models").text, SMOL, "state") == "loaded 2 in flight"

    client.post("/web/models/unload", data={"model": GEMMA})
    assert cell(client.get("/web/models").text, GEMMA, "state") == "on disk"
    assert models.calls == [("load", GEMMA), ("unload", SMOL), ("unload", GEMMA)]

    unknown = client.post("/web/models/load", data={"model": "no-such-model"})
    assert "The model &#39;no-such-model&#39; does not exist." in unknown.text


def test_a_node_without_a_model_pool_says_so(make_client: MakeClient) -> None:
    client = make_client(FakeEngine())
    assert "This node has no embedded models" in client.get("/models").text
    refused = client.post("/web/models/load", data={"model": SMOL})
    assert 'role="alert"' in refused.text and "no embedded models" in refused.text


def model_said(html: str) -> str:
    """What a batch page says of its model, as text."""
    found = re.search(r"<dt>Model</dt><dd>(.*?)</dd>", html, re.S)
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", found.group(1) if found else "")).strip()


def start_with(client: TestClient, file_id: str, model: str) -> str:
    """POST the New batch card's form; the started batch's id."""
    r = client.post(
        "/web/batches",
        data={"file_id": file_id, "endpoint": "/v1/chat/completions", "model": model},
    )
    assert r.status_code == 200
    found = re.search(r"(batch_[A-Za-z0-9]+)", r.text)
    assert found, r.text
    return found.group(1)


def test_run_with_writes_the_model_into_every_line_of_a_stored_file(
    make_client: MakeClient,
) -> None:
    client = make_client(pool(HangingEngine()))
    lines = [batch_line(f"r{i}", "HANG", model="whatever", max_tokens=2) for i in range(3)]
    original = upload(client, jsonl(*lines), name="eval.jsonl")

    preview = client.post(
        "/web/upload",
        files={"file": ("eval.jsonl", jsonl(*lines), "application/jsonl")},
        data={"purpose": "batch"},
    ).text
    select = re.search(r'<select id="run-with" name="model">(.*?)</select>', preview, re.S)
    assert select, preview
    assert re.findall(r'<option value="([^"]*)"', select.group(1)) == ["", SMOL, GEMMA]

    batch_id = start_with(client, original["id"], GEMMA)
    batch = client.get(f"/v1/batches/{batch_id}").json()
    assert batch["input_file_id"] != original["id"]
    stored = client.get(f"/v1/files/{batch['input_file_id']}").json()
    assert stored["purpose"] == "batch" and stored["filename"] == "eval (gemma3:270m).jsonl"
    listed = [f["id"] for f in client.get("/v1/files").json()["data"]]
    assert batch["input_file_id"] in listed and original["id"] in listed
    content = client.get(f"/v1/files/{batch['input_file_id']}/content").content
    rewritten = jsonl_lines(content)
    assert [r["body"]["model"] for r in rewritten] == [GEMMA] * 3
    assert [r["custom_id"] for r in rewritten] == ["r0", "r1", "r2"]
    # The upload is left as it was.
    before = client.get(f"/v1/files/{original['id']}/content").content
    assert {line["body"]["model"] for line in jsonl_lines(before)} == {"whatever"}
    client.post(f"/v1/batches/{batch_id}/cancel")

    refused = client.post(
        "/web/batches",
        data={"file_id": original["id"], "endpoint": "/v1/chat/completions", "model": "nope"},
    )
    assert "The model &#39;nope&#39; is not one this node has." in refused.text
    assert len(client.get("/v1/batches").json()["data"]) == 1


def test_a_batch_page_names_the_model_that_runs_it_and_its_state(
    make_client: MakeClient,
) -> None:
    client = make_client(pool(HangingEngine()))
    by_alias = upload(client, jsonl(batch_line("a", "HANG", model="gpt-4o-mini", max_tokens=2)))
    unknown = upload(client, jsonl(batch_line("u", "HANG", model="gpt-9", max_tokens=2)))
    for f, says in (
        (by_alias, f"is {GEMMA} on disk"),
        (unknown, f"runs on the default model {SMOL} loaded"),
    ):
        b = client.post(
            "/v1/batches",
            json={
                "input_file_id": f["id"],
                "endpoint": "/v1/chat/completions",
                "completion_window": "24h",
            },
        ).json()
        # The batch's model is known once validation has read its file.
        text = until(
            lambda b=b: model_said(client.get(f"/batches/{b['id']}").text),
            10,
            f"the batch page saying {says!r}",
            accept=lambda t, says=says: says in t,
        )
        assert says in text
        client.post(f"/v1/batches/{b['id']}/cancel")


def test_metrics_report_each_model_and_the_memory_budget(make_client: MakeClient) -> None:
    models = pool()
    client = make_client(models)
    client.post("/web/models/load", data={"model": GEMMA})
    types, samples = parse(client.get("/metrics").text)
    assert types["batchyard_model_loads_total"] == "counter"
    assert types["batchyard_model_loaded"] == "gauge"
    assert value(samples, "batchyard_model_loads_total", model=SMOL) == 1
    assert value(samples, "batchyard_model_loads_total", model=GEMMA) == 1
    assert value(samples, "batchyard_model_loads_total", model="broken") == 0
    assert value(samples, "batchyard_model_loaded", model=SMOL) == 1
    assert value(samples, "batchyard_model_loaded", model=GEMMA) == 1
    assert value(samples, "batchyard_model_loaded", model="broken") == 0
    assert value(samples, "batchyard_model_load_seconds", model=SMOL) == 1.25
    assert value(samples, "batchyard_model_load_seconds", model=GEMMA) == 0.5
    assert not any(
        n == "batchyard_model_load_seconds" and labels.get("model") == "broken"
        for n, labels, _ in samples
    )
    reserved, _budget = models.budget()
    assert reserved == (150 + 140) * MiB
    assert value(samples, "batchyard_models_memory_bytes") == reserved
    assert value(samples, "batchyard_models_memory_budget_bytes") == 2048 * MiB


def test_metrics_without_a_model_pool_have_no_model_samples(client: TestClient) -> None:
    types, samples = parse(client.get("/metrics").text)
    assert types["batchyard_models_memory_bytes"] == "gauge"
    assert not [n for n, _, _ in samples if n.startswith(("batchyard_model_", "batchyard_models_"))]


@pytest.fixture
def smollm2_pool() -> Iterator[ModelPool]:
    """The real pool over the real default model (SmolLM2), loaded on demand."""
    settings = Settings(parallel=1, ctx_size=256, model_ttl="0")
    catalog = DictCatalog([file_entry(SMOL, bundled_model_path(), settings, default=True)])
    pool = ModelPool(settings, catalog, budget=4 << 30)
    pool.start()
    yield pool
    pool.close()


def test_the_real_pool_refuses_an_unload_with_a_request_in_flight(
    make_client: MakeClient, smollm2_pool: ModelPool
) -> None:
    client = make_client(smollm2_pool)
    asked = client.post("/web/models/load", data={"model": SMOL})
    assert f"Loading {SMOL}" in asked.text
    state_becomes(client, SMOL, "idle", 60)
    # A long answer (no end token allowed): in flight while the button is pressed.
    body = chat_body("Count.", model=SMOL, max_tokens=200, logit_bias=NO_END)
    long = smollm2_pool.submit(CHAT, body)
    state_becomes(client, SMOL, "loaded 1 in flight", 30)
    refused = client.post("/web/models/unload", data={"model": SMOL})
    assert 'role="alert"' in refused.text
    assert f"The model &#39;{SMOL}&#39; has 1 requests in flight" in refused.text
    assert not long.done()
    smollm2_pool.cancel(long)
    state_becomes(client, SMOL, "idle", 30)
    unloaded = client.post("/web/models/unload", data={"model": SMOL})
    assert f"Unloading {SMOL}" in unloaded.text
    state_becomes(client, SMOL, "on disk", 30)
    assert cell(client.get("/web/models").text, SMOL, "loads").startswith("1 ·")
