"""What the runner, the API and validation ask of a node's engines besides the Engine contract.

The server hands them one `Engine` (base.py): the registry of every engine the node runs
(registry.py), or a test's lone engine. What only a node as a whole can answer is asked
here, of whichever it is, and nowhere else: which lines each engine takes (`lanes`), what
waits for the pool (`demand`, `pooled`), the id a batch line runs as (`run_as`), the id a
name means (`model_id`), the `/v1/models` cards (`model_cards`), each engine's figures
(`members`), and the models validation and the other nodes read (`ModelDirectory`). The
dashboard and /metrics also read the pool's own views (`model_pool`: each `ModelView`, and
whether its model `reasons`) and an upstream's probe (`UpstreamStatus`). import-linter keeps the runner, the API, the
dashboard and /metrics to this module and base.py (pyproject: `engine-contract`); only the
builders of the engines (app.server, app.worker, app.offline, app.cli) reach further.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from app.catalog import DEFAULT_ROUTE, Catalog, Entry, lookup
from app.engine.base import Engine, EngineError
from app.engine.pool import ModelView
from app.engine.pool.loading import node_budget
from app.engine.pool.pool import ModelPool
from app.engine.registry import EMBEDDED, UNROUTED, EngineRegistry, EngineView, Lane, reasons
from app.engine.upstream.engine import UpstreamStatus

if TYPE_CHECKING:
    from app.config import Settings


def members(engine: Engine | None) -> list[EngineView]:
    """Each engine behind `engine`: a registry's members, or a lone engine as `embedded`."""
    if engine is None:
        return []
    if isinstance(engine, EngineRegistry):
        return engine.members()
    return [
        EngineView(
            name=EMBEDDED,
            kind="embedded",
            url=None,
            models=[engine.info.id],
            up=True,
            info=engine.info,
            stats=engine.stats(),
        )
    ]


def model_pool(engine: Engine | None) -> ModelPool | None:
    """The model pool behind `engine` (a registry's `pool`), for the dashboard's Models page
    and /metrics; None without one (--no-embedded, a failed start, a test's lone engine)."""
    return engine.pool if isinstance(engine, EngineRegistry) else None


def pooled(engine: Engine | None) -> bool:
    """Whether a model pool is behind `engine`: whether batch lines' demand means anything."""
    return model_pool(engine) is not None


def lanes(engine: Engine) -> list[Lane]:
    """The lanes behind `engine`: a registry's, or one lane with every line for a lone
    engine."""
    if isinstance(engine, EngineRegistry):
        return engine.lanes()
    return [Lane(EMBEDDED, engine.info.lane_sequences)]


def model_id(engine: Engine, name: str) -> str | None:
    """The id `name` means to `engine` by `app.catalog.lookup`'s rule (a registry's
    `serving`, a lone engine's own id), or None when it means no model there."""
    if isinstance(engine, EngineRegistry):
        found = engine.serving(name)
        return found[1] if found is not None else None
    return lookup({engine.info.id: engine.info.id}, name)


def model_cards(engine: Engine) -> list[dict[str, Any]]:
    """`/v1/models`' cards behind `engine`: a registry's (a catalog model's with what loading
    it takes, `source` among them), or a lone engine's model."""
    if isinstance(engine, EngineRegistry):
        return engine.model_cards()
    return [{"id": engine.info.id, "created": engine.info.created, "owned_by": "batchyard"}]


def run_as(engine: Engine, route: str, named: object) -> str | EngineError:
    """The model id a batch line of `route` runs as (the id validation resolved): the route
    itself, or for the default route (`DEFAULT_ROUTE`) this node's default model (the
    pool's default entry, a lone engine's model). Where no engine here runs those lines (no
    embedded engine), the 404 of a model nothing serves (`named`: the name the line gave)."""
    if route != DEFAULT_ROUTE:
        return route
    if isinstance(engine, EngineRegistry):
        default = engine.default_model()
        return default if default is not None else engine.unknown_model(named)
    return engine.info.id


def demand(engine: Engine, lines: list[tuple[str | None, int, float]]) -> None:
    """Tell the engine's pool, if it has one, which batch lines wait for which model."""
    if isinstance(engine, EngineRegistry):
        engine.demand(lines)


class ModelDirectory:
    """The models a node's engines serve, as its published names and its validation read
    them: the catalog (the pool's, or one read from the settings without a pool), the
    memory budget its models load within, the upstreams' names, and what a name means."""

    def __init__(self, engine: Engine, settings: Settings) -> None:
        self._registry = engine if isinstance(engine, EngineRegistry) else None
        pool = self._registry.pool if self._registry is not None else None
        #: A model pool runs the catalog's models (validation checks their memory then).
        self.pooled = pool is not None
        # The pool's own catalog and budget (measured before its first load), where it has them.
        own = pool.catalog if pool is not None and isinstance(pool.catalog, Catalog) else None
        self.catalog: Catalog = own or Catalog(settings)
        self._settings = settings
        self._budget: list[int] = [pool.budget()[1]] if pool is not None else []

    def budget(self) -> int:
        """The bytes this node's models may take: measured once, on first use, as what the
        machine had free for models (the pool's, measured before its first load)."""
        if not self._budget:
            self._budget.append(node_budget(self._settings))
        return self._budget[0]

    def configured(self) -> list[str]:
        """The upstreams' configured names (`models=`), in their order."""
        upstreams = self._registry.upstreams if self._registry is not None else []
        return [name for upstream in upstreams for name in upstream.spec.models]

    def listed(self) -> frozenset[str]:
        """The names the upstreams' own `GET /v1/models` give now."""
        upstreams = self._registry.upstreams if self._registry is not None else []
        return frozenset(m for upstream in upstreams for m in upstream.models())

    def serving(self, model: str) -> tuple[str, Entry | None] | None:
        """The id `model` means here and its catalog entry (None for an upstream's model), by
        the registry's `serving` (the catalog's `resolve` without a registry); None when no
        engine here knows it."""
        if self._registry is None:
            entry = self.catalog.resolve(model)
            return (entry.id, entry) if entry is not None else None
        found = self._registry.serving(model)
        return (found[1], found[2]) if found is not None else None


__all__ = [
    "EMBEDDED",
    "UNROUTED",
    "EngineView",
    "Lane",
    "ModelDirectory",
    "ModelView",
    "UpstreamStatus",
    "demand",
    "lanes",
    "members",
    "model_cards",
    "model_id",
    "model_pool",
    "pooled",
    "reasons",
    "run_as",
]
