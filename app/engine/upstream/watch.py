"""The upstream engine's down-watch: whether its server answers, and the models it lists.

A `DownWatch` reads the upstream's list of models (`GET /v1/models` for the `openai` kind:
its kind's `models_path`, kinds/) at start, then every WATCH_INTERVAL_S
while it answers and every WATCH_INTERVAL_DOWN_S while it does not (or is still loading its
model). A request that finds the server down (engine.py: refused, no DNS name, connect
timed out, or 502/503/504 through every retry) calls `mark_down`: the engine is down at once
(its lane stops claiming) and the next probe comes WATCH_INTERVAL_DOWN_S later, so the
engine is up again as soon as `/v1/models` answers.

The probe runs on the engine's loop thread; `up`, `last_error` and `discovered` may be read
from any thread.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from typing import Any

import aiohttp

from app.config.upstreams import UpstreamSpec
from app.engine.upstream.kinds import kind_of

log = logging.getLogger("batchyard.upstream")

#: How often the upstream's /v1/models is read again (its models, and whether it is up).
WATCH_INTERVAL_S = 15.0
WATCH_INTERVAL_DOWN_S = 2.0


class DownWatch:
    """Whether one upstream is up, and the model objects its `/v1/models` lists."""

    def __init__(self, spec: UpstreamSpec, on_models: Callable[[], None]) -> None:
        self.spec = spec
        self._kind = kind_of(spec)
        #: Called on the loop thread after each probe that read the models.
        self._on_models = on_models
        self._lock = threading.Lock()
        self._discovered: list[dict[str, Any]] = []
        self._up = False
        self._last_error: str | None = None
        # Owned by the loop thread:
        self._client: aiohttp.ClientSession | None = None
        self._task: asyncio.Task[None] | None = None
        self._look_now: asyncio.Event | None = None  # set when a request found it down

    # ------------------------------------------------------------------ read from any thread

    @property
    def up(self) -> bool:
        with self._lock:
            return self._up

    @property
    def last_error(self) -> str | None:
        with self._lock:
            return self._last_error

    def discovered(self) -> list[dict[str, Any]]:
        """The model objects of the last listing that answered."""
        with self._lock:
            return list(self._discovered)

    # ------------------------------------------------------------------ the loop thread

    def start(self, client: aiohttp.ClientSession) -> None:
        """Begin watching, probing through `client` (called on the loop thread)."""
        self._client = client
        self._look_now = asyncio.Event()
        self._task = asyncio.create_task(self._watch())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def look(self) -> None:
        """One probe of its list of models: up with its models, or down with the reason."""
        assert self._client is not None
        try:
            async with self._client.get(
                self.spec.root + self._kind.models_path, timeout=aiohttp.ClientTimeout(total=10.0)
            ) as r:
                r.raise_for_status()
                models = self._kind.models(await r.read())
        except Exception as exc:  # any failure means "not up"; say why
            self._down(f"{type(exc).__name__}: {exc}")
            return
        with self._lock:
            self._discovered = models
            self._up, self._last_error = True, None
        self._on_models()

    async def _watch(self) -> None:
        assert self._look_now is not None
        while True:
            # An upstream that is down (or still loading its model) is looked at more often.
            interval = WATCH_INTERVAL_S if self.up else WATCH_INTERVAL_DOWN_S
            try:
                await asyncio.wait_for(self._look_now.wait(), interval)
                await asyncio.sleep(WATCH_INTERVAL_DOWN_S)  # marked down: probe shortly
            except asyncio.TimeoutError:
                pass
            self._look_now.clear()
            await self.look()

    def mark_down(self, reason: str) -> None:
        """A request found the server down: stop claiming for it until a probe of its
        list of models answers (the watch looks WATCH_INTERVAL_DOWN_S from now)."""
        self._down(reason)
        if self._look_now is not None:
            self._look_now.set()

    def _down(self, reason: str) -> None:
        """Mark the server down for `reason`, saying so once when it was up."""
        with self._lock:
            was_up, self._up, self._last_error = self._up, False, reason
        if was_up:
            log.warning("engine=%s is down: %s", self.spec.name, reason)


__all__ = ["WATCH_INTERVAL_DOWN_S", "WATCH_INTERVAL_S", "DownWatch"]
