"""A CUDA build of llama.cpp on a machine without a GPU (a Docker build, a CI runner, this one):
`batchyard serve` with it starts, says in one start-up line that it runs on the CPU, answers a
batch, and `engine status` and /health say the same.

The CUDA wheel takes about an hour to compile on 2 cores, so this runs only where `nvcc` is
present and packaging/llama_wheel.sh's cached CUDA wheel (architecture 90) exists, or where
BATCHYARD_TEST_CUDA_BUILD=1 asks for the compile; it skips otherwise. The wheel's libraries
are used through LLAMA_CPP_LIB_PATH beside the installed llama-cpp-python of the same version.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import httpx
import pytest

from app.toolchain import facts
from tests.factories import jsonl_lines
from tests.live import OUTPUT, ROOT, batchyard, start_server, stop_server

ARCH = "90"
COMPILE_ENV = "BATCHYARD_TEST_CUDA_BUILD"


def cuda_wheel() -> Path:
    """The cached CUDA wheel, compiled now when BATCHYARD_TEST_CUDA_BUILD=1 asks; else skip."""
    if shutil.which("nvcc") is None:
        pytest.skip("no nvcc: the CUDA build needs the CUDA toolkit")
    cmd = ["bash", "packaging/llama_wheel.sh", sys.executable, "--cuda", ARCH]
    compile_now = os.environ.get(COMPILE_ENV) == "1"
    found = subprocess.run(
        cmd if compile_now else [*cmd, "--no-build"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
        check=False,
        timeout=3 * 3600,
    )
    wheels = sorted(Path(found.stdout.strip()).glob("llama_cpp_python-*.whl"))
    if not wheels:
        pytest.skip(
            f"no cached CUDA wheel (architecture {ARCH}) in {found.stdout.strip()}: "
            f"`bash packaging/llama_wheel.sh PYTHON --cuda {ARCH}` builds it (about an hour "
            f"on 2 cores), or {COMPILE_ENV}=1 asks this test to"
        )
    return wheels[-1]


@pytest.fixture(scope="module")
def cuda_lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The CUDA wheel's llama_cpp/lib, unpacked."""
    if facts.visible_nvidia_gpu():
        pytest.skip("a GPU is visible: this test is about a CUDA build without one")
    wheel = cuda_wheel()
    out = tmp_path_factory.mktemp("cuda-wheel")
    with zipfile.ZipFile(wheel) as z:
        for name in z.namelist():
            if name.startswith("llama_cpp/lib/"):
                z.extract(name, out)
    return out / "llama_cpp" / "lib"


FALLBACK = (
    "llama-cpp-python is built with CUDA, but no GPU is visible (nvidia-smi lists none): "
    "the engine runs on the CPU."
)


def test_a_cuda_build_without_a_gpu_serves_on_the_cpu(cuda_lib: Path, tmp_path: Path) -> None:
    env = {"LLAMA_CPP_LIB_PATH": str(cuda_lib)}
    status = batchyard("engine", "status", env=env)
    assert status.returncode == 0, status.stderr
    assert "backend: CUDA (built with cuda)" in status.stdout
    assert f"CUDA architectures: sm_{ARCH}" in status.stdout
    assert FALLBACK in status.stdout

    log_path = OUTPUT / "cuda-build-server.log"
    log_path.unlink(missing_ok=True)  # start_server appends: this run's log only
    server = start_server(tmp_path / "data", log_path, env=env)
    try:
        health = httpx.get(server.url + "/health").json()
        assert health["gpu_fallback"] == FALLBACK
        assert health["backend"] == "CPU"
        assert health["n_gpu_layers"] == 0

        from openai import OpenAI

        client = OpenAI(base_url=server.api, api_key="test")
        lines = [
            {
                "custom_id": f"q{i}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {
                    "model": "m",
                    "messages": [{"role": "user", "content": question}],
                    "max_tokens": 8,
                    "temperature": 0,
                },
            }
            for i, question in enumerate(["What is 2 + 2?", "Name a colour."])
        ]
        data = "".join(json.dumps(line) + "\n" for line in lines).encode()
        upload = client.files.create(file=("in.jsonl", io.BytesIO(data)), purpose="batch")
        batch = client.batches.create(
            input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        for _ in range(600):
            batch = client.batches.retrieve(batch.id)
            if batch.status in ("completed", "failed", "expired", "cancelled"):
                break
            time.sleep(0.2)
        assert batch.status == "completed", batch
        assert batch.request_counts is not None and batch.request_counts.completed == 2
        assert batch.output_file_id is not None
        out = jsonl_lines(client.files.content(batch.output_file_id).text)
        assert sorted(o["custom_id"] for o in out) == ["q0", "q1"]
        for o in out:
            body = o["response"]["body"]
            assert o["response"]["status_code"] == 200
            assert body["usage"]["completion_tokens"] > 0
            assert body["choices"][0]["message"]["content"]
    finally:
        stop_server(server)
    log = server.log()
    assert log.count(FALLBACK) == 1, log[-3000:]


def test_engine_build_keeps_a_cuda_build_that_loads_where_no_gpu_is_visible(
    cuda_lib: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What `engine build --cuda` checks in an image build: the new build loads and runs."""
    from app.config import Settings
    from app.toolchain import build

    monkeypatch.setenv("LLAMA_CPP_LIB_PATH", str(cuda_lib))
    ok, why = build.verify("cuda", Settings())
    assert ok, why
    assert "no GPU visible" in why
