"""The engine registry: one `Engine` in front of the embedded engine and the upstreams.

A request's `model` picks its engine, by `app.catalog.lookup`'s rule (an exact name first,
`name` for `name:latest`, then letter case aside) over every name this node serves
(`names`): an upstream's configured names (`models=`), the embedded catalog's names (a
lone engine's id), an upstream's own `GET /v1/models` names, the first of these taking a
name two give. A name nothing here knows runs on the embedded engine: the pool of models
(engine/pool/), whose default model runs names nothing knows, as a single engine did
before. The request reaches its engine as the id it was resolved to (the upstream's own
spelling, the catalog entry's id), so no engine reads a name again. With no embedded
engine (`--no-embedded`, or the embedded model failed to load), an unknown model is the
request's 404.
The runner and the API see the Engine contract, and ask what only the node as a whole
answers (its lanes, its pool's demand, its models and members) through engine/node.py,
which asks the registry; nothing else of it.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from app.catalog import DEFAULT_ROUTE, Catalog, Entry, lookup
from app.engine.base import ChunkCallback, Engine, EngineError, EngineStats, ModelInfo, Priority
from app.engine.pool.loading import node_budget
from app.engine.pool.pool import ModelPool
from app.engine.reasoning import detect
from app.engine.upstream.engine import UpstreamEngine, UpstreamStatus
from app.engine.upstream.process import UpstreamProcess

if TYPE_CHECKING:
    from app.config import Settings

log = logging.getLogger("batchyard")

#: The embedded llama.cpp engine's name on the engines page and in /metrics.
EMBEDDED = "embedded"
#: The lane of lines whose model no engine serves, on a node without the embedded engine:
#: they fail at once (404), so they hold no engine's room.
UNROUTED = "unrouted"


#: An upstream: its client in this process, or in a process of its own (what nodes run).
Upstream = UpstreamEngine | UpstreamProcess
#: What a name means on this node: the engine that serves it, the id it knows the model by,
#: and its catalog entry (None for an upstream's model or a lone engine's).
Served = tuple[Engine, str, Entry | None]
#: What the names table was built from: the identities of the catalog's entries, each
#: upstream's listed names, and a lone engine's id.
_TableKey = tuple[list[int], list[list[str]], str | None]


@dataclass(frozen=True)
class Lane:
    """The batch lines one engine takes, for the runner's claims: those whose batch's route
    (the model id resolved at validation, "" for a name nothing knows) is in `models`, or
    with `models` None (a node with one engine) every line."""

    name: str
    slots: int
    models: frozenset[str] | None = None
    #: False while the engine is down (an upstream that its probe of /v1/models has not
    #: brought back): the lane claims nothing and its lines wait in the queue.
    up: bool = True
    #: How many times its slots the lane may hold (claims.room): the embedded engine's
    #: slots take seconds a line, so a queue as deep as its slots keeps them busy; an
    #: upstream answering in milliseconds needs more queued to cover the runner's steps.
    depth: int = 2
    #: Its engine takes vLLM's and SGLang's `priority` on batch lines (`priority=on`).
    priority: bool = False


@dataclass
class EngineView:
    """One engine as the engines page and /metrics show it."""

    name: str
    kind: str  # "embedded", or an upstream's kind (app/config/upstreams.py: KINDS)
    url: str | None
    models: list[str]
    up: bool
    info: ModelInfo
    stats: EngineStats
    upstream: UpstreamStatus | None = None

    @property
    def errors(self) -> int:
        return self.stats.requests_total.get("failed", 0)


class EngineRegistry:
    """Routes each request by its `model` to the engine that serves it."""

    def __init__(
        self,
        embedded: Engine | None,
        upstreams: list[Upstream],
        *,
        owns_embedded: bool = True,
        embedded_failure: str | None = None,
    ) -> None:
        if embedded is None and not upstreams:
            raise ValueError("a registry needs the embedded engine or at least one upstream")
        #: The embedded engine (the pool of catalog models, or a test's lone engine): it
        #: runs the names no upstream claims first. Held here alone: `pool` reads it.
        self.embedded = embedded
        self.upstreams = upstreams
        self.owns_embedded = owns_embedded
        #: Why the embedded model is missing, when it failed to load (upstreams still serve).
        self.embedded_failure = embedded_failure
        #: What `names()` was built from (the catalog's entries, the upstreams' names), the
        #: table, and its names casefolded.
        self._names: tuple[_TableKey, dict[str, Served], dict[str, Served]] | None = None

    @property
    def pool(self) -> ModelPool | None:
        """The embedded engine when it is a pool of models (routing, lanes, cards, and what
        the dashboard and /metrics read of it)."""
        return self.embedded if isinstance(self.embedded, ModelPool) else None

    @property
    def info(self) -> ModelInfo:
        """The embedded engine's (or first upstream's) model, with every engine's slots:
        the runner keeps that many lines in flight."""
        first = self.embedded if self.embedded is not None else self.upstreams[0]
        total = sum(e.info.n_slots for e in self._engines())
        return dataclasses.replace(first.info, n_slots=total)

    def _engines(self) -> list[Engine]:
        return ([self.embedded] if self.embedded is not None else []) + list(self.upstreams)

    def lanes(self) -> list[Lane]:
        """Which lines each engine takes, by their batch's route: each upstream's lane its
        models (as `route` would send them now: an upstream's models change as its
        /v1/models does), each model the pool feeds now its id, and the default model's
        lane the lines whose name means nothing known (route ""). A line whose model is
        known but fed by no engine here waits: no lane takes it. One engine alone takes
        every line."""
        engines = self._engines()
        if len(engines) == 1 and self.pool is None:
            if self.embedded is not None:
                return [Lane(EMBEDDED, engines[0].info.lane_sequences)]
            only = self.upstreams[0]
            return [
                Lane(
                    only.name,
                    only.info.n_slots,
                    up=only.up,
                    depth=only.lane_depth,
                    priority=only.spec.priority,
                )
            ]
        routed: dict[str, set[str]] = {u.name: set() for u in self.upstreams}
        names = {id(u): u.name for u in self.upstreams}
        served = self.names()
        for upstream in self.upstreams:
            for model in upstream.models():
                # Each of its names is a key of `served`: what `route` sends it to.
                found = served.get(model)
                target = names.get(id(found[0])) if found is not None else None
                if target is not None:
                    routed[target].add(model)
        lanes = [
            Lane(
                u.name,
                u.info.n_slots,
                frozenset(routed[u.name]),
                up=u.up,
                depth=u.lane_depth,
                priority=u.spec.priority,
            )
            for u in self.upstreams
            if routed[u.name]
        ]
        if self.pool is not None:
            default = self.pool.catalog.default()
            for fed in self.pool.active():
                if fed.entry.key == default.key:
                    lanes.append(Lane(EMBEDDED, fed.slots, frozenset({*fed.ids, DEFAULT_ROUTE})))
                else:
                    lanes.append(Lane(f"{EMBEDDED}:{fed.entry.id}", fed.slots, frozenset(fed.ids)))
        elif self.embedded is not None:
            ids = frozenset({self.embedded.info.id, DEFAULT_ROUTE})
            lanes.append(Lane(EMBEDDED, self.embedded.info.lane_sequences, ids))
        else:
            slots = sum(e.info.n_slots for e in engines)
            lanes.append(Lane(UNROUTED, slots, frozenset({DEFAULT_ROUTE})))
        return lanes

    def names(self) -> Mapping[str, Served]:
        """Every name this node's engines serve, and what it means here, in the order they
        take a name two give: each upstream's configured names (`models=`), the embedded
        catalog's names (or a lone engine's id), each upstream's `/v1/models` names. Built
        again only when the catalog's entries or an upstream's models changed."""
        return self._table()[0]

    def _table(self) -> tuple[dict[str, Served], dict[str, Served]]:
        pool = self.pool
        catalog = pool.catalog.entries() if pool is not None else []
        listed = [upstream.models() for upstream in self.upstreams]
        # Entries are made anew when the catalog reads its stores again: their identity
        # says whether it did (the table holds them, so no id is reused meanwhile).
        lone = self.embedded.info.id if pool is None and self.embedded is not None else None
        key: _TableKey = ([id(e) for e in catalog], listed, lone)
        if self._names is not None and self._names[0] == key:
            return self._names[1], self._names[2]
        table: dict[str, Served] = {}
        for upstream in self.upstreams:
            for name in upstream.spec.models:
                table.setdefault(name, (upstream, name, None))
        if pool is not None:
            for entry in catalog:
                for name in entry.names:
                    table.setdefault(name, (pool, entry.id, entry))
        elif self.embedded is not None and lone is not None:
            table.setdefault(lone, (self.embedded, lone, None))
        for upstream, models in zip(self.upstreams, listed, strict=True):
            for name in models:
                table.setdefault(name, (upstream, name, None))
        folded: dict[str, Served] = {}
        for name, served in table.items():
            folded.setdefault(name.casefold(), served)
        self._names = (key, table, folded)
        return table, folded

    def serving(self, model: str) -> Served | None:
        """The engine here that serves `model`, the id it knows it by and its catalog entry
        (None for an upstream's model): what `model` means among `names()` by
        `app.catalog.lookup`'s rule, the one rule other nodes read this node's published
        names by too. None when no engine here knows the name."""
        table, folded = self._table()
        return lookup(table, model, folded)

    def default_model(self) -> str | None:
        """The id the lines of names nothing knows run as here: the pool's default model,
        or a lone engine's; None without the embedded engine (they are each a 404)."""
        if self.pool is not None:
            return self.pool.catalog.default().id
        return self.embedded.info.id if self.embedded is not None else None

    def route(self, model: str | None) -> Engine | None:
        """The engine for a request's `model`: the one `serving` names, else the embedded
        engine."""
        return self._target(model)[0]

    def _target(self, model: str | None) -> tuple[Engine | None, str | None]:
        """The engine for a request's `model` and the id it runs as there."""
        found = self.serving(model) if isinstance(model, str) else None
        if found is not None:
            return found[0], found[1]
        return self.embedded, self.default_model()

    def prompt_tokens(self, endpoint: str, body: dict[str, Any]) -> int | None:
        """A request's prompt tokens by its model's own tokenizer, where that model is
        loaded here now; None otherwise (an upstream's, or a model on disk)."""
        engine = self.route(body.get("model"))
        return engine.prompt_tokens(endpoint, body) if engine is not None else None

    def image_form(self, model: str | None) -> tuple[str, int]:
        """The form of the engine `model` routes to."""
        engine = self.route(model)
        return engine.image_form(model) if engine is not None else ("png", 0)

    def demand(self, lines: list[tuple[str | None, int, float]]) -> None:
        """Tell the pool the batch lines that wait for it: (the batch's route, lines, the
        oldest's unix time), of every model of this node's catalog that it could load (not
        an upstream's, not a model only other nodes hold or one past the pool's budget)."""
        if self.pool is None:
            return
        catalog = self.pool.catalog
        budget = self.pool.budget()[1]
        mine: dict[str, tuple[int, float]] = {}
        for route, count, oldest in lines:
            if route is None:
                continue  # not resolved yet: no lane takes it either
            entry = catalog.default() if route == DEFAULT_ROUTE else catalog.get(route)
            if entry is None or (entry.estimate is not None and entry.estimate.total > budget):
                continue
            n, t = mine.get(entry.id, (0, oldest))
            mine[entry.id] = (n + count, min(t, oldest))
        self.pool.demand(mine)

    def submit(
        self,
        endpoint: str,
        body: dict[str, Any],
        *,
        priority: Priority = Priority.ONLINE,
        on_chunk: ChunkCallback | None = None,
    ) -> Future[dict[str, Any]]:
        engine, model = self._target(body.get("model"))
        if engine is None or model is None:
            fut: Future[dict[str, Any]] = Future()
            fut.set_exception(self.unknown_model(body.get("model")))
            return fut
        named = body.get("model")
        if isinstance(named, str) and named != model:
            # As the id it was resolved to: its engine reads no other name (an upstream
            # gets its own spelling of the model).
            body = {**body, "model": model}
        return engine.submit(endpoint, body, priority=priority, on_chunk=on_chunk)

    def unknown_model(self, model: object) -> EngineError:
        """The 404 of a model no engine here serves."""
        known = ", ".join(f"'{m}'" for m in self.model_names()) or "none"
        return EngineError(
            f"The model '{model}' does not exist; this server serves {known}.",
            status_code=404,
            param="model",
            code="model_not_found",
        )

    def cancel(self, future: Future[dict[str, Any]]) -> None:
        """Each engine keeps its own futures (one map each) and leaves others' alone."""
        for engine in self._engines():
            engine.cancel(future)

    def stats(self) -> EngineStats:
        """Every engine's figures added up."""
        total = EngineStats()
        for engine in self._engines():
            total.add(engine.stats())
        return total

    def close(self) -> None:
        for upstream in self.upstreams:
            upstream.close()
        if self.embedded is not None and self.owns_embedded:
            self.embedded.close()

    # -- what the API, /metrics and the dashboard show -------------------------------------

    def model_cards(self) -> list[dict[str, Any]]:
        """`/v1/models`: every model of the embedded catalog (the default first, each with
        what loading it takes), or the lone embedded model, then each upstream's, each
        name once."""
        cards: dict[str, dict[str, Any]] = {}
        if self.pool is not None:
            for entry in self.pool.catalog.entries():
                cards.setdefault(entry.id, catalog_card(entry))
        elif self.embedded is not None:
            info = self.embedded.info
            cards[info.id] = {"id": info.id, "created": info.created, "owned_by": "batchyard"}
        for upstream in self.upstreams:
            for card in upstream.model_cards():
                cards.setdefault(card["id"], card)
        return list(cards.values())

    def model_names(self) -> list[str]:
        return [c["id"] for c in self.model_cards()]

    def members(self) -> list[EngineView]:
        views = []
        if self.embedded is not None:
            loaded = [i for f in self.pool.active() for i in f.ids] if self.pool is not None else []
            views.append(
                EngineView(
                    name=EMBEDDED,
                    kind="embedded",
                    url=None,
                    models=loaded or [self.embedded.info.id],
                    up=True,
                    info=self.embedded.info,
                    stats=self.embedded.stats(),
                )
            )
        for upstream in self.upstreams:
            status = upstream.status()
            views.append(
                EngineView(
                    name=upstream.name,
                    kind=upstream.kind,
                    url=upstream.spec.url,
                    models=status.models,
                    up=status.up,
                    info=upstream.info,
                    stats=upstream.stats(),
                    upstream=status,
                )
            )
        return views


def load_engines(
    settings: Settings, embedded: Engine | None = None
) -> tuple[EngineRegistry | None, str | None]:
    """Every engine a node runs, behind one registry: the --engine upstreams (started, each
    having read its models once) and the embedded model (`embedded` as given, else loaded
    unless --no-embedded). Returns (the registry, why the embedded model failed to load);
    no registry when that model failed and there is no upstream to serve instead."""
    # Each upstream's HTTP client runs in a process of its own (process.py).
    upstreams: list[Upstream] = [UpstreamProcess(spec) for spec in settings.upstreams]
    for upstream in upstreams:
        upstream.start()
    failure = None
    engine = embedded
    if engine is None and not settings.no_embedded:
        try:
            engine = start_pool(settings)
        except Exception as exc:  # a bad model path: the caller says so, upstreams still serve
            log.exception("the model could not be loaded")
            failure = f"{type(exc).__name__}: {exc}"
            if not upstreams:
                return None, failure
    registry = EngineRegistry(
        engine, upstreams, owns_embedded=embedded is None, embedded_failure=failure
    )
    for member in registry.members():
        log.info(
            "engine=%s models=%s slots=%d",
            member.name,
            ",".join(member.models) or "-",
            member.info.n_slots,
        )
    return registry, failure


def start_pool(settings: Settings) -> ModelPool:
    """The embedded engine: the catalog's models in a pool, the default loaded now."""
    # Imported here: llama_cpp loads its libraries on import, and a build that cannot
    # (a CUDA build whose cuBLAS is gone) is a load failure like a bad model path.
    from app.engine.llama.loading import load_engine

    # The budget is measured before any model loads: their memory is not free after.
    budget = node_budget(settings)
    pool = ModelPool(settings, Catalog(settings), budget=budget, loader=load_engine)
    pool.start()
    return pool


def reasons(entry: Entry) -> bool:
    """Whether a catalog model writes a thought: the chat template it loads with spells a
    thinking format (`reasoning.detect`), as its engine will read it once loaded."""
    return detect(entry.chat_template) is not None


def catalog_card(entry: Entry) -> dict[str, Any]:
    """A catalog model's `/v1/models` card: OpenAI's fields, then what batchyard knows."""
    return {
        "id": entry.id,
        "created": int(entry.mtime),
        "owned_by": "batchyard",
        "source": entry.source,
        "size_bytes": entry.size_bytes,
        "quantization": entry.quantization,
        "architecture": entry.architecture,
        "context_length": entry.context_length,
        "estimated_memory_bytes": entry.estimate.total if entry.estimate else None,
        # A model with a multimodal projector takes images (OpenRouter's field name).
        "input_modalities": ["text", "image"] if entry.projector else ["text"],
        "projector": entry.projector.name if entry.projector else None,
        "estimated_projector_bytes": (
            entry.estimate.projector if entry.estimate and entry.projector else None
        ),
        # A thinking model: its answers carry `reasoning_content` apart from `content`.
        "reasoning": reasons(entry),
    }


__all__ = [
    "EMBEDDED",
    "UNROUTED",
    "EngineRegistry",
    "EngineView",
    "Lane",
    "load_engines",
    "reasons",
]
