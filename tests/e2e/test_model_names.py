"""One model name, one id, on every surface (issue 47): each way of spelling a model (its
exact id, another letter case, `name` for `name:latest`, a models.toml alias, the hub
cache's `ORG/REPO`) crossed with each place a name is read (a batch line through the SDK,
a batch whose lines spell one model several ways, online chat, Responses and embeddings,
`GET /v1/models/{id}`, `batchyard run --model`, an upstream's name). Every cell answers with
the model's one id, or where OpenAI answers 404 for a name nothing knows, one clear 404.

One live front server holds the embedded SmolLM2 (the default), an Ollama pull `smol`
(`smol:latest`), the same model in the hub cache, and an alias; a second server is its
upstream, serving an Ollama pull `far-smol` that only it has. Every model is a link to the
one SmolLM2 file, so all share one loaded engine: no test waits for a load.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest
from openai import OpenAI

from app.config import bundled_model_path
from app.config.settings import default_cache_dir
from tests.factories import batch_line, jsonl, jsonl_lines
from tests.http_helpers import FINISHED, wait_for_status
from tests.live import OUTPUT, LiveServer, batchyard, start_server, stop_server
from tests.models import smollm2
from tests.stores import Home

HUB = "HuggingFaceTB/SmolLM2-135M-Instruct-GGUF"
DEFAULT = "SmolLM2-135M-Instruct.Q4_1"
OLLAMA = "smol:latest"
FAR = "far-smol:latest"  # only the upstream has it

#: Each spelling, and what it is a spelling of ("hub": the hub cache's entry, whose id the
#: server gives).
SPELLINGS = {
    "exact": (DEFAULT, DEFAULT),
    "exact, a pull": (OLLAMA, OLLAMA),
    "letter case": ("smollm2-135m-instruct.q4_1", DEFAULT),
    "letter case, a pull": ("Smol:Latest", OLLAMA),
    ":latest": ("smol", OLLAMA),
    "alias": ("my-smol", OLLAMA),
    "alias, letter case": ("My-Smol", OLLAMA),
    "ORG/REPO": (HUB, "hub"),
    "ORG/REPO, letter case": (HUB.lower(), "hub"),
    "upstream": (FAR, FAR),
    "upstream, letter case": ("Far-Smol:LATEST", FAR),
    "upstream, :latest": ("far-smol", FAR),
}
#: The spellings of catalog models (`batchyard run` has no upstream).
LOCAL = [k for k in SPELLINGS if not k.startswith("upstream")]


@dataclass
class Names:
    front: LiveServer
    upstream: LiveServer
    home: Home
    config: Path
    hub: str  # the id the front gave the hub cache's entry

    def client(self) -> OpenAI:
        return OpenAI(base_url=self.front.api, api_key="unused", max_retries=0, timeout=120)

    def id_of(self, spelling: str) -> str:
        meant = SPELLINGS[spelling][1]
        return self.hub if meant == "hub" else meant

    def env(self) -> dict[str, str]:
        return environ(self.home)


def linked(home: Home) -> None:
    """Every model file of `home` a symlink to the SmolLM2 file: one engine serves them all."""
    size = smollm2().stat().st_size
    for path in list(home.root.rglob("*")):
        if path.is_file() and not path.is_symlink() and path.stat().st_size == size:
            path.unlink()
            path.symlink_to(smollm2().resolve())


def environ(home: Home) -> dict[str, str]:
    """HOME the temporary one: the machine's own stores and caches stay out of it. The
    machine's cache dir stays: its CPU check verdicts spare each start the check."""
    env = {**home.environ, "BATCHYARD_CACHE_DIR": str(default_cache_dir())}
    places = {
        "OLLAMA_MODELS": home.ollama_root,
        "HF_HUB_CACHE": home.hub_root,
        "HF_HOME": home.root / ".cache" / "huggingface",
        "LLAMA_CACHE": home.root / ".cache" / "llama.cpp",
        "XDG_CACHE_HOME": home.root / ".cache",
    }
    env.update({var: str(path) for var, path in places.items() if var in os.environ})
    return env


@pytest.fixture(scope="module")
def names(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Names]:
    assert smollm2().resolve() == bundled_model_path().resolve()
    root = tmp_path_factory.mktemp("model-names")
    far = Home(root / "far-home")
    far.ollama("far-smol", smollm2())
    linked(far)
    home = Home(root / "home")
    home.ollama("smol", smollm2())
    home.hub(HUB, {"SmolLM2-135M-Instruct-Q4_1.gguf": smollm2()})
    linked(home)
    config = root / "models.toml"
    config.write_text('[aliases]\nmy-smol = "smol"\n')
    small = ["--parallel", "2", "--ctx-size", "256"]
    upstream = start_server(
        root / "far-data", OUTPUT / "model-names-upstream.log", env=environ(far), args=small
    )
    try:
        front = start_server(
            root / "data",
            OUTPUT / "model-names-front.log",
            env=environ(home),
            args=[*small, "--models-config", str(config), "--engine", f"up=openai:{upstream.api}"],
        )
    except BaseException:
        stop_server(upstream)
        raise
    listed = httpx.get(front.api + "/models", timeout=10).json()["data"]
    hub = [m["id"] for m in listed if m.get("source") == "hf"]
    assert len(hub) == 1, listed
    yield Names(front, upstream, home, config, hub[0])
    stop_server(front)
    stop_server(upstream)
    shutil.rmtree(root, ignore_errors=True)


def lines_of(c: OpenAI, file_id: str | None) -> list[dict]:
    return jsonl_lines(c.files.content(file_id).text) if file_id else []


def create_batch(c: OpenAI, models: list[str], tag: str) -> str:
    lines = [
        batch_line(f"{tag}-{i}", "Hi", model=m, max_tokens=1, temperature=0)
        for i, m in enumerate(models)
    ]
    upload = c.files.create(file=("in.jsonl", jsonl(*lines)), purpose="batch")
    return c.batches.create(
        input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
    ).id


def answered_models(c: OpenAI, batch_id: str) -> set[str]:
    """The `model` of every output line of a batch that completed with no failed line."""
    b = wait_for_status(c.batches.retrieve, batch_id, FINISHED, 120, poll=0.2)
    assert b.status == "completed" and b.request_counts is not None, b
    assert b.request_counts.failed == 0, lines_of(c, b.error_file_id)
    out = lines_of(c, b.output_file_id)
    assert len(out) == b.request_counts.total
    return {line["response"]["body"]["model"] for line in out}


def test_a_batch_line_runs_as_the_models_one_id(names: Names) -> None:
    c = names.client()
    batches = {
        k: create_batch(c, [spelled], f"b{i}")
        for i, (k, (spelled, _)) in enumerate(SPELLINGS.items())
    }
    for spelling, batch_id in batches.items():
        assert answered_models(c, batch_id) == {names.id_of(spelling)}, spelling


def test_a_batch_that_spells_one_model_several_ways_runs(names: Names) -> None:
    c = names.client()
    by_id: dict[str, list[str]] = {}
    for spelling, (spelled, _) in SPELLINGS.items():
        by_id.setdefault(names.id_of(spelling), []).append(spelled)
    batches = {
        ident: create_batch(c, spelled, f"m{i}") for i, (ident, spelled) in enumerate(by_id.items())
    }
    for ident, batch_id in batches.items():
        assert answered_models(c, batch_id) == {ident}
        assert c.batches.retrieve(batch_id).request_counts.total == len(by_id[ident])  # type: ignore[union-attr]


@pytest.mark.parametrize("spelling", list(SPELLINGS))
def test_online_requests_answer_as_the_models_one_id(names: Names, spelling: str) -> None:
    c, spelled, ident = names.client(), SPELLINGS[spelling][0], names.id_of(spelling)
    chat = c.chat.completions.create(
        model=spelled, messages=[{"role": "user", "content": "Hi"}], max_tokens=1
    )
    assert chat.model == ident
    response = c.responses.create(model=spelled, input="Hi", max_output_tokens=1)
    assert response.model == ident
    assert c.embeddings.create(model=spelled, input="Hi").model == ident
    assert c.models.retrieve(spelled).id == ident


def test_a_name_nothing_knows_is_one_404_on_the_models_endpoint(names: Names) -> None:
    c = names.client()
    for unknown in ("no-such-model", "smol:1b", "far-smol:8b"):
        with pytest.raises(openai.NotFoundError) as caught:
            c.models.retrieve(unknown)
        assert caught.value.code == "model_not_found"
        assert f"The model '{unknown}' does not exist" in str(caught.value.message)
    # Chat keeps running such a name on the default model (no --strict-models).
    chat = c.chat.completions.create(
        model="no-such-model", messages=[{"role": "user", "content": "Hi"}], max_tokens=1
    )
    assert chat.model == DEFAULT


@pytest.mark.parametrize("spelling", ["letter case", ":latest", "alias", "ORG/REPO"])
def test_batchyard_run_model_runs_as_the_models_one_id(
    names: Names, spelling: str, tmp_path: Path
) -> None:
    spelled = SPELLINGS[spelling][0]
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_bytes(jsonl(batch_line("r0", "Hi", model=spelled, max_tokens=1)))
    done = batchyard(
        "run", str(src), "-o", str(out), "--model", spelled,
        "--models-config", str(names.config), "--parallel", "1", "--ctx-size", "256",
        env={**names.env(), "BATCHYARD_STRICT_MODELS": "true"}, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    (line,) = jsonl_lines(out.read_text())
    assert line["response"]["body"]["model"] == names.id_of(spelling)
