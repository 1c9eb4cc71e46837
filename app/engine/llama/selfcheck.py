"""The checks that load a model, each run as a child process so that a crash (a miscompiled
kernel, a broken GPU driver) cannot take the server or `engine build` with it:

- `cpu MODEL THREADS`: decode the same multi-token, multi-sequence batch with plain and with
  extra CPU buffer types and compare the logits (toolchain/cpu_check.py keeps the verdict);
- `gpu MODEL`: load one layer on the GPU (toolchain/build.py's check of a GPU build).

Each prints one line starting with toolchain.facts.ANSWER. Started by module path
(`python -m app.engine.llama.selfcheck`), so no parent imports this module.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.toolchain.facts import ANSWER

if TYPE_CHECKING:
    import numpy as np

#: Probe tokens: two sequences of PROBE_TOKENS each, decoded in one batch, then one token each.
PROBE_TOKENS = 12


def _decode_logits(model_path: str, extra: bool, threads: int) -> list[np.ndarray]:
    import llama_cpp as lc
    import numpy as np

    from app.engine.llama.binding.native import batch_add, load_model, logits_row

    model = load_model(Path(model_path), n_gpu_layers=0, use_extra_bufts=extra)
    ctx_params = lc.llama_context_default_params()
    ctx_params.n_ctx = 512
    ctx_params.n_batch = 64
    ctx_params.n_ubatch = 64
    ctx_params.n_seq_max = 2
    ctx_params.n_threads = threads
    ctx_params.n_threads_batch = threads
    ctx_params.no_perf = True
    ctx = lc.llama_init_from_model(model, ctx_params)
    vocab = lc.llama_model_get_vocab(model)
    n_vocab = lc.llama_vocab_n_tokens(vocab)
    batch = lc.llama_batch_init(64, 0, 1)
    rows: list[np.ndarray] = []
    try:
        # A prompt-sized batch (many rows per matrix product), then a one-token-each step.
        n = 0
        for seq in range(2):
            for i in range(PROBE_TOKENS):
                token = (i * 131 + seq * 17 + 7) % n_vocab
                n = batch_add(batch, n, token, i, seq, i == PROBE_TOKENS - 1)
        batch.n_tokens = n
        if lc.llama_decode(ctx, batch) != 0:
            raise RuntimeError("llama_decode failed")
        for i in (PROBE_TOKENS - 1, 2 * PROBE_TOKENS - 1):
            rows.append(logits_row(ctx, i, n_vocab).astype(np.float64))
        n = 0
        for seq in range(2):
            n = batch_add(batch, n, 42 + seq, PROBE_TOKENS, seq, True)
        batch.n_tokens = n
        if lc.llama_decode(ctx, batch) != 0:
            raise RuntimeError("llama_decode failed")
        for i in range(2):
            rows.append(logits_row(ctx, i, n_vocab).astype(np.float64))
    finally:
        lc.llama_batch_free(batch)
        lc.llama_free(ctx)
        lc.llama_model_free(model)
    return rows


def _agree(plain: Sequence[Any], extra: Sequence[Any]) -> str | None:
    """None when the two runs' logits match closely enough; otherwise what differs."""
    import numpy as np

    for i, (p, e) in enumerate(zip(plain, extra, strict=True)):
        a, b = np.asarray(p, dtype=np.float64), np.asarray(e, dtype=np.float64)
        if not np.all(np.isfinite(b)):
            return f"row {i}: non-finite logits"
        # Both paths quantize activations their own way, so allow small differences; broken
        # kernels give logits that do not correlate at all.
        corr = float(np.corrcoef(a, b)[0, 1])
        if corr < 0.99:
            return f"row {i}: logits correlate at {corr:.3f}"
        if int(np.argmax(a)) != int(np.argmax(b)) and b[int(np.argmax(a))] < b.max() - 0.5:
            return f"row {i}: a different top token"
    return None


def cpu_check(model_path: str, threads: int) -> str:
    """The check itself, in the child: 'ok', what differs, or 'error: ...' if it cannot run."""
    try:
        from llama_cpp import _logger

        _logger.set_verbose(False)
        import llama_cpp as lc

        lc.llama_backend_init()
        plain = _decode_logits(model_path, False, threads)
        extra = _decode_logits(model_path, True, threads)
        return _agree(plain, extra) or "ok"
    except Exception as exc:  # reported, not raised: no verdict on the kernels either way
        return f"error: {type(exc).__name__}: {exc}"


def gpu_check(model: str) -> str:
    """In a child: load the model with one layer on the GPU; 'ok' or what went wrong."""
    try:
        import llama_cpp as lc

        from app.engine.llama.binding.native import gpu_backend_name, load_model

        lc.llama_backend_init()
        if not lc.llama_supports_gpu_offload():
            return "this build cannot offload to a GPU"
        name = gpu_backend_name()
        if name is None:
            return "no GPU device found"
        loaded = load_model(Path(model), n_gpu_layers=1, use_extra_bufts=False)
        lc.llama_model_free(loaded)
        return f"ok: one layer loaded on {name}"
    except Exception as exc:  # reported to the parent, which falls back
        return f"{type(exc).__name__}: {exc}"


def main(argv: list[str]) -> int:
    """`python -m app.engine.llama.selfcheck cpu MODEL THREADS | gpu MODEL`: prints the answer."""
    if argv[:1] == ["cpu"] and len(argv) == 3:
        answer = cpu_check(argv[1], int(argv[2]))
    elif argv[:1] == ["gpu"] and len(argv) == 2:
        answer = gpu_check(argv[1])
    else:
        print("usage: selfcheck cpu MODEL THREADS | gpu MODEL", file=sys.stderr)
        return 2
    print(ANSWER + answer, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
