"""Models by name, end to end (issue 32): one live `batchyard serve` holding several models,
one loaded at a time, driven by the official openai SDK.

The server finds its models where the tools that fetched them keep them, in a temporary
HOME (tests/stores.py): Gemma 3 270M pulled by Ollama as `gemma3:270m`, SmolLM2-135M
downloaded by LM Studio, and SmolLM2-135M again in the Hugging Face hub cache (another
file, so another model to load). Its `--models-dir` holds two files that must not spoil the
others: a GGUF cut short (a download that stopped), one llama.cpp cannot load (a model's
header over tiny tensors, no tokenizer), and a model whose weights alone exceed
`--models-memory` (a sparse file: a 5.7 GiB GGUF that takes no disk). Loads are counted on
/metrics (`batchyard_model_loads_total`). The last test kills the server with SIGKILL at a
swap and starts it again on the same data dir.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from openai import OpenAI

from app.config.settings import default_cache_dir
from tests.e2e.test_crash import rows
from tests.factories import batch_line, jsonl, jsonl_lines
from tests.http_helpers import FINISHED
from tests.live import OUTPUT, LiveServer, start_server, stop_server
from tests.models import gemma, header_model, smollm2
from tests.stores import Home
from tests.waiting import until

OLLAMA = "gemma3:270m"
LMSTUDIO = "lmstudio-community/SmolLM2-135M-Instruct-GGUF"
HUB = "HuggingFaceTB/SmolLM2-135M-Instruct-GGUF"
BUDGET = "2GiB"
LOADS = re.compile(r'^batchyard_model_loads_total\{[^}]*model="([^"]+)"[^}]*\}\s+(\S+)', re.M)


def sparse_model(path: Path, *, n_layer: int = 64, n_embd: int = 4096, n_ff: int = 16384) -> int:
    """A llama GGUF whose Q4_1 tensors hold about 5.7 GiB, written as a sparse file: the
    header is real, the tensor data a hole (zeros) that takes no disk. It is never loaded:
    its estimate alone is over the budget. Returns the tensor bytes."""
    import gguf

    q4_1 = gguf.GGMLQuantizationType.Q4_1
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name(path.stem)
    writer.add_block_count(n_layer)
    writer.add_context_length(4096)
    writer.add_embedding_length(n_embd)
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(32)
    writer.add_head_count_kv(8)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_1)
    writer.add_token_list([f"t{i}" for i in range(32000)])
    total = 0

    def tensor(name: str, rows: int, cols: int) -> None:
        nonlocal total
        nbytes = rows * cols // 32 * 20  # Q4_1: 20 bytes a block of 32 (a multiple of 32)
        writer.add_tensor_info(name, (rows, cols // 32 * 20), np.dtype(np.uint8), nbytes, q4_1)
        total += nbytes

    tensor("token_embd.weight", 32000, n_embd)
    for i in range(n_layer):
        tensor(f"blk.{i}.attn_q.weight", n_embd, n_embd)
        tensor(f"blk.{i}.ffn_up.weight", n_ff, n_embd)
        tensor(f"blk.{i}.ffn_down.weight", n_embd, n_ff)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    writer.close()
    with open(path, "r+b") as fh:  # the data starts at the next 32-byte boundary
        fh.truncate((path.stat().st_size + 31) // 32 * 32 + total)
    return total


@dataclass
class Models:
    """The live server and the ids its catalog gave each model."""

    server: LiveServer
    home: Home
    ollama: str
    lmstudio: str
    hub: str
    broken: str
    hollow: str
    huge: str

    def client(self) -> OpenAI:
        return OpenAI(base_url=self.server.api, api_key="unused", max_retries=0)

    def loads(self) -> dict[str, int]:
        text = httpx.get(self.server.url + "/metrics", timeout=10).text
        return {m: int(float(n)) for m, n in LOADS.findall(text)}


ENV = {"BATCHYARD_LEASE_SECONDS": "3"}


def serve(data: Path, home: Home, models_dir: Path) -> LiveServer:
    # HOME is the temporary one; the machine's own stores and caches stay out of it.
    # The machine's cache dir stays: its CPU check verdicts spare each start the check.
    env = {**ENV, **home.environ, "BATCHYARD_CACHE_DIR": str(default_cache_dir())}
    places = {
        "OLLAMA_MODELS": home.ollama_root,
        "HF_HUB_CACHE": home.hub_root,
        "HF_HOME": home.root / ".cache" / "huggingface",
        "LLAMA_CACHE": home.root / ".cache" / "llama.cpp",
        "XDG_CACHE_HOME": home.root / ".cache",
    }
    env.update({var: str(path) for var, path in places.items() if var in os.environ})
    return start_server(
        data,
        OUTPUT / "models-by-name-server.log",
        env=env,
        args=[
            "--models-dir",
            str(models_dir),
            "--max-loaded-models",
            "1",
            "--models-memory",
            BUDGET,
            "--parallel",
            "2",
        ],
    )


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Models]:
    root = tmp_path_factory.mktemp("models-by-name")
    home = Home(root / "home")
    home.ollama(OLLAMA, gemma())
    home.lmstudio(LMSTUDIO, smollm2())
    home.hub(HUB, {"SmolLM2-135M-Instruct-Q4_1.gguf": smollm2()})
    models_dir = root / "models"
    models_dir.mkdir()
    # A download cut short: the header and the start of the weights.
    with open(smollm2(), "rb") as src, open(models_dir / "broken.gguf", "wb") as dst:
        dst.write(src.read(8 << 20))
    # A whole file whose header reads well and which llama.cpp cannot load (no tokenizer).
    header_model(models_dir / "hollow.gguf")
    sparse_model(models_dir / "huge.gguf")
    server = serve(root / "data", home, models_dir)
    listed = {m["id"]: m for m in httpx.get(server.api + "/models", timeout=10).json()["data"]}

    def find(source: str, prefix: str) -> str:
        found = [i for i, m in listed.items() if m.get("source") == source and prefix in i]
        assert len(found) == 1, (source, prefix, sorted(listed))
        return found[0]

    state = Models(
        server,
        home,
        find("ollama", OLLAMA),
        find("lmstudio", LMSTUDIO),
        find("hf", HUB),
        find("models-dir", "broken"),
        find("models-dir", "hollow"),
        find("models-dir", "huge"),
    )
    yield state
    stop_server(state.server)
    shutil.rmtree(root, ignore_errors=True)


def batch_for(client: OpenAI, model: str, n: int, max_tokens: int = 2, tag: str = "") -> str:
    """Upload N lines naming `model` and create their batch; the batch's id."""
    lines = [
        batch_line(
            f"{tag or model}-{i}",
            f"Name a colour ({i}).",
            model=model,
            max_tokens=max_tokens,
            temperature=0,
        )
        for i in range(n)
    ]
    upload = client.files.create(file=("in.jsonl", jsonl(*lines)), purpose="batch")
    return client.batches.create(
        input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
    ).id


def finished(client: OpenAI, batch_id: str, timeout: float = 120) -> Any:
    return until(
        lambda: client.batches.retrieve(batch_id),
        timeout,
        f"batch {batch_id} to finish",
        accept=lambda b: b.status in FINISHED,
        poll=0.1,
    )


def output(client: OpenAI, file_id: str | None) -> list[dict[str, Any]]:
    if not file_id:
        return []
    text = client.files.content(file_id).text
    return jsonl_lines(text)


def test_three_batches_for_three_models_one_loaded_at_a_time(models: Models) -> None:
    client = models.client()
    before = models.loads()
    wanted = (models.ollama, models.lmstudio, models.hub)
    ids = {m: batch_for(client, m, 3) for m in wanted}  # created at once, before any ends
    done = {m: finished(client, b) for m, b in ids.items()}
    after = models.loads()
    for model, batch in done.items():
        assert batch.status == "completed", batch
        assert batch.request_counts.completed == 3 and batch.request_counts.failed == 0
        answers = output(client, batch.output_file_id)
        assert [a["response"]["body"]["model"] for a in answers] == [model] * 3
        assert all(a["response"]["body"]["choices"][0]["message"]["content"] for a in answers)
    loads = {m: after.get(m, 0) - before.get(m, 0) for m in after}
    # One load per model, plus at most one: the plan finishes a model's lines before the next.
    assert all(loads.get(m, 0) >= 1 for m in wanted), loads
    assert sum(loads.values()) <= 4, loads


def test_names_in_other_letter_case_run_on_the_model_they_name(models: Models) -> None:
    """Ollama's names ignore case: batches naming the Ollama model in capitals and in mixed
    case, one model loaded at a time, complete on that model, and nothing else answers."""
    client = models.client()
    spellings = [models.ollama.upper(), models.ollama.swapcase().title()]
    assert all(name != models.ollama for name in spellings)
    ids = [batch_for(client, name, 2, tag=f"case-{i}") for i, name in enumerate(spellings)]
    for batch_id in ids:
        batch = finished(client, batch_id)
        assert batch.status == "completed", batch
        assert batch.request_counts.completed == 2 and batch.request_counts.failed == 0
        answers = output(client, batch.output_file_id)
        assert [a["response"]["body"]["model"] for a in answers] == [models.ollama] * 2


def test_online_request_for_another_model_during_a_batch(models: Models) -> None:
    client = models.client()
    batch_id = batch_for(client, models.lmstudio, 6, max_tokens=4, tag="during")
    until(
        lambda: client.batches.retrieve(batch_id),
        60,
        "the batch to start",
        accept=lambda b: b.status == "in_progress",
        poll=0.05,
    )
    answer = client.chat.completions.create(
        model=models.ollama,
        messages=[{"role": "user", "content": "Say hello."}],
        max_tokens=3,
        temperature=0,
    )
    assert answer.model == models.ollama
    assert answer.choices[0].message.content
    batch = finished(client, batch_id)
    assert batch.status == "completed" and batch.request_counts.completed == 6
    answers = output(client, batch.output_file_id)
    assert {a["response"]["body"]["model"] for a in answers} == {models.lmstudio}


def test_a_corrupt_gguf_fails_only_its_own_lines(models: Models) -> None:
    client = models.client()
    bad = {m: batch_for(client, m, 2, tag=m) for m in (models.broken, models.hollow)}
    good = batch_for(client, models.hub, 2, tag="good")
    fine = finished(client, good)
    assert fine.status == "completed" and fine.request_counts.completed == 2, fine
    answers = output(client, fine.output_file_id)
    assert [a["response"]["body"]["model"] for a in answers] == [models.hub] * 2
    for model, batch_id in bad.items():
        batch = finished(client, batch_id)
        assert batch.status == "completed", batch
        assert batch.request_counts.failed == 2 and batch.request_counts.completed == 0
        errors = output(client, batch.error_file_id)
        assert sorted(e["custom_id"] for e in errors) == [f"{model}-0", f"{model}-1"]
        for e in errors:  # each line says which model and why
            error = e["response"]["body"]["error"]
            assert error["code"] == "model_load_failed", error
            assert error["message"].startswith(f"The model '{model}' could not be loaded: ")
        if model == models.broken:  # the catalog's reason, not llama.cpp's vaguer one
            assert "damaged or cut short" in error["message"], error


def test_a_model_over_the_budget_fails_its_batch_at_validation(models: Models) -> None:
    client = models.client()
    before = models.loads()
    batch = finished(client, batch_for(client, models.huge, 2, tag="huge"))
    assert batch.status == "failed", batch
    assert batch.errors and batch.errors.data, batch
    error = batch.errors.data[0]
    assert error.code == "model_too_large"
    assert f"The model '{models.huge}' needs" in (error.message or "")
    assert "the budget is 2.00 GiB" in (error.message or "")
    assert models.loads() == before  # nothing was loaded, nothing was unloaded for it


@pytest.mark.slow  # a second start of the server
def test_kill_9_at_a_swap_resumes_with_nothing_lost_or_run_twice(models: Models) -> None:
    client = models.client()
    first = batch_for(client, models.lmstudio, 4, max_tokens=4, tag="kill-a")
    second = batch_for(client, models.hub, 4, max_tokens=4, tag="kill-b")
    counts = lambda b: b.request_counts.completed + b.request_counts.failed  # noqa: E731

    # The swap: one model's batch has ended, the other's has not: the pool is changing model.
    def at_swap() -> bool:
        a, b = client.batches.retrieve(first), client.batches.retrieve(second)
        ends = [x.status in FINISHED for x in (a, b)]
        return any(ends) and not all(ends) and counts(a) + counts(b) < 8

    until(at_swap, 120, "one batch done and the other not yet", poll=0.02)
    models.server.process.send_signal(signal.SIGKILL)
    models.server.process.wait(10)
    data = models.server.data_dir
    at_kill = {**rows(data, first), **rows(data, second)}
    done_at_kill = {c: r for c, r in at_kill.items() if r["status"] in ("succeeded", "failed")}
    assert 4 <= len(done_at_kill) < 8

    models.server = serve(data, models.home, data.parent / "models")
    client = models.client()
    a, b = finished(client, first), finished(client, second)
    after = {**rows(data, first), **rows(data, second)}
    seen = []
    for batch, model in ((a, models.lmstudio), (b, models.hub)):
        assert batch.status == "completed" and batch.request_counts.completed == 4, batch
        answers = output(client, batch.output_file_id)
        assert {x["response"]["body"]["model"] for x in answers} == {model}
        seen += [x["custom_id"] for x in answers + output(client, batch.error_file_id)]
    assert sorted(seen) == sorted(at_kill)  # every line once: nothing lost, none twice
    for cid, r in done_at_kill.items():  # lines finished before the kill were not run again
        assert after[cid]["attempts"] == 1 and after[cid]["request_id"] == r["request_id"]
