"""An upstream engine whose HTTP client runs in a process of its own.

`UpstreamProcess` keeps `UpstreamEngine`'s surface (the Engine contract, its models, `up`
and status) and hands every request to a child process (child.py) that runs the engine
itself: the queue, the window, retries and the down-watch all live there. The node only
encodes each request body once and decodes each answer once; its runner and API threads
no longer share a GIL with the client's event loop (bench/fleet.py: that sharing kept one
node near 0.84x of a plain client on two cores).

The child sends its state (up or down, the models its /v1/models lists, the window and the
retry counts) when it changes; this side counts outcomes and tokens itself as the answers
arrive. A child that dies fails what it held with `EngineUnavailable` (the runner puts those
lines back in the queue without using an attempt) and is started again after a second.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import os
import subprocess
import sys
import threading
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from app.config.upstreams import UpstreamSpec
from app.engine.base import (
    ChunkCallback,
    EngineError,
    EngineStats,
    EngineUnavailable,
    Priority,
    RequestCancelled,
    engine_closed,
    resolve,
)
from app.engine.counters import Counters
from app.engine.upstream import UPSTREAM_COMMAND
from app.engine.upstream.engine import (
    UpstreamEngine,
    UpstreamStatus,
    closed_future,
    model_info,
    refused,
)
from app.engine.upstream.kinds import kind_of
from app.engine.upstream.pipe import (
    CANCELLED,
    READ_SIZE,
    UNAVAILABLE,
    FrameReader,
    frame,
    widen,
    write_all,
)
from app.runtime import jsoncodec
from app.toolchain.facts import child_program
from app.wire.endpoints import ENDPOINTS

log = logging.getLogger("batchyard.upstream")

#: Seconds before a client process that died is started again.
RESTART_DELAY_S = 1.0
#: Seconds the child may take to start (imports) on top of its first look at the upstream.
START_GRACE_S = 30.0
#: Seconds a closing child may take to finish before it is killed.
CLOSE_TIMEOUT_S = 15.0


def child_command() -> list[str]:
    """How to start the client process: `batchyard _upstream` in the single binary (where
    sys.executable is batchyard itself), else this Python with the module."""
    return child_program(UPSTREAM_COMMAND, "app.engine.upstream.child")


def _child_env() -> dict[str, str]:
    """The node's environment, with this package importable from wherever the child starts."""
    env = dict(os.environ)
    if not getattr(sys, "frozen", False):
        root = str(Path(__file__).resolve().parents[3])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    return env


class UpstreamProcess:
    """The Engine protocol over one upstream server, through a client process."""

    #: The engine its child runs: the same queue to keep filled (UpstreamEngine.lane_depth).
    lane_depth = UpstreamEngine.lane_depth

    def __init__(self, spec: UpstreamSpec) -> None:
        self.spec = spec
        self.name = spec.name
        #: Its wire's name (a name in KINDS), and the wire: this side encodes each request.
        self.kind = spec.kind
        self._wire = kind_of(spec)
        self.info = model_info(spec)
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._seq = itertools.count(1)
        # request id -> (its future, its chunk callback); its future -> its id
        self._pending: dict[int, tuple[Future[dict[str, Any]], ChunkCallback | None]] = {}
        self._ids: dict[Future[dict[str, Any]], int] = {}
        self._counters = Counters()
        self._closing = False
        self._proc: subprocess.Popen[bytes] | None = None
        self._reader: threading.Thread | None = None
        self._ready = threading.Event()
        self._discover_timeout = 5.0
        # The child's last word on the upstream (under _lock):
        self._up = False
        self._last_error: str | None = None
        self._cards: list[dict[str, Any]] = []
        self._models: list[str] = list(dict.fromkeys(spec.models))
        self._window = spec.concurrency
        self._retries_total = 0
        self._throttled_total = 0

    # ------------------------------------------------------------------ life

    def start(self, discover_timeout: float = 5.0) -> None:
        """Start the client process and wait for its first look at the upstream's models
        (at most `discover_timeout` seconds of it: a server that is down is looked at again)."""
        self._discover_timeout = discover_timeout
        self._spawn()
        if not self._ready.wait(discover_timeout + START_GRACE_S):
            log.warning("engine=%s its client process has not answered yet", self.name)
        log.info(
            "engine=%s url=%s up=%s models=%s concurrency=%d pid=%s",
            self.name,
            self.spec.url,
            self.up,
            ",".join(self.models()) or "-",
            self.spec.concurrency,
            self._proc.pid if self._proc is not None else "-",
        )

    def _spawn(self) -> None:
        proc = subprocess.Popen(
            child_command(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=_child_env(),
            bufsize=0,
        )
        assert proc.stdin is not None and proc.stdout is not None
        widen(proc.stdin.fileno())
        fields = dataclasses.asdict(self.spec)
        fields["models"] = list(self.spec.models)
        level = logging.getLogger("batchyard.upstream").getEffectiveLevel()
        with self._lock:
            self._proc = proc
        self._write(proc, frame(["spec", fields, self._discover_timeout, level]))
        self._reader = threading.Thread(
            target=self._read, args=(proc,), name=f"upstream-{self.name}", daemon=True
        )
        self._reader.start()

    def close(self) -> None:
        with self._lock:
            if self._closing:
                return
            self._closing = True
            proc = self._proc
        if proc is not None:
            try:
                self._write(proc, frame(["q"]))
                proc.wait(CLOSE_TIMEOUT_S)
            except (OSError, subprocess.TimeoutExpired):
                proc.kill()
                proc.wait()
            if self._reader is not None:
                self._reader.join(5)
        self._fail_all(engine_closed())

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
        future: Future[dict[str, Any]] = Future()
        with self._lock:
            if self._closing:
                return closed_future()
            rid = next(self._seq)
            self._pending[rid] = (future, on_chunk)
            self._ids[future] = rid
            proc = self._proc
        message = ["s", rid, endpoint, int(priority), bool(body.get("stream")), payload]
        message.append(on_chunk is not None)
        try:
            if proc is None:
                raise OSError("no client process")
            self._write(proc, frame(message))
        except OSError:  # the child is gone; its reader fails what it held and starts another
            self._finish(rid, error=EngineUnavailable(self._gone_reason()), outcome="unavailable")
        return future

    def cancel(self, future: Future[dict[str, Any]]) -> None:
        with self._lock:
            rid = self._ids.get(future)
            proc = self._proc
        if rid is None or future.done():
            return
        if self._finish(rid, error=RequestCancelled(), outcome="cancelled") and proc is not None:
            # An OSError: the child is gone, and with it the request.
            with contextlib.suppress(OSError):
                self._write(proc, frame(["c", rid]))

    def prompt_tokens(self, endpoint: str, body: dict[str, Any]) -> int | None:  # noqa: ARG002 - the Engine contract
        """The upstream's tokenizer is not here: no count."""
        return None

    def image_form(self, model: str | None) -> tuple[str, int]:  # noqa: ARG002 - the Engine contract
        """What its `images=` and `image_max_side=` say."""
        return (self.spec.image_mode, self.spec.image_max_side)

    def stats(self) -> EngineStats:
        with self._lock:
            pending, window = len(self._pending), self._window
        active = min(pending, window)
        return self._counters.snapshot(active=active, queued=pending - active)

    # ------------------------------------------------------------------ what it serves

    def models(self) -> list[str]:
        """The model names routed here: the configured ones, then the upstream's own."""
        with self._lock:
            return list(self._models)

    def model_cards(self) -> list[dict[str, Any]]:
        """`/v1/models` entries for this upstream's models (its own `created` and `owned_by`)."""
        with self._lock:
            return [dict(card) for card in self._cards]

    @property
    def up(self) -> bool:
        """Whether its server answers, as the client process last said (see UpstreamEngine)."""
        with self._lock:
            return self._up

    def status(self) -> UpstreamStatus:
        with self._lock:
            return UpstreamStatus(
                up=self._up,
                last_error=self._last_error,
                models=list(self._models),
                window=self._window,
                concurrency=self.spec.concurrency,
                retries_total=self._retries_total,
                throttled_total=self._throttled_total,
            )

    # ------------------------------------------------------------------ the reader thread

    def _read(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        fd = proc.stdout.fileno()
        reader = FrameReader()
        try:
            while True:
                data = os.read(fd, READ_SIZE)
                if not data:
                    break
                for message in reader.feed(data):
                    self._dispatch(message)
        except Exception:  # a broken frame: treat the child as gone
            log.exception("engine=%s its client process sent what could not be read", self.name)
            proc.kill()
        code = proc.wait()
        self._gone(proc, code)

    def _dispatch(self, message: list[Any]) -> None:
        kind = message[0]
        if kind == "r":
            result = jsoncodec.loads(message[2])
            self._finish(message[1], result=result, outcome="succeeded")
        elif kind == "k":
            with self._lock:
                held = self._pending.get(message[1])
            if held is not None and held[1] is not None and not held[0].done():
                held[1](jsoncodec.loads(message[2]))
        elif kind == "e":
            _, rid, which, status, text, param, code, type_ = message
            error: EngineError
            if which == CANCELLED:
                error, outcome = RequestCancelled(text), "cancelled"
            elif which == UNAVAILABLE:
                error, outcome = EngineUnavailable(text), "unavailable"
            else:
                error = EngineError(text, status_code=status, code=code, param=param, type=type_)
                outcome = "" if code == "engine_closed" else "failed"
            self._finish(rid, error=error, outcome=outcome)
        elif kind == "t":
            self._take_state(message[1])

    def _take_state(self, state: dict[str, Any]) -> None:
        cards = [c for c in state["cards"] if isinstance(c, dict)]
        models = [str(c["id"]) for c in cards]
        with self._lock:
            self._up, self._last_error = bool(state["up"]), state["error"]
            self._cards, self._models = cards, models
            self._window = int(state["window"])
            self._retries_total = int(state["retries"])
            self._throttled_total = int(state["throttled"])
        if not self.spec.models and state["id"] != self.info.id:
            self.info = dataclasses.replace(self.info, id=str(state["id"]))
        self._ready.set()

    def _gone(self, proc: subprocess.Popen[bytes], code: int) -> None:
        """The child exited: what it held fails, and unless the node is closing, another
        starts after RESTART_DELAY_S."""
        with self._lock:
            if proc is not self._proc:
                return
            closing = self._closing
            if not closing:
                self._up, self._last_error = False, self._gone_reason(code)
        if closing:
            return  # close() fails what is left once the child is done
        log.error(
            "engine=%s %s Another starts in %.0f s.",
            self.name,
            self._gone_reason(code),
            RESTART_DELAY_S,
        )
        self._fail_all(EngineUnavailable(self._gone_reason(code)), outcome="unavailable")
        timer = threading.Timer(RESTART_DELAY_S, self._restart)
        timer.daemon = True
        timer.start()

    def _restart(self) -> None:
        with self._lock:
            if self._closing:
                return
        try:
            self._spawn()
        except OSError:
            log.exception("engine=%s its client process could not be started", self.name)

    def _gone_reason(self, code: int | None = None) -> str:
        said = f" with code {code}" if code is not None else ""
        return f"The upstream engine '{self.name}' lost its client process (it exited{said})."

    # ------------------------------------------------------------------ bookkeeping

    def _write(self, proc: subprocess.Popen[bytes], data: bytes) -> None:
        assert proc.stdin is not None
        with self._write_lock:
            write_all(proc.stdin.fileno(), data)

    def _finish(
        self,
        rid: int,
        *,
        result: dict[str, Any] | None = None,
        error: BaseException | None = None,
        outcome: str,
    ) -> bool:
        """Forget request `rid`, resolve its future once and count how it ended."""
        with self._lock:
            held = self._pending.pop(rid, None)
            if held is not None:
                self._ids.pop(held[0], None)
        if held is None or not resolve(held[0], result=result, error=error):
            return False
        if outcome:
            self._counters.count(outcome)
        if result is not None:
            self._counters.usage(result.get("usage"))
        return True

    def _fail_all(self, error: EngineError, outcome: str = "") -> None:
        with self._lock:
            rids = list(self._pending)
        for rid in rids:
            self._finish(rid, error=error, outcome=outcome)


__all__ = ["UpstreamProcess", "child_command"]
