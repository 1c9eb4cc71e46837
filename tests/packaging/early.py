"""The packaging tests' slow installs, started in the background as the session starts: the
one-file build (packaging/build.sh, about two minutes), a throwaway venv with the engine's
few dependencies (`batchyard engine build`'s test, about 20 seconds), the package's wheel and
the README's install into a fresh venv (`bash install.sh --venv DIR`), and the README's install
through pipx (`bash install.sh`), about half a minute each. The rest of the
suite leaves one of the machine's two cores idle (it averages about one core: pytest's
process and the servers it waits on), so these run beside it, one after another, in the idle
scheduling class (SCHED_IDLE): they take only the CPU that nothing else wants. A niced job
still outran the test servers' engines, which run in that class themselves
(engine_priority's CPU default), and three at once made the first browser tests 2-3 times
slower. Each test waits for its job (`finish`), and queues it there if nothing did. Each job
works from its own clean copy of the checkout.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.packaging.helpers import clean_copy, outside_env

#: Where the idle scheduling class is missing: how much lower the jobs run (nice(2)).
NICENESS = 19


@dataclass
class Job:
    root: Path
    log: Path
    queued: float
    done: threading.Event = field(default_factory=threading.Event)
    code: int | None = None
    process: subprocess.Popen[bytes] | None = None


@dataclass
class Done:
    code: int
    root: Path  # the job's folder: `clone` (its clean copy) and what the job wrote
    output: str  # the end of its log
    seconds: float  # from when it was queued to now


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


#: What `batchyard engine ...` imports besides llama_cpp (no server parts): the engine names
#: a model's quantization through the catalog, which reads headers with `gguf`.
ENGINE_DEPS = ["numpy", "typing-extensions", "diskcache", "jinja2", "platformdirs", "gguf"]


def _engine_venv(root: Path) -> tuple[str, dict[str, str]]:
    """A throwaway venv holding the wheelhouse's llama-cpp-python and ENGINE_DEPS only, for
    `batchyard engine build` to replace its engine in."""
    py, r = shlex.quote(sys.executable), shlex.quote(str(root))
    return (
        f"set -e; {_wheelhouse()}; {py} -m venv {r}/venv; "
        f"{r}/venv/bin/python -m pip install -q --no-deps $WH/llama_cpp_python-*.whl; "
        f"{r}/venv/bin/python -m pip install -q {' '.join(ENGINE_DEPS)}",
        {},
    )


#: The README's install commands, run in a clean copy of the checkout as a user would; they
#: take llama-cpp-python from packaging/llama_wheel.sh's wheelhouse (tests/run.sh built it
#: with the same flags, so nothing is compiled here).
INSTALL = "bash install.sh"
INSTALL_VENV = "bash install.sh --venv {venv}"


def _pip(root: Path) -> tuple[str, dict[str, str]]:
    """The package's wheel (its contents are checked), then the README's venv install into a
    fresh venv."""
    py, r = shlex.quote(sys.executable), shlex.quote(str(root))
    return (
        f"set -e; {py} -m pip wheel --no-deps -q . -w {r}/wheel; t0=$SECONDS; "
        f"{INSTALL_VENV.format(venv=f'{r}/venv')}; "
        f'echo "the README\'s install into a venv: $((SECONDS - t0))s"',
        {},
    )


def _pipx(root: Path) -> tuple[str, dict[str, str]]:
    """pipx in a venv of its own, on the PATH as a user's is, then the README's install."""
    py, r = shlex.quote(sys.executable), shlex.quote(str(root))
    return (
        f"set -e; {py} -m venv {r}/tools; {r}/tools/bin/python -m pip install -q pipx; "
        f"PATH={r}/tools/bin:$PATH; t0=$SECONDS; {INSTALL}; "
        f'echo "the README\'s install through pipx: $((SECONDS - t0))s"',
        {
            "PIPX_HOME": str(root / "pipx"),
            "PIPX_BIN_DIR": str(root / "bin"),
            "PIPX_MAN_DIR": str(root / "man"),
        },
    )


RECIPES = {"binary": _binary, "engine-venv": _engine_venv, "pip": _pip, "pipx": _pipx}

_jobs: dict[str, Job] = {}
_order: list[str] = []
_lock = threading.Condition()
_stopping = False


def _idle() -> None:
    """In the child, before exec: the idle scheduling class (or the lowest niceness)."""
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        os.nice(NICENESS)


def _run_jobs() -> None:
    """Run the queued jobs one after another, in the order they were queued."""
    while True:
        with _lock:
            while not _stopping and not any(_jobs[n].code is None for n in _order):
                _lock.wait()
            if _stopping:
                return
            name = next(n for n in _order if _jobs[n].code is None)
            job = _jobs[name]
            source = job.root / "clone"
            source.mkdir()
            clean_copy(source)
            script, env = RECIPES[name](job.root)
            with job.log.open("wb") as out:
                job.process = subprocess.Popen(
                    ["bash", "-c", script],
                    cwd=source,
                    env=outside_env(**env),
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    preexec_fn=_idle,
                )
        code = job.process.wait()
        with _lock:
            job.code = code
            job.done.set()
            _lock.notify_all()


_runner: threading.Thread | None = None


def start(name: str) -> None:
    """Queue job `name` (one of RECIPES), once a session; the jobs run one at a time."""
    global _runner
    with _lock:
        if name in _jobs:
            return
        root = Path(tempfile.mkdtemp(prefix=f"batchyard-{name}-"))
        _jobs[name] = Job(root, root / "job.log", time.monotonic())
        _order.append(name)
        if _runner is None:
            _runner = threading.Thread(target=_run_jobs, name="early-jobs", daemon=True)
            _runner.start()
        _lock.notify_all()


def finish(name: str, timeout: float) -> Done:
    """Wait for job `name` (queuing it if nothing did)."""
    start(name)
    job = _jobs[name]
    if not job.done.wait(timeout):
        with _lock:
            if job.process is not None and job.process.poll() is None:
                job.process.kill()
        job.done.wait(60)
    tail = job.log.read_text(errors="replace")[-8000:] if job.log.exists() else ""
    code = job.code if job.code is not None else -1
    return Done(code, job.root, tail, time.monotonic() - job.queued)


def stop() -> None:
    """End the jobs still queued or running and remove what they wrote."""
    global _runner, _stopping
    with _lock:
        _stopping = True
        for job in _jobs.values():
            if job.process is not None and job.process.poll() is None:
                job.process.kill()
        _lock.notify_all()
    if _runner is not None:
        _runner.join(timeout=60)
    for job in _jobs.values():
        shutil.rmtree(job.root, ignore_errors=True)
    with _lock:
        _jobs.clear()
        _order.clear()
        _runner, _stopping = None, False
