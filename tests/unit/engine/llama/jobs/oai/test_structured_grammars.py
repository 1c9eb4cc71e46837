"""The grammars of structured answers (engine/structured.py), checked against text with the
default model's vocabulary: objects closed, JSON spelled one way, a free thought before the
answer."""

from __future__ import annotations

from collections.abc import Callable

from app.engine import structured

Allows = Callable[[str, str], bool]
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


def test_objects_hold_their_listed_properties_only_in_one_spelling(allows: Allows) -> None:
    grammar = structured.json_schema_grammar({"schema": SCHEMA})
    assert allows(grammar, '{"a": 1}')
    assert not allows(grammar, '{"a": 1, "b": 2}')
    assert not allows(grammar, '{"a":1}') and not allows(grammar, '{ "a": 1 }')


def test_a_free_thought_may_come_before_the_answer(allows: Allows) -> None:
    schema = structured.json_schema_grammar({"schema": SCHEMA})
    grammar = structured.after_thought(schema, ("<think>", None), ("</think>", None), opened=False)
    assert allows(grammar, '<think>It is {one}, I think.</think>\n\n{"a": 1}')
    assert allows(grammar, '{"a": 1}')  # the model may answer without a thought
    assert not allows(grammar, "<think>one</think>one") and not allows(grammar, "one")
    opened = structured.after_thought(schema, ("<think>", None), ("</think>", None), opened=True)
    assert allows(opened, 'It is {one}.</think>{"a": 1}')
    assert not allows(opened, '{"a": 1}')  # the template opened a thought: it must close
