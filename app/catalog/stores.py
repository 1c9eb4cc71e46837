"""The places models already are, and the names each tool gives them. Offline: a store is
folders and files on this machine, read as the tool that wrote them lays them out.

- plain folders (--models-dir, else the data dir's models/): `*.gguf` and subfolders;
- Ollama: `manifests/HOST/NAMESPACE/MODEL/TAG` (Docker v2 JSON) naming the blob of the
  `application/vnd.ollama.image.model` layer, `blobs/sha256-HEX`;
- LM Studio: `models/PUBLISHER/REPO/*.gguf`;
- the Hugging Face hub cache (and llama.cpp's own cache, which uses the same layout):
  `models--ORG--REPO/refs/main` names a revision, `snapshots/REV/...` holds its files;
- llama.cpp's older flat cache: `manifest=ORG=REPO=TAG.json` beside `ORG_REPO_FILE.gguf`.

Each store returns what it found as `Found` (an id, its other names, the file's parts, its
projector) and a signature of its folders' mtimes, so the catalog reads a store again only
when a model was added or removed there.

A model's multimodal projector (llama.cpp's mmproj GGUF), where each tool keeps it:

- Ollama: the manifest's `application/vnd.ollama.image.projector` layer, a blob;
- LM Studio: an `mmproj*.gguf` in the model's own PUBLISHER/REPO folder;
- the hub cache: an `mmproj*.gguf` in the model's snapshot folder, else in the nearest
  folder above it within the snapshot (as llama.cpp's -hf picks one);
- llama.cpp's flat cache: the manifest's `mmprojFile`, kept as `ORG_REPO_FILE`;
- plain folders: an `mmproj*.gguf` in the model's subfolder (as llama.cpp's router finds
  one); at a models dir's top level and beside --model, where unrelated models sit side by
  side, only one whose name shares the model's (see `pick_projector`).

Where a folder holds several, `pick_projector` ranks them. models.toml's `mmproj` wins
over all of these (presets.py).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from app.catalog.header import is_model_name, quant_tag, split_name, split_parts
from app.catalog.naming import (
    ModelFiles,
    model_stem,
    models_among,
    pick_projector,
    projectors_among,
)

OLLAMA_MODEL_LAYER = "application/vnd.ollama.image.model"
OLLAMA_PROJECTOR_LAYER = "application/vnd.ollama.image.projector"
OLLAMA_REGISTRY = "registry.ollama.ai"
OLLAMA_LIBRARY = "library"


@dataclass(frozen=True)
class Found:
    """One model a store holds, before its header is read."""

    id: str
    source: str
    paths: tuple[Path, ...]  # the parts, in order; paths[0] is what llama.cpp opens
    names: tuple[str, ...] = ()  # other spellings that mean it
    error: str = ""  # what the store itself says is wrong (a missing blob or part)
    projector: Path | None = None  # its multimodal projector, where the store keeps one


Signature = tuple[tuple[str, int], ...]


def _mtime_ns(path: Path) -> int:
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return -1


def _walk(folder: Path, depth: int, level: int = 0) -> Iterator[tuple[os.DirEntry[str], bool]]:
    """(entry, is it a folder) of the files under `folder` and of the folders `depth`
    levels down, each folder before what it holds: symlinks followed, hidden entries and
    ones that cannot be read skipped, in name order."""
    try:
        children = sorted(os.scandir(folder), key=lambda e: e.name)
    except OSError:
        return
    for child in children:
        if child.name.startswith("."):
            continue
        try:
            is_dir = child.is_dir()
        except OSError:
            continue
        if not is_dir:
            yield child, False
        elif level < depth:
            yield child, True
            yield from _walk(Path(child.path), depth, level + 1)


def dir_signature(roots: list[Path], depth: int) -> Signature:
    """The mtimes of every folder under `roots`, `depth` levels down, and of the files in
    them: a file added, removed or renamed changes its folder's mtime; one rewritten in
    place (an Ollama manifest, a hub ref, a model copied over another) its own."""
    seen: list[tuple[str, int]] = []
    for root in roots:
        seen.append((str(root), _mtime_ns(root)))
        for entry, is_dir in _walk(root, depth):
            if is_dir:
                path = Path(entry.path)
                seen.append((str(path), _mtime_ns(path)))
                continue
            try:
                st = entry.stat()
            except OSError:
                continue
            seen.append((entry.path, st.st_mtime_ns ^ st.st_size))
    return tuple(seen)


def _gguf_files(folder: Path, depth: int) -> Iterator[Path]:
    """Every .gguf under `folder`, `depth` levels of subfolders down, as `_walk` finds them."""
    for entry, is_dir in _walk(folder, depth):
        if not is_dir and entry.name.lower().endswith(".gguf"):
            yield Path(entry.path)


class Store:
    """A place models are. `scan()` lists them; `signature()` changes when it should be
    scanned again."""

    source = ""

    def signature(self) -> Signature:
        raise NotImplementedError

    def scan(self) -> list[Found]:
        raise NotImplementedError


class FilesStore(Store):
    """Single files: the embedded default and --model. Their own mtimes, and their
    folders' (a projector put beside one), are the signature."""

    def __init__(self, source: str, paths: list[Path]) -> None:
        self.source = source
        self.paths = paths

    def signature(self) -> Signature:
        return tuple((str(q), _mtime_ns(q)) for p in self.paths for q in (p, p.parent))

    def scan(self) -> list[Found]:
        found = []
        for path in self.paths:
            split = split_name(path.name)
            parts = split_parts(path, split.count) if split.count > 1 else (path,)
            ident = split.prefix if path.suffix.lower() == ".gguf" else path.name
            missing = [p for p in parts if not p.is_file()]
            error = "missing" if not path.is_file() else ""
            if missing and not error:
                error = f"missing {', '.join(p.name for p in missing)}"
            beside = projectors_among(_files(path.parent)) if not error else []
            projector = pick_projector(path, beside, related_only=True)
            found.append(Found(ident, self.source, parts, (path.name,), error, projector))
        return found


class FoldersStore(Store):
    """Plain folders of GGUF files (--models-dir). A file directly in a folder is named by
    its stem; a subfolder holding one model (a split model's parts, a projector beside it)
    by the subfolder's name, as llama.cpp's router names them; a subfolder holding several
    by `SUBFOLDER/STEM`. A projector in a subfolder is its models'; one at the top level
    only a model's whose name it shares."""

    source = "models-dir"
    DEPTH = 3

    def __init__(self, folders: list[Path]) -> None:
        self.folders = folders

    def signature(self) -> Signature:
        return dir_signature(self.folders, self.DEPTH)

    def scan(self) -> list[Found]:
        found: list[Found] = []
        for folder in self.folders:
            by_dir: dict[Path, list[Path]] = {}
            for path in _gguf_files(folder, self.DEPTH):
                by_dir.setdefault(path.parent, []).append(path)
            for parent, files in by_dir.items():
                models = models_among(files)
                projectors = projectors_among(files)
                rel = parent.relative_to(folder).as_posix() if parent != folder else ""
                for model in models:
                    projector = pick_projector(model.paths[0], projectors, related_only=not rel)
                    stem = model_stem(model.paths[0])
                    names: tuple[str, ...]
                    if not rel:
                        ident, names = stem, (model.paths[0].name,)
                    elif len(models) == 1:
                        ident, names = rel, (f"{rel}/{stem}",)
                    else:
                        ident, names = f"{rel}/{stem}", ()
                    found.append(
                        Found(ident, self.source, model.paths, names, model.error, projector)
                    )
        return found


def ollama_name(host: str, namespace: str, model: str, tag: str) -> str:
    """A model's name as `ollama list` prints it: the default registry and `library/`
    left out (`gemma3:270m`, `user/name:tag`, `hf.co/ORG/REPO:QUANT`)."""
    if host == OLLAMA_REGISTRY:
        base = model if namespace == OLLAMA_LIBRARY else f"{namespace}/{model}"
    else:
        base = f"{host}/{namespace}/{model}"
    return f"{base}:{tag}"


class OllamaStore(Store):
    """Ollama's models folder (OLLAMA_MODELS, else ~/.ollama/models)."""

    source = "ollama"

    def __init__(self, root: Path) -> None:
        self.root = root

    def signature(self) -> Signature:
        # manifests/HOST/NAMESPACE/MODEL hold one file per tag.
        return dir_signature([self.root / "manifests"], 3)

    def scan(self) -> list[Found]:
        found = []
        manifests = self.root / "manifests"
        for host in _subdirs(manifests):
            for namespace in _subdirs(host):
                for model in _subdirs(namespace):
                    for tag in _files(model):
                        item = self._read(host.name, namespace.name, model.name, tag)
                        if item is not None:
                            found.append(item)
        return found

    def _read(self, host: str, namespace: str, model: str, manifest: Path) -> Found | None:
        name = ollama_name(host, namespace, model, manifest.name)
        full = f"{host}/{namespace}/{model}:{manifest.name}"
        names = [full]
        if manifest.name == "latest":
            names.append(name.removesuffix(":latest"))
        try:
            layers = json.loads(manifest.read_text()).get("layers") or []
            digest = next(
                layer["digest"] for layer in layers if layer.get("mediaType") == OLLAMA_MODEL_LAYER
            )
            projector_digest = next(
                (
                    layer["digest"]
                    for layer in layers
                    if layer.get("mediaType") == OLLAMA_PROJECTOR_LAYER
                ),
                None,
            )
        except StopIteration:
            return None  # no model layer: not a language model (an embedding-less adapter...)
        except (OSError, ValueError, AttributeError, TypeError, KeyError) as exc:
            return Found(
                name, self.source, (manifest,), tuple(names), f"unreadable manifest ({exc})"
            )
        blob = self.root / "blobs" / str(digest).replace(":", "-")
        error = "" if blob.is_file() else f"missing blob {blob.name}"
        projector = None
        if projector_digest is not None:
            projector = self.root / "blobs" / str(projector_digest).replace(":", "-")
            if not projector.is_file():
                projector = None  # a pull cut short: the model still reads text
        return Found(name, self.source, (blob,), tuple(names), error, projector)


class LMStudioStore(Store):
    """LM Studio's models folder: `PUBLISHER/REPO/*.gguf`. The id is `PUBLISHER/REPO`, or
    `PUBLISHER/REPO/FILE.gguf` where the folder holds several models."""

    source = "lmstudio"

    def __init__(self, roots: list[Path]) -> None:
        self.roots = roots

    def signature(self) -> Signature:
        return dir_signature(self.roots, 2)

    def scan(self) -> list[Found]:
        found = []
        for root in self.roots:
            for publisher in _subdirs(root):
                for repo in _subdirs(publisher):
                    files = [p for p in _files(repo) if p.name.lower().endswith(".gguf")]
                    models = models_among(files)
                    projectors = projectors_among(files)
                    base = f"{publisher.name}/{repo.name}"
                    for model in models:
                        file_id = f"{base}/{model.paths[0].name}"
                        names: tuple[str, ...]
                        if len(models) == 1:
                            ident, names = base, (file_id,)
                        else:
                            ident, names = file_id, ()
                        projector = pick_projector(model.paths[0], projectors)
                        found.append(
                            Found(ident, self.source, model.paths, names, model.error, projector)
                        )
        return found


class HubStore(Store):
    """A Hugging Face hub cache (and llama.cpp's LLAMA_CACHE, the same layout):
    `models--ORG--REPO/refs/main` names the revision whose `snapshots/REV/` holds the files
    (symlinks into `blobs/`). Ids are llama.cpp -hf's: `ORG/REPO:QUANT`; `ORG/REPO` alone
    names the file -hf would pick: Q4_K_M, else Q8_0, else the first model file."""

    source = "hf"
    PICK = ("Q4_K_M", "Q8_0")

    def __init__(self, roots: list[Path]) -> None:
        self.roots = roots

    def signature(self) -> Signature:
        # The root changes when a repo is added; refs/ when a revision is fetched;
        # snapshots/REV/... when a file is. Datasets and spaces beside them are not walked.
        repos = [r for root in self.roots for r in _subdirs(root) if r.name.startswith("models--")]
        return dir_signature(self.roots, 0) + dir_signature(repos, 4)

    def scan(self) -> list[Found]:
        found = []
        for root in self.roots:
            for repo_dir in _subdirs(root):
                if repo_dir.name.startswith("models--"):
                    found += self._repo(repo_dir)
        return found

    def _repo(self, repo_dir: Path) -> list[Found]:
        repo = repo_dir.name.removeprefix("models--").replace("--", "/")
        if repo.count("/") != 1:
            return []
        rev = _revision(repo_dir / "refs")
        snapshot = repo_dir / "snapshots" / rev
        if not rev or not snapshot.is_dir():
            return []
        by_dir: dict[Path, list[Path]] = {}
        for path in _gguf_files(snapshot, 3):
            by_dir.setdefault(path.parent, []).append(path)
        projectors = {folder: projectors_among(files) for folder, files in by_dir.items()}
        models = [m for files in by_dir.values() for m in models_among(files)]
        models.sort(key=lambda m: m.paths[0].relative_to(snapshot).as_posix())
        picked = self._pick(models)
        found = []
        for model in models:
            rel = model.paths[0].relative_to(snapshot).as_posix()
            tag = quant_tag(model.paths[0].name)
            ident = f"{repo}:{tag}" if tag else f"{repo}/{rel}"
            names = [f"{repo}/{rel}"] if tag else []
            if model is picked:
                names.append(repo)
            projector = _nearest_projector(model.paths[0], snapshot, projectors)
            found.append(
                Found(ident, self.source, model.paths, tuple(names), model.error, projector)
            )
        return found

    def _pick(self, models: list[ModelFiles]) -> ModelFiles | None:
        for tag in self.PICK:
            for model in models:
                if quant_tag(model.paths[0].name) == tag:
                    return model
        return models[0] if models else None


def _nearest_projector(
    model: Path, snapshot: Path, projectors: dict[Path, list[Path]]
) -> Path | None:
    """The projector in the model's own folder of a snapshot, else in the nearest folder
    above it (within the snapshot) that holds one."""
    folder = model.parent
    while True:
        candidates = projectors.get(folder)
        if candidates:
            return pick_projector(model, candidates)
        if folder == snapshot or snapshot not in folder.parents:
            return None
        folder = folder.parent


def _revision(refs: Path) -> str:
    """The commit `refs/main` names, else the first other ref's (as llama.cpp reads it)."""
    fallback = ""
    for ref in _files(refs):
        try:
            commit = ref.read_text().strip()
        except OSError:
            continue
        if not commit or "/" in commit:
            continue
        if ref.name == "main":
            return commit
        fallback = fallback or commit
    return fallback


class LlamaFlatStore(Store):
    """llama.cpp's older -hf cache: `manifest=ORG=REPO=TAG.json` files whose `ggufFile`
    names the downloaded file, kept beside them as `ORG_REPO_FILE` (slashes as `_`), and
    whose `mmprojFile`, where there is one, names the projector kept the same way."""

    source = "hf"

    def __init__(self, root: Path) -> None:
        self.root = root

    def signature(self) -> Signature:
        return dir_signature([self.root], 0)  # its files too: a manifest rewritten in place

    def scan(self) -> list[Found]:
        found = []
        for manifest in _files(self.root):
            parts = manifest.name.removesuffix(".json").split("=")
            if len(parts) != 4 or parts[0] != "manifest" or not manifest.name.endswith(".json"):
                continue
            _, org, repo, _tag = parts
            try:
                data = json.loads(manifest.read_text())
                rfilename = str(data["ggufFile"]["rfilename"])
                mmproj = data.get("mmprojFile") or {}
                mmproj_name = str(mmproj.get("rfilename") or "") if isinstance(mmproj, dict) else ""
            except (OSError, ValueError, KeyError, TypeError, AttributeError):
                continue
            if not is_model_name(rfilename):
                continue
            path = self.root / f"{org}_{repo}_{rfilename}".replace("/", "_")
            split = split_name(path.name)
            parts_ = split_parts(path, split.count) if split.count > 1 else (path,)
            missing = [p.name for p in parts_ if not p.is_file()]
            tag = quant_tag(path.name)
            ident = f"{org}/{repo}:{tag}" if tag else f"{org}/{repo}/{rfilename}"
            error = f"missing {', '.join(missing)}" if missing else ""
            projector = None
            if mmproj_name:
                projector = self.root / f"{org}_{repo}_{mmproj_name}".replace("/", "_")
                projector = projector if projector.is_file() else None
            found.append(Found(ident, self.source, parts_, (), error, projector))
        return found


def _subdirs(path: Path) -> list[Path]:
    try:
        return sorted(
            Path(e.path) for e in os.scandir(path) if e.is_dir() and not e.name.startswith(".")
        )
    except OSError:
        return []


def _files(path: Path) -> list[Path]:
    try:
        return sorted(
            Path(e.path) for e in os.scandir(path) if e.is_file() and not e.name.startswith(".")
        )
    except OSError:
        return []


def home_stores(home: Path, environ: Mapping[str, str]) -> list[Store]:
    """The stores desktop tools fill, where this user's environment puts them."""

    def env_path(name: str) -> Path | None:
        value = environ.get(name, "")
        return Path(value).expanduser() if value else None

    ollama = env_path("OLLAMA_MODELS") or home / ".ollama" / "models"
    lmstudio = [home / ".lmstudio" / "models", home / ".cache" / "lm-studio" / "models"]
    xdg_cache = env_path("XDG_CACHE_HOME") or home / ".cache"
    hf_home = env_path("HF_HOME")
    hub = (
        env_path("HF_HUB_CACHE")
        or env_path("HUGGINGFACE_HUB_CACHE")
        or (hf_home / "hub" if hf_home else xdg_cache / "huggingface" / "hub")
    )
    # llama.cpp's -hf writes the hub layout into LLAMA_CACHE when it is set (and into the
    # hub cache otherwise); before that, flat files into LLAMA_CACHE or ~/.cache/llama.cpp.
    llama_cache = env_path("LLAMA_CACHE")
    hubs = [hub] + ([llama_cache] if llama_cache and llama_cache != hub else [])
    flat = llama_cache or xdg_cache / "llama.cpp"
    return [OllamaStore(ollama), LMStudioStore(lmstudio), HubStore(hubs), LlamaFlatStore(flat)]
