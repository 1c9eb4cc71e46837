"""What a load took: the buffers llama.cpp reports allocating for it, read from its log.

llama.cpp offers no C call that gives a model's buffers (`llama_model_size` counts tensor
bytes, not buffers, and leaves out the KV cache and the compute buffers), but it logs each
buffer as it allocates it, at its info level:

    load_tensors:   CPU_Mapped model buffer size =    93.95 MiB
    llama_context:        CPU  output buffer size =     1.51 MiB
    llama_kv_cache:        CPU KV buffer size =    30.00 MiB
    sched_reserve:        CPU compute buffer size =    66.51 MiB
    reserve_compute_meta:        CPU compute buffer size =    21.00 MiB   (a projector's)

and libmtmd says a projector's weights (`load_hparams: model size: 3.12 MiB`), read into a
buffer of that size. CUDA builds name theirs CUDA0, CUDA_Host and so on.

`install` routes llama.cpp's, ggml's and libmtmd's log through one callback, which passes
each line on to llama-cpp-python's own (that prints at --log-level debug only) and notes the
buffer lines of every thread that is inside `capture`. A load runs in one thread (the pool
gives each its own), so loads side by side are each measured alone, at every log level.
"""

from __future__ import annotations

import contextlib
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import llama_cpp as lc
from llama_cpp import _logger
from llama_cpp import mtmd_cpp as mtmd

MiB = 1 << 20
#: A buffer llama.cpp allocated: `<function>: <buffer type> ... buffer size = <n> MiB`.
BUFFER_LINE = re.compile(r"^\w+: +(?P<name>\S+) .*\bbuffer size = +(?P<mib>\d+(?:\.\d+)?) MiB")
#: A projector's weights (libmtmd reads them into one buffer of the projector's backend).
PROJECTOR_WEIGHTS_LINE = re.compile(r"^load_hparams: +model size: +(?P<mib>\d+(?:\.\d+)?) MiB")


@dataclass
class Buffers:
    """The buffers one load reported: (buffer type, bytes) each, in the order logged."""

    sizes: list[tuple[str, int]] = field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(size for _, size in self.sizes)

    def read(self, line: str) -> None:
        """Note the buffer a log line reports, if it reports one."""
        if match := BUFFER_LINE.match(line):
            self.sizes.append((match["name"], round(float(match["mib"]) * MiB)))
        elif match := PROJECTOR_WEIGHTS_LINE.match(line):
            self.sizes.append(("weights", round(float(match["mib"]) * MiB)))

    def describe(self) -> str:
        """The buffer types and their MiB, for a log line."""
        by_name: dict[str, int] = {}
        for name, size in self.sizes:
            by_name[name] = by_name.get(name, 0) + size
        return " ".join(f"{name}={size / MiB:.1f}MiB" for name, size in by_name.items())


#: The capture of each thread inside `capture` (by threading.get_ident()).
_captures: dict[int, Buffers] = {}
_install_lock = threading.Lock()
_installed = False


@lc.llama_log_callback
def _on_log(level: int, text: bytes | None, user_data: Any) -> None:
    _logger.llama_log_callback(level, text, user_data)
    buffers = _captures.get(threading.get_ident())
    if buffers is not None and text:
        buffers.read(text.decode("utf-8", "replace"))


def install() -> None:
    """Route llama.cpp's (and so ggml's) and libmtmd's log lines through `_on_log`, once.
    llama.cpp's logger is not thread safe: the first load sets it, before any other can."""
    global _installed
    with _install_lock:
        if _installed:
            return
        lc.llama_log_set(_on_log, None)
        mtmd.mtmd_log_set(_on_log, None)
        mtmd.mtmd_helper_log_set(_on_log, None)
        _installed = True


@contextlib.contextmanager
def capture() -> Iterator[Buffers]:
    """The buffers llama.cpp reports allocating in this thread while the block runs."""
    install()
    buffers = Buffers()
    me = threading.get_ident()
    outer = _captures.get(me)
    _captures[me] = buffers
    try:
        yield buffers
    finally:
        if outer is None:
            del _captures[me]
        else:
            _captures[me] = outer
            outer.sizes += buffers.sizes
