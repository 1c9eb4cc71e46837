"""--reasoning-field and --reasoning-budget: flags over BATCHYARD_* over the defaults, each
checked at start with the reason; serve, worker and run take both."""

from __future__ import annotations

import pytest

from app.cli.flags import settings_of
from app.cli.parser import build_parser
from app.config.settings import Settings


def test_the_defaults_are_reasoning_content_and_no_budget() -> None:
    s = Settings()
    assert (s.reasoning_field, s.reasoning_budget) == ("reasoning_content", None)


@pytest.mark.parametrize("command", ["serve", "worker", "run in.jsonl -o out.jsonl"])
def test_each_command_takes_both_flags(command: str) -> None:
    args = build_parser().parse_args(
        [*command.split(), "--reasoning-field", "both", "--reasoning-budget", "512"]
    )
    s = settings_of(args)
    assert (s.reasoning_field, s.reasoning_budget) == ("both", 512)


def test_the_environment_sets_them_and_minus_one_is_no_budget() -> None:
    env = {"BATCHYARD_REASONING_FIELD": "Reasoning", "BATCHYARD_REASONING_BUDGET": "0"}
    assert (Settings.load({}, env).reasoning_field, Settings.load({}, env).reasoning_budget) == (
        "reasoning",
        0,
    )
    # A flag's -1 wins over the environment's budget: no budget.
    assert Settings.load({"reasoning_budget": -1}, env).reasoning_budget is None


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"reasoning_field": "thinking"}, "unknown reasoning field 'thinking'; choose one of"),
        ({"reasoning_budget": -2}, "--reasoning-budget must be a number of tokens, 0 or more"),
    ],
)
def test_a_bad_value_is_refused_with_its_reason(changes: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Settings(**changes)  # type: ignore[arg-type]
