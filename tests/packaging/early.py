"""The packaging tests' slow installs, started in the background as the session starts: the
one-file build (packaging/build.sh, about two minutes), `pip install` of the wheel into a
fresh venv and `pipx install .` (about half a minute each). The rest of the suite leaves one
of the machine's two cores idle (it averages about one core: pytest's process and the servers
it waits on), so these run beside it at a lower CPU priority, and the tests' own processes
keep the cores they ask for. Each test waits for its job (`finish`), and starts it there if
nothing did. Each job works from its own clean copy of the checkout.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from tests.packaging.helpers import clean_copy, outside_env

#: How much lower the jobs run than the tests (nice(2)'s increment).
NICENESS = 10


@dataclass
class Job:
    process: subprocess.Popen[bytes]
    root: Path
    log: Path
    started: float


@dataclass
class Done:
    code: int
    root: Path  # the job's folder: `clone` (its clean copy) and what the job wrote
    output: str  # the end of its log
    seconds: float  # from its start to now


def _binary(root: Path) -> tuple[str, dict[str, str]]:
    return f"bash packaging/build.sh {shlex.quote(str(root / 'dist'))}", {
        "PYTHON": sys.executable,
        "BATCHYARD_BUILD_VENV": str(root / "venv"),
        "BATCHYARD_BUILD_WORK": str(root / "work"),
    }


def _wheelhouse() -> str:
    """Shell that sets WH to packaging/llama_wheel.sh's wheelhouse (tests/run.sh built the
    sound wheel there before the tests; this finds it)."""
    return f"WH=$(bash packaging/llama_wheel.sh {shlex.quote(sys.executable)})"


def _pip(root: Path) -> tuple[str, dict[str, str]]:
    """The package's wheel, then a fresh venv with it installed (llama-cpp-python from the
    wheelhouse, not compiled again)."""
    py, r = shlex.quote(sys.executable), shlex.quote(str(root))
    return (
        f"set -e; {_wheelhouse()}; "
        f"{py} -m pip wheel --no-deps -q . -w {r}/wheel; "
        f"{py} -m venv {r}/venv; t0=$SECONDS; "
        f"PIP_FIND_LINKS=$WH {r}/venv/bin/python -m pip install -q {r}/wheel/batchyard-*.whl; "
        f'echo "pip install of the wheel and its dependencies: $((SECONDS - t0))s"',
        {},
    )


def _pipx(root: Path) -> tuple[str, dict[str, str]]:
    """pipx in a venv of its own, then the README's command in the clean copy: `pipx install .`
    (the pip inside pipx's venv finds the sound wheel, as a user's pip.conf would)."""
    py, r = shlex.quote(sys.executable), shlex.quote(str(root))
    return (
        f"set -e; {_wheelhouse()}; "
        f"{py} -m venv {r}/tools; {r}/tools/bin/python -m pip install -q pipx; t0=$SECONDS; "
        f"PIP_FIND_LINKS=$WH {r}/tools/bin/pipx install .; "
        f'echo "pipx install .: $((SECONDS - t0))s"',
        {
            "PIPX_HOME": str(root / "pipx"),
            "PIPX_BIN_DIR": str(root / "bin"),
            "PIPX_MAN_DIR": str(root / "man"),
        },
    )


RECIPES = {"binary": _binary, "pip": _pip, "pipx": _pipx}

_jobs: dict[str, Job] = {}


def start(name: str) -> None:
    """Start job `name` (one of RECIPES) from a clean copy of the checkout, once a session."""
    if name in _jobs:
        return
    root = Path(tempfile.mkdtemp(prefix=f"batchyard-{name}-"))
    source = root / "clone"
    source.mkdir()
    clean_copy(source)
    script, env = RECIPES[name](root)
    log = root / "job.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            ["bash", "-c", script],
            cwd=source,
            env=outside_env(**env),
            stdout=out,
            stderr=subprocess.STDOUT,
            preexec_fn=lambda: os.nice(NICENESS),
        )
    _jobs[name] = Job(process, root, log, time.monotonic())


def finish(name: str, timeout: float) -> Done:
    """Wait for job `name` (starting it if nothing did)."""
    start(name)
    job = _jobs[name]
    try:
        code = job.process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        job.process.kill()
        code = job.process.wait()
    tail = job.log.read_text(errors="replace")[-8000:]
    return Done(code, job.root, tail, time.monotonic() - job.started)


def stop() -> None:
    """End the jobs still running and remove what they wrote."""
    for job in _jobs.values():
        if job.process.poll() is None:
            job.process.kill()
            job.process.wait()
        shutil.rmtree(job.root, ignore_errors=True)
    _jobs.clear()
