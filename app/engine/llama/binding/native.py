"""llama.cpp through llama-cpp-python's ctypes bindings, everywhere but the decode loop.

Loading the model and its context, the vocabulary (tokenize, pieces), GGUF metadata, the GPU
backend's name, thread and slot defaults, and the two helpers the loop, the embeddings and the
CPU check share: `batch_add` (one row of a llama_batch) and `logits_row`.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# libgomp's spin settings come from app/__init__.py, which runs before llama_cpp loads.
import llama_cpp as lc
import numpy as np

from app.catalog import LoadProfile, quantization
from app.catalog.estimate import (
    LLAMA_MAX_SEQ,
    MIN_SHARED_SLOTS,
    N_UBATCH,
    SHARED_KV,
    context_sequences,
)
from app.config import Settings
from app.engine.base import ModelInfo
from app.engine.llama.jobs.block import SavedCells
from app.toolchain.cpu_check import extra_buffers
from app.toolchain.facts import (
    advice,
    cpu_fallback,
    cpu_threads,
    gpu_libraries,
    visible_nvidia_gpu,
)

log = logging.getLogger("batchyard.engine")

#: --kv-cache-type names (app/config/settings.py) and their ggml element types (enum ggml_type).
KV_GGML_TYPES = {"f16": 1, "bf16": 30, "q8_0": 8, "q4_0": 2}
#: Sequences of the shared-prefix context kept for blocks: the instruction blocks of the
#: files running at once, and those of earlier batches kept for later ones; the rest of
#: llama.cpp's sequences are lines.
SHARED_BLOCKS = 8
#: Lines of the shared-prefix context for each slot (at most llama.cpp's sequences less the
#: blocks'): 248 at the default 32 slots. While the context has work, the runner keeps the
#: engine fed with the slots and these lines (ModelInfo.lane_sequences), so that it holds the
#: lines of every block a file mixes and runs each block's lines in one wave.
SHARED_BRANCHES_PER_SLOT = 8


def kv_needs_flash_attention(kv_cache_type: str) -> bool:
    """A quantized V cache only works inside flash attention; for f16, llama.cpp may choose."""
    return kv_cache_type not in ("f16", "bf16")


def default_parallel(n_gpu_layers: int) -> int:
    """Slots that suit the hardware when --parallel is 0: a GPU keeps many more busy."""
    # A GPU build with no GPU device (CUDA failed to start: no driver) runs on the CPU.
    if n_gpu_layers != 0 and lc.llama_supports_gpu_offload() and gpu_backend_name():
        return 64
    # On a CPU too, more rows per forward pass is cheaper per token (bench/README.md).
    return 32


@functools.cache
def _ggml() -> Any:
    """ggml's library, for its device registry (ctypes: llama-cpp-python does not bind it)."""
    lib_dir = Path(lc.__file__).parent / "lib"
    for name in ("libggml.so", "libggml.dylib", "ggml.dll"):
        if (lib_dir / name).exists():
            ggml = ctypes.CDLL(str(lib_dir / name))
            break
    else:
        return None
    ggml.ggml_backend_dev_count.restype = ctypes.c_size_t
    ggml.ggml_backend_dev_get.restype = ctypes.c_void_p
    ggml.ggml_backend_dev_get.argtypes = [ctypes.c_size_t]
    ggml.ggml_backend_dev_type.restype = ctypes.c_int
    ggml.ggml_backend_dev_type.argtypes = [ctypes.c_void_p]
    ggml.ggml_backend_dev_backend_reg.restype = ctypes.c_void_p
    ggml.ggml_backend_dev_backend_reg.argtypes = [ctypes.c_void_p]
    ggml.ggml_backend_reg_name.restype = ctypes.c_char_p
    ggml.ggml_backend_reg_name.argtypes = [ctypes.c_void_p]
    ggml.ggml_backend_dev_memory.restype = None
    ggml.ggml_backend_dev_memory.argtypes = [
        ctypes.c_void_p,
        ctypes.POINTER(ctypes.c_size_t),
        ctypes.POINTER(ctypes.c_size_t),
    ]
    return ggml


def _gpu_devices() -> list[Any]:
    ggml = _ggml()
    if ggml is None:
        return []
    devices = (ggml.ggml_backend_dev_get(i) for i in range(ggml.ggml_backend_dev_count()))
    return [d for d in devices if ggml.ggml_backend_dev_type(d) != 0]  # 0: the CPU


def gpu_backend_name() -> str | None:
    """The first GPU device's backend registry name (CUDA, Metal, Vulkan, ...) via ggml."""
    for dev in _gpu_devices():
        ggml = _ggml()
        backend: bytes = ggml.ggml_backend_reg_name(ggml.ggml_backend_dev_backend_reg(dev))
        return backend.decode()
    return None


def gpu_free_bytes() -> int | None:
    """Free memory on the GPU devices together, as their backends report it; None without."""
    devices = _gpu_devices()
    if not devices:
        return None
    total = 0
    for dev in devices:
        free, size = ctypes.c_size_t(0), ctypes.c_size_t(0)
        _ggml().ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(size))
        total += free.value
    return total


def memory_in_use() -> int:
    """Bytes this process holds: its resident set plus what the GPU devices have in use.
    The difference across an unload is what the model gave back; across a load, it stands
    in for the buffers llama.cpp reports (buffers.py) only where it reports none."""
    rss = 0
    try:
        with open("/proc/self/statm") as statm:
            rss = int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:  # not Linux: the resource module's peak is the closest figure
        import resource

        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    gpu = 0
    for dev in _gpu_devices():
        free, size = ctypes.c_size_t(0), ctypes.c_size_t(0)
        _ggml().ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(size))
        gpu += size.value - free.value
    return rss + gpu


def meta(model: Any, key: str) -> str | None:
    """One GGUF metadata value of a loaded model, as text."""
    buf = ctypes.create_string_buffer(4096)
    n = lc.llama_model_meta_val_str(model, key.encode(), buf, len(buf))
    return buf.value.decode("utf-8", "replace") if n >= 0 else None


def file_type(model: Any) -> int | None:
    """The GGUF header's `general.file_type` (llama_ftype), if it has one."""
    value = meta(model, "general.file_type")
    return int(value) if value and value.isdigit() else None


def batch_add(batch: Any, n: int, token: int, pos: int, seq: int, logits: bool) -> int:
    """Put one token of sequence `seq` at row `n` of a llama_batch; returns the next row."""
    batch.token[n] = token
    batch.pos[n] = pos
    batch.n_seq_id[n] = 1
    batch.seq_id[n][0] = seq
    batch.logits[n] = logits
    return n + 1


def logits_row(ctx: Any, i: int, n_vocab: int) -> np.ndarray:
    """Row `i` of the last decode's logits, a view of llama.cpp's buffer (valid until the next)."""
    return np.ctypeslib.as_array(lc.llama_get_logits_ith(ctx, i), shape=(n_vocab,))


def load_model(path: Path, *, n_gpu_layers: int, use_extra_bufts: bool) -> Any:
    """The model's weights; raises RuntimeError when llama.cpp cannot load the file."""
    params = lc.llama_model_default_params()
    # -1 means "every layer", which llama.cpp spells as any number above the layer count.
    params.n_gpu_layers = 0x7FFFFFFF if n_gpu_layers < 0 else n_gpu_layers
    params.use_extra_bufts = use_extra_bufts
    model = lc.llama_model_load_from_file(str(path).encode(), params)
    if not model:
        raise RuntimeError(f"llama.cpp could not load {path}")
    return model


class Vocab:
    """A model's vocabulary: text to tokens and tokens to bytes."""

    def __init__(self, model: Any) -> None:
        self.ptr = lc.llama_model_get_vocab(model)
        self.n_vocab = lc.llama_vocab_n_tokens(self.ptr)
        self.bos = lc.llama_vocab_bos(self.ptr)
        self.eos = lc.llama_vocab_eos(self.ptr)

    def tokenize(self, text: str, *, add_special: bool, parse_special: bool = True) -> list[int]:
        data = text.encode("utf-8")
        size = len(data) + 8
        buf = (lc.llama_token * size)()
        n = lc.llama_tokenize(self.ptr, data, len(data), buf, size, add_special, parse_special)
        if n < 0:
            size = -n
            buf = (lc.llama_token * size)()
            n = lc.llama_tokenize(self.ptr, data, len(data), buf, size, add_special, parse_special)
        return list(buf[:n])

    def piece(self, token: int, special: bool = False) -> bytes:
        buf = ctypes.create_string_buffer(64)
        n = lc.llama_token_to_piece(self.ptr, token, buf, len(buf), 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = lc.llama_token_to_piece(self.ptr, token, buf, len(buf), 0, special)
        return buf.raw[:n]

    def token_text(self, token: int) -> str:
        """A special token's text (BOS, EOS for the chat template); empty for none."""
        return self.piece(token, special=True).decode("utf-8", "replace") if token >= 0 else ""

    def is_eog(self, token: int) -> bool:
        return bool(lc.llama_vocab_is_eog(self.ptr, token))


@dataclass
class SharedContext:
    """The shared-prefix context (shared.py): one unified f16 KV stream of `n_cells` cells,
    sequences 0..n_branches-1 for lines and the `n_blocks` above them for blocks."""

    ctx: Any
    mem: Any
    batch: Any
    n_branches: int
    n_blocks: int
    n_cells: int

    def free(self) -> None:
        lc.llama_batch_free(self.batch)
        lc.llama_free(self.ctx)

    def save(self, seq_id: int) -> SavedCells | None:
        """The cells of `seq_id` (positions and K/V), copied out to host memory."""
        size = lc.llama_state_seq_get_size(self.ctx, seq_id)
        buf = (ctypes.c_uint8 * size)()
        written = lc.llama_state_seq_get_data(self.ctx, buf, size, seq_id)
        return buf if written == size else None

    def restore(self, state: SavedCells | None, seq_id: int) -> bool:
        """Put cells saved by `save` back, as sequence `seq_id`; False when llama.cpp finds
        no contiguous room for them (or `state` is None)."""
        if state is None:
            return False
        return lc.llama_state_seq_set_data(self.ctx, state, len(state), seq_id) == len(state)


@dataclass
class LoadedModel:
    """A model and the generation context of `n_slots` sequences, ready for the loop."""

    path: Path
    model: Any
    ctx: Any
    mem: Any
    batch: Any  # the llama_batch the loop fills, n_batch rows
    vocab: Vocab
    n_slots: int  # the slots batch lines take (--parallel)
    n_seqs: int  # the context's sequences: the slots and the online one (context_sequences)
    n_batch: int
    ctx_per_slot: int
    threads: int
    kv_cache_type: str
    n_ctx_train: int
    n_embd: int
    file_type: int | None
    chat_template: str | None
    gpu_backend: str | None  # None: the CPU runs it
    library_version: str
    #: Whether llama.cpp's extra CPU buffer types are on, and why ("on (the check passed)").
    cpu_buffers: str = ""
    #: The command that fixes the build (toolchain/facts.py advice), or None.
    advice: str | None = None
    #: Why a GPU build runs on the CPU (toolchain/facts.py cpu_fallback), or None.
    gpu_fallback: str | None = None
    #: The layers offloaded (the profile's: -1 all, 0 none), whatever the backend.
    n_gpu_layers: int = 0
    #: The shared-prefix context, or None (the profile's shared_cells 0, or no prefix cache).
    shared: SharedContext | None = None

    def model_info(self, *, has_chat_template: bool, n_gpu_layers: int) -> ModelInfo:
        stat = self.path.stat()
        return ModelInfo(
            id=self.path.stem if self.path.suffix == ".gguf" else self.path.name,
            path=str(self.path),
            size_bytes=stat.st_size,
            quantization=quantization(self.file_type, self.path),
            n_ctx_train=self.n_ctx_train,
            ctx_per_slot=self.ctx_per_slot,
            n_slots=self.n_slots,
            backend=self.gpu_backend or "CPU",
            n_gpu_layers=n_gpu_layers if self.gpu_backend else 0,
            embedding_dim=self.n_embd,
            has_chat_template=has_chat_template,
            created=int(stat.st_mtime),
            cpu_buffers=self.cpu_buffers,
            advice=self.advice,
            gpu_fallback=self.gpu_fallback,
        )

    def free(self) -> None:
        if self.shared is not None:
            self.shared.free()
        lc.llama_batch_free(self.batch)
        lc.llama_free(self.ctx)
        lc.llama_model_free(self.model)


def _build_verdict(
    path: Path, threads: int, settings: Settings
) -> tuple[bool, str, str | None, str | None]:
    """Whether llama.cpp's extra CPU buffer types go on and why, the command that fixes the
    build (or None) and the warning of a GPU the build cannot use (or None), each logged."""
    # llama.cpp's extra CPU buffer types (AMX, repacked weights) are much faster where the
    # build is sound and crash where it is not; a child process checks once (cpu_check).
    extra, why = extra_buffers(path, threads, settings.cpu_extra_buffers, settings.cache_path)
    log.info("cpu extra buffer types: %s (%s)", "on" if extra else "off", why)
    gpu_built, gpu_seen = gpu_libraries(), visible_nvidia_gpu()
    fix = advice(extra_ok=extra, why=why, gpu_built=gpu_built, gpu_seen=gpu_seen)
    if fix:
        log.warning("%s", fix)
    fallback = cpu_fallback(gpu_built, gpu_seen)
    if fallback:
        log.warning("%s", fallback)
    return extra, why, fix, fallback


def _generation_context(
    model: Any, profile: LoadProfile, *, n_seqs: int, n_batch: int, threads: int
) -> Any:
    """The slots' context: `n_seqs` sequences of `profile.ctx_size` each, a KV stream each;
    frees the model and raises RuntimeError when llama.cpp cannot make it."""
    params = lc.llama_context_default_params()
    params.n_seq_max = n_seqs
    params.n_ctx = profile.ctx_size * n_seqs
    # Separate KV streams give each sequence its own ctx_size context and keep attention
    # per sequence; n > 1 copies a whole stream with llama_memory_seq_cp. One unified
    # stream was measured against them (bench/waves.py, engine directly, 32 slots, 2 cores,
    # CPU seconds of the process; bench/README.md, issue 33) and lost where it did not win:
    # - q8_0 (the default): 128 lines sharing an 870-token block 26.4 against 27.6 CPU s
    #   (a fork tags cells instead of copying a stream, and a step is 1 ubatch instead of
    #   4-11, but the copies took 0.2 s and attention, most of the time, is the same per-row
    #   kernel); 128 short chats 20.8 against 18.0 CPU s and 28.1 against 15.9 s wall:
    #   attention scans every slot's kept cells (n_kv 1,792-2,304 instead of 256).
    # - f16: the shared block 19.6 against 27.6 (q8_0 split) CPU s, as the CPU's flash
    #   attention takes its tiled path from 64 query rows of one stream; short chats 23.8
    #   against 18.0. So the slots' streams stay split, and lines that share a block run
    #   in a second context of one unified f16 stream (shared_context, shared.py).
    params.kv_unified = False
    params.n_batch = n_batch
    params.n_ubatch = N_UBATCH
    params.n_threads = params.n_threads_batch = threads
    params.no_perf = True
    params.type_k = params.type_v = KV_GGML_TYPES[profile.kv_cache_type]
    params.flash_attn_type = (
        lc.LLAMA_FLASH_ATTN_TYPE_ENABLED
        if kv_needs_flash_attention(profile.kv_cache_type)
        else lc.LLAMA_FLASH_ATTN_TYPE_AUTO
    )
    ctx = lc.llama_init_from_model(model, params)
    if not ctx:
        lc.llama_model_free(model)
        raise RuntimeError("llama.cpp could not create a context (out of memory?)")
    return ctx


def load(
    path: Path, profile: LoadProfile, settings: Settings, *, prompt_tokens_per_step: int
) -> LoadedModel:
    """Load a model file with its load profile (a number of GPU layers, not auto) and a
    context with one KV stream per slot; `settings`: the server's own (threads, logs, the
    CPU check, the prefix cache)."""
    lc.llama_backend_init()
    if settings.log_level.lower() != "debug":
        from llama_cpp import _logger

        _logger.set_verbose(False)
    if not path.is_file():
        raise FileNotFoundError(f"model file not found: {path}")
    threads = cpu_threads(settings.threads)
    extra, why, fix, fallback = _build_verdict(path, threads, settings)
    layers = profile.n_gpu_layers
    model = load_model(path, n_gpu_layers=layers, use_extra_bufts=extra)
    n_slots = profile.parallel if profile.parallel > 0 else default_parallel(layers)
    n_seqs = context_sequences(n_slots)
    n_batch = max(2048, n_seqs + prompt_tokens_per_step)
    kv = profile.kv_cache_type
    ctx = _generation_context(model, profile, n_seqs=n_seqs, n_batch=n_batch, threads=threads)
    shared = None
    cells = profile.shared_cells if settings.prefix_cache else 0
    if cells and n_slots >= MIN_SHARED_SLOTS:
        n_branches = min(LLAMA_MAX_SEQ - SHARED_BLOCKS, SHARED_BRANCHES_PER_SLOT * n_slots)
        shared = shared_context(
            model, cells, n_branches=n_branches, n_batch=n_batch, threads=threads
        )
        if shared is None:
            lc.llama_free(ctx)
            lc.llama_model_free(model)
            raise RuntimeError(
                "llama.cpp could not create the shared-prefix context (out of memory? "
                "--shared-prefix-cells 0 goes without it)"
            )
    template = lc.llama_model_chat_template(model, None)
    return LoadedModel(
        path=path,
        model=model,
        ctx=ctx,
        mem=lc.llama_get_memory(ctx),
        batch=lc.llama_batch_init(n_batch, 0, 1),
        vocab=Vocab(model),
        n_slots=n_slots,
        n_seqs=n_seqs,
        n_batch=n_batch,
        ctx_per_slot=lc.llama_n_ctx_seq(ctx),
        threads=threads,
        kv_cache_type=kv,
        n_ctx_train=lc.llama_model_n_ctx_train(model),
        n_embd=lc.llama_model_n_embd(model),
        file_type=file_type(model),
        chat_template=template.decode() if template else None,
        gpu_backend=gpu_backend_name() if layers != 0 else None,
        n_gpu_layers=layers,
        library_version=lc.__version__,
        cpu_buffers=f"{'on' if extra else 'off'} ({why})",
        advice=fix,
        gpu_fallback=fallback,
        shared=shared,
    )


def shared_context(
    model: Any, n_cells: int, *, n_branches: int, n_batch: int, threads: int
) -> SharedContext | None:
    """A context of one unified f16 KV stream for lines that share blocks (shared.py)."""
    params = lc.llama_context_default_params()
    params.n_seq_max = n_branches + SHARED_BLOCKS
    params.n_ctx = n_cells
    # One stream: a fork tags the block's cells instead of copying a stream, and a
    # micro-batch's rows of every line attend in one flash-attention call (its tiled path).
    params.kv_unified = True
    params.n_batch = n_batch
    params.n_ubatch = N_UBATCH
    params.n_threads = params.n_threads_batch = threads
    params.no_perf = True
    params.type_k = params.type_v = KV_GGML_TYPES[SHARED_KV]
    params.flash_attn_type = lc.LLAMA_FLASH_ATTN_TYPE_ENABLED
    ctx = lc.llama_init_from_model(model, params)
    if not ctx:
        return None
    return SharedContext(
        ctx=ctx,
        mem=lc.llama_get_memory(ctx),
        batch=lc.llama_batch_init(n_batch, 0, 1),
        n_branches=n_branches,
        n_blocks=SHARED_BLOCKS,
        n_cells=lc.llama_n_ctx(ctx),
    )
