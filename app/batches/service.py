"""The batches service: create, read, list, cancel and retry batches, and read their lines
(pages for the dashboard's explorer, one line, what finished so far, progress over time).
Their wire shape: app/wire/batches.py."""

from __future__ import annotations

import builtins
import json
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlmodel import col, func, select

from app.batches.lifecycle.output import CHUNK, result_rows
from app.config import Settings
from app.db import Database
from app.errors import APIError, invalid, missing, not_found
from app.files.service import parse_expires_after
from app.tables import Batch, BatchStatus, File, Request, RequestStatus, new_id, now
from app.wire.batches import OutputExpiresAfter, batch_output_line, encode_line
from app.wire.endpoints import ENDPOINTS

if TYPE_CHECKING:
    from app.batches.runner import Runner

METADATA_MAX_PAIRS, METADATA_KEY_MAX, METADATA_VALUE_MAX = 16, 64, 512

#: The explorer's filters, by the line statuses each shows. "failed" is what the error file
#: holds (failed and expired lines); cancelled lines never ran and show under "all" only.
#: The lines a retry runs again (the `failed` filter).
FAILED_LINES = (RequestStatus.FAILED, RequestStatus.EXPIRED)
LINE_FILTERS: dict[str, tuple[str, ...] | None] = {
    "all": None,
    "succeeded": (RequestStatus.SUCCEEDED,),
    "failed": FAILED_LINES,
    "pending": (RequestStatus.PENDING, RequestStatus.RUNNING),
}
#: Lines that count as done (the batch's completed + failed counters).
COUNTED = (RequestStatus.SUCCEEDED, RequestStatus.FAILED, RequestStatus.EXPIRED)
#: A partial download's kinds, by the line statuses each holds (as the finished files will).
PARTIAL_KINDS = {"output": (RequestStatus.SUCCEEDED,), "errors": FAILED_LINES}
LINES_PAGE_MAX = 200
CUSTOM_ID_SEARCH_MAX = 512
#: The metadata keys that link a retry and the batch it retried.
RETRY_OF, RETRIED_BY = "retry_of", "retried_by"


@dataclass
class LinePage:
    rows: list[Request]
    has_more: bool
    next_after: int | None


@dataclass
class LineDetail:
    request: Request
    #: The input line as sent ({"custom_id", "method", "url", "body"}); None if unreadable.
    input: dict[str, Any] | None


@dataclass
class NodeAtWork:
    """A node (a `serve` or `worker` process) holding lines now, for the engines page."""

    node_id: str
    #: Lines it runs now, every owner's.
    running: int
    #: The viewer's batches among them (another owner's are only counted).
    batch_ids: list[str]
    #: Whether it is the node answering (this process's runner).
    this_node: bool


def check_metadata(metadata: object) -> dict[str, str] | None:
    if metadata is None:
        return None
    if not isinstance(metadata, dict):
        raise invalid(
            "metadata must be an object of string keys and string values.", param="metadata"
        )
    if len(metadata) > METADATA_MAX_PAIRS:
        raise invalid(
            f"metadata may hold at most {METADATA_MAX_PAIRS} pairs; got {len(metadata)}.",
            param="metadata",
        )
    for key, value in metadata.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise invalid("metadata keys and values must be strings.", param=f"metadata.{key}")
        if len(key) > METADATA_KEY_MAX:
            raise invalid(
                f"metadata keys may be at most {METADATA_KEY_MAX} characters; '{key[:20]}…' has {len(key)}.",
                param="metadata",
            )
        if len(value) > METADATA_VALUE_MAX:
            raise invalid(
                f"metadata values may be at most {METADATA_VALUE_MAX} characters; the value of '{key}' has {len(value)}.",
                param=f"metadata.{key}",
            )
    return metadata


class BatchService:
    def __init__(self, settings: Settings, db: Database, runner: Runner) -> None:
        self.settings = settings
        self.db = db
        self.runner = runner

    def create(  # noqa: PLR0917 - callers pass the wire's fields in order; typed in issue 47 part 4
        self,
        owner: str,
        input_file_id: str,
        endpoint: str,
        completion_window: str = "24h",
        metadata: dict[str, str] | None = None,
        output_expires_after: OutputExpiresAfter | None = None,
    ) -> Batch:
        if not input_file_id or not isinstance(input_file_id, str):
            raise missing("input_file_id")
        if endpoint not in ENDPOINTS:
            raise invalid(
                f"Invalid endpoint {json.dumps(endpoint)}. Supported endpoints: {', '.join(ENDPOINTS)}.",
                param="endpoint",
            )
        windows = self.settings.allowed_windows
        if not isinstance(completion_window, str) or completion_window not in windows:
            raise invalid(
                f"Invalid completion_window {json.dumps(completion_window)}. Supported: "
                f"{', '.join(repr(w) for w in windows)} (this server's --completion-windows).",
                param="completion_window",
            )
        meta = check_metadata(metadata)
        out_ttl = None
        if output_expires_after is not None:
            out_ttl = parse_expires_after(
                output_expires_after.anchor, output_expires_after.seconds, "output_expires_after"
            )
        created = now()
        with self.db.write() as s:
            # Locked, so that a delete on another node waits for this batch to exist.
            f = s.get(File, input_file_id, with_for_update=True)
            if f is None or f.owner != owner or f.deleted_at is not None:
                raise APIError(
                    400,
                    f"The input file '{input_file_id}' does not exist.",
                    param="input_file_id",
                    code="file_not_found",
                )
            if f.purpose != "batch":
                raise invalid(
                    f"The input file '{input_file_id}' has purpose '{f.purpose}'; a batch needs a file "
                    "uploaded with purpose 'batch'.",
                    param="input_file_id",
                )
            batch = Batch(
                id=new_id("batch_"),
                owner=owner,
                endpoint=endpoint,
                input_file_id=input_file_id,
                completion_window=completion_window,
                status=BatchStatus.VALIDATING,
                metadata_json=json.dumps(meta) if meta is not None else None,
                output_expires_after=out_ttl,
                created_at=created,
                expires_at=created + self.settings.window_seconds(completion_window),
            )
            s.add(batch)
        self.runner.wake()
        return batch

    def get(self, batch_id: str, owner: str) -> Batch:
        with self.db.read() as s:
            b = s.get(Batch, batch_id)
            if b is None or b.owner != owner:
                raise not_found("batch", batch_id, param="batch_id")
            return b

    def get_many(self, owner: str, ids: Sequence[str]) -> dict[str, Batch]:
        """The owner's batches among `ids`, by id, in one read (the live list polls this)."""
        if not ids:
            return {}
        with self.db.read() as s:
            rows = s.exec(
                select(Batch).where(Batch.owner == owner, col(Batch.id).in_(list(ids)))
            ).all()
        return {b.id: b for b in rows}

    def list(
        self, owner: str, *, limit: int = 20, after: str | None = None
    ) -> tuple[list[Batch], bool]:
        with self.db.read() as s:
            q = select(Batch).where(Batch.owner == owner)
            if after:
                cursor = s.get(Batch, after)
                if cursor is None or cursor.owner != owner:
                    raise not_found("batch", after, param="after")
                q = q.where(col(Batch.created_ns) < cursor.created_ns)
            q = q.order_by(col(Batch.created_ns).desc()).limit(limit + 1)
            rows = list(s.exec(q).all())
        return rows[:limit], len(rows) > limit

    def cancel(self, batch_id: str, owner: str) -> Batch:
        self.get(batch_id, owner)  # 404 for another owner's batch
        return self.runner.cancel(batch_id)

    def nodes_at_work(self, owner: str) -> builtins.list[NodeAtWork]:
        """Each node holding lines now (running, lease not yet lapsed): how many, and which of
        `owner`'s batches. A node running nothing is not listed (there is no node table).
        Read through the batches not finished (a subquery, so that SQLite's planner too goes
        through the lines' (batch_id, status) index instead of scanning every line)."""
        t = time.time()
        unfinished = select(Batch.id).where(col(Batch.status).not_in(BatchStatus.FINISHED))
        with self.db.read() as s:
            rows = s.exec(
                select(Request.claimed_by, Batch.id, Batch.owner, func.count())
                .join(Batch, col(Batch.id) == col(Request.batch_id))
                .where(
                    col(Request.batch_id).in_(unfinished),
                    Request.status == RequestStatus.RUNNING,
                    col(Request.claimed_by).is_not(None),
                    col(Request.lease_until) >= t,
                )
                .group_by(col(Request.claimed_by), col(Batch.id), col(Batch.owner))
            ).all()
        nodes: dict[str, NodeAtWork] = {}
        me = self.runner.worker_id
        for node_id, batch_id, batch_owner, count in rows:
            node = nodes.setdefault(node_id, NodeAtWork(node_id, 0, [], node_id == me))
            node.running += count
            if batch_owner == owner:
                node.batch_ids.append(batch_id)
        for node in nodes.values():
            node.batch_ids.sort()
        # This node first, then the busiest.
        return sorted(nodes.values(), key=lambda n: (not n.this_node, -n.running, n.node_id))

    # -- the results explorer: pages of lines, one line, partial output, progress, retry ----

    def line_counts(self, batch_id: str, owner: str) -> dict[str, int]:
        """How many lines each explorer filter shows (one indexed GROUP BY)."""
        self.get(batch_id, owner)
        with self.db.read() as s:
            rows = s.exec(
                select(Request.status, func.count())
                .where(Request.batch_id == batch_id)
                .group_by(col(Request.status))
            ).all()
        by_status = dict(rows)
        counts = {
            name: sum(by_status.get(st, 0) for st in statuses)
            for name, statuses in LINE_FILTERS.items()
            if statuses
        }
        counts["all"] = sum(by_status.values())
        return counts

    def lines(
        self,
        batch_id: str,
        owner: str,
        *,
        status: str = "all",
        search: str = "",
        after: int = 0,
        limit: int = 50,
    ) -> LinePage:
        """One page of a batch's lines in input order, `after` a line number (keyset paging),
        filtered by status and by a piece of `custom_id`; works while the batch runs."""
        if status not in LINE_FILTERS:
            raise invalid(
                f"Invalid status filter {json.dumps(status)}. Expected one of: "
                f"{', '.join(LINE_FILTERS)}.",
                param="status",
            )
        if not 1 <= limit <= LINES_PAGE_MAX:
            raise invalid(
                f"limit must be between 1 and {LINES_PAGE_MAX}; got {limit}.", param="limit"
            )
        if len(search) > CUSTOM_ID_SEARCH_MAX:
            raise invalid(
                f"The search may be at most {CUSTOM_ID_SEARCH_MAX} characters; got {len(search)}.",
                param="q",
            )
        self.get(batch_id, owner)
        q = select(Request).where(Request.batch_id == batch_id, col(Request.line) > after)
        statuses = LINE_FILTERS[status]
        if statuses:
            q = q.where(col(Request.status).in_(statuses))
        if search:
            q = q.where(col(Request.custom_id).contains(search, autoescape=True))
        with self.db.read() as s:
            rows = list(s.exec(q.order_by(col(Request.line)).limit(limit + 1)).all())
        has_more = len(rows) > limit
        rows = rows[:limit]
        return LinePage(
            rows=rows, has_more=has_more, next_after=rows[-1].line if has_more and rows else None
        )

    def line(self, batch_id: str, owner: str, line: int) -> LineDetail:
        """One line: its input (read back from the input file) and its answer or error."""
        batch = self.get(batch_id, owner)
        with self.db.read() as s:
            req = s.exec(
                select(Request).where(Request.batch_id == batch_id, Request.line == line)
            ).first()
        if req is None:
            raise not_found("line", str(line), param="line")
        try:
            raw = self.runner.storage.read_range(batch.input_file_id, req.offset, req.length)
            source: dict[str, Any] | None = json.loads(raw.decode("utf-8"))
        except (OSError, ValueError):  # the input file expired or was deleted
            source = None
        return LineDetail(request=req, input=source)

    def inputs(
        self, batch: Batch, rows: builtins.list[Request], max_line_bytes: int
    ) -> dict[int, dict[str, Any] | None]:
        """The input lines of `rows` (a page of `lines` of this batch, already the owner's),
        by line number, read in blocks of neighbours; a line longer than `max_line_bytes`,
        or one that can no longer be read, is None."""
        shown = [r for r in rows if r.length <= max_line_bytes]
        out: dict[int, dict[str, Any] | None] = {r.line: None for r in rows}
        try:
            raws = self.runner.storage.read_spans(
                batch.input_file_id, [(r.offset, r.length) for r in shown]
            )
        except OSError:  # the input file expired or was deleted
            return out
        for r, raw in zip(shown, raws, strict=True):
            try:
                out[r.line] = json.loads(raw.decode("utf-8"))
            except ValueError:
                out[r.line] = None
        return out

    def finished_output(self, batch_id: str, owner: str, kind: str) -> Iterator[bytes]:
        """The output (`kind` "output") or error lines ("errors") of the lines finished so
        far, in input order, as the output files will hold them; read in chunks."""
        if kind not in PARTIAL_KINDS:
            raise invalid(
                f"Invalid kind {json.dumps(kind)}. Expected one of: {', '.join(PARTIAL_KINDS)}.",
                param="kind",
            )
        self.get(batch_id, owner)
        statuses = PARTIAL_KINDS[kind]

        def chunks() -> Iterator[bytes]:
            last = 0
            while rows := result_rows(self.db, batch_id, statuses, last):
                yield b"".join(encode_line(batch_output_line(r)) for r in rows)
                last = rows[-1].line

        return chunks()

    def progress_series(self, batch_id: str, owner: str) -> builtins.list[tuple[int, int, int]]:
        """(second, lines finished in it, tokens generated by them) for each second in which
        lines finished: the batch's whole life, from its rows, for the chart and `run`."""
        self.get(batch_id, owner)
        with self.db.read() as s:
            rows = s.exec(
                select(Request.finished_at, func.count(), func.sum(Request.completion_tokens))
                .where(
                    Request.batch_id == batch_id,
                    col(Request.status).in_(COUNTED),
                    col(Request.finished_at).is_not(None),
                )
                .group_by(col(Request.finished_at))
                .order_by(col(Request.finished_at))
            ).all()
        return [(int(t), int(n), int(tok or 0)) for t, n, tok in rows]

    def retry(self, batch_id: str, owner: str) -> Batch:
        """A new batch of the failed lines' original input lines (a new input file), linked
        both ways in metadata: `retry_of` on the new batch, `retried_by` on this one."""
        batch = self.get(batch_id, owner)
        if batch.status not in BatchStatus.FINISHED or batch.status == BatchStatus.FAILED:
            raise invalid(
                f"Batch {batch_id} is {batch.status}: only a completed, cancelled or expired "
                "batch's failed lines can be retried.",
                param="batch_id",
            )
        storage = self.runner.storage
        partial = storage.begin_write(self.settings.max_batch_file_bytes)
        count = 0
        try:
            last = 0
            while True:
                with self.db.read() as s:
                    rows = s.exec(
                        select(Request.line, Request.offset, Request.length)
                        .where(
                            Request.batch_id == batch_id,
                            col(Request.line) > last,
                            col(Request.status).in_(FAILED_LINES),
                        )
                        .order_by(col(Request.line))
                        .limit(CHUNK)
                    ).all()
                if not rows:
                    break
                # Read in blocks of neighbouring lines: one ranged GET each on a bucket.
                spans = [(offset, length) for _line, offset, length in rows]
                for raw in storage.read_spans(batch.input_file_id, spans):
                    partial.write(raw.rstrip(b"\r") + b"\n")
                    count += 1
                last = rows[-1][0]
        except FileNotFoundError:
            partial.discard()
            raise invalid(
                f"The input file {batch.input_file_id} of batch {batch_id} no longer exists, "
                "so its lines cannot be read again.",
                param="batch_id",
            ) from None
        except BaseException:
            partial.discard()
            raise
        if count == 0:
            partial.discard()
            raise invalid(f"Batch {batch_id} has no failed lines to retry.", param="batch_id")
        retry_file = self.runner.files.create(
            partial=partial, filename=f"{batch_id}_retry.jsonl", purpose="batch", owner=owner
        )
        meta = json.loads(batch.metadata_json) if batch.metadata_json else {}
        meta.pop(RETRIED_BY, None)
        meta.pop(RETRY_OF, None)
        meta = dict(list(meta.items())[: METADATA_MAX_PAIRS - 1])
        meta[RETRY_OF] = batch_id
        new = self.create(owner, retry_file.id, batch.endpoint, metadata=meta)
        with self.db.write() as s:
            row = s.get(Batch, batch_id)
            assert row is not None
            linked = json.loads(row.metadata_json) if row.metadata_json else {}
            if RETRIED_BY not in linked and len(linked) >= METADATA_MAX_PAIRS:
                linked.pop(next(iter(linked)))  # the oldest pair makes room for the link
            linked[RETRIED_BY] = new.id
            row.metadata_json = json.dumps(linked)
            s.add(row)
        return new

    def owner_of(self, batch_id: str) -> str:
        """Whose a batch is: for `batchyard retry`, which acts on the data dir it is given."""
        with self.db.read() as s:
            b = s.get(Batch, batch_id)
        if b is None:
            raise not_found("batch", batch_id, param="batch_id")
        return b.owner
