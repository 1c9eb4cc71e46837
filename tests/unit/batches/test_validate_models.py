"""Validation of a batch's model against a real catalog: --strict-models fails a name nothing
knows, line by line, and a model that cannot fit the memory budget alone fails its batch, in
OpenAI's `errors.data` shape; a name another node or an upstream serves passes."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest

from app.batches.lifecycle.validate import Line, ModelRules, Routed, same_model
from app.catalog import Catalog
from app.catalog.budget import gib
from app.config import Settings
from app.services import build_services
from app.tables import BatchStatus
from app.wire.batches import batch_object
from tests.factories import batch_line
from tests.fakes import FakeEngine
from tests.models import header_model, smollm2
from tests.unit.helpers import drive, file_lines, make_batch
from tests.vision import png

LINES = [Line(number=n, offset=0, length=1, custom_id=f"c{n}") for n in (1, 2, 4)]


@pytest.fixture(scope="module")
def catalog(tmp_path_factory: pytest.TempPathFactory) -> Catalog:
    """The embedded SmolLM2 (the default), `smol-a` (the same file under a name of its own)
    and `tiny` (a small header-only model, alias gpt-4o-mini), and no home store."""
    root = tmp_path_factory.mktemp("catalog")
    models = root / "models"
    models.mkdir()
    (models / "smol-a.gguf").symlink_to(smollm2())
    header_model(models / "tiny.gguf")
    config = root / "models.toml"
    config.write_text('[aliases]\ngpt-4o-mini = "tiny"\n')
    settings = Settings.load(
        {
            "data_dir": str(root / "data"),
            "models_dir": [str(models)],
            "models_config": str(config),
            "no_discover": True,
        },
        environ={},
    )
    return Catalog(settings, home=root / "home", environ={})


def smol_need(catalog: Catalog) -> int:
    entry = catalog.resolve("smol-a")
    assert entry is not None and entry.estimate is not None
    return entry.estimate.total


def rules(
    catalog: Catalog, *, strict: bool, budget: int, elsewhere: dict[str, str] | None = None
) -> ModelRules:
    there = elsewhere or {}
    return ModelRules(catalog, elsewhere=lambda: there, budget=lambda: budget, strict=strict)


def test_a_known_name_or_alias_passes(catalog: Catalog) -> None:
    roomy = rules(catalog, strict=True, budget=2 * smol_need(catalog))
    # smol-a is the default model's file under another name: one entry, the default's id.
    smol = catalog.resolve("smol-a")
    assert smol is not None and smol.is_default
    assert roomy.route("smol-a", LINES).route == smol.id
    # An alias, another letter case, a bare name for name:latest: the model's id.
    assert roomy.route("gpt-4o-mini", LINES).route == "tiny"
    assert roomy.route("GPT-4o-Mini", LINES).route == "tiny"
    assert roomy.route("Smol-A", LINES).route == smol.id
    assert roomy.route("tiny", LINES).errors == []


def test_strict_fails_each_line_of_a_name_nothing_knows(catalog: Catalog) -> None:
    errors = (
        rules(catalog, strict=True, budget=2 * smol_need(catalog)).route("gemma3", LINES).errors
    )
    assert [e.to_openai()["line"] for e in errors] == [1, 2, 4]
    assert {e.code for e in errors} == {"model_not_found"}
    assert {e.param for e in errors} == {"body.model"}
    assert "'gemma3' does not exist" in errors[0].message


def test_without_strict_an_unknown_name_runs_on_the_default_model(catalog: Catalog) -> None:
    need = smol_need(catalog)
    unknown = rules(catalog, strict=False, budget=need).route("gemma3", LINES)
    assert unknown.errors == [] and unknown.route == ""  # the default model's lines
    # ... which must fit the budget itself: the default is SmolLM2, as smol-a is.
    errors = rules(catalog, strict=False, budget=need - 1).route("gemma3", LINES).errors
    assert [e.code for e in errors] == ["model_too_large"]
    assert errors[0].message.startswith(
        "The model 'gemma3' names no model here and runs on the default model "
        f"'SmolLM2-135M-Instruct.Q4_1', which needs {gib(need)}, the budget is {gib(need - 1)}"
    )


def test_a_name_another_node_or_an_upstream_serves_passes_strict(catalog: Catalog) -> None:
    budget = smol_need(catalog)
    gemma = {"gemma3:270m": "gemma3:270m"}
    there = rules(catalog, strict=True, budget=budget, elsewhere=gemma)
    # Read by the same rules as this node's names: case aside, `:latest` added.
    assert there.route("Gemma3:270M", []) == Routed("gemma3:270m")
    assert there.route("gemma3", LINES).errors[0].code == "model_not_found"


def test_a_model_that_cannot_fit_alone_fails_its_batch_with_both_sizes(catalog: Catalog) -> None:
    need = smol_need(catalog)
    errors = rules(catalog, strict=False, budget=need // 2).route("smol-a", LINES).errors
    assert len(errors) == 1
    error = errors[0].to_openai()
    assert error["code"] == "model_too_large" and error["line"] is None
    assert (
        f"The model 'smol-a' needs {gib(need)}, the budget is {gib(need // 2)}" in error["message"]
    )
    assert rules(catalog, strict=False, budget=need // 2).route("tiny", LINES).errors == []
    # A node that publishes it fits it in its own budget: the batch waits for that node,
    # by the id the name has there.
    elsewhere = {"smol-a": "smol-a-there"}
    assert rules(catalog, strict=False, budget=1, elsewhere=elsewhere).route(
        "smol-a", []
    ) == Routed("smol-a-there")


def test_the_runner_fails_such_a_batch_at_validation(catalog: Catalog, tmp_path: Path) -> None:
    svc = build_services(Settings(data_dir=str(tmp_path)), FakeEngine())
    need = smol_need(catalog)
    svc.runner.models = rules(catalog, strict=True, budget=need // 2)
    unknown = make_batch(svc, [batch_line(f"c{i}", "hi", model="gemma3") for i in range(3)])
    too_big = make_batch(svc, [batch_line("c0", "hi", model="smol-a")])
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
    assert f"needs {gib(need)}, the budget is {gib(need // 2)}" in (shown.data[0].message or "")
    assert results[too_big].total == 0  # no line was queued


def image_line(cid: str, model: str) -> dict[str, Any]:
    line = batch_line(cid, "What is this?", model=model)
    pixel = base64.b64encode(png((200, 30, 30), size=(8, 8))).decode()
    line["body"]["messages"][-1]["content"] = [
        {"type": "text", "text": "What is this?"},
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{pixel}"}},
    ]
    return line


@pytest.mark.parametrize("strict", [False, True])
def test_an_image_line_for_a_model_that_takes_no_images_fails_at_validation(
    catalog: Catalog, tmp_path: Path, strict: bool
) -> None:
    svc = build_services(Settings(data_dir=str(tmp_path)), FakeEngine())
    svc.runner.models = rules(catalog, strict=strict, budget=2 * smol_need(catalog))
    lines = [batch_line("t0", "hi", model="tiny"), image_line("i1", "tiny")]
    lines += [batch_line("t2", "hi", model="tiny"), image_line("i3", "tiny")]
    done = drive(svc, make_batch(svc, lines))
    message = "The model 'tiny' takes no images (it has no multimodal projector), and line"
    if strict:  # as for an unknown model: the whole batch fails, each such line named
        shown = batch_object(done).errors
        assert done.status == BatchStatus.FAILED and shown is not None
        assert [(e.code, e.line) for e in shown.data] == [
            ("model_takes_no_images", 2),
            ("model_takes_no_images", 4),
        ]
        assert message in (shown.data[0].message or "")
        return
    # Without --strict-models they fail alone, and the text lines run.
    assert (done.status, done.completed, done.failed) == (BatchStatus.COMPLETED, 2, 2)
    errors = {e["custom_id"]: e["response"] for e in file_lines(svc, done.error_file_id)}
    assert sorted(errors) == ["i1", "i3"]
    assert {e["status_code"] for e in errors.values()} == {400}
    assert {e["body"]["error"]["code"] for e in errors.values()} == {"model_takes_no_images"}
    assert f"{message} 2 holds one" in errors["i1"]["body"]["error"]["message"]
    assert sorted(x["custom_id"] for x in file_lines(svc, done.output_file_id)) == ["t0", "t2"]


def test_a_batch_that_spells_one_model_several_ways_runs_on_it(
    catalog: Catalog, tmp_path: Path
) -> None:
    svc = build_services(Settings(data_dir=str(tmp_path)), FakeEngine())
    svc.runner.models = rules(
        catalog, strict=True, budget=2 * smol_need(catalog), elsewhere={"far": "far-id"}
    )
    # The id, an alias, another letter case: one model, `tiny`.
    mixed = ["tiny", "gpt-4o-mini", "TINY", "Gpt-4o-Mini"]
    one = make_batch(svc, [batch_line(f"c{i}", "hi", model=m) for i, m in enumerate(mixed)])
    # Two models, each known: the second is a mismatch, however it is spelled.
    two = make_batch(
        svc, [batch_line("c0", "hi", model="tiny"), batch_line("c1", "hi", model="SMOL-A")]
    )
    # Another node's model, spelled two ways, is one model there.
    far = make_batch(
        svc, [batch_line("c0", "hi", model="far"), batch_line("c1", "hi", model="FAR")]
    )
    results = {b: drive(svc, b) for b in (one, two, far)}
    assert results[one].status == BatchStatus.COMPLETED
    assert (results[one].route, results[one].total) == ("tiny", 4)
    assert results[far].route == "far-id"
    shown = batch_object(results[two]).errors
    assert results[two].status == BatchStatus.FAILED and shown is not None
    assert [(e.code, e.line) for e in shown.data] == [("mismatched_model", 2)]


def test_names_nothing_knows_are_one_model_by_the_name_rule() -> None:
    # Without a catalog (the dashboard's preview), or for names no model has: by
    # `lookup`'s rule alone (they run on the default model).
    assert same_model("foo", "Foo:latest") and same_model("FOO:latest", "foo")
    assert not same_model("foo", "bar")
    assert not same_model("foo:1b", "foo:2b")
