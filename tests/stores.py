"""Model stores laid out in a temporary HOME as the tools that fill them lay them out,
holding real model files (tests/models.py): where a tool keeps a real file (an Ollama blob,
a hub blob, an LM Studio download) the file is a hard link to the model, so nothing is
copied; where a tool keeps a symlink (a hub snapshot's entry), it is one.

    home = Home(tmp_path)
    home.ollama("gemma3:270m", gemma())
    home.lmstudio("lmstudio-community/gemma-3-270m-it-GGUF", gemma())
    home.hub("unsloth/gemma-3-270m-it-GGUF", {"gemma-3-270m-it-Q4_K_M.gguf": gemma()})
    home.catalog(data_dir)  # Catalog(settings, home=home.root, environ=home.environ)
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from pathlib import Path
from typing import Any

from app.catalog import Catalog
from app.config import Settings

OLLAMA_MODEL = "application/vnd.ollama.image.model"


@functools.lru_cache(maxsize=64)
def _sha256(path: str, size: int, mtime_ns: int) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


def sha256(path: Path) -> str:
    """The file's sha256, as Ollama and the hub name blobs (once per file per process)."""
    st = path.stat()
    return _sha256(str(path), st.st_size, st.st_mtime_ns)


def place(source: Path, target: Path) -> Path:
    """`source` at `target` as a real file: a hard link (a copy across file systems)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.exists():
        target.unlink()
    try:
        os.link(source.resolve(), target)
    except OSError:
        import shutil

        shutil.copyfile(source, target)
    return target


class Home:
    """A HOME with no stores until a method lays one out; `environ` is its environment
    (HOME only, so no variable of the machine's leaks in)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.root.mkdir(parents=True, exist_ok=True)
        self.environ: dict[str, str] = {"HOME": str(root)}

    def catalog(self, data_dir: Path, **flags: Any) -> Catalog:
        """Catalog(Settings(data_dir=..., **flags)) over this HOME's stores; no variable of
        the machine's reaches the settings either."""
        settings = Settings.load({"data_dir": str(data_dir), **flags}, environ={})
        return Catalog(settings, home=self.root, environ=self.environ)

    # -- Ollama ------------------------------------------------------------------------

    @property
    def ollama_root(self) -> Path:
        return Path(self.environ.get("OLLAMA_MODELS") or self.root / ".ollama" / "models")

    def ollama(
        self,
        name: str,
        model: Path,
        *,
        projector: Path | None = None,
        layers: list[dict[str, object]] | None = None,
    ) -> Path:
        """`ollama pull NAME` of `model`: its blob, a config blob and the manifest at
        manifests/HOST/NAMESPACE/MODEL/TAG. NAME as `ollama` takes it: `gemma3:270m`,
        `user/model:tag`, `hf.co/ORG/REPO:Q4_K_M`; no tag means `latest`."""
        host, namespace, repo, tag = ollama_parts(name)
        blobs = self.ollama_root / "blobs"
        digest = sha256(model)
        place(model, blobs / f"sha256-{digest}")
        config = json.dumps({"model_format": "gguf", "model_type": "", "file_type": ""}).encode()
        config_digest = hashlib.sha256(config).hexdigest()
        blobs.mkdir(parents=True, exist_ok=True)
        (blobs / f"sha256-{config_digest}").write_bytes(config)
        entries: list[dict[str, object]] = [
            {"mediaType": OLLAMA_MODEL, "digest": f"sha256:{digest}", "size": model.stat().st_size}
        ]
        if projector is not None:
            proj_digest = sha256(projector)
            place(projector, blobs / f"sha256-{proj_digest}")
            entries.append(
                {
                    "mediaType": "application/vnd.ollama.image.projector",
                    "digest": f"sha256:{proj_digest}",
                    "size": projector.stat().st_size,
                }
            )
        manifest = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
            "config": {
                "mediaType": "application/vnd.docker.container.image.v1+json",
                "digest": f"sha256:{config_digest}",
                "size": len(config),
            },
            "layers": layers if layers is not None else entries,
        }
        path = self.ollama_root / "manifests" / host / namespace / repo / tag
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(manifest))
        return path

    # -- LM Studio ---------------------------------------------------------------------

    def lmstudio(self, repo: str, *files: Path, legacy: bool = False) -> Path:
        """LM Studio's download of `files` into models/PUBLISHER/REPO/ (`legacy`: the older
        ~/.cache/lm-studio/models)."""
        base = self.root / (".cache/lm-studio/models" if legacy else ".lmstudio/models")
        folder = base / repo
        for f in files:
            place(f, folder / f.name)
        return folder

    # -- the Hugging Face hub cache (and llama.cpp's, the same layout) -----------------

    @property
    def hub_root(self) -> Path:
        if "HF_HUB_CACHE" in self.environ:
            return Path(self.environ["HF_HUB_CACHE"])
        if "HF_HOME" in self.environ:
            return Path(self.environ["HF_HOME"]) / "hub"
        return self.root / ".cache" / "huggingface" / "hub"

    def hub(
        self,
        repo: str,
        files: dict[str, Path],
        *,
        revision: str = "0123456789abcdef0123456789abcdef01234567",
        root: Path | None = None,
    ) -> Path:
        """`hf download REPO FILES` (or llama.cpp's -hf): each file a blob named by its
        sha256 under models--ORG--REPO/blobs/, snapshots/REV/FILE a relative symlink to it,
        refs/main naming REV."""
        repo_dir = (root or self.hub_root) / ("models--" + repo.replace("/", "--"))
        snapshot = repo_dir / "snapshots" / revision
        for rel, source in files.items():
            blob = place(source, repo_dir / "blobs" / sha256(source))
            link = snapshot / rel
            link.parent.mkdir(parents=True, exist_ok=True)
            if link.is_symlink() or link.exists():
                link.unlink()
            link.symlink_to(os.path.relpath(blob, link.parent))
        (repo_dir / "refs").mkdir(parents=True, exist_ok=True)
        (repo_dir / "refs" / "main").write_text(revision)
        return snapshot

    def llama_flat(self, repo: str, tag: str, file: str, model: Path, *, root: Path) -> Path:
        """llama.cpp's older -hf cache: manifest=ORG=REPO=TAG.json and ORG_REPO_FILE."""
        org, name = repo.split("/")
        root.mkdir(parents=True, exist_ok=True)
        manifest = {"ggufFile": {"rfilename": file, "size": model.stat().st_size}}
        (root / f"manifest={org}={name}={tag}.json").write_text(json.dumps(manifest))
        return place(model, root / f"{org}_{name}_{file}".replace("/", "_"))


def ollama_parts(name: str) -> tuple[str, str, str, str]:
    """HOST, NAMESPACE, MODEL, TAG of an Ollama name, its defaults filled in."""
    base, _, tag = name.partition(":")
    parts = base.split("/")
    if len(parts) == 1:
        parts = ["registry.ollama.ai", "library", *parts]
    elif len(parts) == 2:
        parts = ["registry.ollama.ai", *parts]
    host, namespace, model = parts
    return host, namespace, model, tag or "latest"
