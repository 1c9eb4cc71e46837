"""The catalog of a node that knows one model: the --model file (or the embedded default).

Stands in for `app.catalog.Catalog` wherever that is not available, so the pool serves a
one-model node exactly as the lone engine did: every name means that model.
"""

from __future__ import annotations

from app.catalog import Entry, LoadProfile
from app.config import Settings
from app.model_files import quantization


def profile_of(settings: Settings) -> LoadProfile:
    """The load profile the server's own flags give a model."""
    return LoadProfile(
        ctx_size=settings.ctx_size,
        parallel=settings.parallel,
        n_gpu_layers=settings.n_gpu_layers,
        kv_cache_type=settings.kv_cache_type,
    )


class OneModel:
    """A catalog of one entry, the default."""

    def __init__(self, settings: Settings) -> None:
        path = settings.model_path
        stat = path.stat() if path.is_file() else None
        id = path.stem if path.suffix == ".gguf" else path.name
        self._entry = Entry(
            id=id,
            names=frozenset({id}),
            source="model" if settings.model else "default",
            path=path,
            size_bytes=stat.st_size if stat else 0,
            mtime=stat.st_mtime if stat else 0.0,
            quantization=quantization(None, path),
            profile=profile_of(settings),
            paths=(path,),
            is_default=True,
        )

    def entries(self) -> list[Entry]:
        return [self._entry]

    def resolve(self, name: str | None) -> Entry | None:
        return self._entry if name in self._entry.names else None

    def default(self) -> Entry:
        return self._entry

    def route(self, name: str | None) -> Entry:
        return self._entry

    def get(self, id: str) -> Entry | None:
        return self._entry if id == self._entry.id else None

    def names(self) -> frozenset[str]:
        return self._entry.names
