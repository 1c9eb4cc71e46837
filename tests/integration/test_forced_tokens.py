"""Forced tokens fed as a chunk change nothing: under greedy decoding each answer's token
ids are the same whether the grammar's forced tokens go into one decode or are sampled a
step each, and usage counts every one of them."""

from __future__ import annotations

import functools
from typing import Any

import pytest

from app.config import Settings
from app.engine.llama.binding import grammars
from app.engine.llama.contexts import sequences, slots_context
from app.engine.llama.contexts.sequences import Sequences, fill_rows
from app.engine.llama.contexts.slots import Seq
from app.engine.llama.engine import LlamaEngine
from app.engine.llama.loading import load_engine
from app.wire.endpoints import CHAT
from tests.schemas import SCHEMAS


@pytest.fixture(scope="module")
def engine() -> Any:
    eng = load_engine(Settings(parallel=len(SCHEMAS), ctx_size=512))
    yield eng
    eng.close()


def body(question: str, schema: dict[str, Any]) -> dict[str, Any]:
    """A greedy chat request whose answer holds to `schema`."""
    return {
        "messages": [{"role": "user", "content": question}],
        "temperature": 0,
        "max_tokens": 96,
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "a", "schema": schema, "strict": True},
        },
    }


def answers(
    engine: LlamaEngine, monkeypatch: pytest.MonkeyPatch, fed: list[int]
) -> list[tuple[list[int], int]]:
    """Each schema's answer: its token ids and usage.completion_tokens; `fed` gets the
    count of each chunk of forced tokens."""
    tokens: dict[str, list[int]] = {}
    finish, forced = Sequences.finish, sequences.forced

    def counted(matcher: Any) -> list[int]:
        ahead = forced(matcher)
        if ahead:
            fed.append(len(ahead))
        return ahead

    def record(self: Sequences, slot: Seq, reason: str) -> None:
        assert slot.job is not None and slot.choice is not None
        tokens[slot.job.id] = list(slot.choice.tokens)
        finish(self, slot, reason)

    monkeypatch.setattr(Sequences, "finish", record)
    monkeypatch.setattr(sequences, "forced", counted)
    futures = [engine.submit(CHAT, body(question, schema)) for question, schema in SCHEMAS]
    results = [f.result(timeout=300) for f in futures]
    monkeypatch.undo()
    return [(tokens[r["id"]], r["usage"]["completion_tokens"]) for r in results]


def test_forced_tokens_leave_every_answer_as_it_was(
    engine: LlamaEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    chunks: list[int] = []
    fed = answers(engine, monkeypatch, chunks)
    assert sum(chunks) > len(SCHEMAS)  # keys and punctuation went in as chunks
    # Each slot's whole chunk in one decode (the shared-prefix context's way; the slots'
    # feed chunks of one length for every generating slot).
    monkeypatch.setattr(slots_context, "fill_rows", functools.partial(fill_rows, streams=False))
    chunked = answers(engine, monkeypatch, [])
    monkeypatch.setattr(grammars, "FEED_FORCED", False)
    none: list[int] = []
    stepped = answers(engine, monkeypatch, none)
    assert not none
    assert fed == chunked == stepped
    for ids, completion_tokens in fed:
        assert completion_tokens == len(ids) > 0


def test_a_request_alone_takes_its_forced_tokens_in_fewer_decodes(
    engine: LlamaEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One sequence generating in the slots' context: its chunks add no ubatch, so they go
    in whole, and the answer needs fewer decodes (an online request's wait)."""
    request = body(*SCHEMAS[0])
    decodes: list[int] = []
    decode = slots_context.SlotsContext.decode

    def counted(self: Any, n: int) -> bool:
        decodes.append(n)
        return bool(decode(self, n))

    monkeypatch.setattr(slots_context.SlotsContext, "decode", counted)
    chunked = engine.submit(CHAT, request).result(timeout=300)
    steps_chunked, decodes[:] = len(decodes), []
    monkeypatch.setattr(grammars, "FEED_FORCED", False)
    stepped = engine.submit(CHAT, request).result(timeout=300)
    steps_stepped = len(decodes)
    text = chunked["choices"][0]["message"]["content"]
    assert text == stepped["choices"][0]["message"]["content"]
    tokens = chunked["usage"]["completion_tokens"]
    assert tokens == stepped["usage"]["completion_tokens"]
    # The prompt and the sampled tokens take a decode each; forced ones ride along.
    assert steps_chunked < steps_stepped <= tokens + 2
