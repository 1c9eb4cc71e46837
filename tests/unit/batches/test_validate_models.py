"""Validation of a batch's model: --strict-models fails a name nothing knows, line by line,
and a model that cannot fit the memory budget alone fails its batch, in OpenAI's
`errors.data` shape; a name another node or an upstream serves passes."""

from __future__ import annotations

from pathlib import Path

from app.batches.validate import Line, ModelRules
from app.catalog import Entry, Estimate, LoadProfile
from app.config import Settings
from app.services import build_services
from app.tables import BatchStatus
from app.wire.batches import batch_object
from tests.factories import batch_line
from tests.fakes import FakeEngine
from tests.unit.helpers import drive, make_batch

GIB = 2**30


def entry(model_id: str, gib: float, *names: str, default: bool = False) -> Entry:
    return Entry(
        id=model_id,
        names=frozenset({model_id, *names}),
        source="models-dir",
        path=Path(f"/models/{model_id}.gguf"),
        size_bytes=1,
        mtime=0.0,
        quantization="Q4_K_M",
        profile=LoadProfile(ctx_size=2048, parallel=0, n_gpu_layers=0, kv_cache_type="q8_0"),
        estimate=Estimate(int(gib * GIB) - 2 * (GIB // 8), GIB // 8, GIB // 8),
        is_default=default,
    )


class StandInCatalog:
    """The two calls validation makes of app.catalog's Catalog, over a list of entries."""

    def __init__(self, *entries: Entry) -> None:
        self.by_name = {name: e for e in entries for name in e.names}
        self.first = entries[0]

    def resolve(self, name: str | None) -> Entry | None:
        return self.by_name.get(name or "")

    def default(self) -> Entry:
        return self.first


SMOL = entry("smol", 0.3, "gpt-4o-mini", default=True)
BIG = entry("llama-70b", 42.5, "llama-70b:latest")
LINES = [Line(number=n, offset=0, length=1, custom_id=f"c{n}") for n in (1, 2, 4)]


def rules(
    *, strict: bool, elsewhere: frozenset[str] = frozenset(), budget: float = 8
) -> ModelRules:
    return ModelRules(
        StandInCatalog(SMOL, BIG),
        elsewhere=lambda: elsewhere,
        budget=lambda: int(budget * GIB),
        strict=strict,
    )


def test_a_known_name_or_alias_passes() -> None:
    assert rules(strict=True).errors("smol", LINES) == []
    assert rules(strict=True).errors("gpt-4o-mini", LINES) == []


def test_strict_fails_each_line_of_a_name_nothing_knows() -> None:
    errors = rules(strict=True).errors("gemma3:270m", LINES)
    assert [e.to_openai()["line"] for e in errors] == [1, 2, 4]
    assert {e.code for e in errors} == {"model_not_found"}
    assert {e.param for e in errors} == {"body.model"}
    assert "'gemma3:270m' does not exist" in errors[0].message


def test_without_strict_an_unknown_name_runs_on_the_default_model() -> None:
    assert rules(strict=False).errors("gemma3:270m", LINES) == []
    # ... which must fit the budget itself.
    errors = rules(strict=False, budget=0.25).errors("gemma3:270m", LINES)
    assert [e.code for e in errors] == ["model_too_large"]
    assert "'smol' needs 0.30 GiB, the budget is 0.25 GiB" in errors[0].message


def test_a_name_another_node_or_an_upstream_serves_passes_strict() -> None:
    elsewhere = frozenset({"gemma3:270m"})
    assert rules(strict=True, elsewhere=elsewhere).errors("gemma3:270m", LINES) == []


def test_a_model_that_cannot_fit_alone_fails_its_batch_with_both_sizes() -> None:
    errors = rules(strict=False).errors("llama-70b:latest", LINES)
    assert len(errors) == 1
    error = errors[0].to_openai()
    assert error["code"] == "model_too_large" and error["line"] is None
    assert "The model 'llama-70b' needs 42.50 GiB, the budget is 8.00 GiB" in error["message"]
    # A node that publishes it fits it in its own budget: the batch waits for that node.
    elsewhere = frozenset({"llama-70b:latest"})
    assert rules(strict=False, elsewhere=elsewhere).errors("llama-70b:latest", LINES) == []
    assert rules(strict=False, budget=64).errors("llama-70b", LINES) == []


def test_the_runner_fails_such_a_batch_at_validation(tmp_path: Path) -> None:
    svc = build_services(Settings(data_dir=str(tmp_path)), FakeEngine())
    svc.runner.models = rules(strict=True)
    unknown = make_batch(svc, [batch_line(f"c{i}", "hi", model="gemma3:270m") for i in range(3)])
    too_big = make_batch(svc, [batch_line("c0", "hi", model="llama-70b")])
    known = make_batch(svc, [batch_line("c0", "hi", model="gpt-4o-mini")])
    results = {b: drive(svc, b) for b in (unknown, too_big, known)}
    assert results[known].status == BatchStatus.COMPLETED
    shown = batch_object(results[unknown]).errors
    assert results[unknown].status == BatchStatus.FAILED and shown is not None
    assert [(e.code, e.line, e.param) for e in shown.data] == [
        ("model_not_found", n, "body.model") for n in (1, 2, 3)
    ]
    shown = batch_object(results[too_big]).errors
    assert results[too_big].status == BatchStatus.FAILED and shown is not None
    assert [e.code for e in shown.data] == ["model_too_large"]
    assert "needs 42.50 GiB, the budget is 8.00 GiB" in (shown.data[0].message or "")
    assert results[too_big].total == 0  # no line was queued
