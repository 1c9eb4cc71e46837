"""Images in, engine's form out: every image of a body is read (a data URL, a Files API file
id, an http(s) URL fetched safely), checked, and put back in the form the body's engine
takes.

The forms (`ImageTarget.mode`):
- the embedded engine and `png`: every image a `data:image/png;base64,` or
  `data:image/jpeg;base64,` URL (PNG and JPEG as they are, WEBP and GIF as PNG); a Responses
  part's `file_id` is removed and its `image_url` holds the data URL;
- `inline`: every image a data URL of its own format;
- `pass`: http(s) URLs as they are (the upstream fetches them); data URLs and file ids as
  data URLs of their own format.
With `max_side`, an image whose longer side is larger is scaled down first (a URL left to the
upstream in `pass` is not).

`ImageResolver` is one per node: the runner hands it every claimed line (`submit`, which
resolves a line's images in its own threads and then hands the line to the engine) and the
API every online request (`resolve` in a worker thread). Within one batch each distinct URL
is fetched once (a bounded cache keyed by batch and URL, failures included), and each
distinct image is decoded once (a bounded cache keyed by its bytes).
"""

from __future__ import annotations

import copy
import hashlib
import logging
import secrets
import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from functools import partial
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from sqlmodel import select

from app.config import Settings
from app.engine.base import Engine, EngineError, Priority, RequestCancelled, resolve
from app.errors import APIError
from app.images.decode import Image, data_url_bytes, prepare, too_large
from app.images.errors import INVALID_IMAGE_FILE, ImageError
from app.images.fetch import FetchRules, fetch_image
from app.images.parts import ImageRef, find_images
from app.tables import Batch

if TYPE_CHECKING:
    from app.files.service import FileService

log = logging.getLogger("batchyard.images")

#: Purposes of the files a `file_id` image may name (OpenAI's SDK uploads with these).
IMAGE_FILE_PURPOSES = ("vision", "user_data")
#: Bytes each of the two caches (fetched bodies; decoded images) holds at most.
CACHE_BYTES = 256 * 1024 * 1024
#: Threads that resolve batch lines' images at once (each may wait on a fetch).
WORKERS = 8
#: Batches whose owner is remembered (a file id is looked up as the batch's owner's).
OWNERS_KEPT = 1024
#: What a cached failure counts against the cache's bytes.
ERROR_BYTES = 1024

#: OpenAI's `detail: "low"`: the model sees the image at most this many pixels a side (its
#: projector then takes one tile of it, not several).
LOW_DETAIL_SIDE = 512


@dataclass(frozen=True)
class ImageTarget:
    """The form an engine takes images in: one of pass, inline, png (the embedded engine's
    is png), and the longest side it takes (0: any)."""

    mode: str = "png"
    max_side: int = 0

    @property
    def to_png(self) -> bool:
        return self.mode == "png"

    @property
    def fetches(self) -> bool:
        """Whether http(s) URLs are fetched here (not left to the engine)."""
        return self.mode != "pass"


#: The embedded engine's form: PNG and JPEG data URLs only.
EMBEDDED_TARGET = ImageTarget("png")


def target_for(engine: Engine | None, model: str | None) -> ImageTarget:
    """The form the engine that `model` routes to takes (the Engine contract's
    `image_form`): an upstream's `images=` and `image_max_side=`, else the embedded
    engine's."""
    if engine is None:
        return EMBEDDED_TARGET
    mode, max_side = engine.image_form(model)
    return ImageTarget(mode, max_side)


@dataclass
class Resolved:
    """A body with its images in the engine's form, and those images (in order; an http
    URL left to a `pass` upstream is not among them)."""

    body: dict[str, Any]
    images: list[Image]


K = TypeVar("K")
V = TypeVar("V")


class _Cache(Generic[K, V]):
    """A least-recently-used map bounded by the bytes of what it holds."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.used = 0
        self._items: OrderedDict[K, tuple[V, int]] = OrderedDict()

    def get(self, key: K) -> V | None:
        hit = self._items.get(key)
        if hit is None:
            return None
        self._items.move_to_end(key)
        return hit[0]

    def put(self, key: K, value: V, size: int) -> None:
        if size > self.budget:
            return
        old = self._items.pop(key, None)
        if old is not None:
            self.used -= old[1]
        self._items[key] = (value, size)
        self.used += size
        while self.used > self.budget:
            _, (_, dropped) = self._items.popitem(last=False)
            self.used -= dropped


class ImageResolver:
    """Resolves the images of bodies for one node (see the module's docstring)."""

    def __init__(
        self,
        settings: Settings,
        files: FileService | None,
        *,
        workers: int = WORKERS,
        cache_bytes: int = CACHE_BYTES,
    ) -> None:
        self.rules = FetchRules(
            max_bytes=settings.max_image_bytes,
            timeout=settings.image_fetch_timeout,
            allow_private=settings.allow_private_image_urls,
        )
        self.files = files
        self.workers = workers
        #: http(s) fetches made (each distinct URL once per batch while it stays cached).
        self.fetches = 0
        self._lock = threading.Lock()
        #: (scope, url) -> the body fetched, or why it could not be.
        self._fetched: _Cache[tuple[str, str], bytes | ImageError] = _Cache(cache_bytes)
        self._fetching: dict[tuple[str, str], Future[bytes]] = {}
        #: (sha256, to_png, max_side) -> the image in that form, or why it cannot be.
        self._prepared: _Cache[tuple[bytes, bool, int], Image | ImageError] = _Cache(cache_bytes)
        self._owners: OrderedDict[str, str] = OrderedDict()
        self._pool: ThreadPoolExecutor | None = None
        #: The runner's future of each line being resolved -> the engine's, once submitted.
        self._held: dict[Future[dict[str, Any]], Future[dict[str, Any]] | None] = {}

    # -- one body -----------------------------------------------------------------------

    def resolve(
        self,
        endpoint: str,
        body: dict[str, Any],
        *,
        target: ImageTarget = EMBEDDED_TARGET,
        owner: str | None = None,
        scope: str | None = None,
    ) -> Resolved:
        """`body` with its images in `target`'s form (a copy; `body` itself is left as it
        is), or ImageError for the first image that cannot be used, at its param. `owner`:
        whose files a `file_id` may name; `scope`: the batch whose fetches are shared
        (None: this body's own)."""
        if not find_images(endpoint, body):
            return Resolved(body, [])
        body = copy.deepcopy(body)
        scope = scope or f"once-{secrets.token_hex(8)}"
        images: list[Image] = []
        for ref in find_images(endpoint, body):
            try:
                image = self._image(ref, target, owner, scope)
            except ImageError as exc:
                raise exc.at(ref.param) from None
            if image is not None:
                ref.point_to(image.data_url())
                images.append(image)
        return Resolved(body, images)

    def _image(
        self, ref: ImageRef, target: ImageTarget, owner: str | None, scope: str
    ) -> Image | None:
        limit = self.rules.max_bytes
        if ref.source == "data":
            raw = data_url_bytes(ref.value, limit)
        elif ref.source == "file":
            raw = self._file_bytes(ref.value, owner)
        elif target.fetches:
            raw = self._fetch(scope, ref.value)
        else:
            return None  # `pass`: the upstream fetches it (and reads `detail` itself)
        if ref.detail == "low":
            side = min(target.max_side or LOW_DETAIL_SIDE, LOW_DETAIL_SIDE)
            target = replace(target, max_side=side)
        return self._prepare(raw, target)

    def _prepare(self, raw: bytes, target: ImageTarget) -> Image:
        key = (hashlib.sha256(raw).digest(), target.to_png, target.max_side)
        with self._lock:
            hit = self._prepared.get(key)
        if isinstance(hit, ImageError):
            raise hit
        if hit is not None:
            return hit
        try:
            image = prepare(raw, to_png=target.to_png, max_side=target.max_side)
        except ImageError as exc:
            with self._lock:
                self._prepared.put(key, exc, ERROR_BYTES)
            raise
        with self._lock:
            self._prepared.put(key, image, len(image.data))
        return image

    def _file_bytes(self, file_id: str, owner: str | None) -> bytes:
        """The bytes of the owner's file `file_id`, uploaded for images."""
        files = self.files
        row = None
        if files is not None and owner is not None:
            try:
                row = files.get(file_id, owner)
            except APIError:  # 404: another owner's, deleted, or never there
                row = None
        if files is None or row is None:
            raise ImageError(f"No such file: '{file_id}'.", code=INVALID_IMAGE_FILE)
        if row.purpose not in IMAGE_FILE_PURPOSES:
            raise ImageError(
                f"The file '{file_id}' was uploaded with purpose '{row.purpose}'; an image's "
                f"file must have purpose {' or '.join(repr(p) for p in IMAGE_FILE_PURPOSES)}.",
                code=INVALID_IMAGE_FILE,
            )
        if row.bytes > self.rules.max_bytes:
            raise too_large(f"The file '{file_id}' ({row.bytes} bytes)", self.rules.max_bytes)
        with files.storage.open_file(file_id) as f:
            return f.read(self.rules.max_bytes + 1)

    def _fetch(self, scope: str, url: str) -> bytes:
        """The body at `url`, fetched once per scope: a second line asking while the first
        fetch runs waits for it; a failure is remembered like a success."""
        key = (scope, url)
        with self._lock:
            hit = self._fetched.get(key)
            waiting = None if hit is not None else self._fetching.get(key)
            mine: Future[bytes] | None = None
            if hit is None and waiting is None:
                mine = Future()
                self._fetching[key] = mine
        if isinstance(hit, ImageError):
            raise hit
        if hit is not None:
            return hit
        if waiting is not None:
            return waiting.result()
        assert mine is not None
        try:
            data = fetch_image(url, self.rules)
        except ImageError as exc:
            with self._lock:
                self.fetches += 1
                self._fetched.put(key, exc, ERROR_BYTES)
                self._fetching.pop(key, None)
            mine.set_exception(exc)
            raise
        except BaseException as exc:
            with self._lock:
                self._fetching.pop(key, None)
            mine.set_exception(exc)
            raise
        with self._lock:
            self.fetches += 1
            self._fetched.put(key, data, len(data))
            self._fetching.pop(key, None)
        mine.set_result(data)
        return data

    # -- the runner's lines -------------------------------------------------------------

    def submit(
        self,
        engine: Engine,
        endpoint: str,
        body: dict[str, Any],
        *,
        priority: Priority = Priority.BATCH,
        batch_id: str | None = None,
    ) -> Future[dict[str, Any]]:
        """Hand a batch line to `engine` once its images are resolved. A line with no image
        goes to the engine at once (its future is the engine's); one with images is
        resolved in this resolver's threads, and fails with its ImageError or goes on to
        the engine. Withdraw such a line with `cancel`, not the engine's."""
        try:
            refs = find_images(endpoint, body)
        except ImageError as exc:
            failed: Future[dict[str, Any]] = Future()
            failed.set_exception(exc)
            return failed
        if not refs:
            return engine.submit(endpoint, body, priority=priority)
        line: Future[dict[str, Any]] = Future()
        with self._lock:
            self._held[line] = None
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="images")
            pool = self._pool
        pool.submit(self._run, line, engine, endpoint, body, priority=priority, batch_id=batch_id)
        return line

    def _run(
        self,
        line: Future[dict[str, Any]],
        engine: Engine,
        endpoint: str,
        body: dict[str, Any],
        *,
        priority: Priority,
        batch_id: str | None,
    ) -> None:
        try:
            if line.done():
                return
            owner = self.batch_owner(batch_id) if batch_id else None
            target = target_for(engine, body.get("model"))
            resolved = self.resolve(endpoint, body, target=target, owner=owner, scope=batch_id)
        except ImageError as exc:
            self._settle(line, exc)
            return
        except Exception as exc:
            log.exception("batch=%s the images of a line could not be resolved", batch_id)
            self._settle(
                line,
                EngineError(
                    f"The images of this line could not be read: {exc}",
                    status_code=500,
                    code="server_error",
                    type="server_error",
                ),
            )
            return
        with self._lock:
            if line.done():  # withdrawn meanwhile
                self._held.pop(line, None)
                return
            inner = engine.submit(endpoint, resolved.body, priority=priority)
            self._held[line] = inner
        inner.add_done_callback(partial(self._copy, line))

    def _settle(self, line: Future[dict[str, Any]], error: BaseException) -> None:
        with self._lock:
            self._held.pop(line, None)
        resolve(line, error=error)

    def _copy(self, line: Future[dict[str, Any]], inner: Future[dict[str, Any]]) -> None:
        with self._lock:
            self._held.pop(line, None)
        exc = inner.exception()
        if exc is not None:
            resolve(line, error=exc)
        else:
            resolve(line, result=inner.result())

    def cancel(self, engine: Engine, future: Future[dict[str, Any]]) -> None:
        """Withdraw a line `submit` returned: one still resolving fails with
        RequestCancelled at once, one handed on is cancelled in the engine."""
        with self._lock:
            known = future in self._held
            inner = self._held.get(future)
        if not known:
            engine.cancel(future)
        elif inner is None:
            self._settle(future, RequestCancelled())
        else:
            engine.cancel(inner)

    def batch_owner(self, batch_id: str) -> str | None:
        """The owner of a batch (whose files its lines' file ids name), remembered."""
        with self._lock:
            owner = self._owners.get(batch_id)
        if owner is not None or self.files is None:
            return owner
        with self.files.db.read() as s:
            owner = s.exec(select(Batch.owner).where(Batch.id == batch_id)).first()
        if owner is not None:
            with self._lock:
                self._owners[batch_id] = owner
                while len(self._owners) > OWNERS_KEPT:
                    self._owners.popitem(last=False)
        return owner

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
