"""Runner-level test helpers: services on a real SQLite file, a batch made the way the API makes it."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from app.batches import runner as runner_module
from app.catalog import Entry
from app.config import Settings, bundled_model_path
from app.engine.pool.pool import ModelPool
from app.engine.registry import EngineRegistry
from app.services import Services, build_services
from app.tables import Batch, BatchStatus, File, Request, RequestStatus
from tests.catalogs import DictCatalog, entry
from tests.factories import CHAT, batch_line, jsonl, jsonl_lines
from tests.fakes import HangingEngine


def services(data_dir: Path, engine: Any, **settings: Any) -> Services:
    return build_services(Settings(data_dir=str(data_dir), **settings), engine)


def make_batch(svc: Services, lines: list[dict[str, Any]] | bytes, owner: str = "") -> str:
    data = lines if isinstance(lines, bytes) else jsonl(*lines)
    partial = svc.storage.begin_write(len(data) + 1)
    partial.write(data)
    f = svc.files.create(partial=partial, filename="in.jsonl", purpose="batch", owner=owner)
    return svc.batches.create(owner, f.id, CHAT).id


def batch(svc: Services, batch_id: str) -> Batch:
    with svc.db.read() as s:
        b = s.get(Batch, batch_id)
        assert b is not None
        return b


def drive(svc: Services, batch_id: str, timeout: float = 20) -> Batch:
    """Step the runner until the batch ends (a loop of work, each turn a step: not an until())."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        svc.runner.step()
        b = batch(svc, batch_id)
        if b.status in BatchStatus.FINISHED:
            return b
        time.sleep(0.01)
    raise AssertionError(f"batch {batch_id} stayed {batch(svc, batch_id).status}")


def file_lines(svc: Services, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    text = svc.storage.path(file_id).read_text(encoding="utf-8")
    return jsonl_lines(text)


def request_rows(svc: Services, batch_id: str) -> list[Request]:
    from sqlmodel import select

    with svc.db.read() as s:
        return list(s.exec(select(Request).where(Request.batch_id == batch_id)).all())


def running(svc: Services, batch_id: str) -> int:
    """How many of the batch's lines are running now."""
    return sum(r.status == RequestStatus.RUNNING for r in request_rows(svc, batch_id))


def hanging_lines(prefix: str, n: int, model: str) -> list[dict[str, Any]]:
    """`n` batch lines for `model` that a HangingEngine holds until the test finishes them."""
    return [batch_line(f"{prefix}{i}", f"HANG {prefix}{i}", model=model) for i in range(n)]


def file_rows(svc: Services) -> list[File]:
    from sqlmodel import select

    with svc.db.read() as s:
        return list(s.exec(select(File)).all())


#: A pool node's settings: one model loaded at a time, switched as soon as its queue empties.
MODEL_SETTINGS = dict(max_loaded_models=1, model_ttl="0", model_switch_after="1h")


def pool_node(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    loader: Callable[[Settings, Entry], HangingEngine],
    second: str,
    *aliases: str,
) -> tuple[Services, ModelPool]:
    """A node whose pool, loading with `loader`, holds the default model "a" and `second`
    (also named `aliases`); the runner tells the pool its demand at every step."""
    monkeypatch.setattr(runner_module, "DEMAND_INTERVAL", 0.0)
    monkeypatch.setattr(runner_module, "DEMAND_SHARE", 0)
    settings = Settings(**MODEL_SETTINGS)
    path = bundled_model_path()
    # One file under two load profiles: two engines (a loaded engine is keyed by both).
    other = Settings(**MODEL_SETTINGS, ctx_size=1024)
    catalog = DictCatalog(
        [entry("a", path, settings, default=True), entry(second, path, other, *aliases)]
    )
    pool = ModelPool(settings, catalog, budget=1 << 40, loader=loader)
    pool.start()
    return services(tmp_path, EngineRegistry(pool, []), **MODEL_SETTINGS), pool
