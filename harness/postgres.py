"""PostgreSQL for tests and benches: a fresh database on a server (`PgDatabase`), and for
those that restart it, a private cluster (`private_postgres`): a cluster of its own, made by
`initdb` in a fresh folder and run by `pg_ctl` on a free port, never the machine's shared
server (others' tests use that one).

The binaries are found on PATH or under /usr/lib/postgresql/*/bin. PostgreSQL refuses to
run as root: as root, the cluster belongs to the `postgres` user and each command runs as
it (`runuser`). Where none of this is possible, `private_postgres` says why, so that a test
skips the step that needs it.
"""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

from harness.live import free_port

#: How long a start or a stop may take on a loaded machine.
START_SECONDS = 60
#: The machine's shared server, where a bench makes its fresh databases by default.
SHARED_SERVER = "postgresql+psycopg://root@127.0.0.1:5432/test"


class PgDatabase:
    """A fresh database on the server at `server_url` (NAME_<random>), until `drop()`."""

    def __init__(self, server_url: str, prefix: str = "batchyard_fleet") -> None:
        from sqlalchemy import create_engine, make_url, text

        self._text = text
        server = make_url(server_url)
        self.name = f"{prefix}_{secrets.token_hex(5)}"
        self.admin = create_engine(server, isolation_level="AUTOCOMMIT")
        with self.admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{self.name}"'))
        #: A SQLAlchemy URL on the new database.
        self.url = server.set(database=self.name).render_as_string(hide_password=False)

    def drop(self) -> None:
        with self.admin.connect() as conn:
            conn.execute(self._text(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)'))
        self.admin.dispose()


def binaries() -> Path | None:
    """The folder holding initdb and pg_ctl, or None."""
    found = shutil.which("pg_ctl")
    if found and shutil.which("initdb"):
        return Path(os.path.realpath(found)).parent
    for folder in sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True):
        if (folder / "pg_ctl").is_file() and (folder / "initdb").is_file():
            return folder
    return None


@dataclass
class Cluster:
    """A running private PostgreSQL: trust auth for `postgres` on 127.0.0.1:`port`."""

    bin: Path
    data: Path
    port: int
    log: Path
    user: str | None  # runs its commands as this user (when the caller is root)

    @property
    def url(self) -> str:
        """A SQLAlchemy URL on its `postgres` database, whose user may CREATE DATABASE."""
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *args: str, timeout: float = START_SECONDS) -> None:
        cmd = [str(self.bin / args[0]), *args[1:]]
        if self.user:
            cmd = ["runuser", "-u", self.user, "--", *cmd]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(args[:2])} failed:\n{done.stdout}{done.stderr}")

    def start(self) -> None:
        """Start it and wait until it takes connections."""
        self._run(
            "pg_ctl", "start", "-w", "-t", str(START_SECONDS), "-D", str(self.data),
            "-l", str(self.log), "-o", f"-p {self.port} -k {self.data}",
        )  # fmt: skip

    def stop(self, mode: str = "fast") -> None:
        """Stop it: `fast` (an operator's restart: every session ends at once) or
        `immediate` (a crash: no shutdown checkpoint, recovery at the next start)."""
        self._run("pg_ctl", "stop", "-w", "-m", mode, "-D", str(self.data))

    def running(self) -> bool:
        return (self.data / "postmaster.pid").exists()


def _owner() -> tuple[str | None, int, int]:
    """Who the cluster runs as: (user to run as, uid, gid); nobody special unless root."""
    if os.geteuid() != 0:
        return None, os.getuid(), os.getgid()
    try:
        pw = pwd.getpwnam("postgres")
    except KeyError:
        raise LookupError("running as root, and there is no `postgres` user to run it") from None
    if shutil.which("runuser") is None:
        raise LookupError("running as root, and there is no `runuser` to run it as postgres")
    return "postgres", pw.pw_uid, pw.pw_gid


@contextmanager
def private_postgres(log: Path) -> Iterator[Cluster | str]:
    """A fresh private cluster, running, removed afterwards; or why it cannot be made."""
    folder_bin = binaries()
    if folder_bin is None:
        yield "no initdb/pg_ctl on PATH or under /usr/lib/postgresql/*/bin"
        return
    try:
        user, uid, gid = _owner()
    except LookupError as exc:
        yield str(exc)
        return
    # Not under pytest's tmp_path: the `postgres` user cannot enter root's 0700 folders.
    folder = Path(tempfile.mkdtemp(prefix="batchyard-pg-"))
    data = folder / "data"
    data.mkdir()
    os.chown(folder, uid, gid)
    os.chown(data, uid, gid)
    log.parent.mkdir(parents=True, exist_ok=True)
    pg_log = folder / "postgres.log"
    cluster = Cluster(folder_bin, data, free_port(), pg_log, user)
    try:
        try:
            cluster._run(
                "initdb", "-D", str(data), "-U", "postgres", "-A", "trust", "--no-sync",
                "-E", "UTF8",
            )  # fmt: skip
            with open(data / "postgresql.conf", "a") as conf:
                # A throwaway cluster: no fsync, and room for two nodes' pools.
                conf.write(
                    "listen_addresses = '127.0.0.1'\nfsync = off\nsynchronous_commit = off\n"
                    "full_page_writes = off\nmax_connections = 200\n"
                )
            cluster.start()
        except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
            yield f"a private PostgreSQL could not start: {exc}"
            return
        yield cluster
    finally:
        if cluster.running():
            with suppress(RuntimeError, subprocess.TimeoutExpired):
                cluster.stop("immediate")
        if pg_log.exists():
            shutil.copyfile(pg_log, log)
        shutil.rmtree(folder, ignore_errors=True)
