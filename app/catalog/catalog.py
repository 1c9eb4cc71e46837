"""The Catalog: every model in every store, by every name that means it.

Stores are read at start and again when their folders change (looked at no more than
every RECHECK_SECONDS), so a model pulled into Ollama or copied into --models-dir shows up
without a restart. Headers are read once per file (header.FACTS). Nothing here loads a
model or touches the network.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import TypeVar

from app.catalog import presets
from app.catalog.entry import Entry, LoadProfile, ProjectorFacts
from app.catalog.estimate import estimate
from app.catalog.header import FACTS, NotAModel, quantization
from app.catalog.stores import FilesStore, FoldersStore, Found, Signature, Store, home_stores
from app.config import Settings, bundled_model_path

log = logging.getLogger("batchyard.catalog")
T = TypeVar("T")

#: How often, at most, entries() looks whether a store changed.
RECHECK_SECONDS = 2.0
LATEST = ":latest"
#: A batch's route (`Batch.route`) when its model names nothing known: the lines of
#: whichever node's default model takes them. Any other route is a model's id.
DEFAULT_ROUTE = ""
#: The clock of the recheck interval (a test steps it).
clock = time.monotonic
#: Sources that name a file by its path alone.
_PLAIN = ("model", "default", "models-dir")


def server_profile(settings: Settings) -> LoadProfile:
    """The server's flags as a load profile: every entry's, under models.toml's settings,
    and a model loaded alone (engine/llama/loading.py). No shared-prefix cells without the
    prefix cache, which they are part of."""
    return LoadProfile(
        ctx_size=settings.ctx_size,
        parallel=settings.parallel,
        n_gpu_layers=settings.n_gpu_layers,
        kv_cache_type=settings.kv_cache_type,
        shared_prefix_cells=settings.shared_prefix_cells if settings.prefix_cache else 0,
    )


class Catalog:
    """The models this install can serve (see app/catalog/__init__.py)."""

    def __init__(
        self,
        settings: Settings,
        *,
        home: Path | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self._settings = settings
        environ = os.environ if environ is None else environ
        home = home if home is not None else Path(environ.get("HOME") or Path.home())
        # In the order their entries are listed and win a contested id.
        self._stores: list[Store] = []
        if settings.model:
            self._stores.append(FilesStore("model", [settings.model_path]))
        self._stores.append(FilesStore("default", [bundled_model_path()]))
        self._stores.append(FoldersStore(settings.models_dirs))
        if not settings.no_discover:
            self._stores += home_stores(home, environ)
        self._config_path = settings.models_config_path
        self._lock = threading.RLock()
        self._checked = float("-inf")
        self._signatures: list[Signature | None] = [None] * len(self._stores)
        self._found: list[list[Found]] = [[] for _ in self._stores]
        self._config_mtime: int | None = None
        self._config = presets.ModelsConfig()
        self._entries: list[Entry] = []
        self._by_name: dict[str, Entry] = {}
        self._by_folded: dict[str, Entry] = {}
        self._refresh(force=True)
        if settings.default_model and self.resolve(settings.default_model) is None:
            known = ", ".join(e.id for e in self._entries) or "none"
            raise ValueError(
                f"--default-model {settings.default_model!r} names no model this server "
                f"has; the models are: {known}"
            )

    # -- the API ----------------------------------------------------------------------

    def entries(self) -> list[Entry]:
        """Every model, the default first, then by store (--model, the embedded default,
        --models-dir, Ollama, LM Studio, the hub cache) and id."""
        self._refresh()
        return list(self._entries)

    def resolve(self, name: str | None) -> Entry | None:
        """The entry `name` means, by `lookup`'s rules (an id, an alias or another name;
        `name` alone for `name:latest`; letter case aside when nothing matches exactly).
        None when nothing known is meant."""
        if not name:
            return None
        self._refresh()
        with self._lock:
            return lookup(self._by_name, name, self._by_folded)

    def default(self) -> Entry:
        """The model of lines whose name means nothing known: --default-model, else
        --model, else the embedded SmolLM2."""
        self._refresh()
        with self._lock:
            return self._entries[0]

    def entry_for(self, name: str | None) -> Entry:
        """The entry `name` means, or the default model's for a name nothing knows."""
        return self.resolve(name) or self.default()

    def get(self, id: str) -> Entry | None:
        self._refresh()
        with self._lock:
            return next((e for e in self._entries if e.id == id), None)

    def names(self) -> frozenset[str]:
        """Every name of every entry."""
        self._refresh()
        with self._lock:
            return frozenset(self._by_name)

    @property
    def config(self) -> presets.ModelsConfig:
        return self._config

    # -- reading the stores ---------------------------------------------------------------

    def _refresh(self, force: bool = False) -> None:
        now = clock()
        if not force and now - self._checked < RECHECK_SECONDS:
            return
        with self._lock:
            if not force and now - self._checked < RECHECK_SECONDS:
                return
            self._checked = now
            changed = force
            for i, store in enumerate(self._stores):
                try:
                    signature = store.signature()
                    if signature != self._signatures[i]:
                        self._found[i] = store.scan()
                        self._signatures[i] = signature
                        changed = True
                except Exception:  # a store that cannot be read keeps what it last listed
                    log.exception("model store %s not read", store.source)
            config_mtime = _mtime(self._config_path)
            if force or config_mtime != self._config_mtime:
                # A bad models.toml is a start-up error; edited badly later, the last good
                # one stays in force and the mistake is logged.
                try:
                    self._config = presets.load(self._config_path)
                except ValueError:
                    if force:
                        raise
                    log.exception("models config not reloaded")
                self._config_mtime = config_mtime
                changed = True
            if changed:
                self._build()

    def _build(self) -> None:
        entries = self._found_entries()
        by_name = {n: i for i, e in enumerate(entries) for n in e.names}
        self._apply_config(entries, by_name)
        default = self._default_index(entries, by_name)
        if default is not None:
            entries.insert(0, replace(entries.pop(default), is_default=True))
        self._entries = entries
        self._by_name = {n: e for e in entries for n in e.names}
        self._by_folded = {}
        for e in reversed(entries):  # the first entry wins a name that differs by case only
            for n in e.names:
                self._by_folded[n.casefold()] = e

    def _found_entries(self) -> list[Entry]:
        """The stores' models as entries, each with names no entry before it took."""
        base = self._config.every.apply(server_profile(self._settings))
        entries: list[Entry] = []
        by_path: dict[Path, int] = {}
        taken: set[str] = set()
        for found in (f for store in self._found for f in store):
            entry = _entry(found, base)
            if entry is None:
                continue
            # One file given twice (--model inside --models-dir, the embedded default linked
            # there) is one entry. Names a tool gives one file (`ollama cp`) stay entries of
            # their own, as that tool lists them; the pool keys engines by file, so they
            # share one engine.
            same = by_path.get(_real(entry.path)) if entry.source in _PLAIN else None
            if same is not None:
                entries[same] = _with_names(entries[same], {entry.id, *entry.names} - taken)
                taken |= entries[same].names
                continue
            ident = _free_id(entry, taken)
            names = {n for n in {ident, *entry.names} if n not in taken}
            entry = replace(entry, id=ident, names=frozenset(names))
            taken |= names
            if entry.source in _PLAIN:
                by_path.setdefault(_real(entry.path), len(entries))
            entries.append(entry)
        return entries

    def _apply_config(self, entries: list[Entry], by_name: dict[str, int]) -> None:
        """models.toml's aliases, then its per-model sections, each found by the names they
        use (`entries` and `by_name` are changed in place)."""
        for alias, target in self._config.aliases.items():
            i = lookup(by_name, target)
            if i is None:
                log.warning("models config: alias %r names no model (%r)", alias, target)
            elif alias in by_name and by_name[alias] != i:
                log.warning("models config: alias %r is already a model's name", alias)
            else:
                entries[i] = _with_names(entries[i], {alias})
                by_name[alias] = i
        for section, preset in self._config.models.items():
            i = lookup(by_name, section)
            if i is None:
                log.warning("models config: [%r] names no model", section)
                continue
            entries[i] = _with_profile(entries[i], preset.apply(entries[i].profile))
            if preset.mmproj is not None:  # `mmproj` wins over the projector found beside
                entries[i] = _with_projector(entries[i], preset.mmproj or None)

    def _default_index(self, entries: list[Entry], by_name: dict[str, int]) -> int | None:
        wanted = self._settings.default_model
        if wanted:
            i = lookup(by_name, wanted)
            if i is not None:
                return i
        for source in ("model", "default"):
            for i, e in enumerate(entries):
                if e.source == source:
                    return i
        return 0 if entries else None


def _mtime(path: Path | None) -> int | None:
    if path is None:
        return None
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return None


def _real(path: Path) -> Path:
    try:
        return path.resolve()
    except OSError:
        return path


def lookup(by_name: Mapping[str, T], name: str, folded: Mapping[str, T] | None = None) -> T | None:
    """What `name` means in `by_name`: the one rule by which a model's name is read,
    wherever it is read (this catalog, models.toml, the names other nodes publish).

    As Ollama reads names: `name` exactly, else `name:latest` where `name` has no tag;
    then the same with letter case aside (`folded`: `by_name` keyed by casefolded names,
    the first entry winning, when the caller keeps one). Ids, aliases from models.toml and
    a hub-cache model's bare `ORG/REPO` are names of their entry already."""
    name = name.strip()
    tries = [name] if ":" in name.rsplit("/", 1)[-1] else [name, name + LATEST]
    for key in tries:
        if key in by_name:
            return by_name[key]
    if folded is None:
        folded = {}
        for n, value in by_name.items():
            folded.setdefault(n.casefold(), value)
    for key in tries:
        if key.casefold() in folded:
            return folded[key.casefold()]
    return None


def _free_id(entry: Entry, taken: set[str]) -> str:
    """The entry's id, or where another store's model has it, `SOURCE:ID` (then `#2`...)."""
    if entry.id not in taken:
        return entry.id
    ident = f"{entry.source}:{entry.id}"
    n = 2
    while ident in taken:
        ident = f"{entry.source}:{entry.id}#{n}"
        n += 1
    return ident


def _with_names(entry: Entry, names: set[str]) -> Entry:
    return replace(entry, names=entry.names | names)


def _with_profile(entry: Entry, profile: LoadProfile) -> Entry:
    est = estimate(entry.facts, profile, entry.projector_facts) if entry.facts else None
    return replace(entry, profile=profile, estimate=est)


def _with_projector(entry: Entry, path: Path | None) -> Entry:
    projector, facts = _projector(path)
    est = estimate(entry.facts, entry.profile, facts) if entry.facts else None
    return replace(entry, projector=projector, projector_facts=facts, estimate=est)


def _projector(path: Path | None) -> tuple[Path | None, ProjectorFacts | None]:
    """A projector file and its facts; (None, None) for none, or for one that cannot be
    read (logged: the model then reads text only)."""
    if path is None:
        return None, None
    try:
        return path, FACTS.projector(path)
    except OSError as exc:
        log.warning("projector %s not used: unreadable (%s)", path, exc.strerror or exc)
    except ValueError as exc:
        log.warning("projector %s not used: %s", path, exc)
    return None, None


def _entry(found: Found, profile: LoadProfile) -> Entry | None:
    """An Entry for what a store found: its header read (from the cache), its projector's
    too, its estimate for `profile`; None for a GGUF that is not a language model (a
    projector)."""
    size, mtime = 0, 0.0
    for part in found.paths:
        try:
            st = part.stat()
        except OSError:
            continue
        size += st.st_size
        mtime = max(mtime, st.st_mtime)
    facts, error = None, found.error
    if not error:
        try:
            facts = FACTS.facts(found.paths)
        except NotAModel:
            return None
        except (OSError, ValueError) as exc:
            error = str(exc) if isinstance(exc, ValueError) else f"unreadable ({exc.strerror})"
    projector, projector_facts = _projector(found.projector)
    return Entry(
        id=found.id,
        names=frozenset({found.id, *found.names}),
        source=found.source,
        path=found.paths[0],
        size_bytes=size,
        mtime=mtime,
        quantization=quantization(facts.file_type if facts else None, found.paths[0]),
        profile=profile,
        facts=facts,
        estimate=estimate(facts, profile, projector_facts) if facts else None,
        paths=found.paths,
        error=error,
        projector=projector,
        projector_facts=projector_facts,
    )
