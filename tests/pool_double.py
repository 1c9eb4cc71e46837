"""A stand-in for the engine pool's dashboard surface (`views()`, `budget()`, `load(id)`,
`unload(id)`, as app/engine/pool defines them) and what routing reads of it (`catalog`,
`active()`, `demand()`), for integration tests of the Models page, "Run with", the batch
page and /metrics over a fake engine. It keeps the pool's bookkeeping rules the page
relies on (unknown ids are 404, an unload with requests in flight is refused with 409) and
nothing else; the real pool is tested with real models (tests/browser/test_models_page_in_browser.py).
"""

from __future__ import annotations

import dataclasses
import threading
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from app.catalog import Entry, Estimate, HeaderFacts, LoadProfile
from app.engine.base import ChunkCallback, EngineStats, ModelInfo, Priority
from app.engine.pool import Fed, ModelView, model_busy, model_not_found
from app.engine.pool.pool import ModelPool
from tests.catalogs import DictCatalog
from tests.fakes import FakeEngine

MiB = 1024 * 1024


def model_view(entry: Entry, state: str, **figures: Any) -> ModelView:
    """The pool's ModelView of `entry`, its figures zero unless given."""
    blank: dict[str, Any] = {
        "in_flight": 0,
        "waiting": 0,
        "loads": 0,
        "last_used": None,
        "measured_bytes": None,
        "load_seconds": None,
    }
    return ModelView(entry, state, **{**blank, **figures})


def entry(
    id: str,
    *,
    names: tuple[str, ...] = (),
    source: str = "models-dir",
    size: int = 100 * MiB,
    estimate: int = 160 * MiB,
    is_default: bool = False,
    error: str = "",
    projector: int = 0,
    chat_template: str | None = None,
) -> Entry:
    """A catalog entry with the facts the page shows (its file need not exist); `projector`:
    the bytes of a multimodal projector it has (mmproj-ID.gguf), within `estimate`;
    `chat_template`: its GGUF's."""
    facts = HeaderFacts(
        architecture="llama",
        n_layer=30,
        n_head_kv=3,
        key_length=64,
        value_length=64,
        n_embd=576,
        context_length=8192,
        file_type=15,
        tensor_bytes=size,
        has_chat_template=True,
        chat_template=chat_template,
    )
    return Entry(
        id=id,
        names=frozenset({id, *names}),
        source=source,
        path=Path(f"/models/{id.replace(':', '-').replace('/', '_')}.gguf"),
        size_bytes=size,
        mtime=0.0,
        quantization="Q4_K_M",
        profile=LoadProfile(ctx_size=2048, parallel=4, n_gpu_layers=0, kv_cache_type="f16"),
        facts=facts,
        estimate=Estimate(
            weights=size,
            kv_cache=estimate - size - 10 * MiB - projector,
            compute=10 * MiB,
            projector=projector,
        ),
        error=error,
        is_default=is_default,
        projector=Path(f"/models/mmproj-{id.replace(':', '-')}.gguf") if projector else None,
    )


class PoolDouble(ModelPool):
    """Views a test sets; load/unload move a model's state as the pool's buttons would.

    A ModelPool to the registry it is handed to (`create_app(engine=...)`: the registry's
    `pool`), it builds none of the real pool's state: its requests go to `engine` (a
    FakeEngine unless given), whatever model they name."""

    def __init__(
        self,
        views: list[ModelView],
        budget: int = 1024 * MiB,
        *,
        engine: FakeEngine | None = None,
    ) -> None:
        self._views = {v.entry.id: v for v in views}
        self._budget = budget
        self._lock = threading.Lock()
        self.calls: list[tuple[str, str]] = []
        self.engine = engine if engine is not None else FakeEngine()

    # The Engine contract, handed to the fake engine.

    @property
    def info(self) -> ModelInfo:
        return self.engine.info

    def submit(
        self,
        endpoint: str,
        body: dict[str, Any],
        *,
        priority: Priority = Priority.ONLINE,
        on_chunk: ChunkCallback | None = None,
    ) -> Future[dict[str, Any]]:
        return self.engine.submit(endpoint, body, priority=priority, on_chunk=on_chunk)

    def cancel(self, future: Future[dict[str, Any]]) -> None:
        self.engine.cancel(future)

    def stats(self) -> EngineStats:
        return self.engine.stats()

    def prompt_tokens(self, endpoint: str, body: dict[str, Any]) -> int | None:
        return self.engine.prompt_tokens(endpoint, body)

    def image_form(self, model: Any) -> tuple[str, int]:
        """PNG and JPEG data URLs, any size: as the embedded engine's."""
        return ("png", 0)

    def close(self) -> None:
        self.engine.close()

    # The pool's surface.

    def views(self) -> list[ModelView]:
        with self._lock:
            return [dataclasses.replace(v) for v in self._views.values()]

    @property
    def catalog(self) -> DictCatalog:
        """Its models by name, the default first, read by the catalog's rules."""
        entries = [v.entry for v in self.views()]
        return DictCatalog(sorted(entries, key=lambda e: not e.is_default))

    def active(self) -> list[Fed]:
        """The models loaded now, each with 2 slots."""
        return [
            Fed(v.entry, (v.entry.id,), 2) for v in self.views() if v.state in ("loaded", "idle")
        ]

    def demand(self, lines: Any) -> None:
        self.demanded = dict(lines)

    def budget(self) -> tuple[int, int]:
        with self._lock:
            loaded = [v for v in self._views.values() if v.state in ("loaded", "idle", "loading")]
            used = sum(
                v.measured_bytes or (v.entry.estimate.total if v.entry.estimate else 0)
                for v in loaded
            )
            return used, self._budget

    def view(self, id: str) -> ModelView:
        with self._lock:
            found = self._views.get(id)
        if found is None:
            raise model_not_found(id)
        return found

    def load(self, id: str) -> None:
        v = self.view(id)
        with self._lock:
            self.calls.append(("load", id))
            if v.state in ("on disk", "failed"):
                v.state, v.loads, v.load_seconds = "idle", v.loads + 1, 0.5
                v.measured_bytes = v.entry.size_bytes + 40 * MiB

    def unload(self, id: str) -> None:
        v = self.view(id)
        with self._lock:
            self.calls.append(("unload", id))
            if v.in_flight:
                raise model_busy(id, v.in_flight)
            v.state, v.measured_bytes = "on disk", None
