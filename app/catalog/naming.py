"""How a folder's GGUF files name models and projectors: which files are models (whole or
split into parts), which are projectors, and which projector belongs to which model. The
stores (stores.py) read the folders; this reads the names they find there.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from app.catalog.header import is_model_name, is_projector_name, split_name, split_parts


@dataclass(frozen=True)
class ModelFiles:
    """A model among files: its parts, or what is missing."""

    paths: tuple[Path, ...]
    error: str = ""


def models_among(files: list[Path]) -> list[ModelFiles]:
    """The models among .gguf files of one folder: whole files and split models (by their
    first part), not projectors, imatrices or draft heads."""
    models = []
    for path in files:
        if not is_model_name(path.name):
            continue
        split = split_name(path.name)
        if split.index != 1:
            continue  # a later part: its first part stands for the whole model
        parts = split_parts(path, split.count) if split.count > 1 else (path,)
        missing = [p.name for p in parts if not p.exists()]
        error = (
            f"missing part{'s' if len(missing) > 1 else ''} {', '.join(missing)}" if missing else ""
        )
        models.append(ModelFiles(parts, error))
    return models


def model_stem(path: Path) -> str:
    return split_name(path.name).prefix


#: A quantization at the end of a file's stem: `-Q4_K_M`, `.Q8_0`, `-f16`, `_BF16`.
_QUANT_SUFFIX = re.compile(r"[-._](I?Q\d+(?:_[A-Z0-9]+)*|BF16|F16|F32)$", re.I)
_SEPARATORS = re.compile(r"[-._ ]+")


def _base_and_quant(stem: str) -> tuple[str, str]:
    """A stem's name without its quantization, lower case and without separators, and the
    quantization (upper case, "" when the stem names none)."""
    match = _QUANT_SUFFIX.search(stem)
    quant = match.group(1).upper() if match else ""
    base = stem[: match.start()] if match else stem
    return _SEPARATORS.sub("", base.lower()), quant


def projectors_among(files: list[Path]) -> list[Path]:
    """The projector files among a folder's files, by their names (`mmproj` in them)."""
    return sorted(p for p in files if is_projector_name(p.name))


def pick_projector(
    model: Path, candidates: list[Path], *, related_only: bool = False
) -> Path | None:
    """The projector of `model` among `candidates` (projector files of one folder): the one
    whose name shares the model's name (`mmproj-gemma-3-4b-it-f16.gguf` for
    `gemma-3-4b-it-Q4_K_M.gguf`), then the one of the model's own quantization, then the
    f16 one, then the first by name. `related_only`: only one whose name shares the
    model's, for folders where unrelated models sit side by side."""
    model_base, model_quant = _base_and_quant(model_stem(model))

    def rank(path: Path) -> tuple[bool, bool, bool, str]:
        stem = model_stem(path)
        base, quant = _base_and_quant(re.sub("mmproj", "", stem, flags=re.I))
        shares_name = bool(base) and (base in model_base or model_base in base)
        shares_quant = bool(quant) and quant == model_quant
        return (not shares_name, not shares_quant, quant != "F16", path.name)

    ranked = sorted(candidates, key=rank)
    if not ranked or (related_only and rank(ranked[0])[0]):
        return None
    return ranked[0]
