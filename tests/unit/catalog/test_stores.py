"""Each store's models under the names its tool gives them, found offline in a temporary
HOME laid out as the tools lay it out, holding the real model files."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from app.catalog import Catalog, header
from app.catalog import catalog as catalog_module
from tests.models import gemma, header_model, header_projector, smollm2
from tests.stores import Home, sha256

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
    assert catalog.default() is catalog.entry_for("no-such-model") is catalog.entry_for(None)
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


def test_ollama_names_as_ollama_list_prints_them(
    make_catalog: MakeCatalog, home: Home, tmp_path: Path
) -> None:
    home.ollama("gemma3:270m", gemma())
    home.ollama("smollm2", smollm2())  # no tag: latest
    home.ollama("someone/tiny:q4", smollm2())
    projector = header_projector(tmp_path / "proj.gguf")
    home.ollama("hf.co/unsloth/gemma-3-270m-it-GGUF:Q4_K_M", gemma(), projector=projector)

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
    header_model(data_dir / "models" / "tiny.gguf", context_length=1234)  # rewritten in place
    assert catalog.entry_for("tiny").context_length == 1234
    (data_dir / "models" / "tiny.gguf").unlink()
    assert catalog.resolve("tiny") is None


def test_stores_are_looked_at_no_more_than_every_two_seconds(
    home: Home, data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = [1000.0]
    monkeypatch.setattr(catalog_module, "clock", lambda: clock[0])
    catalog = home.catalog(data_dir)
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
    assert catalog.default().is_default and catalog.entry_for("nothing-known").id == "gemma3:270m"
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


def test_listing_reads_each_header_once(
    make_catalog: MakeCatalog, home: Home, monkeypatch: pytest.MonkeyPatch
) -> None:
    home.ollama("gemma3:270m", gemma())
    home.lmstudio("lmstudio-community/gemma-3-270m-it-GGUF", gemma())  # the same file, linked
    reads: list[Path] = []
    monkeypatch.setattr(catalog_module, "FACTS", header.FactsCache())
    real = header.read_facts

    def counted(paths: list[Path]) -> object:
        reads.append(paths[0])
        return real(paths)

    monkeypatch.setattr(header, "read_facts", counted)
    make_catalog().entries()
    make_catalog().entries()
    assert sorted(p.name for p in reads) == sorted(
        ["SmolLM2-135M-Instruct.Q4_1.gguf", "sha256-" + sha256(gemma())]
    )


def test_lm_studio_ids_are_publisher_repo_or_the_file_where_a_folder_holds_several(
    make_catalog: MakeCatalog, home: Home, tmp_path: Path
) -> None:
    home.lmstudio("lmstudio-community/gemma-3-270m-it-GGUF", gemma())
    other = header_model(tmp_path / "src" / "SmolLM2-135M-Instruct-Q8_0.gguf")
    home.lmstudio("bartowski/SmolLM2-GGUF", smollm2(), *other)
    projector = header_model(tmp_path / "src" / "mmproj-model-f16.gguf", arch="clip")
    home.lmstudio("ggml-org/tiny-vision-GGUF", *header_model(tmp_path / "v" / "tiny-Q4_0.gguf"))
    home.lmstudio("ggml-org/tiny-vision-GGUF", *projector)
    home.lmstudio("old/layout-GGUF", *header_model(tmp_path / "o" / "old-Q4_0.gguf"), legacy=True)

    catalog = make_catalog()

    assert ids(catalog) == {
        SMOLLM2_ID: "default",
        "bartowski/SmolLM2-GGUF/SmolLM2-135M-Instruct-Q8_0.gguf": "lmstudio",
        "bartowski/SmolLM2-GGUF/SmolLM2-135M-Instruct.Q4_1.gguf": "lmstudio",
        "ggml-org/tiny-vision-GGUF": "lmstudio",  # the projector beside it is no model
        "lmstudio-community/gemma-3-270m-it-GGUF": "lmstudio",
        "old/layout-GGUF": "lmstudio",
    }
    gemma_entry = catalog.get("lmstudio-community/gemma-3-270m-it-GGUF")
    assert gemma_entry is not None and gemma_entry.path.samefile(gemma())
    by_file = "lmstudio-community/gemma-3-270m-it-GGUF/gemma-3-270m-q4_k_m.gguf"
    assert catalog.resolve(by_file) == gemma_entry


def test_hub_cache_ids_as_llama_cpp_hf_names_them(
    make_catalog: MakeCatalog, home: Home, tmp_path: Path
) -> None:
    q8 = header_model(tmp_path / "src" / "g-q8.gguf")[0]
    projector = header_model(tmp_path / "src" / "mm.gguf", general_type="mmproj")[0]
    snapshot = home.hub(
        "unsloth/gemma-3-270m-it-GGUF",
        {
            "gemma-3-270m-it-Q8_0.gguf": q8,
            "gemma-3-270m-it-Q4_K_M.gguf": gemma(),
            "mmproj-F16.gguf": projector,
        },
    )
    split = header_model(tmp_path / "src" / "Big-Q6_K.gguf", split_max_tensors=2)
    home.hub(
        "bartowski/Big-GGUF",
        {f"Big-Q6_K/{p.name}": p for p in split} | {"Big-Q8_0.gguf": q8},
    )
    # A name with no tag at its end: the file names it. (llama.cpp reads a tag after the
    # last - or ., so "smollm2-135m-instruct.gguf" would be ...:INSTRUCT, as it lists it.)
    home.hub("HuggingFaceTB/SmolLM2-135M-Instruct-GGUF", {"model.gguf": smollm2()})
    # A repo of safetensors (no GGUF) is no model of the catalog's.
    (home.hub_root / "models--google--gemma-3-270m" / "snapshots").mkdir(parents=True)

    catalog = make_catalog()

    assert ids(catalog) == {
        SMOLLM2_ID: "default",
        "HuggingFaceTB/SmolLM2-135M-Instruct-GGUF/model.gguf": "hf",
        "bartowski/Big-GGUF:Q6_K": "hf",
        "bartowski/Big-GGUF:Q8_0": "hf",
        "unsloth/gemma-3-270m-it-GGUF:Q4_K_M": "hf",
        "unsloth/gemma-3-270m-it-GGUF:Q8_0": "hf",
    }
    q4 = catalog.get("unsloth/gemma-3-270m-it-GGUF:Q4_K_M")
    assert q4 is not None and q4.path == snapshot / "gemma-3-270m-it-Q4_K_M.gguf"
    assert q4.path.is_symlink() and q4.path.samefile(gemma())
    # ORG/REPO alone: Q4_K_M, else Q8_0, else the only (first) file, as -hf picks.
    assert catalog.resolve("unsloth/gemma-3-270m-it-GGUF") == q4
    assert catalog.resolve("unsloth/gemma-3-270m-it-gguf:q4_k_m") == q4
    assert catalog.resolve("bartowski/Big-GGUF") == catalog.get("bartowski/Big-GGUF:Q8_0")
    smol = catalog.get("HuggingFaceTB/SmolLM2-135M-Instruct-GGUF/model.gguf")
    assert catalog.resolve("HuggingFaceTB/SmolLM2-135M-Instruct-GGUF") == smol
    big = catalog.get("bartowski/Big-GGUF:Q6_K")
    assert big is not None and len(big.paths) == 3
    assert big.size_bytes == sum(p.stat().st_size for p in split)


def test_a_hub_repo_follows_refs_main_to_its_snapshot(
    make_catalog: MakeCatalog, home: Home, tmp_path: Path
) -> None:
    old = header_model(tmp_path / "src" / "old.gguf", context_length=1024)[0]
    new = header_model(tmp_path / "src" / "new.gguf", context_length=2048)[0]
    repo = "someone/tiny-GGUF"
    home.hub(repo, {"tiny-Q4_K_M.gguf": old}, revision="a" * 40)
    catalog = make_catalog()
    assert catalog.entry_for(repo).context_length == 1024
    home.hub(repo, {"tiny-Q4_K_M.gguf": new}, revision="b" * 40)  # refs/main moves on
    assert catalog.entry_for(repo).context_length == 2048


def test_hub_cache_from_hf_hub_cache_hf_home_and_llama_cache(
    make_catalog: MakeCatalog, home: Home, tmp_path: Path
) -> None:
    home.environ["HF_HOME"] = str(tmp_path / "hf-home")
    home.hub("a/one-GGUF", {"one-Q4_K_M.gguf": smollm2()})
    assert "a/one-GGUF:Q4_K_M" in ids(make_catalog())
    home.environ["HF_HUB_CACHE"] = str(tmp_path / "hub")  # wins over HF_HOME
    home.hub("b/two-GGUF", {"two-Q4_K_M.gguf": smollm2()})
    assert {"a/one-GGUF:Q4_K_M", "b/two-GGUF:Q4_K_M"} & set(ids(make_catalog())) == {
        "b/two-GGUF:Q4_K_M"
    }
    # llama.cpp's own cache: the hub layout in LLAMA_CACHE, and its older flat files.
    llama_cache = tmp_path / "llama-cache"
    home.environ["LLAMA_CACHE"] = str(llama_cache)
    home.hub("c/three-GGUF", {"three-Q8_0.gguf": smollm2()}, root=llama_cache)
    home.llama_flat("d/four-GGUF", "Q4_1", "four.Q4_1.gguf", smollm2(), root=llama_cache)
    found = ids(make_catalog())
    assert {k: v for k, v in found.items() if v == "hf"} == {
        "b/two-GGUF:Q4_K_M": "hf",
        "c/three-GGUF:Q8_0": "hf",
        "d/four-GGUF:Q4_1": "hf",
    }
    # Without LLAMA_CACHE, llama.cpp's older files sit in ~/.cache/llama.cpp.
    del home.environ["LLAMA_CACHE"]
    home.llama_flat(
        "e/five-GGUF", "Q4_1", "five.Q4_1.gguf", smollm2(), root=home.root / ".cache/llama.cpp"
    )
    assert "e/five-GGUF:Q4_1" in ids(make_catalog())


def test_an_id_two_stores_give_goes_to_the_first_and_the_other_is_prefixed(
    make_catalog: MakeCatalog, home: Home, tmp_path: Path
) -> None:
    home.hub("a/one-GGUF", {"one-Q4_K_M.gguf": smollm2()})
    home.llama_flat(
        "a/one-GGUF", "Q4_K_M", "one-Q4_K_M.gguf", gemma(), root=home.root / ".cache/llama.cpp"
    )
    catalog = make_catalog()
    assert {k: v for k, v in ids(catalog).items() if v == "hf"} == {
        "a/one-GGUF:Q4_K_M": "hf",
        "hf:a/one-GGUF:Q4_K_M": "hf",
    }
    assert catalog.entry_for("a/one-GGUF:Q4_K_M").architecture == "llama"  # the hub cache's
    assert catalog.entry_for("hf:a/one-GGUF:Q4_K_M").architecture == "gemma3"
