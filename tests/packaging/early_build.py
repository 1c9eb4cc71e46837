"""The one-file build (packaging/build.sh), started in the background as the session starts
wherever tests/packaging/test_binary.py is selected. The build takes about two minutes, most
of it on one core, and the rest of the suite leaves one of the machine's two cores idle (it
averages about one core: pytest's process and the servers it waits on). The build runs at a
lower CPU priority, so the tests' own processes keep the cores they ask for; test_binary.py's
`binary` fixture waits for it, and starts it there if nothing did.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from tests.packaging.helpers import clean_copy, outside_env

#: How much lower the build runs than the tests (nice(2)'s increment).
NICENESS = 10


@dataclass
class Build:
    process: subprocess.Popen[bytes]
    root: Path
    log: Path
    started: float


_build: Build | None = None


def start() -> None:
    """Start the build from a clean copy of the checkout (once per session)."""
    global _build
    if _build is not None:
        return
    root = Path(tempfile.mkdtemp(prefix="batchyard-binary-"))
    source = root / "clone"
    source.mkdir()
    clean_copy(source)
    log = root / "build.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            ["bash", "packaging/build.sh", str(root / "dist")],
            cwd=source,
            env=outside_env(
                PYTHON=sys.executable,
                BATCHYARD_BUILD_VENV=str(root / "venv"),
                BATCHYARD_BUILD_WORK=str(root / "work"),
            ),
            stdout=out,
            stderr=subprocess.STDOUT,
            preexec_fn=lambda: os.nice(NICENESS),
        )
    _build = Build(process, root, log, time.monotonic())


def finish(timeout: float) -> tuple[int, Path, str, float]:
    """Wait for the build: its exit code, its dist folder, the end of its output, and the
    seconds since it started."""
    start()
    assert _build is not None
    try:
        code = _build.process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        _build.process.kill()
        code = _build.process.wait()
    tail = _build.log.read_text(errors="replace")[-8000:]
    return code, _build.root / "dist", tail, time.monotonic() - _build.started


def stop() -> None:
    """End a build still running and remove what it wrote."""
    global _build
    if _build is None:
        return
    if _build.process.poll() is None:
        _build.process.kill()
        _build.process.wait()
    shutil.rmtree(_build.root, ignore_errors=True)
    _build = None
