"""Each store's models under the names its tool gives them, found offline in a temporary
HOME laid out as the tools lay it out, holding the real model files."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from app.catalog import Catalog
from app.catalog import catalog as catalog_module
from app.config import Settings
from tests.models import gemma, header_model, smollm2
from tests.stores import Home

SMOLLM2_ID = "SmolLM2-135M-Instruct.Q4_1"
MakeCatalog = Callable[..., Catalog]


def ids(catalog: Catalog) -> dict[str, str]:
    return {e.id: e.source for e in catalog.entries()}


def test_with_no_store_the_embedded_default_is_the_one_model(make_catalog: MakeCatalog) -> None:
    catalog = make_catalog()
    [entry] = catalog.entries()
    assert (entry.id, entry.source, entry.is_default) == (SMOLLM2_ID, "default", True)
    assert entry.path == smollm2()
    assert (entry.quantization, entry.architecture, entry.context_length) == ("Q4_1", "llama", 8192)
    assert entry.size_bytes == smollm2().stat().st_size
    assert catalog.default() is catalog.route("no-such-model") is catalog.route(None)
    assert catalog.resolve("no-such-model") is None
    assert catalog.resolve(f"{SMOLLM2_ID}.gguf") == entry


def test_models_dir_files_subfolders_split_models_and_projectors(
    make_catalog: MakeCatalog, data_dir: Path
) -> None:
    models = data_dir / "models"
    models.mkdir(parents=True)
    os.link(gemma(), models / "gemma-3-270m-q4_k_m.gguf")
    header_model(models / "mmproj-gemma-f16.gguf", arch="clip", general_type="mmproj")
    header_model(models / "vision-proj.gguf", arch="clip")  # a projector by its header alone
    parts = header_model(models / "big-Q8_0.gguf", split_max_tensors=2)
    (models / "qwen").mkdir()
    header_model(models / "qwen" / "qwen-tiny-Q4_K_M.gguf")
    header_model(models / "qwen" / "mmproj-qwen.gguf", general_type="mmproj")
    (models / "pair").mkdir()
    header_model(models / "pair" / "a-Q4_0.gguf")
    header_model(models / "pair" / "b-Q4_0.gguf")

    catalog = make_catalog()

    assert ids(catalog) == {
        SMOLLM2_ID: "default",
        "big-Q8_0": "models-dir",
        "gemma-3-270m-q4_k_m": "models-dir",
        "pair/a-Q4_0": "models-dir",
        "pair/b-Q4_0": "models-dir",
        "qwen": "models-dir",
    }
    big = catalog.get("big-Q8_0")
    assert big is not None and len(parts) == 3
    assert big.path == parts[0] and big.paths == tuple(parts)
    assert big.size_bytes == sum(p.stat().st_size for p in parts)
    assert catalog.resolve("qwen/qwen-tiny-Q4_K_M") == catalog.get("qwen")
    g = catalog.get("gemma-3-270m-q4_k_m")
    assert g is not None
    assert (g.quantization, g.architecture, g.context_length) == ("Q4_K_M", "gemma3", 32768)


def test_a_split_model_missing_a_part_is_listed_with_what_is_missing(
    make_catalog: MakeCatalog, data_dir: Path
) -> None:
    parts = header_model(data_dir / "models" / "big.gguf", split_max_tensors=2)
    parts[1].unlink()
    entry = make_catalog().get("big")
    assert entry is not None and entry.facts is None and entry.estimate is None
    assert entry.error == "missing part big-00002-of-00003.gguf"


def test_a_corrupt_file_is_listed_with_its_error_and_never_raises(
    make_catalog: MakeCatalog, data_dir: Path
) -> None:
    models = data_dir / "models"
    models.mkdir(parents=True)
    (models / "notes-Q8_0.gguf").write_bytes(b"not a gguf file at all")
    head = smollm2().read_bytes()[:4096]  # a real header, cut short
    (models / "cut.gguf").write_bytes(head)
    (models / "empty.gguf").write_bytes(b"")
    catalog = make_catalog()
    by_id = {e.id: e for e in catalog.entries()}
    notes, cut, empty = by_id["notes-Q8_0"], by_id["cut"], by_id["empty"]
    assert notes.error == "not a GGUF file (it does not start with GGUF)"
    assert notes.quantization == "Q8_0"  # what its name says
    assert cut.error.startswith("unreadable GGUF header")
    assert empty.error == "not a GGUF file (it does not start with GGUF)"
    assert all(e.facts is None and e.estimate is None for e in (notes, cut, empty))
    assert cut.size_bytes == 4096


def test_ollama_names_as_ollama_list_prints_them(make_catalog: MakeCatalog, home: Home) -> None:
    home.ollama("gemma3:270m", gemma())
    home.ollama("smollm2", smollm2())  # no tag: latest
    home.ollama("someone/tiny:q4", smollm2())
    home.ollama("hf.co/unsloth/gemma-3-270m-it-GGUF:Q4_K_M", gemma(), projector=smollm2())

    catalog = make_catalog()

    assert ids(catalog) == {
        SMOLLM2_ID: "default",
        "gemma3:270m": "ollama",
        "hf.co/unsloth/gemma-3-270m-it-GGUF:Q4_K_M": "ollama",
        "smollm2:latest": "ollama",
        "someone/tiny:q4": "ollama",
    }
    latest = catalog.get("smollm2:latest")
    assert latest is not None
    assert catalog.resolve("smollm2") == latest  # `:latest` is optional
    assert catalog.resolve("registry.ollama.ai/library/smollm2:latest") == latest
    assert catalog.resolve("Gemma3:270M") == catalog.get("gemma3:270m")  # as ollama: any case
    g = catalog.get("gemma3:270m")
    assert g is not None and g.path.parent.name == "blobs" and g.path.name.startswith("sha256-")
    assert g.path.samefile(gemma()) and g.architecture == "gemma3"
    # The hf.co model's projector layer is no model of its own.
    assert len([e for e in catalog.entries() if e.source == "ollama"]) == 4


def test_an_ollama_manifest_without_its_blob_is_listed_with_the_blob_missing(
    make_catalog: MakeCatalog, home: Home
) -> None:
    home.ollama("gemma3:270m", gemma())
    for blob in (home.ollama_root / "blobs").iterdir():
        blob.unlink()
    entry = make_catalog().get("gemma3:270m")
    assert entry is not None and entry.error.startswith("missing blob sha256-")


def test_ollama_models_env_and_no_discover(
    make_catalog: MakeCatalog, home: Home, tmp_path: Path
) -> None:
    home.environ["OLLAMA_MODELS"] = str(tmp_path / "elsewhere")
    home.ollama("gemma3:270m", gemma())
    assert "gemma3:270m" in ids(make_catalog())
    assert ids(make_catalog(no_discover=True)) == {SMOLLM2_ID: "default"}


def test_a_model_added_to_a_store_shows_up_without_a_restart(
    make_catalog: MakeCatalog, home: Home, data_dir: Path
) -> None:
    catalog = make_catalog()
    assert catalog.resolve("gemma3:270m") is None
    home.ollama("gemma3:270m", gemma())
    (data_dir / "models").mkdir(parents=True)
    header_model(data_dir / "models" / "tiny.gguf")
    assert catalog.resolve("gemma3:270m") is not None
    assert catalog.resolve("tiny") is not None
    (data_dir / "models" / "tiny.gguf").unlink()
    assert catalog.resolve("tiny") is None


def test_stores_are_looked_at_no_more_than_every_two_seconds(
    home: Home, data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = [1000.0]
    monkeypatch.setattr(catalog_module.time, "monotonic", lambda: clock[0])
    settings = Settings.load({"data_dir": str(data_dir)}, environ={})
    catalog = Catalog(settings, home=home.root, environ=home.environ)
    home.ollama("gemma3:270m", gemma())
    clock[0] += 1.0
    assert catalog.resolve("gemma3:270m") is None  # looked at 1 s ago
    clock[0] += catalog_module.RECHECK_SECONDS
    assert catalog.resolve("gemma3:270m") is not None


def test_model_flag_and_default_model(
    make_catalog: MakeCatalog, home: Home, tmp_path: Path
) -> None:
    home.ollama("gemma3:270m", gemma())
    mine = tmp_path / "mine.gguf"
    shutil.copyfile(smollm2(), mine)
    catalog = make_catalog(model=str(mine))
    assert [e.id for e in catalog.entries()][:2] == ["mine", SMOLLM2_ID]
    assert catalog.default().id == "mine" and catalog.default().source == "model"

    catalog = make_catalog(model=str(mine), default_model="Gemma3:270m")
    assert catalog.entries()[0].id == "gemma3:270m"  # the default is listed first
    assert catalog.default().is_default and catalog.route("nothing-known").id == "gemma3:270m"
    assert [e.id for e in catalog.entries() if e.is_default] == ["gemma3:270m"]


def test_an_unknown_default_model_is_a_start_up_error_naming_the_models(
    make_catalog: MakeCatalog, home: Home
) -> None:
    home.ollama("gemma3:270m", gemma())
    with pytest.raises(ValueError) as err:
        make_catalog(default_model="llama3")
    assert str(err.value) == (
        "--default-model 'llama3' names no model this server has; the models are: "
        f"{SMOLLM2_ID}, gemma3:270m"
    )


def test_one_file_found_twice_is_one_entry(make_catalog: MakeCatalog, data_dir: Path) -> None:
    (data_dir / "models").mkdir(parents=True)
    link = data_dir / "models" / "tiny.gguf"
    link.symlink_to(smollm2())
    catalog = make_catalog(model=str(link))
    [entry] = catalog.entries()
    assert entry.id == "tiny" and entry.source == "model"
    assert catalog.resolve(SMOLLM2_ID) == entry  # the embedded default's name joins it


def test_listing_reads_each_header_once(make_catalog: MakeCatalog, home: Home) -> None:
    home.ollama("gemma3:270m", gemma())
    make_catalog()
    start = time.perf_counter()
    make_catalog().entries()
    assert time.perf_counter() - start < 1.0  # cached facts: no header read again
