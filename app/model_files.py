"""The models an install can serve, and what a GGUF file's header says about one.

`batchyard models` lists the embedded default, the `--model` file and every .gguf in the
data dir's `models/`. The header is read directly (GGUF's key/value section) so that
listing needs neither the model loaded nor any package beyond the standard library.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from app.config import Settings, default_model_path

GGUF_MAGIC = b"GGUF"
# GGUF value types: fixed-size ones by struct format; 8 is a string, 9 an array.
_FIXED = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}
_STRING, _ARRAY = 8, 9
#: llama.cpp's llama_ftype values (`general.file_type`) by name.
FILE_TYPES = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K",
    11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S",
    17: "Q5_K_M", 18: "Q6_K", 19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S", 22: "IQ3_XS",
    23: "IQ3_XXS", 24: "IQ1_S", 25: "IQ4_NL", 26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S",
    29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M", 32: "BF16", 36: "TQ1_0", 37: "TQ2_0",
    38: "MXFP4_MOE", 39: "NVFP4", 40: "Q1_0", 41: "Q2_0",
}  # fmt: skip
_QUANT_IN_NAME = re.compile(r"(?<![A-Za-z0-9])(I?Q\d+_[A-Z0-9_]+|I?Q\d+|BF16|F16|F32)", re.I)


def quantization(ftype: int | None, path: Path) -> str:
    """A model file's quantization: its header's `general.file_type` by name, else what the
    file's name says (`...Q4_K_M.gguf`), else the bare type number or "unknown"."""
    if ftype is not None and ftype in FILE_TYPES:
        return FILE_TYPES[ftype]
    match = _QUANT_IN_NAME.search(path.stem)
    if match:
        return match.group(1).upper()
    return f"type {ftype}" if ftype is not None else "unknown"


class NotGGUF(ValueError):
    pass


def _read(fh: BinaryIO, fmt: str) -> Any:
    size = struct.calcsize(fmt)
    data = fh.read(size)
    if len(data) != size:
        raise NotGGUF("the file ends inside its header")
    return struct.unpack(fmt, data)[0]


def _string(fh: BinaryIO) -> str:
    n = _read(fh, "<Q")
    return fh.read(n).decode("utf-8", "replace")


def _value(fh: BinaryIO, vtype: int, keep: bool) -> Any:
    if vtype in _FIXED:
        return _read(fh, _FIXED[vtype])
    if vtype == _STRING:
        return _string(fh)
    if vtype == _ARRAY:
        etype, count = _read(fh, "<I"), _read(fh, "<Q")
        if etype in _FIXED and not keep:
            fh.seek(count * struct.calcsize(_FIXED[etype]), 1)
            return None
        items = [_value(fh, etype, keep) for _ in range(count)]
        return items if keep else None
    raise NotGGUF(f"unknown GGUF value type {vtype}")


def read_gguf_metadata(path: Path, keys: tuple[str, ...] | None = None) -> dict[str, Any]:
    """The header's key/value pairs (arrays skipped unless asked for by `keys`)."""
    with open(path, "rb") as fh:
        if fh.read(4) != GGUF_MAGIC:
            raise NotGGUF(f"{path} is not a GGUF file")
        version = _read(fh, "<I")
        count_fmt = "<I" if version == 1 else "<Q"
        _read(fh, count_fmt)  # tensor count
        n_kv = _read(fh, count_fmt)
        meta: dict[str, Any] = {}
        for _ in range(n_kv):
            key = _string(fh)
            vtype = _read(fh, "<I")
            wanted = keys is None or key in keys
            value = _value(fh, vtype, keep=keys is not None and key in keys)
            if wanted and value is not None:
                meta[key] = value
        return meta


@dataclass
class ModelFile:
    name: str
    path: Path
    source: str  # "default", "--model" or "data-dir"
    size_bytes: int
    quantization: str
    architecture: str = ""
    context_length: int = 0
    error: str = ""


def describe(path: Path, source: str) -> ModelFile:
    """Size and quantisation of one model file: from its header, else from its name."""
    name = path.stem if path.suffix == ".gguf" else path.name
    if not path.is_file():
        return ModelFile(name, path, source, 0, "-", error="missing")
    size = path.stat().st_size
    ftype, arch, ctx, error = None, "", 0, ""
    try:
        meta = read_gguf_metadata(path)
        value = meta.get("general.file_type")
        ftype = value if isinstance(value, int) and not isinstance(value, bool) else None
        arch = str(meta.get("general.architecture", ""))
        ctx = int(meta.get(f"{arch}.context_length", 0) or 0)
    except (OSError, NotGGUF) as exc:
        error = str(exc)
    return ModelFile(name, path, source, size, quantization(ftype, path), arch, ctx, error)


def available_models(settings: Settings) -> list[ModelFile]:
    """The default model, the configured `--model`, and `<data dir>/models/*.gguf`."""
    candidates: list[tuple[Path, str]] = [(default_model_path(), "default")]
    if settings.model:
        candidates.append((settings.model_path, "--model"))
    models_dir = settings.data_path / "models"
    if models_dir.is_dir():
        candidates += [(p, "data-dir") for p in sorted(models_dir.glob("*.gguf"))]
    seen: set[Path] = set()
    found = []
    for path, source in candidates:
        key = path.resolve()
        if key in seen:
            continue
        seen.add(key)
        found.append(describe(path, source))
    return found
