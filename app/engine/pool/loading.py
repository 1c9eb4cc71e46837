"""Loading: how the pool (pool.py) carries out the plan's loads and unloads.

A load runs in a thread of its own, never an engine's (so decoding goes on meanwhile), and
the pool's loop plans again once it is done. Where the budget holds every model the plan
wants, their loads run side by side (`Loads.start` with several berths). Each engine says
what its own load took (`measured_bytes`: the buffers llama.cpp reported in that load's
thread, engine/llama/binding/buffers.py), so loads that overlap are each measured alone; that
figure replaces the model's estimate in the placement. The next model's file is read ahead
into the page cache meanwhile. An unload closes the engine and keeps its figures, so that
/metrics' counters never go back.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from app.catalog import Entry
from app.catalog.budget import gpu_layers, memory_budget
from app.config import AUTO_GPU_LAYERS, Settings
from app.engine.base import EngineError, EngineStats, resolve
from app.engine.pool import LOADS_KEPT
from app.engine.pool.berth import Berth, Loaded
from app.engine.pool.placement import Placement
from app.engine.pool.plan import FAILED, LOADED, LOADING, ON_DISK
from app.toolchain.facts import free_vram_bytes

log = logging.getLogger("batchyard.pool")

#: Bytes read at a time when a file is read ahead into the page cache.
READ_AHEAD_CHUNK = 8 << 20

#: Loads an entry and starts its engine: `app.engine.llama.loading.load_engine` (tests may
#: give another). The engine it returns says `measured_bytes`, `load_seconds` and, once
#: closed, `freed_bytes` where it knows them (`berth.Loaded`; LlamaEngine does).
Loader = Callable[[Settings, Entry], Loaded]


def load_failed(entry: Entry, reason: str) -> EngineError:
    """The error of a request whose model could not be loaded."""
    return EngineError(
        f"The model '{entry.id}' could not be loaded: {reason}",
        status_code=500,
        code="model_load_failed",
        param="model",
        type="server_error",
    )


def too_big(need: int, budget: int) -> str:
    """Why a model that cannot fit alone is not loaded."""
    return (
        f"it needs {need / 2**30:.2f} GiB, the budget is {budget / 2**30:.2f} GiB (--models-memory)"
    )


def read_ahead(path: Path) -> None:
    """Ask the kernel to read a model file into the page cache (the load then reads memory,
    not the disk); where it cannot be asked, read the file once."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
        else:  # pragma: no cover - macOS, Windows
            while os.read(fd, READ_AHEAD_CHUNK):
                pass
    except OSError:
        pass
    finally:
        os.close(fd)


class Loads:
    """The pool's loads and unloads: each berth's state, its engine and the placement's
    reservations, changed under the pool's lock (`cond`), which is notified when a load
    ends."""

    def __init__(
        self,
        settings: Settings,
        placement: Placement,
        cond: threading.Condition,
        *,
        loader: Loader,
        clock: Callable[[], float],
        free_vram: Callable[[], int | None],
    ) -> None:
        self.settings = settings
        self.placement = placement
        self._cond = cond
        self._loader = loader
        self._clock = clock
        self._free_vram = free_vram
        #: The figures of engines closed since start, and the requests failed because
        #: their model could not load (/metrics' counters never go back).
        self.retired = EngineStats()
        self._threads: list[threading.Thread] = []
        self._prefetched: Path | None = None

    # ------------------------------------------------------------------------- loads

    def load_now(self, berth: Berth) -> None:
        """Load a berth here and now (the default model at start); a failure raises, and
        leaves the berth on disk."""
        with self._cond:
            self._begin(berth)
        t = time.monotonic()
        try:
            engine = self._loader(self.settings, self._placed([berth.entry])[0])
        except Exception:
            with self._cond:
                berth.state = ON_DISK
                self.placement.release(berth.key)
            raise
        self._loaded(berth, engine, t)

    def start(self, berths: list[Berth]) -> None:
        """Start the loads of `berths`, side by side: each in a thread of its own."""
        ready = []
        with self._cond:
            for berth in berths:
                if berth.entry.error:
                    # The catalog could not read the file's header: llama.cpp would fail on
                    # it too, with a vaguer reason (and the CPU check would run on a broken
                    # file).
                    log.warning("model=%s is not loaded: %s", berth.id, berth.entry.error)
                    self.fail(berth, berth.entry.error)
                    continue
                self._begin(berth)
                ready.append(berth)
        if not ready:
            return
        self._prefetched = None  # read ahead again next time one is to load
        entries = self._placed([b.entry for b in ready])
        for berth, entry in zip(ready, entries, strict=True):
            thread = threading.Thread(
                target=self._load, args=(berth, entry), name="model-load", daemon=True
            )
            self._threads = [t for t in self._threads if t.is_alive()] + [thread]
            thread.start()

    def join(self) -> None:
        """Wait for the loads under way (the pool is closing)."""
        for thread in self._threads:
            thread.join()

    def _begin(self, berth: Berth) -> None:
        """The berth loads now: its bytes are reserved (under the lock)."""
        berth.state, berth.wanted = LOADING, False
        self.placement.reserve(berth.key, berth.need())

    def _load(self, berth: Berth, entry: Entry) -> None:
        """Load in this thread; the loop plans again once the load has ended."""
        t = time.monotonic()
        try:
            engine = self._loader(self.settings, entry)
        except Exception as exc:
            log.exception("model=%s could not be loaded", berth.id)
            with self._cond:
                self.fail(berth, f"{type(exc).__name__}: {exc}")
        else:
            self._loaded(berth, engine, t)
        with self._cond:
            self._cond.notify_all()

    def _loaded(self, berth: Berth, engine: Loaded, began: float) -> None:
        """Note what a load took; its requests may go to it from the next plan on."""
        seconds = engine.load_seconds or time.monotonic() - began
        measured = engine.measured_bytes
        with self._cond:
            berth.engine, berth.info, berth.state, berth.error = engine, engine.info, LOADED, ""
            berth.loads += 1
            berth.loaded_at = [*berth.loaded_at[1 - LOADS_KEPT :], self._clock()]
            berth.load_seconds = seconds
            berth.last_used = self._clock()
            if measured:
                berth.measured_bytes = measured
                self.placement.measured(berth.key, measured)
        estimate = berth.entry.estimate.total if berth.entry.estimate else None
        log.info(
            "model=%s loaded in %.2fs loads=%d estimate=%s measured=%s",
            berth.id,
            seconds,
            berth.loads,
            _mib(estimate),
            _mib(measured),
        )

    def _placed(self, entries: list[Entry]) -> list[Entry]:
        """The entries as they load: --n-gpu-layers auto made a number of layers that the
        free VRAM holds now (the models already loaded have taken theirs, and those loading
        beside it take their estimates). Each key stays the catalog's: the berth is the
        entry as listed."""
        out, free = [], None
        for entry in entries:
            profile = entry.profile
            if profile.n_gpu_layers != AUTO_GPU_LAYERS:
                out.append(entry)
                continue
            if free is None:
                free = self._free_vram()
            n_layer = entry.facts.n_layer if entry.facts else 0
            layers = gpu_layers(profile.n_gpu_layers, n_layer, entry.estimate, free)
            log.info("model=%s n_gpu_layers auto: %d", entry.id, layers)
            if free is not None and entry.estimate is not None:
                free -= entry.estimate.total
            placed = dataclasses.replace(profile, n_gpu_layers=layers)
            out.append(dataclasses.replace(entry, profile=placed))
        return out

    def read_ahead(self, berth: Berth) -> None:
        """Read the berth's file into the page cache, in a thread (once until it loads)."""
        if berth.entry.path == self._prefetched:
            return
        self._prefetched = berth.entry.path
        threading.Thread(
            target=read_ahead, args=(berth.entry.path,), name="read-ahead", daemon=True
        ).start()

    # ---------------------------------------------------------------- failures, unloads

    def fail(self, berth: Berth, reason: str) -> None:
        """The model cannot be loaded: it and its waiting requests fail (under the lock;
        the futures' callbacks only queue work)."""
        berth.state, berth.error = FAILED, reason
        self.placement.release(berth.key)
        waiting, berth.waiting = berth.waiting, []
        failed = sum(resolve(w.future, error=load_failed(berth.entry, reason)) for w in waiting)
        self.count_failed(failed)

    def count_failed(self, n: int) -> None:
        """Requests the pool failed itself (their model cannot load), for /metrics."""
        if n:
            counts = self.retired.requests_total
            counts["failed"] = counts.get("failed", 0) + n

    def unload(self, berth: Berth) -> None:
        """Unload a model with nothing in flight; its bytes are free once it has closed."""
        with self._cond:
            engine, berth.engine = berth.engine, None
            berth.state = ON_DISK
            assert not berth.in_flight, "a model is never unloaded with requests in flight"
        if engine is not None:
            stats = engine.stats()
            engine.close()
            with self._cond:
                stats.active_slots = stats.queue_depth = 0
                stats.tokens_per_second = 0.0
                self.retired.add(stats)
        with self._cond:
            self.placement.release(berth.key)
        # What the process gave back beside what llama.cpp had reserved: on a CPU, the pages
        # of a buffer never written were never resident (Gemma 3 270M at 2 slots of 256
        # cells reserves 769 MiB, 514 of them compute buffer, and gives back 250), so the
        # two are logged, not compared.
        freed = engine.freed_bytes if engine is not None else None
        log.info(
            "model=%s unloaded freed=%s measured=%s", berth.id, _mib(freed), _mib(berth.need())
        )


def _mib(n: int | None) -> str:
    return f"{n / 2**20:.0f}MiB" if n else "-"


def node_budget(settings: Settings) -> int:
    """The bytes the loaded models may take together (catalog/budget.py): --models-memory,
    else the free VRAM on a CUDA build, else the free RAM, less a margin."""
    return memory_budget(settings, free_vram=free_vram_bytes())


def llama_loader(settings: Settings, entry: Entry) -> Loaded:
    """The loader of real models: `app.engine.llama.loading.load_engine`."""
    # Imported here: llama_cpp loads its libraries on import (registry.load_engines).
    from app.engine.llama import loading

    return loading.load_engine(settings, entry)
