"""`batchyard run`: one JSONL file in, its output (and error) JSONL out, with no HTTP server;
or a sheet (.csv, .tsv, .xlsx) and a prompt template in, the sheet with its answers out.

It takes the API's own path: a state data dir holds the database and the files,
`FileService` stores the input, `BatchService.create` makes the batch, the real `Runner`
validates, claims and records every line on the real engine, and the batch's output and
error files are copied to where the user asked. A sheet takes `SheetService`'s path, as the
dashboard does: its rows become the input file, and the results are joined back to them.
A folder of images is a sheet of their names (written in the state dir), one row each. An
interrupted run leaves its state dir behind; `--resume` starts the runner on it again, and
lines already recorded stay done.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shlex
import shutil
import signal
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, TextIO

from app.batches import throughput
from app.batches.claims.projection import seconds_left
from app.batches.lifecycle.validate import first_endpoint
from app.batches.throughput import duration
from app.config import Settings
from app.errors import APIError
from app.runtime.logs import LOG_FORMAT
from app.sheets.images import IMAGE_SUFFIXES, folder_images, write_folder_sheet
from app.sheets.requests import SheetSpec
from app.tables import Batch, BatchStatus

if TYPE_CHECKING:
    from app.services import Services

log = logging.getLogger("batchyard.offline")

#: The owner of offline batches: the same one the API uses when no API keys are set.
OWNER = ""
#: A short lease, so that a resumed run takes back the lines of the interrupted one at once.
OFFLINE_LEASE_SECONDS = 2
#: An offline run has no completion window; lines never expire while it runs.
OFFLINE_WINDOW_SECONDS = 10 * 365 * 24 * 3600
#: What the state dir remembers about its run, to resume it.
RUN_FILE = "run.json"
#: The sheet a folder of images becomes, in the state dir.
FOLDER_SHEET = "folder.csv"
#: Seconds between progress lines when stderr is not a terminal.
PLAIN_PROGRESS_EVERY_S = 5.0
BAR_WIDTH = 28

#: Exit codes (also in `batchyard run --help`).
EXIT_OK = 0
EXIT_INVALID = 1  # the input failed validation, or the batch did not complete
EXIT_USAGE = 2
EXIT_SOME_FAILED = 3  # completed, but some lines failed (see the errors file)
EXIT_INTERRUPTED = 130


class RunError(Exception):
    """A problem with the command line or the state dir, reported in one line."""


@dataclass
class RunOptions:
    input: Path
    output: Path
    errors: Path | None = None
    state_dir: Path | None = None
    endpoint: str | None = None
    resume: bool = False
    #: The template and output columns when the input is a sheet.
    sheet: SheetSpec | None = None

    @property
    def state(self) -> Path:
        return self.state_dir or self.output.with_name(self.output.name + ".batchyard-state")

    @property
    def source(self) -> Path:
        """The file the run stores: the input, or the sheet a folder of images becomes."""
        return self.state / FOLDER_SHEET if self.input.is_dir() else self.input

    @property
    def source_name(self) -> str:
        return f"{self.input.resolve().name}.csv" if self.input.is_dir() else self.input.name


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def offline_settings(overrides: dict[str, Any], state: Path) -> Settings:
    """The settings of an offline run: flags and env as for serve, over the state dir."""
    values = {k: v for k, v in overrides.items() if v is not None}
    values.setdefault("log_level", "warning")
    values.update(
        data_dir=str(state),
        database_url="",  # always the state dir's own SQLite file
        files_url="",  # and its own files: the run copies its output out of them
        lease_seconds=OFFLINE_LEASE_SECONDS,
        batch_window_seconds=OFFLINE_WINDOW_SECONDS,
    )
    return Settings.load(values)


# -- progress ---------------------------------------------------------------------------


class Progress:
    """Lines done / total, tokens/s and ETA: a redrawn bar on a terminal, else plain lines."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.tty = stream.isatty()
        self.started = time.monotonic()
        self.last_plain = 0.0
        self.drawn = False

    def _line(
        self, done: int, total: int, tok_s: float, finish_at: float | None, deadline: float | None
    ) -> str:
        elapsed = time.monotonic() - self.started
        finish = ""
        # The runner's projection (batches/claims/projection.py), as the dashboard shows it.
        eta = duration(seconds_left(finish_at, time.time(), total=total, done=done))
        if finish_at is not None and total > done:
            finish = f"  finishes {time.strftime('%H:%M:%S', time.localtime(finish_at))}"
        if deadline is not None and total > done:
            finish += f"  deadline {time.strftime('%H:%M:%S', time.localtime(deadline))}"
        pct = 100.0 * done / total if total else 0.0
        text = f"{done}/{total} lines ({pct:.0f}%)  {tok_s:.1f} tok/s  ETA {eta}{finish}"
        if self.tty:
            filled = int(BAR_WIDTH * done / total) if total else 0
            return f"[{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {text}"
        return f"progress: {text}  elapsed {duration(elapsed)}"

    def update(
        self,
        done: int,
        total: int,
        tok_s: float,
        *,
        final: bool = False,
        finish_at: float | None = None,
        deadline: float | None = None,
    ) -> None:
        """Draw the bar (or print a line); `finish_at` is the projected finish, `deadline`
        the batch's window's end (a run has none), both unix seconds."""
        line = self._line(done, total, tok_s, finish_at, deadline)
        if self.tty:
            self.stream.write("\r\x1b[2K" + line)
            if final:
                self.stream.write("\n")
            self.drawn = not final
            self.stream.flush()
            return
        t = time.monotonic()
        if final or t - self.last_plain >= PLAIN_PROGRESS_EVERY_S:
            self.last_plain = t
            print(line, file=self.stream, flush=True)

    def end_line(self) -> None:
        """Leave the bar's line before anything else is printed."""
        if self.tty and self.drawn:
            self.stream.write("\n")
            self.stream.flush()
            self.drawn = False


# -- the run ----------------------------------------------------------------------------


class _Interrupted(Exception):
    pass


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:  # noqa: ARG001 - signal's
    raise _Interrupted(signal.Signals(signum).name)


def _copy_out(storage_path: Path | None, dest: Path) -> None:
    """Copy a result file into place atomically (an empty file when there is none)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.partial")
    if storage_path is None:
        tmp.write_bytes(b"")
    else:
        shutil.copyfile(storage_path, tmp)
    os.replace(tmp, dest)


def _start_or_resume(opts: RunOptions, services: Services) -> Batch:
    """Store the input and create its batch, or find the batch of the run to resume."""
    digest = sha256_of(opts.source)
    if opts.resume:
        run_file = opts.state / RUN_FILE
        record = json.loads(run_file.read_text(encoding="utf-8"))
        if record.get("input_sha256") != digest:
            raise RunError(
                f"{opts.input} is not the file the interrupted run in {opts.state} started on "
                "(its contents differ); run without --resume, or give that run's --state-dir."
            )
        return services.batches.get(record["batch_id"], OWNER)
    if opts.sheet is not None:
        with open(opts.source, "rb") as fh:
            stored = services.sheets.store(fh, opts.source_name, OWNER)
        batch = services.sheets.start(OWNER, stored.id, _with_model(opts.sheet, services))
        _remember(opts, digest, stored.id, batch.id)
        return batch
    with open(opts.input, "rb") as fh:
        stored = services.files.store(fh, filename=opts.input.name, purpose="batch", owner=OWNER)
    if opts.endpoint is None:
        with open(opts.input, "rb") as fh:
            endpoint = first_endpoint(fh)
    else:
        endpoint = opts.endpoint
    batch = services.batches.create(OWNER, stored.id, endpoint, "24h")
    _remember(opts, digest, stored.id, batch.id)
    return batch


def _with_model(sheet: SheetSpec, services: Services) -> SheetSpec:
    """The sheet's rows name the run's model (--model, a file or a name, else the embedded
    default) by the id the catalog gives it, as its answers will."""
    if sheet.model:
        return sheet
    from app.catalog import Catalog

    return replace(sheet, model=Catalog(services.settings).default().id)


def _remember(opts: RunOptions, digest: str, file_id: str, batch_id: str) -> None:
    """What `--resume` needs of this run, in the state dir."""
    (opts.state / RUN_FILE).write_text(
        json.dumps(
            {
                "input": str(opts.input.resolve()),
                "input_sha256": digest,
                "file_id": file_id,
                "batch_id": batch_id,
                "output": str(opts.output.resolve()),
                "started_at": int(time.time()),
            },
            indent=2,
        ),
        encoding="utf-8",
    )


def _prepare_state(opts: RunOptions) -> None:
    run_file = opts.state / RUN_FILE
    if opts.resume:
        if not run_file.is_file():
            raise RunError(
                f"there is no interrupted run to resume in {opts.state}; run without --resume."
            )
        return
    if not opts.state.exists():
        return
    if not run_file.is_file():
        raise RunError(
            f"{opts.state} exists and is not a batchyard run's state dir; "
            "give another --state-dir or remove it."
        )
    from app.db import Database

    record = json.loads(run_file.read_text(encoding="utf-8"))
    db = Database(Settings(data_dir=str(opts.state)).db_url)
    try:
        with db.read() as s:
            b = s.get(Batch, record.get("batch_id", ""))
            unfinished = b is not None and b.status in BatchStatus.ACTIVE
    finally:
        db.close()
    if unfinished:
        raise RunError(
            f"{opts.state} holds an interrupted run; add --resume to continue it, "
            "or remove that directory to start over."
        )
    shutil.rmtree(opts.state)  # a finished run's state: start afresh


def run_batch(
    opts: RunOptions,
    overrides: dict[str, Any],
    *,
    err: TextIO | None = None,
    argv: list[str] | None = None,
) -> int:
    """Run one input file to its output file; returns the exit code."""
    err = err or sys.stderr
    try:
        settings = _open_state(opts, overrides)
        with offline_services(settings) as services:
            run = _Run(opts, services, err)
            try:
                try:
                    run.batch = _start_or_resume(opts, services)
                except APIError as exc:
                    print(f"batchyard run: {exc.message}", file=err)
                    return EXIT_INVALID
                batch = _run_to_end(run, settings)
                if batch.status == BatchStatus.FAILED:
                    _report_invalid(run, batch)
                    return EXIT_INVALID
                _report_finished(run, batch)
            except _Interrupted as exc:
                _report_interrupt(run, exc, argv)
                return EXIT_INTERRUPTED
    except RunError as exc:
        print(f"batchyard run: {exc}", file=err)
        return EXIT_USAGE
    return _write_outputs(opts, services, batch, err)


@dataclass
class _Run:
    """One run in progress: what an interrupt report needs of it."""

    opts: RunOptions
    services: Services
    err: TextIO
    batch: Batch | None = None
    progress: Progress | None = None


def _open_state(opts: RunOptions, overrides: dict[str, Any]) -> Settings:
    """Check the input, prepare the state dir and read the settings (RunError: usage)."""
    folder = opts.sheet is not None and opts.input.is_dir()
    if not opts.input.is_file() and not folder:
        raise RunError(f"{opts.input}: no such file")
    if folder and not folder_images(opts.input):
        raise RunError(f"{opts.input} holds no {', '.join(IMAGE_SUFFIXES)} images.")
    if opts.sheet is not None:
        sheet_format(opts.output)
    from app.db import DatabaseError

    try:
        _prepare_state(opts)
    except DatabaseError as exc:  # another run holds the state dir
        raise RunError(str(exc)) from exc
    if folder:  # the same names in the same order make the same sheet (--resume checks it)
        opts.state.mkdir(parents=True, exist_ok=True)
        write_folder_sheet(opts.input, opts.source)
    try:
        settings = offline_settings(overrides, opts.state)
    except ValueError as exc:
        raise RunError(str(exc)) from exc
    logging.basicConfig(level=settings.log_level.upper(), format=LOG_FORMAT)
    return settings


@contextmanager
def offline_services(settings: Settings) -> Iterator[Services]:
    """The services on the state dir, with SIGINT and SIGTERM raising _Interrupted while
    they are open; on the way out the signals are restored, the runner stopped, the engine
    (once attached) closed and the database closed."""
    from app.db import DatabaseError
    from app.services import build_services

    try:
        services = build_services(settings)
    except DatabaseError as exc:
        raise RunError(str(exc)) from exc
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    for sig in previous:
        signal.signal(sig, _raise_interrupt)
    try:
        yield services
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        services.runner.stop()
        if services.engine is not None:
            services.engine.close()
        services.db.close()


def _run_to_end(run: _Run, settings: Settings) -> Batch:
    """Load the engine, start the runner and show progress until the batch ends."""
    from app.engine.registry import EngineRegistry, start_pool

    assert run.batch is not None, "_start_or_resume first"
    opts, services, err = run.opts, run.services, run.err
    # The embedded models alone, as `serve` runs them: a batch names one of the catalog's.
    engine = EngineRegistry(start_pool(settings), [])
    services.attach_engine(engine)
    print(
        f"batchyard run: {opts.input} -> {opts.output}  "
        f"model {engine.info.id} on {engine.info.backend}, {engine.info.n_slots} slots  "
        f"state {opts.state}",
        file=err,
        flush=True,
    )
    batch = run.batch = services.batches.get(run.batch.id, OWNER)
    progress = run.progress = Progress(err)
    while batch.status in BatchStatus.ACTIVE:
        if batch.status != BatchStatus.VALIDATING:
            projection = services.runner.projections.get(batch.id)
            progress.update(
                batch.completed + batch.failed,
                batch.total,
                engine.stats().tokens_per_second,
                finish_at=projection.finish_at if projection is not None else None,
            )
        time.sleep(0.25 if progress.tty else 0.5)
        batch = run.batch = services.batches.get(batch.id, OWNER)
    return batch


def _report_invalid(run: _Run, batch: Batch) -> None:
    """The validation errors of a batch that failed before any line ran."""
    if run.progress is not None:
        run.progress.end_line()
    print(f"batchyard run: {run.opts.input} failed validation:", file=run.err)
    for e in json.loads(batch.errors_json or "[]"):
        where = f"line {e['line']}" if e.get("line") else "file"
        print(f"  {where}: {e['message']} [{e['code']}]", file=run.err)


def _report_finished(run: _Run, batch: Batch) -> None:
    """The final progress line and the throughput report."""
    if run.progress is not None:
        run.progress.update(batch.completed + batch.failed, batch.total, 0.0, final=True)
    # The same figures as the dashboard's throughput chart, from the same rows.
    tp = throughput.of_batch(
        batch, run.services.batches.progress_series(batch.id, OWNER), time.time()
    )
    for line in throughput.report(tp):
        print(f"batchyard run: {line}", file=run.err, flush=True)


def _report_interrupt(run: _Run, exc: _Interrupted, argv: list[str] | None) -> None:
    """Stop the runner, then say how far the run got and how to resume it."""
    batch, opts = run.batch, run.opts
    done = (batch.completed + batch.failed) if batch is not None else 0
    total = batch.total if batch is not None else 0
    if run.progress is not None:
        run.progress.end_line()
    run.services.runner.stop()
    if batch is not None:
        batch = run.services.batches.get(batch.id, OWNER)
        done, total = batch.completed + batch.failed, batch.total
    words = list(argv or ["batchyard", "run", str(opts.input), "-o", str(opts.output)])
    resume = shlex.join(words if "--resume" in words else [*words, "--resume"])
    print(
        f"batchyard run: stopped by {exc}; {done} of {total} lines are done and kept in "
        f"{opts.state}.\nResume with: {resume}",
        file=run.err,
        flush=True,
    )


def _write_outputs(opts: RunOptions, services: Services, batch: Batch, err: TextIO) -> int:
    if services.sheets.sheet_of(batch.id, OWNER) is not None:
        return _write_sheet(opts, services, batch, err)
    storage = services.storage
    out = storage.path(batch.output_file_id) if batch.output_file_id else None
    _copy_out(out, opts.output)
    errors_to = opts.errors
    if errors_to is None and batch.error_file_id:
        errors_to = opts.output.with_name(opts.output.stem + ".errors.jsonl")
    if errors_to is not None:
        _copy_out(storage.path(batch.error_file_id) if batch.error_file_id else None, errors_to)
    return _summary(
        batch,
        "lines",
        f"output {opts.output}" + (f", errors {errors_to}" if batch.failed else ""),
        err,
    )


def _write_sheet(opts: RunOptions, services: Services, batch: Batch, err: TextIO) -> int:
    """The sheet with its answers (the output's ending says CSV or XLSX), written atomically."""
    opts.output.parent.mkdir(parents=True, exist_ok=True)
    tmp = opts.output.with_name(f".{opts.output.name}.partial")
    try:
        with open(tmp, "wb") as fh:
            services.sheets.export(batch.id, OWNER, sheet_format(opts.output), fh)
        os.replace(tmp, opts.output)
    finally:
        tmp.unlink(missing_ok=True)
    return _summary(
        batch,
        "rows",
        f"sheet {opts.output}"
        + (" (failed rows say why in its error column)" if batch.failed else ""),
        err,
    )


def _summary(batch: Batch, unit: str, written: str, err: TextIO) -> int:
    """The run's last line on stderr (how it ended, the counts, where the results are),
    and its exit status."""
    if batch.status != BatchStatus.COMPLETED:
        print(f"batchyard run: the batch ended {batch.status}.", file=err)
        return EXIT_INVALID
    usage = f"{batch.input_tokens} tokens in, {batch.output_tokens} out"
    if batch.reasoning_tokens:  # a thinking model's: its thoughts' share of the tokens out
        usage += f" ({batch.reasoning_tokens} of them reasoning)"
    print(
        f"batchyard run: {batch.completed} {unit} succeeded, {batch.failed} failed ({usage}); "
        + written,
        file=err,
    )
    return EXIT_SOME_FAILED if batch.failed else EXIT_OK


def sheet_format(output: Path) -> str:
    """csv or xlsx, by the output's name (RunError for any other)."""
    suffix = output.suffix.lower().lstrip(".")
    if suffix not in ("csv", "xlsx"):
        raise RunError(f"{output}: the output of a sheet is a .csv or an .xlsx file.")
    return suffix
