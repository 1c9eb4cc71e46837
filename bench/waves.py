"""Where an engine batch's seconds go, step by step: a bench-only trace (`throughput.py --trace`).

Nothing here runs in a server. `install()` is called in the engine worker of
`throughput.py --batchyard engine --trace` before the engine loads:
- llama.cpp's eval callback (`cb_eval`, set on the generation context only) sees every
  micro-batch's first attention output, so each `llama_decode` reports its ubatches, their
  tokens and streams, and `n_kv` (the cells attention scans per stream);
- the engine's `_decode` is wrapped: each step's rows split into prompt rows and generated
  rows, the stream copies queued for it, its wall time, and the time before the first ubatch
  computes (the queued stream copies and the graph's build: "copy" below);
- the rest of the wall time is the loop's Python (admission, sampling, answers).

`summary()` prints the totals by kind of step (prefill: any prompt rows; decode: generated
rows only) and the first steps one by one. The callback makes each ubatch stop once in the
middle of its graph, so the traced run is a little slower than a plain one.
"""

from __future__ import annotations

import ctypes
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import llama_cpp as lc


class GgmlTensor(ctypes.Structure):
    """The head of ggml.h's struct ggml_tensor, as far as the name (GGML_MAX_SRC 10)."""

    _fields_ = [
        ("type", ctypes.c_int),
        ("buffer", ctypes.c_void_p),
        ("ne", ctypes.c_int64 * 4),
        ("nb", ctypes.c_size_t * 4),
        ("op", ctypes.c_int),
        ("op_params", ctypes.c_int32 * 16),
        ("flags", ctypes.c_int32),
        ("src", ctypes.c_void_p * 10),
        ("view_src", ctypes.c_void_p),
        ("view_offs", ctypes.c_size_t),
        ("data", ctypes.c_void_p),
        ("name", ctypes.c_char * 64),
    ]


def _tensor(ptr: int | None) -> GgmlTensor | None:
    return GgmlTensor.from_address(ptr) if ptr else None


@dataclass
class Ubatch:
    tokens: int
    n_kv: int  # cells attention scans per stream (0: not found)
    streams: int


@dataclass
class Step:
    context: str  # "main" (a stream a slot) or "shared" (the shared-prefix context)
    prompt_rows: int
    gen_rows: int
    copies: int  # stream copies queued for this decode (llama_memory_seq_cp across streams)
    seconds: float = 0.0
    cpu: float = 0.0  # the process's CPU seconds over the decode (all its threads)
    before_first: float = 0.0  # decode start -> first ubatch's attention: copies + graph build
    ubatches: list[Ubatch] = field(default_factory=list)


class Trace:
    def __init__(self) -> None:
        self.steps: list[Step] = []
        self.t_start = 0.0
        self.t_end = 0.0
        self._t_decode = 0.0
        self._copies = 0
        self.callback = lc.ggml_backend_sched_eval_callback(self._on_tensor)

    # llama.cpp calls this for each graph node with ask=True; True asks for the node's data,
    # which makes the scheduler stop there once per ubatch (the first layer's attention).
    def _on_tensor(self, t: int, ask: bool, _user: int) -> bool:
        node = _tensor(t)
        if node is None or node.name != b"kqv_out-0":
            return False
        if ask and self.steps:
            step = self.steps[-1]
            if not step.ubatches:
                step.before_first = time.perf_counter() - self._t_decode
            # kqv_out = reshape(flash_attn_ext(q, k, v, mask)): k is [d, n_kv, heads, streams]
            fa = _tensor(node.src[0])
            k = _tensor(fa.src[1]) if fa is not None else None
            n_kv, streams = (int(k.ne[1]), int(k.ne[3])) if k is not None else (0, 1)
            step.ubatches.append(Ubatch(int(node.ne[1]), n_kv, streams))
        return True

    def install_params(self, *, kv_unified: bool = False, contexts: int = 2) -> None:
        """The next `contexts` llama_context_default_params() (native.load's: the slots' and
        the shared-prefix context's) carry the callback, and with `kv_unified` the slots'
        context has one KV stream for every slot instead of one stream each."""
        original = lc.llama_context_default_params
        init = lc.llama_init_from_model
        left = [contexts]

        def params() -> Any:
            left[0] -= 1
            if left[0] <= 0:
                lc.llama_context_default_params = original  # the embedder's stays plain
            p = original()
            p.cb_eval = self.callback
            if kv_unified:

                def init_unified(model: Any, p: Any) -> Any:
                    lc.llama_init_from_model = init
                    p.kv_unified = True  # native.load sets it False after taking the params
                    return init(model, p)

                lc.llama_init_from_model = init_unified
            return p

        lc.llama_context_default_params = params

    def attach(self, engine: Any) -> None:
        seq_cp = lc.llama_memory_seq_cp

        def counted_cp(*a: Any) -> Any:
            self._copies += 1
            return seq_cp(*a)

        # The contexts call lc.llama_memory_seq_cp through the module; count the stream copies.
        lc.llama_memory_seq_cp = counted_cp

        def tracer(context: str, decode: Any, slots: list[Any]) -> Any:
            def traced(n: int) -> bool:
                gen = sum(1 for s in slots if s.generating and s.i_batch >= 0)
                self.steps.append(Step(context, n - gen, gen, self._copies))
                self._copies = 0
                if not self.t_start:
                    self.t_start = time.perf_counter()
                self._t_decode, cpu = time.perf_counter(), time.process_time()
                ok = bool(decode(n))
                self.steps[-1].seconds = time.perf_counter() - self._t_decode
                self.steps[-1].cpu = time.process_time() - cpu
                self.t_end = time.perf_counter()
                return ok

            return traced

        main = engine._context  # slots_context.py
        main.decode = tracer("main", main.decode, main.slots)
        shared = engine._shared  # shared_context.py, None without the shared context
        if shared is not None:
            shared.decode = tracer("shared", shared.decode, shared.branches)

    def summary(self) -> str:
        lines = []
        wall = self.t_end - self.t_start
        decode_s = sum(s.seconds for s in self.steps)
        lines.append(
            f"trace: {len(self.steps)} steps, wall {wall:.2f} s (first decode to last), "
            f"in llama_decode {decode_s:.2f} s, loop Python {wall - decode_s:.2f} s"
        )
        for context, kind, pick in (
            ("main", "prefill", lambda s: s.context == "main" and s.prompt_rows > 0),
            ("main", "decode", lambda s: s.context == "main" and s.prompt_rows == 0),
            ("shared", "prefill", lambda s: s.context == "shared" and s.prompt_rows > 0),
            ("shared", "decode", lambda s: s.context == "shared" and s.prompt_rows == 0),
        ):
            steps = [s for s in self.steps if pick(s)]
            if not steps:
                continue
            ubs = [u for s in steps for u in s.ubatches]
            lines.append(
                f"  {context:<6} {kind:<7} steps {len(steps):>4}  {sum(s.seconds for s in steps):7.2f} s  "
                f"cpu {sum(s.cpu for s in steps):7.2f} s  "
                f"copy+build {sum(s.before_first for s in steps):6.2f} s  "
                f"copies {sum(s.copies for s in steps):>4}  prompt rows "
                f"{sum(s.prompt_rows for s in steps):>6}  gen rows {sum(s.gen_rows for s in steps):>5}"
                f"  ubatches {len(ubs):>4} (tokens median {_med([u.tokens for u in ubs])}, "
                f"n_kv median {_med([u.n_kv for u in ubs])} max {max((u.n_kv for u in ubs), default=0)}"
                f", streams median {_med([u.streams for u in ubs])})"
            )
        lines.append(
            "  first steps: context, rows prompt/gen, copies, ms, copy+build ms, "
            "ubatches tokens@n_kv"
        )
        for i, s in enumerate(self.steps[:40]):
            ub = " ".join(f"{u.tokens}@{u.n_kv}x{u.streams}" for u in s.ubatches)
            lines.append(
                f"  {i:>3} {s.context:<6} {s.prompt_rows:>5}/{s.gen_rows:<3} {s.copies:>3} "
                f"{s.seconds * 1e3:8.1f} {s.before_first * 1e3:7.1f}  {ub}"
            )
        return "\n".join(lines)


def _med(xs: list[int]) -> int:
    return int(statistics.median(xs)) if xs else 0


if __name__ == "__main__":
    import argparse

    argparse.ArgumentParser(
        description="A trace of where an engine batch's seconds go; it runs inside "
        "`python bench/throughput.py --batchyard engine --trace`, not on its own."
    ).parse_args()
    print("run it through: python bench/throughput.py --batchyard engine --trace")
