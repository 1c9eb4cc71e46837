"""models.toml: per-model settings over the server's flags, aliases, and a clear error for
every mistake."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from app.catalog import Catalog, LoadProfile
from app.catalog.estimate import estimate
from app.config import AUTO_GPU_LAYERS
from tests.models import gemma
from tests.stores import Home

SMOLLM2_ID = "SmolLM2-135M-Instruct.Q4_1"
MakeCatalog = Callable[..., Catalog]

CONFIG = """
["*"]
ctx_size = 1024

["gemma3"]                # gemma3:latest
parallel = 4
kv_cache_type = "F16"
n_gpu_layers = -1
chat_template = "templates/gemma.jinja"
aliases = ["gemma-small"]

["SmolLM2-135M-Instruct.Q4_1"]
ctx_size = 512
chat_template = "{% for m in messages %}{{ m.content }}{% endfor %}"

[aliases]
gpt-4o-mini = "gemma3"
"gpt-3.5-turbo" = "SmolLM2-135M-Instruct.Q4_1"
"""


@pytest.fixture
def config(data_dir: Path) -> Path:
    data_dir.mkdir(parents=True, exist_ok=True)
    (data_dir / "templates").mkdir()
    (data_dir / "templates" / "gemma.jinja").write_text("{{ bos_token }}gemma")
    path = data_dir / "models.toml"  # found in the data dir without --models-config
    path.write_text(CONFIG)
    return path


def test_profiles_take_the_flags_then_star_then_the_models_section(
    make_catalog: MakeCatalog, home: Home, config: Path
) -> None:
    home.ollama("gemma3", gemma())
    catalog = make_catalog(parallel=8, kv_cache_type="q4_0")

    g = catalog.resolve("gemma3")
    smol = catalog.resolve(SMOLLM2_ID)
    assert g is not None and smol is not None
    assert g.profile == LoadProfile(
        ctx_size=1024, parallel=4, n_gpu_layers=-1, kv_cache_type="f16",
        chat_template="{{ bos_token }}gemma", shared_prefix_cells=-1,
    )  # fmt: skip
    assert smol.profile == LoadProfile(
        ctx_size=512, parallel=8, n_gpu_layers=AUTO_GPU_LAYERS, kv_cache_type="q4_0",
        chat_template="{% for m in messages %}{{ m.content }}{% endfor %}",
        shared_prefix_cells=-1,
    )  # fmt: skip
    # The estimate is the profile's.
    assert g.facts is not None and g.estimate == estimate(g.facts, g.profile)
    # Four slots' cells and the online sequence's, in the profile's type; with so few, no
    # shared-prefix context.
    assert g.estimate.kv_cache == 18 * 1 * (256 + 256) * 2 * 1024 * (4 + 1)


def test_aliases_from_the_aliases_table_and_a_models_section(
    make_catalog: MakeCatalog, home: Home, config: Path
) -> None:
    home.ollama("gemma3", gemma())
    catalog = make_catalog()
    g = catalog.get("gemma3:latest")
    assert g is not None
    assert catalog.resolve("gpt-4o-mini") == catalog.resolve("gemma-small") == g
    assert catalog.entry_for("gpt-3.5-turbo").id == SMOLLM2_ID
    assert {"gpt-4o-mini", "gemma-small", "gemma3", "gemma3:latest"} <= g.names
    assert "gpt-4o-mini" in catalog.names()


def test_a_section_or_alias_for_a_model_not_there_waits_for_it(
    make_catalog: MakeCatalog, home: Home, config: Path
) -> None:
    catalog = make_catalog()  # no gemma3 yet: its section and aliases name nothing
    assert catalog.resolve("gpt-4o-mini") is None
    home.ollama("gemma3", gemma())
    g = catalog.resolve("gpt-4o-mini")
    assert g is not None and g.profile.parallel == 4


def test_an_edited_models_toml_applies_without_a_restart_and_a_bad_edit_keeps_the_last(
    make_catalog: MakeCatalog, config: Path, caplog: pytest.LogCaptureFixture
) -> None:
    catalog = make_catalog(models_config=str(config))
    assert catalog.default().profile.ctx_size == 512
    config.write_text(CONFIG.replace("ctx_size = 512", "ctx_size = 768"))
    assert catalog.default().profile.ctx_size == 768
    config.write_text("[aliases\n")
    assert catalog.default().profile.ctx_size == 768
    assert "models config not reloaded" in caplog.text


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[aliases\n", "not valid TOML: "),
        ('ctx_size = 4\n', 'ctx_size = ... must be inside a section: ["MODEL"], ["*"] or [aliases]'),
        ('["m"]\nctx = 4\n', '["m"] ctx: unknown setting; the settings are ctx_size, parallel, n_gpu_layers, kv_cache_type, chat_template, mmproj and aliases'),
        ('["m"]\nctx_size = "big"\n', '["m"] ctx_size: must be a whole number, 1 or more'),
        ('["m"]\nparallel = -1\n', '["m"] parallel: must be a whole number, 0 or more'),
        ('["m"]\nn_gpu_layers = -2\n', '["m"] n_gpu_layers: must be a whole number, -1 or more'),
        ('["m"]\nkv_cache_type = "q9"\n', '["m"] kv_cache_type: must be one of f16, bf16, q8_0, q4_0'),
        ('["m"]\naliases = "x"\n', '["m"] aliases: must be a list of names'),
        ('["m"]\nchat_template = "none.jinja"\n', '["m"] chat_template: '),
        ("[aliases]\nx = 1\n", "[aliases] x: must be a model's name (a string)"),
    ],
)  # fmt: skip
def test_a_bad_models_toml_is_a_start_up_error_naming_the_file_and_key(
    make_catalog: MakeCatalog, tmp_path: Path, text: str, message: str
) -> None:
    path = tmp_path / "models.toml"
    path.write_text(text)
    with pytest.raises(ValueError) as err:
        make_catalog(models_config=str(path))
    assert str(err.value).startswith(f"{path}: {message}")


def test_a_missing_models_config_is_an_error_naming_it(
    make_catalog: MakeCatalog, tmp_path: Path
) -> None:
    with pytest.raises(ValueError, match=r"nope\.toml: cannot read the models config"):
        make_catalog(models_config=str(tmp_path / "nope.toml"))
