"""The thinking models (harness/reasoning_model.py) as llama.cpp and batchyard read them: each
format's tags are single tokens of the kind its family's GGUF has, the right tokens end
generation, the template renders the family's generation prompt (and batchyard's `detect`
knows the family), and greedy, each model writes its tags around a thought and an answer.

The models are written once per machine (tests/reasoning.py, about 8 s the first time);
here each is loaded (its vocabulary, or the whole model for a few greedy tokens).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import llama_cpp as lc
import pytest
from llama_cpp.llama_chat_format import Jinja2ChatFormatter

from app.engine.reasoning import detect
from harness.reasoning_model import HARMONY_TAGS, THINK_TAGS

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module", params=["think", "opened", "channels"])
def model(request: pytest.FixtureRequest, reasoning_models: dict[str, Path]) -> Iterator[lc.Llama]:
    llm = lc.Llama(str(reasoning_models[request.param]), n_ctx=256, n_threads=2, verbose=False)
    llm.fmt = request.param  # type: ignore[attr-defined]
    yield llm
    llm.close()


def token(llm: lc.Llama, text: str) -> int:
    """The one token `text` (a tag) is, as llama.cpp parses special tokens in a prompt."""
    ids = llm.tokenize(text.encode(), add_bos=False, special=True)
    assert len(ids) == 1, (text, ids)
    return ids[0]


def render(llm: lc.Llama, messages: list[dict[str, str]], prompt: bool = True, **kw: object) -> str:
    """The model's own template, rendered as batchyard renders it (llama-cpp-python's
    Jinja2ChatFormatter)."""
    template = llm.metadata["tokenizer.chat_template"]
    formatter = Jinja2ChatFormatter(template, "", "", add_generation_prompt=prompt)
    return formatter(messages=messages, **kw).prompt  # type: ignore[arg-type]


def test_tags_are_tokens_of_their_family_and_the_right_ones_end_generation(
    model: lc.Llama,
) -> None:
    vocab = lc.llama_model_get_vocab(model.model)
    tags = HARMONY_TAGS if model.fmt == "channels" else THINK_TAGS  # type: ignore[attr-defined]
    attr = {t: lc.llama_vocab_get_attr(vocab, token(model, t)) for t in tags}
    im_end = token(model, "<|im_end|>")
    assert lc.llama_vocab_is_eog(vocab, im_end)
    if model.fmt == "channels":  # type: ignore[attr-defined]
        # written as control tokens; llama.cpp renders <|start|>, <|channel|>, <|message|>
        # (user-defined) and takes <|end|> out of the end-of-generation tokens, as it does
        # for gpt-oss, because <|return|> and <|call|> are there
        ret, end = token(model, "<|return|>"), token(model, "<|end|>")
        assert lc.llama_vocab_eos(vocab) == lc.llama_vocab_eot(vocab) == ret
        assert lc.llama_vocab_is_eog(vocab, ret) and lc.llama_vocab_is_eog(
            vocab, token(model, "<|call|>")
        )
        assert not lc.llama_vocab_is_eog(vocab, end)
        assert attr["<|return|>"] & lc.LLAMA_TOKEN_ATTR_CONTROL
        for tag in ("<|start|>", "<|channel|>", "<|message|>", "<|end|>"):
            assert attr[tag] & lc.LLAMA_TOKEN_ATTR_USER_DEFINED, tag
    else:  # user-defined, as in Qwen3's GGUF: always rendered, never the end
        assert lc.llama_vocab_eos(vocab) == im_end
        for tag in THINK_TAGS:
            assert attr[tag] & lc.LLAMA_TOKEN_ATTR_USER_DEFINED, tag
            assert not lc.llama_vocab_is_eog(vocab, token(model, tag))


def test_the_template_renders_the_familys_generation_prompt(model: lc.Llama) -> None:
    fmt = model.fmt  # type: ignore[attr-defined]
    template = model.metadata["tokenizer.chat_template"]
    prompt = render(model, QUESTION)
    found = detect(template, prompt)
    assert found is not None
    if fmt == "channels":
        assert prompt == (
            "<|start|>system<|message|>Reasoning: medium<|end|>"
            "<|start|>user<|message|>What is the capital of France?<|end|><|start|>assistant"
        )
        assert "Reasoning: low<|end|>" in render(model, QUESTION, reasoning_effort="low")
        assert (found.name, found.reads_effort, found.opened) == ("channels", True, False)
        return
    assert found.name == "think"
    if fmt == "opened":
        assert prompt.endswith("<|im_start|>assistant\n<think>\n")
        assert found.opened and not found.switch
        return
    assert prompt.endswith("<|im_start|>assistant\n")
    assert render(model, QUESTION, enable_thinking=False).endswith(
        "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )
    assert found.switch and not found.opened
    # Qwen3's: an answer after the last question shows its thought, an earlier one does not
    answered = [*QUESTION, {"role": "assistant", "content": "Paris.", "reasoning_content": "Easy."}]
    assert render(model, answered, prompt=False).endswith(
        "<|im_start|>assistant\n<think>\nEasy.\n</think>\n\nParis.<|im_end|>\n"
    )
    again = render(model, [*answered, {"role": "user", "content": "And Italy?"}])
    assert "Easy." not in again and "<|im_start|>assistant\nParis.<|im_end|>" in again


#: What each writes greedily to QUESTION, in its first tokens: its tags in place (channels:
#: the whole answer, to its end).
SHAPES = {
    "think": (10, r"<think>\n[^<]+</think>"),
    "opened": (8, r"[^<]+</think>"),
    "channels": (
        28,
        r"<\|channel\|>analysis<\|message\|>[^<]+<\|end\|>"
        r"<\|start\|>assistant<\|channel\|>final<\|message\|>[^<]+<\|return\|>",
    ),
}


def test_greedy_the_model_writes_its_tags(model: lc.Llama) -> None:
    n, shape = SHAPES[model.fmt]  # type: ignore[attr-defined]
    vocab = lc.llama_model_get_vocab(model.model)
    prompt = model.tokenize(render(model, QUESTION).encode(), add_bos=False, special=True)
    out: list[int] = []
    for t in model.generate(prompt, temp=0.0, top_k=1):
        out.append(t)
        if lc.llama_vocab_is_eog(vocab, t) or len(out) >= n:
            break
    text = b"".join(model.detokenize([t], special=True) for t in out).decode()
    assert re.match(shape, text), text
