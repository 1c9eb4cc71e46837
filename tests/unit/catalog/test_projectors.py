"""Each model's multimodal projector, found where its tool keeps it (Ollama's projector
layer, LM Studio's and the hub cache's `mmproj*.gguf` beside the model, a models dir's
subfolder, llama.cpp's flat cache, models.toml's `mmproj`), never listed as a model of its
own, and counted in the model's memory estimate."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import msgspec
import pytest

from app.catalog import Catalog, Entry
from app.catalog.estimate import DEFAULT_PATCHES, IMAGE_CACHE_BYTES, MAX_PATCHES, projector_bytes
from app.catalog.header import read_projector
from app.catalog.naming import pick_projector
from app.engine.registry import catalog_card
from app.wire.inference import CatalogModel
from tests.models import gemma, header_model, header_projector, smollm2
from tests.stores import Home

SMOLLM2_ID = "SmolLM2-135M-Instruct.Q4_1"
MakeCatalog = Callable[..., Catalog]


def by_id(catalog: Catalog) -> dict[str, Entry]:
    return {e.id: e for e in catalog.entries()}


def seen(entry: Entry | None) -> str | None:
    """The name of the projector file an entry has (None: it reads text only)."""
    assert entry is not None
    return entry.projector.name if entry.projector else None


def test_ollama_takes_the_projector_layers_blob(
    make_catalog: MakeCatalog, home: Home, tmp_path: Path
) -> None:
    projector = header_projector(tmp_path / "src" / "proj.gguf")
    home.ollama("gemma3:4b", gemma(), projector=projector)
    home.ollama("smollm2", smollm2())

    catalog = make_catalog()

    assert sorted(e.id for e in catalog.entries() if e.source == "ollama") == [
        "gemma3:4b",
        "smollm2:latest",
    ]  # the projector's blob is no model of its own
    g = catalog.get("gemma3:4b")
    assert g is not None and g.projector is not None and g.takes_images
    assert g.projector.parent.name == "blobs" and g.projector.name.startswith("sha256-")
    assert g.projector.samefile(projector)
    assert g.projector_facts is not None and g.projector_facts.projector_type == "gemma3"
    assert seen(catalog.get("smollm2:latest")) is None


def test_an_ollama_projector_blob_missing_leaves_a_model_that_reads_text(
    make_catalog: MakeCatalog, home: Home, tmp_path: Path
) -> None:
    projector = header_projector(tmp_path / "src" / "proj.gguf")
    home.ollama("gemma3:4b", gemma(), projector=projector)
    for blob in (home.ollama_root / "blobs").iterdir():
        if blob.samefile(projector):
            blob.unlink()
    g = make_catalog().get("gemma3:4b")
    assert g is not None and g.error == "" and g.projector is None


def test_lm_studio_takes_the_mmproj_beside_the_model(
    make_catalog: MakeCatalog, home: Home, tmp_path: Path
) -> None:
    src = tmp_path / "src"
    model = header_model(src / "gemma-3-4b-it-Q4_K_M.gguf")
    home.lmstudio(
        "lmstudio-community/gemma-3-4b-it-GGUF",
        *model,
        header_projector(src / "mmproj-model-f16.gguf"),
    )
    # One folder, two quantizations and two projectors: each model the projector of its own
    # quantization, else the f16 one.
    q8, q4 = src / "qwen" / "Qwen2.5-VL-3B-Instruct-Q8_0.gguf", src / "qwen" / "q4"
    home.lmstudio(
        "unsloth/Qwen2.5-VL-3B-Instruct-GGUF",
        *header_model(q8),
        *header_model(q4 / "Qwen2.5-VL-3B-Instruct-Q4_K_M.gguf"),
        header_projector(src / "qwen" / "mmproj-F16.gguf"),
        header_projector(src / "qwen" / "mmproj-Q8_0.gguf"),
    )
    home.lmstudio("bartowski/SmolLM2-GGUF", smollm2())

    entries = by_id(make_catalog())

    assert sorted(i for i, e in entries.items() if e.source == "lmstudio") == [
        "bartowski/SmolLM2-GGUF",
        "lmstudio-community/gemma-3-4b-it-GGUF",
        "unsloth/Qwen2.5-VL-3B-Instruct-GGUF/Qwen2.5-VL-3B-Instruct-Q4_K_M.gguf",
        "unsloth/Qwen2.5-VL-3B-Instruct-GGUF/Qwen2.5-VL-3B-Instruct-Q8_0.gguf",
    ]
    g = entries["lmstudio-community/gemma-3-4b-it-GGUF"]
    assert g.projector == home.root / ".lmstudio/models/lmstudio-community/gemma-3-4b-it-GGUF" / (
        "mmproj-model-f16.gguf"
    )
    qwen = "unsloth/Qwen2.5-VL-3B-Instruct-GGUF/Qwen2.5-VL-3B-Instruct-"
    assert seen(entries[qwen + "Q8_0.gguf"]) == "mmproj-Q8_0.gguf"
    assert seen(entries[qwen + "Q4_K_M.gguf"]) == "mmproj-F16.gguf"
    assert seen(entries["bartowski/SmolLM2-GGUF"]) is None


def test_the_hub_cache_takes_the_mmproj_in_the_snapshot(
    make_catalog: MakeCatalog, home: Home, tmp_path: Path
) -> None:
    src = tmp_path / "src"
    q8 = header_model(src / "q8.gguf")[0]
    projector = header_projector(src / "mm.gguf")
    snapshot = home.hub(
        "ggml-org/gemma-3-4b-it-GGUF",
        {
            "gemma-3-4b-it-Q4_K_M.gguf": gemma(),
            "gemma-3-4b-it-Q8_0.gguf": q8,
            "mmproj-model-f16.gguf": projector,
        },
    )
    # A split model in a subfolder: the projector at the snapshot's root is the nearest.
    split = header_model(src / "Big-Q6_K.gguf", split_max_tensors=2)
    home.hub(
        "bartowski/Big-VL-GGUF",
        {f"Big-Q6_K/{p.name}": p for p in split}
        | {"mmproj-Big-VL-f16.gguf": header_projector(src / "big-mm.gguf", n_embd=32)},
    )
    home.hub("HuggingFaceTB/SmolLM2-135M-Instruct-GGUF", {"model.gguf": smollm2()})

    entries = by_id(make_catalog())

    assert sorted(i for i, e in entries.items() if e.source == "hf") == [
        "HuggingFaceTB/SmolLM2-135M-Instruct-GGUF/model.gguf",
        "bartowski/Big-VL-GGUF:Q6_K",
        "ggml-org/gemma-3-4b-it-GGUF:Q4_K_M",
        "ggml-org/gemma-3-4b-it-GGUF:Q8_0",
    ]
    q4 = entries["ggml-org/gemma-3-4b-it-GGUF:Q4_K_M"]
    assert q4.projector == snapshot / "mmproj-model-f16.gguf"
    assert q4.projector.is_symlink() and q4.projector.samefile(projector)
    assert seen(entries["ggml-org/gemma-3-4b-it-GGUF:Q8_0"]) == "mmproj-model-f16.gguf"
    assert seen(entries["bartowski/Big-VL-GGUF:Q6_K"]) == "mmproj-Big-VL-f16.gguf"
    assert seen(entries["HuggingFaceTB/SmolLM2-135M-Instruct-GGUF/model.gguf"]) is None


def test_llama_cpps_caches_the_hub_layout_and_the_flat_files(
    make_catalog: MakeCatalog, home: Home, tmp_path: Path
) -> None:
    cache = tmp_path / "llama-cache"
    home.environ["LLAMA_CACHE"] = str(cache)
    src = tmp_path / "src"
    home.hub(
        "ggml-org/SmolVLM-256M-Instruct-GGUF",
        {
            "SmolVLM-256M-Instruct-Q8_0.gguf": header_model(src / "smolvlm.gguf")[0],
            "mmproj-SmolVLM-256M-Instruct-Q8_0.gguf": header_projector(
                src / "smolvlm-mm.gguf", projector_type="idefics3", image_size=512, patch_size=16
            ),
        },
        root=cache,
    )
    home.llama_flat("a/flat-GGUF", "Q4_1", "flat.Q4_1.gguf", smollm2(), root=cache)
    manifest = cache / "manifest=a=flat-GGUF=Q4_1.json"
    text = manifest.read_text().replace(
        "}}", '}, "mmprojFile": {"rfilename": "mmproj-flat-f16.gguf"}}'
    )
    manifest.write_text(text)
    header_projector(cache / "a_flat-GGUF_mmproj-flat-f16.gguf")

    entries = by_id(make_catalog())

    assert sorted(i for i, e in entries.items() if e.source == "hf") == [
        "a/flat-GGUF:Q4_1",
        "ggml-org/SmolVLM-256M-Instruct-GGUF:Q8_0",
    ]
    smolvlm = entries["ggml-org/SmolVLM-256M-Instruct-GGUF:Q8_0"]
    assert seen(smolvlm) == "mmproj-SmolVLM-256M-Instruct-Q8_0.gguf"
    assert smolvlm.projector_facts is not None
    assert smolvlm.projector_facts.projector_type == "idefics3"
    assert entries["a/flat-GGUF:Q4_1"].projector == cache / "a_flat-GGUF_mmproj-flat-f16.gguf"


def test_models_dir_subfolders_and_the_top_level(make_catalog: MakeCatalog, data_dir: Path) -> None:
    models = data_dir / "models"
    header_model(models / "gemma-3-4b-it-Q4_K_M.gguf")
    header_projector(models / "mmproj-gemma-3-4b-it-f16.gguf")
    header_model(models / "llama-3.2-1b-Q4_K_M.gguf")  # unrelated: no projector of its own
    header_model(models / "smolvlm" / "SmolVLM-Q8_0.gguf")
    header_projector(models / "smolvlm" / "mmproj.gguf")
    header_model(models / "text" / "tiny.gguf")

    entries = by_id(make_catalog())

    assert sorted(i for i, e in entries.items() if e.source == "models-dir") == [
        "gemma-3-4b-it-Q4_K_M",
        "llama-3.2-1b-Q4_K_M",
        "smolvlm",
        "text",
    ]
    assert seen(entries["gemma-3-4b-it-Q4_K_M"]) == "mmproj-gemma-3-4b-it-f16.gguf"
    assert entries["smolvlm"].projector == models / "smolvlm" / "mmproj.gguf"
    assert seen(entries["llama-3.2-1b-Q4_K_M"]) is None
    assert seen(entries["text"]) is None


def test_a_file_named_mmproj_that_is_no_projector_is_not_used(
    make_catalog: MakeCatalog, data_dir: Path
) -> None:
    models = data_dir / "models" / "odd"
    header_model(models / "odd-Q4_0.gguf")
    header_model(models / "mmproj-odd.gguf")  # a language model's header, misnamed
    entries = by_id(make_catalog())
    assert seen(entries["odd"]) is None
    assert "odd/mmproj-odd" not in entries


def test_models_toml_mmproj_wins_and_false_takes_it_away(
    make_catalog: MakeCatalog, home: Home, data_dir: Path, tmp_path: Path
) -> None:
    home.ollama("gemma3:4b", gemma(), projector=header_projector(tmp_path / "src" / "p.gguf"))
    home.ollama("smollm2", smollm2())
    header_projector(data_dir / "projectors" / "mine.gguf", n_embd=128)
    (data_dir / "models.toml").write_text(
        '["smollm2"]\nmmproj = "projectors/mine.gguf"\n\n["gemma3:4b"]\nmmproj = false\n'
    )

    entries = by_id(make_catalog())

    smol = entries["smollm2:latest"]
    assert smol.projector == data_dir / "projectors" / "mine.gguf"
    assert smol.estimate is not None and smol.projector_facts is not None
    assert smol.estimate.projector == projector_bytes(smol.projector_facts) > 0
    g = entries["gemma3:4b"]
    assert g.projector is None and g.estimate is not None and g.estimate.projector == 0


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ('["m"]\nmmproj = "nowhere.gguf"\n', '["m"] mmproj: {dir}/nowhere.gguf is not a file'),
        ('["m"]\nmmproj = 3\n', '["m"] mmproj: must be a projector file (a string) or false'),
        ('["*"]\nmmproj = "p.gguf"\n', '["*"] mmproj: a projector belongs to one model'),
    ],
)
def test_models_toml_mmproj_mistakes(
    make_catalog: MakeCatalog, data_dir: Path, config: str, message: str
) -> None:
    data_dir.mkdir(parents=True)
    (data_dir / "p.gguf").write_bytes(b"")
    (data_dir / "models.toml").write_text(config)
    with pytest.raises(ValueError) as err:
        make_catalog()
    assert message.format(dir=data_dir.resolve()) in str(err.value)


def test_the_estimate_counts_the_projector_apart(
    make_catalog: MakeCatalog, home: Home, tmp_path: Path
) -> None:
    projector = header_projector(tmp_path / "src" / "p.gguf", n_embd=64, n_ff=128)
    home.ollama("gemma3:4b", gemma(), projector=projector)
    home.ollama("gemma3:text", gemma())
    entries = by_id(make_catalog())
    seeing, text = entries["gemma3:4b"].estimate, entries["gemma3:text"].estimate
    assert seeing is not None and text is not None
    # 896 px in 14 px patches: 64 x 64 patches, each (4 x 64 + 128) f32 activations; the
    # projector's one 64 x 48 f32 tensor; and the encoded images the engine keeps.
    assert seeing.projector == 64 * 48 * 4 + 4096 * (4 * 64 + 128) * 4 + IMAGE_CACHE_BYTES
    assert (seeing.weights, seeing.kv_cache, seeing.compute) == (
        text.weights,
        text.kv_cache,
        text.compute,
    )
    assert seeing.total == text.total + seeing.projector


def test_projector_bytes_caps_the_patches_and_has_a_default(tmp_path: Path) -> None:
    facts = read_projector(header_projector(tmp_path / "p.gguf"))
    assert (facts.image_size, facts.patch_size, facts.n_embd, facts.n_ff) == (896, 14, 64, 128)
    assert facts.tensor_bytes == 64 * 48 * 4
    huge = replace(facts, image_size=4096)
    unsized = replace(facts, image_size=0)
    per_patch = (4 * facts.n_embd + facts.n_ff) * 4
    kept = facts.tensor_bytes + IMAGE_CACHE_BYTES
    assert projector_bytes(huge) == kept + MAX_PATCHES * per_patch
    assert projector_bytes(unsized) == kept + DEFAULT_PATCHES * per_patch


@pytest.mark.parametrize(
    ("model", "candidates", "related_only", "picked"),
    [
        # The model's own name first, whatever the quantization.
        (
            "gemma-3-4b-it-Q4_K_M.gguf",
            ["mmproj-F16.gguf", "mmproj-gemma-3-4b-it-Q8_0.gguf"],
            False,
            "mmproj-gemma-3-4b-it-Q8_0.gguf",
        ),
        # Then the model's quantization, then f16, then the first by name.
        ("m-Q8_0.gguf", ["mmproj-BF16.gguf", "mmproj-F16.gguf", "mmproj-Q8_0.gguf"], False, "mmproj-Q8_0.gguf"),
        ("m-Q4_K_M.gguf", ["mmproj-BF16.gguf", "mmproj-F16.gguf", "mmproj-Q8_0.gguf"], False, "mmproj-F16.gguf"),
        ("m-Q4_K_M.gguf", ["mmproj-b.gguf", "mmproj-a.gguf"], False, "mmproj-a.gguf"),
        # Beside unrelated models, only a projector that shares the model's name.
        ("llama-3.2-1b-Q4_K_M.gguf", ["mmproj-gemma-3-4b-it-f16.gguf"], True, None),
        ("gemma-3-4b-it-Q4_K_M.gguf", ["mmproj-gemma-3-4b-it-f16.gguf"], True, "mmproj-gemma-3-4b-it-f16.gguf"),
        ("model.gguf", ["mmproj-F16.gguf"], True, None),
        ("m.gguf", [], False, None),
    ],
)  # fmt: skip
def test_pick_projector_ranks_a_folders_projectors(
    model: str, candidates: list[str], related_only: bool, picked: str | None
) -> None:
    folder = Path("/models")
    found = pick_projector(
        folder / model, [folder / c for c in candidates], related_only=related_only
    )
    assert (found.name if found else None) == picked


def test_models_cards_say_which_models_take_images(
    make_catalog: MakeCatalog, home: Home, tmp_path: Path
) -> None:
    home.ollama("gemma3:4b", gemma(), projector=header_projector(tmp_path / "src" / "p.gguf"))
    catalog = make_catalog()
    seeing, text = catalog.get("gemma3:4b"), catalog.get(SMOLLM2_ID)
    assert seeing is not None and seeing.projector is not None and text is not None
    card = catalog_card(seeing)
    assert card["input_modalities"] == ["text", "image"]
    assert card["projector"] == seeing.projector.name
    assert seeing.estimate is not None and card["estimated_memory_bytes"] == seeing.estimate.total
    assert card["estimated_projector_bytes"] == seeing.estimate.projector
    plain = catalog_card(text)
    assert plain["input_modalities"] == ["text"] and plain["projector"] is None
    assert plain["estimated_projector_bytes"] is None
    # As /v1/models sends them (app/api/inference.py).
    sent = msgspec.json.decode(msgspec.json.encode(CatalogModel(**card)))
    assert sent["input_modalities"] == ["text", "image"] and sent["projector"] == card["projector"]


def test_beside_the_model_flag_a_projector_that_shares_its_name(
    make_catalog: MakeCatalog, tmp_path: Path
) -> None:
    mine = tmp_path / "mine"
    [model] = header_model(mine / "gemma-3-4b-it-Q4_K_M.gguf")
    header_model(mine / "other-Q8_0.gguf")
    catalog = make_catalog(model=str(model))
    assert seen(catalog.default()) is None
    header_projector(mine / "mmproj-gemma-3-4b-it-f16.gguf")  # put there while it runs
    assert seen(catalog.default()) == "mmproj-gemma-3-4b-it-f16.gguf"
    assert seen(make_catalog(model=str(mine / "other-Q8_0.gguf")).default()) is None
    assert seen(catalog.get(SMOLLM2_ID)) is None  # the embedded default reads text


def test_a_projector_added_later_shows_up_without_a_restart(
    make_catalog: MakeCatalog, home: Home, tmp_path: Path
) -> None:
    folder = home.lmstudio("ggml-org/gemma-3-4b-it-GGUF", *header_model(tmp_path / "g-Q4_0.gguf"))
    catalog = make_catalog()
    assert seen(catalog.get("ggml-org/gemma-3-4b-it-GGUF")) is None
    header_projector(folder / "mmproj-model-f16.gguf")
    assert seen(catalog.get("ggml-org/gemma-3-4b-it-GGUF")) == "mmproj-model-f16.gguf"
    (folder / "mmproj-model-f16.gguf").unlink()
    assert seen(catalog.get("ggml-org/gemma-3-4b-it-GGUF")) is None
