"""packaging/build.sh makes one executable with llama.cpp, the templates, the static files
and the default model inside; it answers --version, runs a batch file and serves."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import httpx
import pytest

from tests.factories import batch_line, jsonl, jsonl_lines
from tests.packaging import early
from tests.packaging.helpers import check_dashboard, outside_env, start, static_files

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def binary() -> Path:
    # Started as the session started (tests/conftest.py), beside the other tests.
    done = early.finish("binary", timeout=900)
    assert done.code == 0, done.output
    dist = done.root / "dist"
    exe = dist / "batchyard"
    assert exe.is_file() and os.access(exe, os.X_OK)
    assert sorted(p.name for p in dist.iterdir()) == ["batchyard"]  # one file, nothing beside it
    print(
        f"\nbuilt {exe} {done.seconds:.0f}s after it was queued: {exe.stat().st_size / 1e6:.1f} MB"
    )
    return exe


def test_binary_prints_its_version(binary: Path, tmp_path: Path) -> None:
    r = subprocess.run([str(binary), "--version"], cwd=tmp_path, env=outside_env(),
                       capture_output=True, text=True, timeout=120)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("batchyard 0.")


def test_binary_runs_a_batch_file_on_the_bundled_model(binary: Path, tmp_path: Path) -> None:
    lines = [
        batch_line(f"bin-{i}", q, model="x", max_tokens=8)
        for i, q in enumerate(["Say hello", "Name a fruit"])
    ]
    (tmp_path / "in.jsonl").write_bytes(jsonl(*lines))
    r = subprocess.run(
        [str(binary), "run", "in.jsonl", "-o", "out.jsonl", "--parallel", "2", "--ctx-size", "256"],
        cwd=tmp_path,
        env=outside_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    out = jsonl_lines((tmp_path / "out.jsonl").read_text())
    assert [o["custom_id"] for o in out] == ["bin-0", "bin-1"]
    for o in out:
        body = o["response"]["body"]
        assert o["response"]["status_code"] == 200
        assert body["model"] == "SmolLM2-135M-Instruct.Q4_1"
        assert body["choices"][0]["message"]["content"]
    # The model it ran is the one inside the bundle.
    models = subprocess.run([str(binary), "models", "--json"], cwd=tmp_path, env=outside_env(),
                            capture_output=True, text=True, timeout=120)  # fmt: skip
    default = next(m for m in json.loads(models.stdout) if m["default"])
    assert "_MEI" in default["path"] and default["quantization"] == "Q4_1", default


def test_binary_serves_the_dashboard(binary: Path, source: Path, tmp_path: Path) -> None:
    server = start([str(binary)], tmp_path, tmp_path / "serve.log")
    try:
        print(f"\nsingle binary ready on /health in {server.seconds_to_ready:.1f}s")
        check_dashboard(server.url, static_files(source))
        # A second one in front of it: its upstream client process is `batchyard _upstream`.
        front = start(
            [str(binary)],
            tmp_path,
            tmp_path / "front.log",
            args=("--no-embedded", "--engine", f"up=openai:{server.url}/v1"),
            data_dir="front-data",
        )
        try:
            r = httpx.post(
                front.url + "/v1/chat/completions",
                json={
                    "model": "SmolLM2-135M-Instruct.Q4_1",
                    "messages": [{"role": "user", "content": "Say hello"}],
                    "max_tokens": 4,
                },
                timeout=60,
            )
            assert r.status_code == 200, r.text
            assert r.json()["choices"][0]["message"]["content"]
        finally:
            front.stop()
    finally:
        server.stop()
