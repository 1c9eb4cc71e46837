"""Whether llama.cpp's extra CPU buffer types are sound in the installed build, on this CPU.

The extra buffer types (AMX on recent Intel Xeons, repacked weights on AVX2 and ARM) hold the
weights in layouts with much faster kernels (bench/README.md), but a build can be broken: GCC
12 miscompiles the AMX tile configuration, and the first multi-token batch then crashes.

So the engine asks a child process (engine/llama/selfcheck.py): load the model both
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
from pathlib import Path
from typing import Any

from app.toolchain.facts import llama_lib_dir, run_child, selfcheck_command

log = logging.getLogger("batchyard.engine")

PROBE_TIMEOUT_S = 120.0
#: Verdicts kept in the cache file, newest last.
CACHE_ENTRIES = 16


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


#: Deaths that a broken kernel causes; a check killed any other way proves nothing.
CRASH_SIGNALS = {signal.SIGSEGV, signal.SIGILL, signal.SIGBUS, signal.SIGFPE, signal.SIGABRT}


def check_command(model: Path, threads: int) -> list[str]:
    """A fresh process for the check: a crash must not take the server with it."""
    return selfcheck_command("cpu", str(model), str(threads))


def probe(model: Path, threads: int, command: list[str] | None = None) -> tuple[bool, str, bool]:
    """Run the check in a child process (`command`, default check_command): (sound, why, final).

    Not final (so not cached) when the child was interrupted, killed or timed out, or could
    not run the check: then nothing is known about the kernels, and the next start checks again.
    """
    try:
        done = run_child(command or check_command(model, threads), PROBE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return False, f"the check did not finish in {PROBE_TIMEOUT_S:.0f} s", False
    answer, code = done.answer, done.returncode
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
