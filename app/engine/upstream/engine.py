"""An upstream engine: the Engine contract over HTTP to an OpenAI-compatible server, or to
a server of another kind (kinds/).

vLLM, SGLang, llama-server, Ollama or another batchyard serve `/v1/chat/completions` and
friends; an `UpstreamEngine` hands them the request body as sent and resolves the future with
the body they answer. One asyncio loop in its own thread owns the HTTP client and the queue:

- Online requests go ahead of batch lines (a heap keyed by priority, then arrival).
- At most `window` requests are in flight. The window is AIMD-like: it halves on 429 or 503
  (once per round trip), grows by about one per window of fast successes, never above
  `concurrency`, and a `Retry-After` pauses every new request until it has passed.
- Connection errors, timeouts and 5xx are tried again with exponential backoff, a bounded
  number of times; only the final outcome resolves the future, so a line's result is
  recorded once. The upstream's own 4xx is the request's error: its status and error body.
- A server that cannot be reached (connection refused, connect timeout, no DNS name) or
  answers 502/503/504 through every retry is down, not the request's fault: the request
  fails with `EngineUnavailable`, the engine marks itself down (its lane stops claiming)
  and its down-watch probes its list of models (`/v1/models`) every couple of seconds until
  the server answers again. A 500 that stays, or a broken connection mid-answer, is still
  the request's error.
- `cancel` drops a queued request and aborts a running one's HTTP request.

The `--engine` grammar is in app/config/upstreams.py, one HTTP try and what its failure
means in attempt.py, the down-watch in watch.py, the window in window.py, and the upstream's
wire (its paths and headers, its request bodies, the reading of its answers: errors,
Retry-After, streams, its list of models) in its kind's module: kinds/openai.py for the
`openai` kind, chosen by the spec's kind through the table KINDS of app/config/upstreams.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import heapq
import itertools
import logging
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import aiohttp

from app.config.upstreams import UpstreamSpec
from app.engine.base import (
    ChunkCallback,
    EngineError,
    EngineStats,
    EngineUnavailable,
    ModelInfo,
    Priority,
    RequestCancelled,
    engine_closed,
    resolve,
)
from app.engine.counters import Counters
from app.engine.upstream.attempt import Retry, UpstreamJob, attempt
from app.engine.upstream.http1 import Http1Pool
from app.engine.upstream.kinds import kind_of
from app.engine.upstream.watch import DownWatch
from app.engine.upstream.window import AdaptiveWindow
from app.wire.endpoints import ENDPOINTS

log = logging.getLogger("batchyard.upstream")

#: A retry waits the spec's `backoff` (0.5 s unless set), then twice as long each time, at
#: most BACKOFF_MAX_S (or the server's Retry-After).
BACKOFF_MAX_S = 30.0


@dataclass
class UpstreamStatus:
    """What the engines page and /metrics show about one upstream besides EngineStats."""

    up: bool
    last_error: str | None
    models: list[str]
    window: int
    concurrency: int
    retries_total: int
    throttled_total: int


class UpstreamEngine:
    """The Engine protocol over HTTP to one upstream server, speaking its spec's kind."""

    #: How many times its slots a node's claims may hand it (Lane.depth). bench/fleet.py,
    #: 10,000 lines to a 20 ms upstream at C=64 on 2 cores, medians of 2 rounds: 2 -> 4 took
    #: SQLite from 1,970 to 2,244 lines/s and PostgreSQL from 1,412 to 1,655; at 2 the
    #: client's queue was empty at about half of its looks every 50 ms, its 64 requests
    #: coming back in waves faster than the runner's steps refilled it.
    lane_depth = 4

    def __init__(self, spec: UpstreamSpec) -> None:
        self.spec = spec
        self.name = spec.name
        #: Its wire's name (a name in KINDS), and the wire itself.
        self.kind = spec.kind
        self._wire = kind_of(spec)
        self._lock = threading.Lock()
        self._jobs: dict[Future[dict[str, Any]], UpstreamJob] = {}
        self._seq = itertools.count()
        self._closing = False
        # Owned by the loop thread:
        self._queue: list[UpstreamJob] = []
        self._running: set[UpstreamJob] = set()
        self._waiting = 0  # jobs sleeping out their backoff
        self._window = AdaptiveWindow(spec.concurrency)
        self._pause_timer: asyncio.TimerHandle | None = None
        self._client: aiohttp.ClientSession | None = None
        self._pool: Http1Pool | None = None
        self._watch = DownWatch(spec, self._name_by_first_model)
        # Read from any thread (under _lock):
        self._counters = Counters()
        self._retries_total = 0
        self._throttled_total = 0
        self.info = model_info(spec)
        self._loop = new_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name=f"upstream-{spec.name}", daemon=True
        )

    # ------------------------------------------------------------------ life

    def start(self, discover_timeout: float = 5.0, *, quiet: bool = False) -> None:
        """Start the loop thread and read the upstream's models once (waiting at most
        `discover_timeout` seconds: a server that is down is looked at again later).
        `quiet`: no log line (the client process's node logs its own)."""
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._open(), self._loop).result(10)
        first = asyncio.run_coroutine_threadsafe(self._watch.look(), self._loop)
        # A slow or down upstream is retried by the watcher.
        with contextlib.suppress(Exception):
            first.result(discover_timeout)
        if quiet:
            return
        log.info(
            "engine=%s url=%s up=%s models=%s concurrency=%d",
            self.name,
            self.spec.url,
            self._watch.up,
            ",".join(self.models()) or "-",
            self.spec.concurrency,
        )

    async def _open(self) -> None:
        headers = self._wire.headers(self.spec)
        # aiohttp, not httpx: httpx's pool scans every connection on each request, which
        # took a quarter of this thread at 64 connections (bench/fleet.py); aiohttp's
        # connector hands a free connection over in constant time.
        self._client = aiohttp.ClientSession(
            headers=headers,
            # The timeout is a wait for the next bytes, as long as a stream goes on.
            timeout=aiohttp.ClientTimeout(total=None, connect=10.0, sock_read=self.spec.timeout),
            connector=aiohttp.TCPConnector(limit=self.spec.concurrency + 2),
            # One stream event is one line: room for long ones.
            read_bufsize=1 << 20,
        )
        # Answers in one piece (every batch line) go through the lean pool: about a third
        # of aiohttp's CPU a request (http1.py); streams and the probe stay on aiohttp.
        self._pool = Http1Pool(
            self.spec.root,
            {k: v for k, v in headers.items() if k != "Content-Type"},
            connect_timeout=10.0,
            read_timeout=self.spec.timeout,
        )
        self._watch.start(self._client)

    def close(self) -> None:
        with self._lock:
            if self._closing:
                return
            self._closing = True
        if self._thread.ident is not None:
            try:
                asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(15)
            finally:
                self._loop.call_soon_threadsafe(self._loop.stop)
                self._thread.join(5)
        with self._lock:
            pending = list(self._jobs.values())
        for job in pending:
            self._settle(job, error=engine_closed())
        if not self._loop.is_running():
            self._loop.close()

    async def _shutdown(self) -> None:
        self._watch.stop()
        for job in list(self._running):
            if job.task is not None:
                job.task.cancel()
        self._queue.clear()
        if self._running:
            await asyncio.wait([j.task for j in self._running if j.task is not None], timeout=5)
        if self._client is not None:
            await self._client.close()
        if self._pool is not None:
            await self._pool.close()

    # ------------------------------------------------------------------ the contract

    def submit(
        self,
        endpoint: str,
        body: dict[str, Any],
        *,
        priority: Priority = Priority.ONLINE,
        on_chunk: ChunkCallback | None = None,
    ) -> Future[dict[str, Any]]:
        if endpoint not in ENDPOINTS:
            raise ValueError(f"unknown endpoint {endpoint!r}")
        try:
            payload = self._wire.encode(endpoint, body)
        except EngineError as exc:  # a parameter its kind refuses (kinds/thoughts.py)
            return refused(exc)
        job = self._job(endpoint, payload, bool(body.get("stream")), priority, on_chunk)
        if job is not None:
            self._loop.call_soon_threadsafe(self._enqueue, job)
        return job.future if job is not None else closed_future()

    def submit_encoded(
        self,
        endpoint: str,
        payload: bytes,
        *,
        stream: bool,
        priority: Priority,
        on_chunk: ChunkCallback | None = None,
    ) -> Future[dict[str, Any]]:
        """`submit` of a body already encoded for the wire (its kind's `encode`), called on
        the engine's own loop thread (the client process's bridge, process.py): queued at
        once, no hop."""
        if endpoint not in ENDPOINTS:
            raise ValueError(f"unknown endpoint {endpoint!r}")
        job = self._job(endpoint, payload, stream, priority, on_chunk)
        if job is None:
            return closed_future()
        self._enqueue(job)
        return job.future

    def _job(
        self,
        endpoint: str,
        payload: bytes,
        stream: bool,
        priority: Priority,
        on_chunk: ChunkCallback | None,
    ) -> UpstreamJob | None:
        """A new request, registered; None once the engine is closing."""
        job = UpstreamJob(int(priority), next(self._seq), endpoint, payload, stream, on_chunk)
        with self._lock:
            if self._closing:
                return None
            self._jobs[job.future] = job
        return job

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The loop the engine's HTTP client runs on, in its own thread."""
        return self._loop

    def cancel(self, future: Future[dict[str, Any]]) -> None:
        with self._lock:
            job = self._jobs.get(future)
        if job is None or future.done():
            return
        if self._settle(job, error=RequestCancelled()):
            self._count("cancelled")
        if not self._closing:
            self._loop.call_soon_threadsafe(self._abort, job)

    def prompt_tokens(self, endpoint: str, body: dict[str, Any]) -> int | None:  # noqa: ARG002 - the Engine contract
        """The upstream's tokenizer is not here: no count."""
        return None

    def image_form(self, model: str | None) -> tuple[str, int]:  # noqa: ARG002 - the Engine contract
        """What its `images=` and `image_max_side=` say."""
        return (self.spec.image_mode, self.spec.image_max_side)

    def stats(self) -> EngineStats:
        with self._lock:
            active, queued = len(self._running), len(self._queue) + self._waiting
        return self._counters.snapshot(active=active, queued=queued)

    # ------------------------------------------------------------------ what it serves

    def models(self) -> list[str]:
        """The model names routed here: the configured ones, then the upstream's own."""
        found = [str(m.get("id")) for m in self._watch.discovered() if m.get("id")]
        return list(dict.fromkeys([*self.spec.models, *found]))

    def model_cards(self) -> list[dict[str, Any]]:
        """`/v1/models` entries for this upstream's models (its own `created` and `owned_by`)."""
        found = {str(m.get("id")): m for m in self._watch.discovered() if m.get("id")}
        cards = []
        for name in self.models():
            m = found.get(name, {})
            created = m.get("created")
            cards.append(
                {
                    "id": name,
                    "created": created if isinstance(created, int) else self.info.created,
                    "owned_by": str(m.get("owned_by") or self.name),
                }
            )
        return cards

    @property
    def up(self) -> bool:
        """Whether its server answers: its last probe of its models did, and no request has
        found it down since (the runner claims nothing for a down engine's lane)."""
        return self._watch.up

    def status(self) -> UpstreamStatus:
        up, error = self._watch.up, self._watch.last_error
        with self._lock:
            retries, throttled = self._retries_total, self._throttled_total
        return UpstreamStatus(
            up=up,
            last_error=error,
            models=self.models(),
            window=self._window.limit(),
            concurrency=self.spec.concurrency,
            retries_total=retries,
            throttled_total=throttled,
        )

    def _name_by_first_model(self) -> None:
        """Its first model names it on /health, when none was configured (called by the
        down-watch after each look that read the upstream's models)."""
        if not self.spec.models and self.models():
            self.info = dataclasses.replace(self.info, id=self.models()[0])

    # ------------------------------------------------------------------ the loop thread

    def _enqueue(self, job: UpstreamJob) -> None:
        if job.future.done():
            return
        heapq.heappush(self._queue, job)
        self._pump()

    def _abort(self, job: UpstreamJob) -> None:
        if job.task is not None and not job.task.done():
            job.task.cancel()  # closes its connection: the upstream stops work on it
        if job.backoff is not None:  # no next try, and off the queue depth now, not after it
            job.backoff.cancel()
            job.backoff = None
            self._waiting -= 1
        # A queued one is skipped when it comes up.

    def _pump(self) -> None:
        """Start queued jobs while the window has room and no Retry-After pause holds."""
        while self._queue and not self._closing:
            wait = self._window.paused_until - time.monotonic()
            if wait > 0:
                if self._pause_timer is None:
                    self._pause_timer = self._loop.call_later(wait, self._resume)
                return
            if len(self._running) >= self._window.limit():
                return
            job = heapq.heappop(self._queue)
            if job.future.done():
                continue
            self._running.add(job)
            job.task = self._loop.create_task(self._run(job))

    def _resume(self) -> None:
        self._pause_timer = None
        self._pump()

    def _requeue(self, job: UpstreamJob) -> None:
        job.backoff = None
        self._waiting -= 1
        self._enqueue(job)

    async def _run(self, job: UpstreamJob) -> None:
        job.started = time.monotonic()
        try:
            assert self._client is not None and self._pool is not None
            result = await attempt(job, self.spec, self._wire, self._client, self._pool)
        except asyncio.CancelledError:
            pass  # cancel() or close() already settled it
        except Retry as retry:
            self._after_retriable(job, retry)
        except EngineError as exc:
            if self._settle(job, error=exc):
                self._count("failed")
        except Exception as exc:  # a broken answer fails this request alone
            log.exception("engine=%s request failed", self.name)
            err = EngineError(
                f"The upstream engine '{self.name}' gave an answer batchyard could not read: {exc}",
                status_code=502,
                code="upstream_error",
                type="server_error",
            )
            if self._settle(job, error=err):
                self._count("failed")
        else:
            self._window.grow()
            if self._settle(job, result=result):
                self._count("succeeded", result.get("usage"))
        finally:
            self._running.discard(job)
            self._pump()

    def _after_retriable(self, job: UpstreamJob, retry: Retry) -> None:
        if retry.throttle:
            self._shrink(job, retry.retry_after)
        job.attempts += 1
        if job.emitted or job.attempts > self.spec.retries or job.future.done():
            error = retry.error
            if retry.down and not job.emitted:
                self._watch.mark_down(error.message)
                error = EngineUnavailable(error.message)
            if self._settle(job, error=error):
                self._count("unavailable" if retry.down else "failed")
            return
        with self._lock:
            self._retries_total += 1
        delay = retry.retry_after
        if delay is None:
            delay = min(BACKOFF_MAX_S, self.spec.backoff * 2 ** (job.attempts - 1))
        log.info(
            "engine=%s retry=%d in=%.2fs reason=%r",
            self.name,
            job.attempts,
            delay,
            retry.error.message,
        )
        self._waiting += 1
        job.backoff = self._loop.call_later(delay, self._requeue, job)

    def _shrink(self, job: UpstreamJob, retry_after: float | None) -> None:
        with self._lock:
            self._throttled_total += 1
        self._window.shrink(job.started, retry_after)

    # ------------------------------------------------------------------ bookkeeping

    def _settle(
        self,
        job: UpstreamJob,
        *,
        result: dict[str, Any] | None = None,
        error: BaseException | None = None,
    ) -> bool:
        """Forget the job and resolve its future once (see base.resolve)."""
        with self._lock:
            self._jobs.pop(job.future, None)
        return resolve(job.future, result=result, error=error)

    def _count(self, outcome: str, usage: object = None) -> None:
        self._counters.count(outcome)
        self._counters.usage(usage)


def model_info(spec: UpstreamSpec) -> ModelInfo:
    """What /v1/models, /health and the engines page say of an upstream before it answers."""
    return ModelInfo(
        id=spec.models[0] if spec.models else spec.name,
        path=spec.url,
        size_bytes=0,
        quantization="",
        n_ctx_train=0,
        ctx_per_slot=0,
        n_slots=spec.concurrency,
        backend="upstream",
        n_gpu_layers=0,
        embedding_dim=0,
        has_chat_template=True,
        created=int(time.time()),
    )


def closed_future() -> Future[dict[str, Any]]:
    """The answer to a request sent to an engine that is shutting down."""
    return refused(engine_closed())


def refused(error: EngineError) -> Future[dict[str, Any]]:
    """The answer to a request refused before it was sent: its error."""
    future: Future[dict[str, Any]] = Future()
    future.set_exception(error)
    return future


def new_loop() -> asyncio.AbstractEventLoop:
    """The upstream thread's loop: uvloop where it is installed (it runs the HTTP client's
    callbacks at about half the CPU of asyncio's own loop), else asyncio's."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


__all__ = ["UpstreamEngine", "UpstreamStatus", "model_info", "refused"]
