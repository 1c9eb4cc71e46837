"""The command line: serve's help names every flag's env variable and default, `models`,
`--log-level`, and `--version`."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import httpx

from app.catalog import Catalog
from app.catalog.estimate import human_size
from app.cli import build_parser
from app.config import Settings, bundled_model_path
from tests.live import ROOT, batchyard, start_server, stop_process
from tests.models import gemma, header_projector
from tests.stores import Home


def serve_options() -> list[tuple[str, str]]:
    """(flag, Settings field) of every option `serve` takes."""
    parser = build_parser()
    serve = parser._subparsers._group_actions[0].choices["serve"]  # type: ignore[union-attr]
    return [(a.option_strings[-1], a.dest) for a in serve._actions if a.dest != "help"]


def test_serve_help_lists_every_flag_with_its_env_variable_and_default() -> None:
    r = batchyard("serve", "--help", env={"COLUMNS": "100"})
    assert r.returncode == 0
    text = " ".join(r.stdout.split())  # undo argparse's line wrapping
    text = text[text.index("options:") :]  # past the usage summary
    options = serve_options()
    assert len(options) >= 13
    settings_fields = set(Settings.__dataclass_fields__)
    starts = sorted((text.index(f"{flag} "), flag, dest) for flag, dest in options)
    for i, (start, flag, dest) in enumerate(starts):
        end = starts[i + 1][0] if i + 1 < len(starts) else len(text)
        entry = text[start:end]
        assert dest in settings_fields, flag
        assert f"env {Settings.env_name(dest)}" in entry, entry
        assert "default:" in entry, entry
    assert "default: 8000" in text and "default: '127.0.0.1'" in text


def test_each_env_variable_in_the_help_sets_its_setting() -> None:
    s = Settings.load(
        environ={"BATCHYARD_PORT": "9123", "BATCHYARD_NO_BROWSER": "1", "BATCHYARD_API_KEYS": "a,b"}
    )
    assert (s.port, s.no_browser, s.api_keys) == (9123, True, ["a", "b"])
    # A flag wins over its variable.
    assert Settings.load({"port": 1}, environ={"BATCHYARD_PORT": "9123"}).port == 1


def test_an_unknown_kv_cache_type_is_refused_with_the_choices(tmp_path: Path) -> None:
    assert Settings.load(environ={"BATCHYARD_KV_CACHE_TYPE": "F16"}).kv_cache_type == "f16"
    (tmp_path / "in.jsonl").write_text("")
    serve = ["serve", "--no-browser", "--data-dir", str(tmp_path / "d")]
    run = ["run", str(tmp_path / "in.jsonl"), "-o", str(tmp_path / "out.jsonl")]
    for args in (serve, run):
        r = batchyard(*args, "--kv-cache-type", "q9")
        assert r.returncode != 0
        assert "unknown KV cache type 'q9'; choose one of f16, bf16, q8_0, q4_0" in r.stderr


def test_serve_refuses_to_start_on_a_completion_window_too_short(tmp_path: Path) -> None:
    serve = ["serve", "--no-browser", "--data-dir", str(tmp_path / "d")]
    r = batchyard(*serve, "--completion-windows", "1h,10m")
    assert r.returncode != 0
    assert (
        "batchyard: --completion-windows: '10m' is outside the windows batchyard allows "
        "(1 hour to 7 days)" in r.stderr
    )


def test_libgomp_settings_come_before_llama_cpp_and_the_user_wins() -> None:
    probe = (
        "import os, sys, app.config as c; c.bundled_model_path(); "
        "print(os.environ['GOMP_SPINCOUNT'], os.environ['OMP_WAIT_POLICY'], "
        "'llama_cpp' in sys.modules)"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    run = [sys.executable, "-c", probe]
    r = subprocess.run(run, cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    # Finding the embedded model does not import llama_cpp, which would load libgomp first.
    assert r.stdout.split() == ["1000", "ACTIVE", "False"]
    env["GOMP_SPINCOUNT"] = "5"
    r = subprocess.run(run, cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    assert r.stdout.split() == ["5", "ACTIVE", "False"]


def test_models_lists_every_store_with_size_quantization_context_and_memory(
    tmp_path: Path,
) -> None:
    home = Home(tmp_path / "home")
    home.ollama("gemma3:270m", gemma(), projector=header_projector(tmp_path / "proj.gguf"))
    data = tmp_path / "data"
    (data / "models").mkdir(parents=True)
    # A copy under another name: its quantisation must come from the header, not the name.
    shutil.copyfile(bundled_model_path(), data / "models" / "tiny-chat-Q8_0.gguf")
    other = tmp_path / "elsewhere-Q8_0.gguf"
    other.write_bytes(b"not a gguf file at all")

    r = batchyard("models", "--data-dir", str(data), "--model", str(other), env=home.environ)

    assert r.returncode == 0, r.stderr
    header, *lines = r.stdout.splitlines()
    assert header.split() == [
        "ID", "SOURCE", "SIZE", "QUANT", "ARCH", "CONTEXT", "MEMORY", "INPUT"
    ]  # fmt: skip
    rows = {line.split()[0]: line.split()[1:] for line in lines}
    assert list(rows) == [
        "elsewhere-Q8_0",  # --model: the default, marked *
        "SmolLM2-135M-Instruct.Q4_1",
        "tiny-chat-Q8_0",
        "gemma3:270m",
    ]
    smol = Catalog(Settings.load({"data_dir": str(data)}, environ={})).default()
    assert smol.estimate is not None
    memory = human_size(smol.estimate.total).split()
    size = human_size(smol.size_bytes).split()
    assert rows["SmolLM2-135M-Instruct.Q4_1"] == [
        "default",
        *size,
        "Q4_1",
        "llama",
        "8192",
        *memory,
        "text",
    ]
    assert rows["tiny-chat-Q8_0"] == [
        "models-dir", *size, "Q4_1", "llama", "8192", *memory, "text"
    ]  # fmt: skip
    assert rows["gemma3:270m"][:6] == ["ollama", "241.4", "MiB", "Q4_K_M", "gemma3", "32768"]
    assert rows["gemma3:270m"][-1] == "text+image"  # its projector layer
    # Not a GGUF: listed, with the name's quantisation, its real size and why.
    assert rows["elsewhere-Q8_0"] == ["*", "model", "22", "B", "Q8_0", "-", "-", "-", "text"]
    assert f"elsewhere-Q8_0: not a GGUF file (it does not start with GGUF) ({other})" in r.stderr

    r = batchyard("models", "--data-dir", str(data), "--json", env=home.environ)
    listed = {m["id"]: m for m in json.loads(r.stdout)}
    assert listed["gemma3:270m"]["size_bytes"] == gemma().stat().st_size
    assert listed["gemma3:270m"]["projector"].startswith(str(home.ollama_root / "blobs"))
    assert listed["tiny-chat-Q8_0"]["projector"] is None
    assert listed["SmolLM2-135M-Instruct.Q4_1"]["default"] is True
    assert listed["SmolLM2-135M-Instruct.Q4_1"]["estimated_bytes"] == smol.estimate.total

    r = batchyard("models", "--data-dir", str(data), "--default-model", "llama3", env=home.environ)
    assert r.returncode == 1
    assert "--default-model 'llama3' names no model this server has; the models are: " in r.stderr


def test_version() -> None:
    r = batchyard("--version")
    assert r.returncode == 0 and re.fullmatch(r"batchyard \d+\.\d+\.\d+\S*\n", r.stdout)


def test_log_level_warning_drops_the_request_lines(tmp_path: Path) -> None:
    log = tmp_path / "serve.log"
    server = start_server(
        tmp_path / "d",
        log,
        env={"BATCHYARD_LOG_LEVEL": "warning"},
        args=["--parallel", "1", "--ctx-size", "256"],
        timeout=60,
    )
    try:
        assert httpx.get(server.api + "/models").status_code == 200
    finally:
        stop_process(server.process, timeout=20)
    text = log.read_text()
    assert "method=GET" not in text
    assert " INFO " not in text
