"""Whether llama.cpp's extra CPU buffer types are sound in the installed build, on this CPU.

The extra buffer types (AMX on recent Intel Xeons, repacked weights on AVX2 and ARM) hold the
weights in layouts with much faster kernels (bench/README.md), but a build can be broken: GCC
12 miscompiles the AMX tile configuration, and the first multi-token batch then crashes.

So the engine asks a child process (`python -m app.engine.cpu_check`): load the model both
ways, decode the same multi-token, multi-sequence batch with each, and compare the logits. A
crash or a mismatch means plain buffers. The verdict is cached per llama.cpp build, model file
and thread count; a check that was interrupted, or could not run, gives plain buffers for this
start only.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

log = logging.getLogger("batchyard.engine")

PROBE_TIMEOUT_S = 120.0
#: Probe tokens: two sequences of PROBE_TOKENS each, decoded in one batch, then one token each.
PROBE_TOKENS = 12
#: Verdicts kept in the cache file, newest last.
CACHE_ENTRIES = 16


def cpu_threads(requested: int) -> int:
    """Threads for llama.cpp: the request, or every core this process may run on."""
    if requested > 0:
        return requested
    # llama.cpp's own default is a fixed 4, which oversubscribes small machines.
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - macOS, Windows
        return max(1, os.cpu_count() or 1)


def llama_lib_dir() -> Path:
    import importlib.util

    if os.environ.get("LLAMA_CPP_LIB_PATH"):  # a frozen app's bundle, or the user's choice
        return Path(os.environ["LLAMA_CPP_LIB_PATH"])

    spec = importlib.util.find_spec("llama_cpp")
    assert spec is not None and spec.origin is not None
    return Path(spec.origin).parent / "lib"


def _fingerprint(model: Path, threads: int) -> str:
    """The build, the model file and the thread count.

    The build is its libraries' names and sizes and the bytes of ggml's CPU backend, where the
    kernels are: not modification times, since a frozen app unpacks them anew at each start.
    """
    digest = hashlib.sha256(f"threads={threads}\n".encode())
    lib = llama_lib_dir()
    for path in sorted(lib.iterdir()) if lib.is_dir() else []:
        if path.is_file() and not path.is_symlink():
            digest.update(f"{path.name}:{path.stat().st_size}\n".encode())
            if "ggml-cpu" in path.name:
                digest.update(path.read_bytes())
    st = model.stat()
    digest.update(f"{model.resolve()}:{st.st_size}:{st.st_mtime_ns}".encode())
    return digest.hexdigest()[:32]


def _decode_logits(model_path: str, extra: bool, threads: int) -> list[np.ndarray]:
    import llama_cpp as lc
    import numpy as np

    from app.engine.native import batch_add, load_model, logits_row

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


#: Deaths that a broken kernel causes; a check killed any other way proves nothing.
CRASH_SIGNALS = {signal.SIGSEGV, signal.SIGILL, signal.SIGBUS, signal.SIGFPE, signal.SIGABRT}


#: The hidden `batchyard` subcommand a frozen app runs the check through (app/cli.py).
CHECK_COMMAND = "_cpu-check"
#: How the child's answer line starts on its standard output.
ANSWER = "cpu-check: "


def check(model_path: str, threads: int) -> str:
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


def main(argv: list[str]) -> int:
    """`python -m app.engine.cpu_check MODEL THREADS`: prints the answer line."""
    print(ANSWER + check(argv[0], int(argv[1])), flush=True)
    return 0


def check_command(model: Path, threads: int) -> list[str]:
    """A fresh process for the check: a crash must not take the server with it."""
    if getattr(sys, "frozen", False):  # the single binary: sys.executable is batchyard
        return [sys.executable, CHECK_COMMAND, str(model), str(threads)]
    return [sys.executable, "-m", "app.engine.cpu_check", str(model), str(threads)]


def probe(model: Path, threads: int, command: list[str] | None = None) -> tuple[bool, str, bool]:
    """Run the check in a child process (`command`, default check_command): (sound, why, final).

    Not final (so not cached) when the child was interrupted, killed or timed out, or could
    not run the check: then nothing is known about the kernels, and the next start checks again.
    """
    try:
        done = subprocess.run(
            command or check_command(model, threads),
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return False, f"the check did not finish in {PROBE_TIMEOUT_S:.0f} s", False
    answers = [line for line in done.stdout.splitlines() if line.startswith(ANSWER)]
    answer = answers[-1].removeprefix(ANSWER) if answers else None
    code = done.returncode
    if answer is None and code < 0 and -code in CRASH_SIGNALS:
        return False, f"the check crashed ({signal.Signals(-code).name})", True
    if answer is None:
        return False, f"the check ended without an answer (exit code {code})", False
    if answer.startswith("error:"):
        return False, f"the check failed ({answer.removeprefix('error: ')})", False
    if answer != "ok":
        return False, answer, True
    return True, "the check passed", True


CACHE_FILE = "cpu-check.json"


def _read_cache(cache: Path) -> dict[str, Any]:
    try:
        known = json.loads(cache.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return known if isinstance(known, dict) else {}


def cached_verdict(model: Path, threads: int, cache_dir: Path) -> tuple[bool, str] | None:
    """The check's cached verdict for the installed build, `model` and `threads`, without
    running it; None when this build has not been checked yet."""
    try:
        entry = _read_cache(cache_dir / CACHE_FILE).get(_fingerprint(model, threads))
    except OSError:
        return None
    if not isinstance(entry, dict):
        return None
    return bool(entry.get("ok")), str(entry.get("why", ""))


def extra_buffers(model: Path, threads: int, setting: str, cache_dir: Path) -> tuple[bool, str]:
    """Whether to load with llama.cpp's extra CPU buffer types, and why.

    `setting` is Settings.cpu_extra_buffers ("auto", "on" or "off"); "auto" runs the check,
    or reads its verdict from `cache_dir`.
    """
    if setting in ("on", "off"):
        return setting == "on", f"cpu_extra_buffers={setting}"
    cache = cache_dir / CACHE_FILE
    try:
        key = _fingerprint(model, threads)
    except OSError as exc:
        return False, f"cannot fingerprint the build: {exc}"
    known = _read_cache(cache)
    if isinstance(known.get(key), dict):
        entry = known[key]
        return bool(entry.get("ok")), f"{entry.get('why', '')} (cached)"
    ok, why, final = probe(model, threads)
    if not final:
        log.warning("the CPU buffer check gave no verdict (%s); plain buffers this time", why)
        return ok, why
    known[key] = {"ok": ok, "why": why}
    known = dict(list(known.items())[-CACHE_ENTRIES:])
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(known, indent=1), encoding="utf-8")
        tmp.replace(cache)
    except OSError as exc:
        log.warning("could not cache the CPU buffer check: %s", exc)
    return ok, why


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
