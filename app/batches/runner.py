"""The runner: one thread per node that claims lines, hands them to the engine and records
each result the moment its future resolves.

A node is a runner plus, optionally, the HTTP API; nodes never talk to each other, the
database is the only coordination. Claims carry a lease that the runner renews while it
holds them. A crash simply stops the renewals: when the lease runs out the line is claimed
again, by this node or another, with the same query that claims a fresh line (FOR UPDATE
SKIP LOCKED on PostgreSQL, so two nodes never take one line). A result is written only by
the holder of the claim, so no line is recorded twice. Validation, cancel and expiry live
in lifecycle.py, the leases in leases.py, the writing of results in recording.py, output
files in finalize.py.

An engine that is down (`EngineUnavailable`: its upstream cannot be reached) is not the
line's fault: the line goes back to the queue without using an attempt, and the engine's
lane claims nothing more until the engine says it is up again. Only the batch's completion
window ends such lines (`batch_expired`). A line whose input cannot be read because the
files' store is away (the object store did not answer: `input_away`) waits the same way.
"""

from __future__ import annotations

import logging
import queue
import time
from collections import Counter
from collections.abc import Callable, Container
from concurrent.futures import Future
from functools import partial
from typing import Any

from sqlmodel import Session, select

from app.batches.claims.claims import Claim, claim, waiting_lines
from app.batches.claims.leases import Leases
from app.batches.claims.pauses import LanePauses
from app.batches.claims.projection import Projections
from app.batches.lifecycle import lifecycle
from app.batches.lifecycle.finalize import FINALIZE_RETRY_DELAYS, Finalizer
from app.batches.lifecycle.output import sweep_orphans
from app.batches.lifecycle.recording import (
    Held,
    Result,
    exhausted,
    failed,
    input_away,
    record_done,
    unreadable,
)
from app.batches.lifecycle.validate import ModelRules
from app.batches.nodes import NodeNames
from app.config import Settings
from app.db import Database
from app.engine.base import Engine, EngineError, EngineUnavailable, Priority
from app.engine.node import demand, lanes, pooled, run_as
from app.files.service import FileService
from app.files.storage import Storage
from app.images import ImageResolver
from app.runtime import jsoncodec
from app.runtime.polling import PollingThread
from app.tables import Batch, BatchStatus

log = logging.getLogger("batchyard.runner")

#: Seconds between two looks for batches to validate, cancel, expire or finalize when
#: nothing on this node asked for one: a step that only records results skips them.
POLL_INTERVAL = 0.25
#: The same while this node runs lines: their results wake it (the hot path records them
#: and claims into their room), and each look is several transactions, whose CPU comes
#: out of the engine's cores. At 0.25 s they took 6-7% of a core through a batch of long
#: prompts on 2 cores (bench/README.md).
BUSY_POLL_INTERVAL = 1.0
#: Seconds one step may spend validating batches one after another. Batches created together
#: then start together, and the model pool hears of all their lines at once: told of the
#: first alone, it would swap the loaded model out for that one's model, and the next
#: batch's model might be the one it had (bench/models.py: 4 loads where 3 do).
VALIDATE_BUDGET = 0.2
#: Seconds a step woken by a result waits for more (bench/fleet.py: steps of one or two
#: results each cost more runner time than the lines they recorded).
RESULT_GATHER_S = 0.01
#: Seconds between two counts of the lines waiting for each model (the model pool's
#: demand): a GROUP BY over the pending lines, so not every step; at least DEMAND_SHARE
#: times the last count's own time apart (60,000 pending lines on SQLite: 43 ms a count).
DEMAND_INTERVAL = 1.0
DEMAND_SHARE = 50
#: Seconds between two sweeps of expired files.
SWEEP_INTERVAL = 60.0
#: Files and temporary uploads younger than this are never swept at start-up: on a shared
#: files location they may be another node's upload or output in the making.
SWEEP_MIN_AGE = 3600.0


class Runner:
    def __init__(
        self,
        settings: Settings,
        db: Database,
        storage: Storage,
        files: FileService,
        engine: Engine | None,
        *,
        node_id: str = "",
        sweep_interval: float = SWEEP_INTERVAL,
        finalize_retry_delays: tuple[float, ...] = FINALIZE_RETRY_DELAYS,
    ) -> None:
        self.settings = settings
        self.db = db
        self.storage = storage
        self.files = files
        self.engine = engine
        #: Reads each line's images into its engine's form before the line reaches it
        #: (app/images/); lines without images go straight to the engine.
        self.images = ImageResolver(settings, files)
        #: Who holds a claim (Request.claimed_by): unique to this process, so a restarted
        #: node never renews the leases of the one that died.
        self.worker_id = node_id or settings.new_node_id()
        self.leases = Leases(db, self.worker_id, settings.lease_seconds)
        self._thread = PollingThread(
            "batchyard-runner", self._tick, POLL_INTERVAL, log=log, on_exit=self._shut_down
        )
        self._results: queue.Queue[Result] = queue.Queue()
        # request id -> (batch id, future, lane) for every line handed to the engine
        self._held: dict[str, Held] = {}
        self._last_sweep = 0.0
        self._sweep_interval = sweep_interval
        self._finalizer = Finalizer(
            settings,
            db,
            storage,
            files,
            retry_delays=finalize_retry_delays,
            ended=self._ended,
        )
        # Set when a batch ended: deleted input files it held may be released.
        self._batch_ended = False
        #: Run every sweep interval, after the files' sweep (the services add theirs).
        self.sweeps: list[Callable[[], object]] = []
        #: This node's published model names and the other nodes' (nodes.py), set by the
        #: services: it beats on every step at its own pace and withdraws at a clean stop.
        self.nodes: NodeNames | None = None
        #: How validation judges a batch's model (the services set it; None: any model runs).
        self.models: ModelRules | None = None
        #: Called with the transaction and the batch each time a batch reaches a final
        #: status, before it commits (the webhooks service queues its event here).
        self.end_hooks: list[Callable[[Session, Batch], object]] = []
        #: Each batch in progress's projected finish (projection.py): sampled each step at
        #: its own pace; it hears of each end to record how far it was off.
        self.projections = Projections(db)
        self.end_hooks.append(self.projections.ended)
        # Set by wake(): this node's API created or cancelled a batch, so the next step
        # looks for lifecycle work at once instead of at the next poll.
        self._poked = False
        self._last_poll = 0.0
        #: Lanes whose engine was found down: they claim nothing until it is up again.
        self.pauses = LanePauses()
        self._last_demand = 0.0
        self._demand_cost = 0.0  # seconds the last count of waiting lines took
        # Batches from before routes get theirs once, at this node's first poll.
        self._routed_old = False
        #: Why the files' store was last found away (a read of lines' input failed), until
        #: a read succeeds again: see _wait_for_store.
        self._store_away: str | None = None

    # -- lifecycle ----------------------------------------------------------------------

    @property
    def _engine(self) -> Engine:
        # The runner is started (and stepped) only once an engine is attached.
        assert self.engine is not None, "the runner needs an engine"
        return self.engine

    @property
    def held(self) -> int:
        """Lines this node has handed to its engine and not yet recorded."""
        return len(self._held)

    def start(self) -> None:
        # With one SQLite file this is the only process; on a shared files location other
        # nodes may be writing right now, so only old leftovers are swept.
        min_age = 0.0 if self.db.is_sqlite else SWEEP_MIN_AGE
        self.storage.sweep_tmp(min_age=min_age)
        sweep_orphans(self.db, self.storage, min_age=min_age)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._thread.stop(timeout)

    def wake(self) -> None:
        self._poked = True
        self._thread.wake()

    def _tick(self) -> None:
        """One step of the runner's thread: woken by a result, it only records and claims;
        the look for lifecycle work waits for the poll interval or a wake()."""
        interval = BUSY_POLL_INTERVAL if self._held else POLL_INTERVAL
        poll = self._poked or time.monotonic() - self._last_poll >= interval
        if not poll and self._held and not self._thread.stopping:
            # Woken by a result: let the next few come back too, so that one step records
            # them in one transaction; the engine's queue (a room ahead) keeps it busy.
            time.sleep(RESULT_GATHER_S)
        self.step(poll=poll)
        # Unwoken, the thread sleeps until the next look is due, and while it holds lines
        # wakes at least twice in each third of a lease, when leases are renewed (leases.py).
        busy = min(BUSY_POLL_INTERVAL, max(POLL_INTERVAL, self.settings.lease_seconds / 6))
        self._thread.interval = busy if self._held else POLL_INTERVAL

    def _shut_down(self) -> None:
        """The thread's last act once stopped: withdraw what the engine still runs and
        hand the claims back."""
        for _, fut, _ in list(self._held.values()):
            self.images.cancel(self._engine, fut)
        try:
            self._release_claims()
        except Exception:
            log.exception("claims not handed back; their leases will lapse")
        if self.nodes is not None:
            try:
                self.nodes.withdraw()
            except Exception:
                log.exception("model names not withdrawn; they lapse with the node's lease")

    def _release_claims(self) -> None:
        """On a clean stop, hand this node's running lines back to the queue at once
        (leases.py) instead of making other nodes wait for the lease."""
        if not self._held:
            return
        self.leases.release()
        self._held.clear()

    def step(self, *, poll: bool = True) -> None:
        """One pass over the work there is. Public so tests can drive it directly.

        `poll=False` (the loop, woken by results between two polls) records the results,
        claims lines into the room they left and finalizes what they finished; it skips the
        look for batches to validate, cancel or expire. Those queries took about a third of
        the runner's time while it was woken for each result (bench/README.md).
        """
        self._renew_leases()
        if poll:
            recorded = self._record_results()
            self._poked = False
            self._last_poll = time.monotonic()
            self._route_old_batches()
            self._validate_next()
            self._cancel_requested()
            self._expire_due()
            self._claim_and_submit()
            self._feed_demand()  # what still waits once this step has claimed
            self._finalizer.finalize_ready()
        else:
            # The hot path: the results and the claims into the room they left, one commit.
            recorded = self._record_results(claim=True)
            # A batch with a line this node still runs is not finished: no need to look.
            running = {h.batch_id for h in self._held.values()}
            if recorded - running:
                self._finalizer.finalize_ready(recorded - running)
        self.projections.sample()
        if self.nodes is not None:
            self.nodes.beat()
        if time.monotonic() - self._last_sweep > self._sweep_interval:
            self._last_sweep = time.monotonic()
            self._batch_ended = False
            self.files.sweep_expired()
            for sweep in self.sweeps:
                sweep()
        elif self._batch_ended:
            self._batch_ended = False
            self.files.release_deleted()

    def _ended(self, s: Session, b: Batch) -> None:
        """Every transition to a final status calls this, in its transaction."""
        self._batch_ended = True
        for hook in self.end_hooks:
            hook(s, b)

    # -- validation, cancel, expiry (lifecycle.py) --------------------------------------

    def _validate_next(self) -> None:
        """Validate the batches waiting, oldest first, for VALIDATE_BUDGET seconds at most."""
        start, changed = time.monotonic(), False
        while lifecycle.validate_next(
            self.settings, self.db, self.storage, self._ended, self.models
        ):
            changed = True
            if time.monotonic() - start >= VALIDATE_BUDGET:
                self.wake()  # there may be more: the next step goes on at once
                break
        if changed:
            # Their lines wait now: the model pool hears of them this step, not a second on
            # (a model with room for it loads at once).
            self._last_demand = float("-inf")

    def _route_old_batches(self) -> None:
        """Route the batches validated before routes were kept (lifecycle.route_unrouted),
        once, once this node knows the names other nodes serve."""
        if self._routed_old or self.models is None:
            return
        if self.nodes is not None:
            self.nodes.read_elsewhere()
        if lifecycle.route_unrouted(self.db, self.models):
            self._last_demand = float("-inf")
        self._routed_old = True

    def cancel(self, batch_id: str) -> Batch:
        """The API's cancel (called from an API thread, on any node)."""
        b = lifecycle.request_cancel(self.db, batch_id)
        self.wake()
        return b

    def _withdraw(self, batch_id: str) -> None:
        for bid, fut, _ in list(self._held.values()):
            if bid == batch_id:
                self.images.cancel(self._engine, fut)

    def _cancel_requested(self) -> None:
        with self.db.read() as s:
            ids = s.exec(select(Batch.id).where(Batch.status == BatchStatus.CANCELLING)).all()
        if ids:
            self._poked = True  # settle them as their withdrawn lines come back
        for batch_id in ids:
            self._withdraw(batch_id)
            if any(h.batch_id == batch_id for h in self._held.values()):
                continue  # their cancelled futures come back through _record_results
            left = lifecycle.settle_cancel(self.db, batch_id, self.worker_id, self._ended)
            if left == "finalize":
                self._finalizer.finalize(batch_id, BatchStatus.CANCELLED)

    def _expire_due(self) -> None:
        for batch_id in lifecycle.due_to_expire(self.db):
            self._withdraw(batch_id)
            if lifecycle.expire(self.db, batch_id):
                self._finalizer.finalize(batch_id, BatchStatus.EXPIRED)

    # -- claims (claims.py) -------------------------------------------------------------

    def _feed_demand(self) -> None:
        """Tell the engine's model pool which lines wait for which model (each second at
        most), so that it plans loads for models nothing asked for online. A node without
        a pool (upstreams only) counts nothing: the GROUP BY would only cost it."""
        if not pooled(self._engine):
            return
        start = time.monotonic()
        if start - self._last_demand < max(DEMAND_INTERVAL, DEMAND_SHARE * self._demand_cost):
            return
        with self.db.read() as s:
            lines = waiting_lines(s)
        self._last_demand = time.monotonic()
        self._demand_cost = self._last_demand - start
        demand(self._engine, lines)

    def _claim(self, s: Session, recorded: Container[str]) -> list[Claim]:
        """Claim lines in the caller's transaction, into the room left by the lines this
        node holds besides those `recorded` in it."""
        held = Counter(h.lane for rid, h in self._held.items() if rid not in recorded)
        risky = self.projections.at_risk()  # served ahead of shares, within a bound
        held_risky = (
            Counter(
                h.lane
                for rid, h in self._held.items()
                if h.batch_id in risky and rid not in recorded
            )
            if risky
            else None
        )
        return claim(
            s,
            self.pauses.open(lanes(self._engine)),
            held,
            self._held,
            worker_id=self.worker_id,
            lease_seconds=self.settings.lease_seconds,
            at_risk=risky,
            held_at_risk=held_risky,
        )

    def _claim_and_submit(self) -> None:
        with self.db.write() as s:
            claims = self._claim(s, ())
        self._submit_claims(claims)

    def _submit_claims(self, claims: list[Claim]) -> None:
        """Hand claimed lines to the engine (after their claim committed)."""
        by_file: dict[str, list[Claim]] = {}
        for c in claims:
            if not c.exhausted:
                by_file.setdefault(c.input_file_id, []).append(c)
        for file_id, group in by_file.items():
            self._submit_lines(file_id, group)
        for c in claims:
            if c.exhausted:
                self._hand_back(c, exhausted(c.attempts))

    def _submit_lines(self, file_id: str, group: list[Claim]) -> None:
        """Read the claimed lines of one input file in blocks and hand them to the engine."""
        try:
            raws = self.storage.read_spans(file_id, [(c.offset, c.length) for c in group])
        except Exception as exc:
            if input_away(exc):
                self._wait_for_store(file_id, group, exc)
                return
            for c in group:  # the file is gone or unreadable: its lines fail alone
                self._hand_back(c, unreadable(exc))
            return
        if self._store_away is not None:
            log.info("file=%s the store answers again: its lines run", file_id)
            self._store_away = None
        for c, raw in zip(group, raws, strict=True):
            self._submit(c, raw)

    def _wait_for_store(self, file_id: str, group: list[Claim], exc: Exception) -> None:
        """The store that holds the lines' input is away: they go back to the queue with
        their attempt unused, as lines whose engine is down do (`_record`), and their lanes
        pause for LANE_PAUSE_MIN (pauses.py) before they claim again, so the store is asked
        about once a LANE_PAUSE_MIN while it is away. Only the batch's window ends them."""
        if self._store_away is None:  # once an outage, not once a try
            log.warning(
                "file=%s lines=%d input unreadable, waiting for the store: %s",
                file_id,
                len(group),
                exc,
            )
        self._store_away = str(exc)
        for lane in {c.lane for c in group}:
            # Paused here, so that _record does not report their engine down: it is not.
            self.pauses.pause(lane)
        for c in group:
            self._hand_back(c, EngineUnavailable(f"The input line could not be read: {exc}"))

    def _submit(self, c: Claim, raw: bytes) -> None:
        try:
            body = jsoncodec.loads(raw)["body"]
        except Exception as exc:  # the file changed under us: fail this line alone
            self._hand_back(c, unreadable(exc))
            return
        if c.route is not None:
            # The model its batch was routed to at validation, by id, and for the default
            # route this node's default model's id: no engine reads the name written again
            # (it may differ in case, be an alias, or be taken by a model pulled since).
            model = run_as(self._engine, c.route, body.get("model"))
            if isinstance(model, EngineError):
                self._hand_back(c, model)
                return
            body["model"] = model
        if c.priority is not None:  # a lane with priority=on (claims.line_priority)
            body["priority"] = c.priority
        fut = self.images.submit(
            self._engine, c.endpoint, body, priority=Priority.BATCH, batch_id=c.batch_id
        )
        self._held[c.request_id] = Held(c.batch_id, fut, c.lane)
        fut.add_done_callback(partial(self._on_done, c.request_id, c.batch_id))

    def _hand_back(self, c: Claim, error: EngineError) -> None:
        """A claimed line that fails without reaching the engine: recorded like any result."""
        fut = failed(error)
        self._held[c.request_id] = Held(c.batch_id, fut, c.lane)
        self._on_done(c.request_id, c.batch_id, fut)

    def _on_done(self, request_id: str, batch_id: str, fut: Future[dict[str, Any]]) -> None:
        self._results.put((request_id, batch_id, fut))
        self._thread.wake()

    def _renew_leases(self) -> None:
        if self._held:
            self.leases.renew()

    # -- results ------------------------------------------------------------------------

    def _record_results(self, *, claim: bool = False) -> set[str]:
        """Record every result that came back, and with `claim` claim lines into the room
        they leave, in one transaction; the batches of the results."""
        done: list[Result] = []
        while True:
            try:
                done.append(self._results.get_nowait())
            except queue.Empty:
                break
        if not done and not claim:
            return set()
        claims: list[Claim] = []
        try:
            with self.db.write() as s:
                if done:
                    self._record(s, done)
                if claim:
                    claims = self._claim(s, {request_id for request_id, _, _ in done})
        except BaseException:
            # Nothing was written (one transaction): keep the results for the next step.
            for item in done:
                self._results.put(item)
            raise
        for request_id, _, _ in done:
            self._held.pop(request_id, None)
        self._submit_claims(claims)
        return {batch_id for _, batch_id, _ in done}

    def _record(self, s: Session, done: list[Result]) -> None:
        """Write the results in the caller's transaction (recording.py), and pause the lanes
        whose engine was found down."""
        down = record_done(s, done, self.worker_id, self._held, field=self.settings.reasoning_field)
        for lane in sorted(down):
            if self.pauses.pause(lane):
                log.warning("lane=%s engine unavailable: its lines wait in the queue", lane)
