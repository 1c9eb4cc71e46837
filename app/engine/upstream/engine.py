"""An upstream engine: the Engine contract over HTTP to an OpenAI-compatible server.

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
  and probes `/v1/models` every couple of seconds until the server answers again.
  A 500 that stays, or a broken connection mid-answer, is still the request's error.
- `cancel` drops a queued request and aborts a running one's HTTP request.

The `--engine` grammar is in app/config/upstreams.py, the window in window.py, and the reading
of the upstream's answers (errors, Retry-After, streams) in wire.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
import heapq
import itertools
import logging
import threading
import time
from collections.abc import Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from app import jsoncodec
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
from app.engine.upstream.http1 import ConnectError, Http1Pool, ResponseError
from app.engine.upstream.window import AdaptiveWindow
from app.engine.upstream.wire import StreamAssembler, error_from, retry_after_seconds
from app.wire.endpoints import ENDPOINTS

log = logging.getLogger("batchyard.upstream")

#: Statuses that mean "too busy now": the window shrinks and the request waits its turn again.
THROTTLE_STATUSES = frozenset({429, 503})
#: Statuses tried again with backoff (besides connection errors and timeouts).
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
#: Statuses that, when they outlast the retries, mean the server (or the proxy in front of
#: it) is down rather than that the request is bad.
DOWN_STATUSES = frozenset({502, 503, 504})
BACKOFF_BASE_S = 0.5
BACKOFF_MAX_S = 30.0
#: How often the upstream's /v1/models is read again (its models, and whether it is up).
WATCH_INTERVAL_S = 15.0
WATCH_INTERVAL_DOWN_S = 2.0


@dataclass(order=True)
class _Job:
    priority: int
    seq: int
    endpoint: str = field(compare=False)
    payload: bytes = field(compare=False)  # the request body as JSON, encoded once
    stream: bool = field(compare=False)
    on_chunk: ChunkCallback | None = field(compare=False, default=None)
    future: Future[dict[str, Any]] = field(compare=False, default_factory=Future)
    task: asyncio.Task[None] | None = field(compare=False, default=None)
    attempts: int = field(compare=False, default=0)
    started: float = field(compare=False, default=0.0)
    emitted: bool = field(compare=False, default=False)  # a chunk went out: no retry
    backoff: asyncio.TimerHandle | None = field(compare=False, default=None)  # its next try

    __hash__ = object.__hash__  # one job is one request: the running set holds it by identity


class _Retry(Exception):
    """One attempt failed in a way worth trying again; `error` is what the caller gets if
    the tries run out."""

    def __init__(
        self,
        error: EngineError,
        *,
        throttle: bool = False,
        retry_after: float | None = None,
        down: bool = False,
    ) -> None:
        super().__init__(error.message)
        self.error = error
        self.throttle = throttle
        self.retry_after = retry_after
        #: The server could not be reached or said it is unavailable: if the retries run
        #: out on this, the engine is down (EngineUnavailable), not the request bad.
        self.down = down


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
    """The Engine protocol over HTTP to one OpenAI-compatible server."""

    kind = "openai"
    #: How many times its slots a node's claims may hand it (Lane.depth). bench/fleet.py,
    #: 10,000 lines to a 20 ms upstream at C=64 on 2 cores, medians of 2 rounds: 2 -> 4 took
    #: SQLite from 1,970 to 2,244 lines/s and PostgreSQL from 1,412 to 1,655; at 2 the
    #: client's queue was empty at about half of its looks every 50 ms, its 64 requests
    #: coming back in waves faster than the runner's steps refilled it.
    lane_depth = 4

    def __init__(self, spec: UpstreamSpec) -> None:
        self.spec = spec
        self.name = spec.name
        self._lock = threading.Lock()
        self._jobs: dict[Future[dict[str, Any]], _Job] = {}
        self._seq = itertools.count()
        self._closing = False
        # Owned by the loop thread:
        self._queue: list[_Job] = []
        self._running: set[_Job] = set()
        self._waiting = 0  # jobs sleeping out their backoff
        self._window = AdaptiveWindow(spec.concurrency)
        self._pause_timer: asyncio.TimerHandle | None = None
        self._client: aiohttp.ClientSession | None = None
        self._pool: Http1Pool | None = None
        self._watcher: asyncio.Task[None] | None = None
        self._look_now: asyncio.Event | None = None  # set when a request found it down
        # Read from any thread (under _lock):
        self._discovered: list[dict[str, Any]] = []
        self._up = False
        self._last_error: str | None = None
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
        first = asyncio.run_coroutine_threadsafe(self._discover(), self._loop)
        try:
            first.result(discover_timeout)
        except Exception:  # noqa: BLE001 - a slow or down upstream is retried by the watcher
            pass
        if quiet:
            return
        log.info(
            "engine=%s url=%s up=%s models=%s concurrency=%d",
            self.name,
            self.spec.url,
            self._up,
            ",".join(self.models()) or "-",
            self.spec.concurrency,
        )

    async def _open(self) -> None:
        headers = {"Content-Type": "application/json"}
        if self.spec.key:
            headers["Authorization"] = f"Bearer {self.spec.key}"
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
        self._look_now = asyncio.Event()
        self._watcher = asyncio.create_task(self._watch())

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
        if self._watcher is not None:
            self._watcher.cancel()
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
        payload = jsoncodec.dumps_bytes(body)
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
        """`submit` of a body already encoded as JSON, called on the engine's own loop
        thread (the client process's bridge, process.py): queued at once, no hop."""
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
    ) -> _Job | None:
        """A new request, registered; None once the engine is closing."""
        job = _Job(int(priority), next(self._seq), endpoint, payload, stream, on_chunk)
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

    def stats(self) -> EngineStats:
        with self._lock:
            active, queued = len(self._running), len(self._queue) + self._waiting
        return self._counters.snapshot(active=active, queued=queued)

    # ------------------------------------------------------------------ what it serves

    def models(self) -> list[str]:
        """The model names routed here: the configured ones, then the upstream's own."""
        with self._lock:
            found = [str(m.get("id")) for m in self._discovered if m.get("id")]
        return list(dict.fromkeys([*self.spec.models, *found]))

    def model_cards(self) -> list[dict[str, Any]]:
        """`/v1/models` entries for this upstream's models (its own `created` and `owned_by`)."""
        with self._lock:
            found = {str(m.get("id")): m for m in self._discovered if m.get("id")}
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

    def serves(self, model: str) -> bool:
        return model in self.models()

    @property
    def up(self) -> bool:
        """Whether its server answers: its last /v1/models probe did, and no request has
        found it down since (the runner claims nothing for a down engine's lane)."""
        with self._lock:
            return self._up

    def status(self) -> UpstreamStatus:
        with self._lock:
            up, error = self._up, self._last_error
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

    async def _discover(self) -> None:
        assert self._client is not None
        try:
            async with self._client.get(
                self.spec.root + "/v1/models", timeout=aiohttp.ClientTimeout(total=10.0)
            ) as r:
                r.raise_for_status()
                answer = jsoncodec.loads(await r.read())
            data = answer.get("data")
            if not isinstance(data, list):
                raise ValueError("GET /v1/models answered without a `data` list")
        except Exception as exc:  # noqa: BLE001 - any failure means "not up"; say why
            reason = f"{type(exc).__name__}: {exc}"
            with self._lock:
                was_up, self._up, self._last_error = self._up, False, reason
            if was_up:
                log.warning("engine=%s is down: %s", self.name, reason)
            return
        with self._lock:
            self._discovered = [m for m in data if isinstance(m, dict)]
            self._up, self._last_error = True, None
        if not self.spec.models and self.models():  # its first model names it on /health
            self.info = dataclasses.replace(self.info, id=self.models()[0])

    async def _watch(self) -> None:
        assert self._look_now is not None
        while True:
            # An upstream that is down (or still loading its model) is looked at more often.
            interval = WATCH_INTERVAL_S if self._up else WATCH_INTERVAL_DOWN_S
            try:
                await asyncio.wait_for(self._look_now.wait(), interval)
                await asyncio.sleep(WATCH_INTERVAL_DOWN_S)  # marked down: probe shortly
            except asyncio.TimeoutError:
                pass
            self._look_now.clear()
            await self._discover()

    def _mark_down(self, reason: str) -> None:
        """A request found the server down: stop claiming for it until a probe of its
        /v1/models answers (the watcher looks every WATCH_INTERVAL_DOWN_S from now)."""
        with self._lock:
            was_up, self._up, self._last_error = self._up, False, reason
        if was_up:
            log.warning("engine=%s is down: %s", self.name, reason)
        if self._look_now is not None:
            self._look_now.set()

    # ------------------------------------------------------------------ the loop thread

    def _enqueue(self, job: _Job) -> None:
        if job.future.done():
            return
        heapq.heappush(self._queue, job)
        self._pump()

    def _abort(self, job: _Job) -> None:
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

    def _requeue(self, job: _Job) -> None:
        job.backoff = None
        self._waiting -= 1
        self._enqueue(job)

    async def _run(self, job: _Job) -> None:
        job.started = time.monotonic()
        try:
            result = await self._attempt(job)
        except asyncio.CancelledError:
            pass  # cancel() or close() already settled it
        except _Retry as retry:
            self._after_retriable(job, retry)
        except EngineError as exc:
            if self._settle(job, error=exc):
                self._count("failed")
        except Exception as exc:  # noqa: BLE001 - a broken answer fails this request alone
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

    def _after_retriable(self, job: _Job, retry: _Retry) -> None:
        if retry.throttle:
            self._shrink(job, retry.retry_after)
        job.attempts += 1
        if job.emitted or job.attempts > self.spec.retries or job.future.done():
            error = retry.error
            if retry.down and not job.emitted:
                self._mark_down(error.message)
                error = EngineUnavailable(error.message)
            if self._settle(job, error=error):
                self._count("unavailable" if retry.down else "failed")
            return
        with self._lock:
            self._retries_total += 1
        delay = retry.retry_after
        if delay is None:
            delay = min(BACKOFF_MAX_S, BACKOFF_BASE_S * 2 ** (job.attempts - 1))
        log.info(
            "engine=%s retry=%d in=%.2fs reason=%r",
            self.name,
            job.attempts,
            delay,
            retry.error.message,
        )
        self._waiting += 1
        job.backoff = self._loop.call_later(delay, self._requeue, job)

    def _shrink(self, job: _Job, retry_after: float | None) -> None:
        with self._lock:
            self._throttled_total += 1
        self._window.shrink(job.started, retry_after)

    async def _attempt(self, job: _Job) -> dict[str, Any]:
        assert self._client is not None and self._pool is not None
        url = self.spec.root + job.endpoint
        try:
            if job.stream:
                return await self._stream(job, url)
            answer = await self._pool.post(job.endpoint, job.payload)
            if answer.status != 200:
                raise self._http_error(answer.status, answer.body, answer.headers)
            data = jsoncodec.loads(answer.body)
            if not isinstance(data, dict):
                raise ValueError("the answer is not a JSON object")
            return data
        except (aiohttp.ClientError, asyncio.TimeoutError, ConnectError, ResponseError) as exc:
            # refused, reset, timed out: the upstream's trouble
            raise _Retry(
                EngineError(
                    f"The upstream engine '{self.name}' could not be reached at {self.spec.url} "
                    f"(tried {job.attempts + 1} times): {type(exc).__name__}: {exc}",
                    status_code=502,
                    code="upstream_unavailable",
                    type="server_error",
                ),
                # No connection at all (refused, no DNS name, connect timed out): down. A
                # connection broken mid-answer may be this request's doing: its own error.
                down=isinstance(
                    exc,
                    (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError, ConnectError),
                ),
            ) from exc

    async def _stream(self, job: _Job, url: str) -> dict[str, Any]:
        assert self._client is not None
        chunks = StreamAssembler()
        async with self._client.post(url, data=job.payload) as r:
            if r.status != 200:
                raise self._http_error(r.status, await r.read(), r.headers)
            async for raw in r.content:
                line = raw.decode("utf-8").strip()
                if not line.startswith("data:"):
                    continue
                data = line[len("data:") :].strip()
                if data == "[DONE]":
                    break
                chunk = jsoncodec.loads(data)
                if isinstance(chunk, dict) and (
                    isinstance(chunk.get("error"), dict) or chunk.get("type") == "error"
                ):  # the upstream failed mid-stream: the API relays the error as its own
                    raise error_from(500, chunk, self.name)
                job.emitted = True
                chunks.add(chunk)
                if job.on_chunk is not None and not job.future.done():
                    job.on_chunk(chunk)
        return chunks.body(job.endpoint)

    def _http_error(self, status: int, content: bytes, headers: Mapping[str, str]) -> Exception:
        try:
            parsed = jsoncodec.loads(content)
        except ValueError:
            parsed = content.decode("utf-8", "replace")[:1000]
        error = error_from(status, parsed, self.name)
        if status in RETRY_STATUSES:
            return _Retry(
                error,
                throttle=status in THROTTLE_STATUSES,
                retry_after=retry_after_seconds(headers.get("retry-after")),
                down=status in DOWN_STATUSES,
            )
        return error

    # ------------------------------------------------------------------ bookkeeping

    def _settle(
        self, job: _Job, *, result: dict[str, Any] | None = None, error: BaseException | None = None
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
    future: Future[dict[str, Any]] = Future()
    future.set_exception(engine_closed())
    return future


def new_loop() -> asyncio.AbstractEventLoop:
    """The upstream thread's loop: uvloop where it is installed (it runs the HTTP client's
    callbacks at about half the CPU of asyncio's own loop), else asyncio's."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


__all__ = ["UpstreamEngine", "UpstreamStatus", "model_info"]
