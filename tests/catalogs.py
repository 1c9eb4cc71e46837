"""A catalog over fixed entries (app.catalog's `Catalog` API), for tests of the model pool
and the claims that need to say exactly which models a node knows."""

from __future__ import annotations

from pathlib import Path

from app.catalog import Entry, LoadProfile, lookup
from app.config import Settings


class DictCatalog:
    """The catalog's API over fixed entries, the first the default."""

    def __init__(self, entries: list[Entry]) -> None:
        self._entries = entries

    def entries(self) -> list[Entry]:
        return list(self._entries)

    def put(self, entry: Entry) -> None:
        """List `entry` in place of the one with its id (a file the stores read again)."""
        self._entries = [entry if e.id == entry.id else e for e in self._entries]

    def resolve(self, name: str | None) -> Entry | None:
        """By the catalog's one rule for names (`app.catalog.lookup`)."""
        if not name:
            return None
        by_name: dict[str, Entry] = {}
        for e in self._entries:
            for n in e.names:
                by_name.setdefault(n, e)
        return lookup(by_name, name)

    def default(self) -> Entry:
        return self._entries[0]

    def entry_for(self, name: str | None) -> Entry:
        return self.resolve(name) or self.default()

    def get(self, id: str) -> Entry | None:
        return next((e for e in self._entries if e.id == id), None)

    def names(self) -> frozenset[str]:
        return frozenset(n for e in self._entries for n in e.names)


def entry(id: str, path: Path, settings: Settings, *aliases: str, default: bool = False) -> Entry:
    """An entry for a model file, loaded with the server's own flags."""
    stat = path.stat()
    return Entry(
        id=id,
        names=frozenset({id, *aliases}),
        source="models-dir",
        path=path,
        size_bytes=stat.st_size,
        mtime=stat.st_mtime,
        quantization="unknown",
        profile=LoadProfile(
            ctx_size=settings.ctx_size,
            parallel=settings.parallel,
            n_gpu_layers=settings.n_gpu_layers,
            kv_cache_type=settings.kv_cache_type,
        ),
        paths=(path,),
        is_default=default,
    )
