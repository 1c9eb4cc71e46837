"""Shared by the packaging tests: a clean copy of the checkout, and a server started from it."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.live import ROOT, free_port, stop_process
from tests.waiting import until


def clean_copy(dest: Path) -> Path:
    """The files a fresh clone has (tracked and not ignored), without .venv or build output."""
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        src = ROOT / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    return dest


def files_under(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}


def static_files(source: Path) -> list[str]:
    """The checkout's static files, real ones first (not .keep placeholders)."""
    found = sorted(files_under(source / "static"), key=lambda s: (s.endswith(".keep"), s))
    assert found, "static/ is empty"
    return found


def outside_env(**extra: str) -> dict[str, str]:
    """The environment of a user's shell: nothing that points Python at the checkout."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env.update(extra)
    return env


def assert_llama_cpp_from(wheelhouse: Path, python: Path) -> None:
    """The llama_cpp that `python` imports is the wheelhouse's build, byte for byte: pip took
    the sound wheel instead of compiling the index's source package again."""
    probe = (
        "import importlib.metadata as m, importlib.util as u; "
        "print(m.version('llama-cpp-python')); "
        "print(u.find_spec('llama_cpp').submodule_search_locations[0])"
    )
    out = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, check=True)
    version, package = out.stdout.split()
    (wheel,) = wheelhouse.glob(f"llama_cpp_python-{version}-*.whl")
    with zipfile.ZipFile(wheel) as z:
        libs = [n for n in z.namelist() if n.startswith("llama_cpp/lib/lib")]
        assert libs, z.namelist()
        for name in libs:
            installed = Path(package) / name.removeprefix("llama_cpp/")
            assert installed.read_bytes() == z.read(name), f"{installed} is not {wheel}'s"


def has_amx() -> bool:
    """Whether this CPU has AMX tiles (recent Xeons): the kernels the fix header makes sound."""
    try:
        return " amx_tile" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


def assert_cpu_buffers(server: Started) -> str:
    """The CPU check's verdict, as a user reads it: logged at start-up and the same in
    /health's `cpu_buffers`; on a CPU with AMX, on (the check passed: the sound build), unless
    the user's environment sets the answer itself. Returns the verdict."""
    text = server.log.read_text(errors="replace")
    found = re.search(r"cpu extra buffer types: (.*)$", text, re.MULTILINE)
    assert found, text
    verdict = found.group(1)
    print(f"cpu_buffers: {verdict}")
    health = httpx.get(server.url + "/health", timeout=10).json()
    assert health["cpu_buffers"] == verdict, health
    if has_amx() and "BATCHYARD_CPU_EXTRA_BUFFERS" not in os.environ:
        assert verdict.startswith("on (the check passed"), text
        assert health["advice"] is None, health
    return verdict


@dataclass
class Started:
    url: str
    process: subprocess.Popen[bytes]
    log: Path
    seconds_to_ready: float

    def stop(self) -> None:
        stop_process(self.process, timeout=20)


def start(
    cmd: list[str],
    cwd: Path,
    log: Path,
    timeout: float = 120,
    args: tuple[str, ...] = (),
    data_dir: str = "batchyard-data",
    **env: str,
) -> Started:
    """Run `<cmd> serve ... <args>` from `cwd` and wait for /health to say ready."""
    port = free_port()
    data = cwd / data_dir
    t0 = time.monotonic()
    with open(log, "wb") as fh:
        proc = subprocess.Popen(
            [*cmd, "serve", "--no-browser", "--port", str(port), "--data-dir", str(data),
             "--parallel", "2", "--ctx-size", "512", *args],
            cwd=cwd,
            env=outside_env(**env),
            stdout=fh,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
    server = Started(f"http://127.0.0.1:{port}", proc, log, 0.0)

    def ready() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"serve exited with {proc.returncode}:\n{log.read_text()}")
        r = httpx.get(server.url + "/health", timeout=2)
        return r.status_code == 200 and r.json()["status"] == "ready"

    left = timeout - (time.monotonic() - t0)
    try:
        until(ready, left, "serve's /health to say ready", poll=0.1, ignoring=(httpx.HTTPError,))
    except AssertionError as e:
        if proc.poll() is not None:
            raise  # it exited: the message has its log already
        server.stop()
        raise AssertionError(f"{e}\n{log.read_text()}") from None
    server.seconds_to_ready = time.monotonic() - t0
    return server


def check_dashboard(url: str, static_files: list[str]) -> None:
    """The dashboard page, and the static files it links to (or, failing that, one of them)."""
    page = httpx.get(url + "/")
    assert page.status_code == 200, page.text
    assert "text/html" in page.headers["content-type"]
    assert "<html" in page.text.lower()
    linked = re.findall(r"""(?:src|href)=["'](/static/[^"'?#]+)""", page.text)
    wanted = linked or [f"/static/{static_files[0]}"]
    for path in wanted:
        r = httpx.get(url + path)
        assert r.status_code == 200, path
    metrics = httpx.get(url + "/metrics")
    assert metrics.status_code == 200 and "batchyard_ready 1" in metrics.text
