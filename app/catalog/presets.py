"""models.toml: per-model settings and aliases, laid out as llama.cpp's --models-preset
and llama-swap lay theirs, one section per model:

    ["*"]                       # every model (the server's flags stay below this)
    ctx_size = 4096

    ["gemma3:270m"]             # any name that means the model: its id, an alias, `gemma3`
    ctx_size = 8192
    parallel = 4
    n_gpu_layers = -1           # -1 all, 0 none
    kv_cache_type = "f16"       # f16, bf16, q8_0, q4_0
    chat_template = "gemma.jinja"   # a file (relative to models.toml) or a template itself
    mmproj = "mmproj-gemma3.gguf"   # its projector (relative to models.toml); false: none
    aliases = ["gemma"]

    [aliases]
    gpt-4o-mini = "gemma3:270m"

A setting applies in this order: the server's flags, then `["*"]`, then the model's own
section. `chat_template` is read as a file when such a file exists, else taken as the
template itself if it looks like one (holds `{{` or `{%`). `mmproj` names the model's
multimodal projector, in place of the one its store keeps beside it (stores.py), or
`false` for none; it is a model's own setting, never `["*"]`'s. Every mistake is a
ValueError that names the file and the key.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from app.catalog.entry import LoadProfile
from app.config.settings import KV_CACHE_TYPES

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

ALL_MODELS = "*"
ALIASES = "aliases"
SETTINGS = ("ctx_size", "parallel", "n_gpu_layers", "kv_cache_type", "chat_template", "mmproj")


@dataclass(frozen=True)
class Preset:
    """One section: the settings it gives (only those it names) and its aliases."""

    settings: dict[str, Any] = field(default_factory=dict)
    aliases: tuple[str, ...] = ()
    #: The model's projector file; False: none, whatever its store keeps; None: not said.
    mmproj: Path | Literal[False] | None = None

    def apply(self, profile: LoadProfile) -> LoadProfile:
        return replace(profile, **self.settings) if self.settings else profile


@dataclass(frozen=True)
class ModelsConfig:
    path: Path | None = None
    every: Preset = field(default_factory=Preset)
    models: dict[str, Preset] = field(default_factory=dict)  # by the name the section uses
    aliases: dict[str, str] = field(default_factory=dict)  # alias -> the name it means


def load(path: Path | None) -> ModelsConfig:
    """models.toml at `path`, or an empty config when there is none."""
    if path is None:
        return ModelsConfig()
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ValueError(f"{path}: cannot read the models config ({exc.strerror or exc})") from None
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{path}: not valid TOML: {exc}") from None
    every, models, aliases = Preset(), {}, {}
    for section, body in data.items():
        if not isinstance(body, dict):
            raise ValueError(
                f'{path}: {section} = ... must be inside a section: ["MODEL"], ["*"] or [aliases]'
            )
        if section == ALIASES:
            aliases.update(_alias_section(path, body))
        elif section == ALL_MODELS:
            every = _every_section(path, body)
        else:
            models[section] = preset = _preset(path, section, body)
            for alias in preset.aliases:
                aliases[alias] = section
    return ModelsConfig(path, every, models, aliases)


def _alias_section(path: Path, body: dict[str, Any]) -> dict[str, str]:
    """[aliases]: alias -> the name it means."""
    aliases = {}
    for alias, target in body.items():
        if not isinstance(target, str) or not target.strip():
            raise ValueError(f"{path}: [aliases] {alias}: must be a model's name (a string)")
        aliases[alias] = target.strip()
    return aliases


def _every_section(path: Path, body: dict[str, Any]) -> Preset:
    """["*"]: the settings of every model; aliases and a projector belong to one model."""
    every = _preset(path, ALL_MODELS, body)
    if every.aliases:
        raise ValueError(f'{path}: ["*"] aliases: an alias names one model')
    if every.mmproj is not None:
        raise ValueError(f'{path}: ["*"] mmproj: a projector belongs to one model')
    return every


def _preset(path: Path, section: str, body: dict[str, Any]) -> Preset:
    where = f'{path}: ["{section}"]'
    settings: dict[str, Any] = {}
    aliases: tuple[str, ...] = ()
    mmproj: Path | Literal[False] | None = None
    for key, value in body.items():
        if key == "aliases":
            if not isinstance(value, list) or not all(isinstance(a, str) and a for a in value):
                raise ValueError(f"{where} aliases: must be a list of names")
            aliases = tuple(value)
        elif key in ("ctx_size", "parallel", "n_gpu_layers"):
            low = {"ctx_size": 1, "parallel": 0, "n_gpu_layers": -1}[key]
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{where} {key}: must be a whole number, {low} or more")
            settings[key] = value
        elif key == "kv_cache_type":
            kind = str(value).strip().lower()
            if not isinstance(value, str) or kind not in KV_CACHE_TYPES:
                raise ValueError(f"{where} {key}: must be one of {', '.join(KV_CACHE_TYPES)}")
            settings[key] = kind
        elif key == "chat_template":
            settings[key] = _template(path, where, value)
        elif key == "mmproj":
            mmproj = _mmproj(path, where, value)
        else:
            raise ValueError(
                f"{where} {key}: unknown setting; the settings are "
                f"{', '.join(SETTINGS)} and aliases"
            )
    return Preset(settings, aliases, mmproj)


def _mmproj(path: Path, where: str, value: Any) -> Path | Literal[False]:
    if value is False:
        return False
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{where} mmproj: must be a projector file (a string) or false")
    file = (path.parent / Path(value.strip()).expanduser()).resolve()
    if not file.is_file():
        raise ValueError(f"{where} mmproj: {file} is not a file; give the model's mmproj GGUF")
    return file


def _template(path: Path, where: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{where} chat_template: must be a file or a Jinja template (a string)")
    if "{{" in value or "{%" in value:
        return value
    file = (path.parent / Path(value).expanduser()).resolve()
    try:
        return file.read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(
            f"{where} chat_template: {file} cannot be read ({exc.strerror or exc}); give a "
            "template file or the template itself"
        ) from None
