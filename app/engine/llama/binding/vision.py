"""A model's projector: its multimodal encoder (libmtmd), and the encoded images it keeps.

`Projector` loads the projector GGUF beside the text model (mtmd_init_from_file), cuts a
rendered chat prompt with image markers into text and image chunks (mtmd_tokenize) and
encodes an image chunk into embedding rows (mtmd_encode_chunk); rows.py decodes them, and
places them where an M-RoPE model (Qwen2-VL) wants them.

`ImageStore` holds each distinct image's embeddings once per load, keyed by the hash of the
image's bytes (oai/media.py gives the ids it takes in a prompt), and encodes images in a
thread of its own, so the engine's owner thread keeps decoding text for every slot while an
image is encoded; a slot whose next chunk is an image waits until its rows are ready. Rows
a queued or running request still needs stay pinned; the others go, least recently used
first, past IMAGE_CACHE_BYTES.
"""

from __future__ import annotations

import contextlib
import ctypes
import heapq
import itertools
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import llama_cpp as lc
import numpy as np
from llama_cpp import mtmd_cpp as mtmd

from app.catalog.estimate import IMAGE_CACHE_BYTES
from app.engine.base import EngineError
from app.engine.llama.binding import buffers
from app.engine.llama.binding.rows import Layout
from app.engine.llama.jobs.oai import media

log = logging.getLogger("batchyard.engine")

# IMAGE_CACHE_BYTES (app/catalog/estimate.py, which counts it in a projector's estimate):
# encoded images kept per loaded model besides those pinned by lines in flight. Kept small:
# lines that share an image mostly come close together.
#: The projector leaves memory once the model has had no image line queued or running for
#: this long, and loads again with the next one: it stays loaded only while image lines
#: come, and a pause between a batch's claims does not unload it. The encoded rows stay.
PROJECTOR_IDLE = 30.0


@dataclass(eq=False)
class ImageChunk:
    """One image chunk of a tokenized prompt, before the store takes it."""

    key: str  # image key (sha256 of its bytes) / the chunk's place among that image's chunks
    first: int  # its first id in the prompt's token list
    n_tokens: int
    full: Any  # the chunk with its pixels (mtmd_input_chunk_copy): what encoding needs
    layout: Layout | None = None  # where its rows go (M-RoPE projectors only)

    def free(self) -> None:
        if self.full:
            mtmd.mtmd_input_chunk_free(self.full)
        self.full = None


class Projector:
    """A projector, tied to the text model it was loaded with. It loads at once (so a bad
    file fails the load), may `unload` while no image needs it, and loads again on use.
    Tokenizing (submitting threads) and encoding (the store's thread) use the context at
    once, as llama-server does; an unload waits for neither, it skips while one runs."""

    def __init__(self, path: Path, model: Any, *, threads: int, use_gpu: bool) -> None:
        # libmtmd logs through its own hooks: routed where llama.cpp's go, so they print
        # only at --log-level debug (native.load sets that verbosity) and its buffers count.
        buffers.install()
        self.path, self._model, self._threads, self._use_gpu = path, model, threads, use_gpu
        self._cond = threading.Condition()
        self._users = 0
        self.ctx: Any = None
        self.loads = 0
        self._load()
        ctx = self.ctx
        if not mtmd.mtmd_support_vision(ctx):
            self.free()
            raise RuntimeError(f"the projector {path} has no vision encoder")
        #: Rows placed on a grid of M-RoPE positions (Qwen2-VL and later; rows.py).
        self.mrope = bool(mtmd.mtmd_decode_use_mrope(ctx))
        self.marker = mtmd.mtmd_default_marker().decode()
        self.n_embd = lc.llama_model_n_embd_inp(model)
        #: Image rows attend to each other both ways (Gemma 3): each image decodes alone,
        #: in one micro-batch, with causal attention off.
        self.non_causal = bool(mtmd.mtmd_decode_use_non_causal(ctx, None))

    def _load(self) -> None:
        params = mtmd.mtmd_context_params_default()
        params.use_gpu = self._use_gpu
        params.n_threads = self._threads
        params.print_timings = False
        ctx = mtmd.mtmd_init_from_file(str(self.path).encode(), self._model, params)
        if not ctx:
            raise RuntimeError(f"llama.cpp could not load the projector {self.path}")
        self.ctx = ctx
        self.loads += 1

    @property
    def loaded(self) -> bool:
        return bool(self.ctx)

    def _ready(self) -> Any:
        """The context, loaded again if it was unloaded (a 500 if that fails now)."""
        if not self.ctx:
            try:
                self._load()
            except RuntimeError as exc:
                raise EngineError(
                    str(exc), status_code=500, code="projector_load_failed", type="server_error"
                ) from None
            log.info("projector %s loaded again", self.path.name)
        return self.ctx

    @contextlib.contextmanager
    def _use(self) -> Iterator[Any]:
        """The context, loaded if need be, kept loaded while the block runs."""
        with self._cond:
            ctx = self._ready()
            self._users += 1
        try:
            yield ctx
        finally:
            with self._cond:
                self._users -= 1
                self._cond.notify_all()

    def unload(self) -> bool:
        """Free the context unless a tokenize or an encode uses it (then False); the next
        use loads it again."""
        with self._cond:
            if self._users:
                return False
            if self.ctx:
                mtmd.mtmd_free(self.ctx)
                self.ctx = None
                log.info("projector %s unloaded: no image lines", self.path.name)
            return True

    def free(self) -> None:
        with self._cond:
            while self._users:
                self._cond.wait()
        self.unload()

    def tokenize(self, text: str, images: list[bytes]) -> tuple[list[int], list[ImageChunk]]:
        """The prompt's token list (oai/media.py's ids for image rows) and its image chunks.
        `text` holds one marker per image, in order. Raises a 400 for an image libmtmd
        cannot decode."""
        with self._use() as ctx:
            return self._tokenize(ctx, text, images)

    def _tokenize(
        self, ctx: Any, text: str, images: list[bytes]
    ) -> tuple[list[int], list[ImageChunk]]:
        bitmaps: list[Any] = []
        chunks = mtmd.mtmd_input_chunks_init()
        try:
            for i, raw in enumerate(images):
                buf = (ctypes.c_uint8 * len(raw)).from_buffer_copy(raw)
                bitmap = mtmd.mtmd_helper_bitmap_init_from_buf(ctx, buf, len(raw), False)
                if not bitmap:
                    raise media.bad_image(
                        f"image {i + 1} of the prompt could not be decoded (PNG or JPEG).",
                        "messages",
                    )
                bitmaps.append(bitmap)
                mtmd.mtmd_bitmap_set_id(bitmap, media.image_key(raw).encode())
            data = text.encode("utf-8")
            # The rendered template holds the BOS text already, as the text path's tokens do.
            inp = mtmd.mtmd_input_text(data, len(data), False, True)
            arr = (mtmd.mtmd_bitmap_p_ctypes * max(1, len(bitmaps)))(*bitmaps)
            rc = mtmd.mtmd_tokenize(ctx, chunks, ctypes.byref(inp), arr, len(bitmaps))
            if rc != 0:
                raise media.bad_image(
                    "the prompt's images could not be prepared for this model "
                    f"(mtmd_tokenize returned {rc}).",
                    "messages",
                )
            return self._read_chunks(chunks)
        finally:
            mtmd.mtmd_input_chunks_free(chunks)
            for bitmap in bitmaps:
                mtmd.mtmd_bitmap_free(bitmap)

    def _read_chunks(self, chunks: Any) -> tuple[list[int], list[ImageChunk]]:
        tokens: list[int] = []
        parts: list[ImageChunk] = []
        seen: dict[str, int] = {}
        for i in range(mtmd.mtmd_input_chunks_size(chunks)):
            chunk = mtmd.mtmd_input_chunks_get(chunks, i)
            kind = mtmd.mtmd_input_chunk_get_type(chunk)
            if kind == mtmd.MTMD_INPUT_CHUNK_TYPE_TEXT:
                n = ctypes.c_size_t(0)
                ptr = mtmd.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(n))
                tokens.extend(ptr[: n.value])
                continue
            if kind != mtmd.MTMD_INPUT_CHUNK_TYPE_IMAGE:
                for part in parts:
                    part.free()
                raise media.bad_image("only images are taken, not audio.", "messages")
            image = (mtmd.mtmd_input_chunk_get_id(chunk) or b"").decode()
            ordinal = seen[image] = seen.get(image, -1) + 1
            n_tokens = mtmd.mtmd_input_chunk_get_n_tokens(chunk)
            ids = media.image_ids(image, ordinal, n_tokens)
            parts.append(
                ImageChunk(
                    key=f"{image}/{ordinal}",
                    first=ids[0],
                    n_tokens=n_tokens,
                    full=mtmd.mtmd_input_chunk_copy(chunk),
                    layout=Layout.of(chunk) if self.mrope else None,
                )
            )
            tokens.extend(ids)
        return tokens, parts

    def encode(self, chunk: Any, n_tokens: int) -> np.ndarray:
        """The embedding rows of an image chunk (a copy: the encoder's buffer is reused)."""
        with self._use() as ctx:
            rc = mtmd.mtmd_encode_chunk(ctx, chunk)
            rows = mtmd.mtmd_get_output_embd(ctx) if rc == 0 else None
            if rows is not None:
                return np.ctypeslib.as_array(rows, shape=(n_tokens * self.n_embd,)).copy()
            raise EngineError(
                f"the image could not be encoded (mtmd_encode_chunk returned {rc}).",
                status_code=500,
                code="image_encode_failed",
                type="server_error",
            )


@dataclass(eq=False)
class Encoded:
    """One image chunk in the store: its rows once encoded, or why it could not be."""

    key: str
    n_tokens: int
    full: Any = None  # the chunk with its pixels, until encoded
    layout: Layout | None = None  # where its rows go (M-RoPE projectors only)
    rows: np.ndarray | None = None
    error: EngineError | None = None
    pins: int = 0  # requests that still need it
    queued: bool = False
    nbytes: int = 0


@dataclass(order=True)
class _Work:
    priority: int
    seq_no: int
    encoded: Encoded = field(compare=False)


class ImageStore:
    """Each distinct image chunk encoded once per load; its rows kept for later requests."""

    def __init__(
        self,
        projector: Projector,
        *,
        limit_bytes: int = IMAGE_CACHE_BYTES,
        on_ready: Callable[[], None] = lambda: None,
        idle_seconds: float = PROJECTOR_IDLE,
        free_chunk: Callable[[Any], None] = mtmd.mtmd_input_chunk_free,
    ) -> None:
        self._free_chunk = free_chunk
        self.projector = projector
        self.idle_seconds = idle_seconds
        self._last_use = time.monotonic()
        self.limit_bytes = limit_bytes
        self._on_ready = on_ready
        self._encodings: OrderedDict[str, Encoded] = OrderedDict()  # least recently used first
        self._lock = threading.Condition()
        self._work: list[_Work] = []
        self._seq = itertools.count()
        self._closing = False
        #: Chunks encoded since the load, and the seconds the encodes took together.
        self.encodes = 0
        self.encode_seconds = 0.0
        self._thread = threading.Thread(target=self._run, name="llama-images", daemon=True)
        self._thread.start()

    @property
    def cached_bytes(self) -> int:
        with self._lock:
            return sum(e.nbytes for e in self._encodings.values())

    def pin(self, parts: list[ImageChunk], priority: int) -> list[str]:
        """Take a request's image chunks: each is pinned until `release`, and queued for
        encoding unless it is already encoded or queued. The chunks' handles pass to the
        store (or are freed). Returns the keys to release."""
        keys = []
        with self._lock:
            for part in parts:
                encoded = self._encodings.get(part.key)
                if encoded is None or encoded.error is not None and not encoded.pins:
                    if encoded is not None:
                        self._forget(encoded)
                    encoded = Encoded(part.key, part.n_tokens, part.full, part.layout)
                    part.full = None
                    self._encodings[part.key] = encoded
                else:
                    self._encodings.move_to_end(part.key)
                    self._free_chunk(part.full)
                    part.full = None
                encoded.pins += 1
                if encoded.rows is None and encoded.error is None and not encoded.queued:
                    encoded.queued = True
                    heapq.heappush(self._work, _Work(priority, next(self._seq), encoded))
                keys.append(encoded.key)
            self._last_use = time.monotonic()
            self._lock.notify()
        return keys

    def take(self, key: str) -> Encoded | None:
        """The chunk's encoding once it is done (or failed), pinned once more until
        `release([key])` (a cancel elsewhere cannot free it mid-decode); None while it waits."""
        with self._lock:
            encoded = self._encodings.get(key)
            if encoded is None or (encoded.rows is None and encoded.error is None):
                return None
            encoded.pins += 1
            return encoded

    def release(self, keys: list[str]) -> None:
        """A request no longer needs these chunks; keep what fits, the newest first."""
        with self._lock:
            for key in keys:
                encoded = self._encodings.get(key)
                if encoded is not None:
                    encoded.pins -= 1
            self._trim()
            self._last_use = time.monotonic()
            self._lock.notify()  # the encoder times the projector's idleness from here

    def close(self) -> None:
        with self._lock:
            self._closing = True
            self._lock.notify()
        self._thread.join()
        with self._lock:
            for encoded in list(self._encodings.values()):
                self._forget(encoded)

    def _trim(self) -> None:
        total = sum(e.nbytes for e in self._encodings.values())
        for encoded in list(self._encodings.values()):
            if total <= self.limit_bytes:
                break
            if encoded.pins <= 0 and not encoded.queued:
                total -= encoded.nbytes
                self._forget(encoded)
        for encoded in list(self._encodings.values()):
            if encoded.pins <= 0 and encoded.error is not None:
                self._forget(encoded)

    def _forget(self, encoded: Encoded) -> None:
        self._encodings.pop(encoded.key, None)
        if encoded.full:
            self._free_chunk(encoded.full)
        encoded.full = None
        encoded.rows = None

    def _in_use(self) -> bool:
        return bool(self._work) or any(e.pins > 0 for e in self._encodings.values())

    def _idle_wait(self) -> float | None:
        """How long the encoder may sleep before it looks at the projector's idleness
        again (None: until woken; a pin or a release wakes it)."""
        if not self.projector.loaded:
            return None
        if self._in_use():
            return self.idle_seconds
        return max(0.0, self._last_use + self.idle_seconds - time.monotonic())

    def _idle_unload(self) -> bool:
        """Unload the projector when no image has been needed for idle_seconds."""
        if self._in_use():
            self._last_use = time.monotonic()
            return False
        if self.projector.loaded and time.monotonic() - self._last_use >= self.idle_seconds:
            if self.projector.unload():
                return True
            self._last_use = time.monotonic()  # a tokenize was using it: look again later
        return False

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._closing and not self._work:
                    if self._idle_unload():
                        continue
                    self._lock.wait(self._idle_wait())
                if self._closing:
                    return
                encoded = heapq.heappop(self._work).encoded
                if encoded.pins <= 0:  # every request that wanted it is gone
                    encoded.queued = False
                    self._trim()
                    continue
                full = encoded.full
            t = time.monotonic()
            rows, error = None, None
            try:
                rows = self.projector.encode(full, encoded.n_tokens)
            except EngineError as exc:
                error = exc
            seconds = time.monotonic() - t
            with self._lock:
                if full:
                    self._free_chunk(full)
                encoded.full = None
                encoded.queued = False
                encoded.rows, encoded.error = rows, error
                encoded.nbytes = rows.nbytes if rows is not None else 0
                if rows is not None:
                    self.encodes += 1
                    self.encode_seconds += seconds
                self._trim()
            log.debug("image %s encoded in %.3f s", encoded.key[:12], seconds)
            self._on_ready()
