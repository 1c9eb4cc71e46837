"""A grammar checked against text the way the engine holds a model to it: llguidance with
the default model's own vocabulary (loaded vocabulary-only: no weights)."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator

import pytest

from tests import models


@pytest.fixture(scope="session")
def allows() -> Iterator[Callable[[str, str], bool]]:
    """allows(grammar, text): whether the grammar lets an answer be exactly `text`."""
    import llama_cpp as lc
    from llguidance import LLMatcher
    from llguidance.llamacpp import lltokenizer_from_vocab

    params = lc.llama_model_default_params()
    params.vocab_only = True
    model = lc.llama_model_load_from_file(str(models.smollm2()).encode(), params)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        tokenizer = lltokenizer_from_vocab(lc.llama_model_get_vocab(model))

    def check(grammar: str, text: str) -> bool:
        matcher = LLMatcher(tokenizer, grammar, log_level=0)
        return matcher.consume_tokens(tokenizer.tokenize_str(text)) and matcher.is_accepting()

    yield check
    lc.llama_model_free(model)
