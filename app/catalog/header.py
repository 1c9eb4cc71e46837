"""What a GGUF file's header says, read with the `gguf` package (llama.cpp's own reader).

Listing reads every model's header, so it must be quick. `gguf.GGUFReader` builds a numpy
view per element of every array, and a tokenizer is arrays of a few hundred thousand
strings: 12.2 s for Gemma 3 270M's header (262,144 tokens), 4.4 s for SmolLM2's, on this
project's 2-core machine. `_Reader` steps over long arrays by their byte lengths and keeps
only their element count (Gemma 3: 0.06 s, SmolLM2: 0.03 s); everything else is the
package's own parsing. Facts are then cached by the file's identity, size and mtime.
"""

from __future__ import annotations

import os
import re
import sys
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import gguf
import numpy as np

from app.catalog.entry import HeaderFacts, ProjectorFacts

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

#: A split model's part, as llama.cpp's gguf-split names them: NAME-00001-of-00003.gguf.
_SPLIT = re.compile(r"^(?P<prefix>.+)-(?P<index>\d{5})-of-(?P<count>\d{5})\.gguf$", re.I)
#: The quantization tag at the end of a file's name, as llama.cpp's -hf reads it
#: (common/download.cpp): `...-Q4_K_M.gguf`, `....Q4_1.gguf`.
_TAG = re.compile(r"[-.]([A-Za-z0-9_]+)$")
#: Files beside models that are not models, by the words llama.cpp's -hf skips in a name:
#: multimodal projectors, importance matrices, draft and speculative heads.
_NOT_MODEL_WORDS = ("mmproj", "imatrix", "mtp-", "eagle3-", "dflash-", "dspark-")
#: `general.type` values (and architectures) of GGUFs that are not language models.
_NOT_MODEL_TYPES = ("mmproj", "adapter", "imatrix")
_NOT_MODEL_ARCHS = ("clip",)


def quantization(ftype: int | None, path: Path) -> str:
    """A model file's quantization: its header's `general.file_type` by name, else what the
    file's name says (`...Q4_K_M.gguf`), else the bare type number or "unknown"."""
    if ftype is not None and ftype in FILE_TYPES:
        return FILE_TYPES[ftype]
    match = _QUANT_IN_NAME.search(path.stem)
    if match:
        return match.group(1).upper()
    return f"type {ftype}" if ftype is not None else "unknown"


@dataclass(frozen=True)
class SplitName:
    prefix: str  # the name before -0000i-of-0000n (a whole file's stem when not split)
    index: int  # 1-based
    count: int  # 1 for a whole file


def split_name(file_name: str) -> SplitName:
    """Where a file sits in a split model (1 of 1 for a whole file)."""
    match = _SPLIT.match(file_name)
    if match:
        return SplitName(match["prefix"], int(match["index"]), int(match["count"]))
    stem = file_name[: -len(".gguf")] if file_name.lower().endswith(".gguf") else file_name
    return SplitName(stem, 1, 1)


def split_parts(first: Path, count: int) -> tuple[Path, ...]:
    """Every part of the split model whose first part is `first`, in order."""
    prefix = split_name(first.name).prefix
    return tuple(
        first.with_name(f"{prefix}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1)
    )


def quant_tag(file_name: str) -> str:
    """The quantization tag llama.cpp's -hf gives a file (`Q4_K_M`), or "" when its name has none."""
    match = _TAG.search(split_name(file_name).prefix)
    return match.group(1).upper() if match else ""


def is_projector_name(file_name: str) -> bool:
    """A .gguf whose name says it is a multimodal projector (`mmproj` anywhere in it, as
    llama.cpp's -hf and --models-dir look for one)."""
    name = file_name.lower()
    return name.endswith(".gguf") and "mmproj" in name


def is_model_name(file_name: str) -> bool:
    """A .gguf whose name does not say it is a projector, an imatrix or a draft head."""
    name = file_name.lower()
    return name.endswith(".gguf") and not any(word in name for word in _NOT_MODEL_WORDS)


class NotAModel(ValueError):
    """A GGUF that is not a language model (a multimodal projector, a LoRA adapter)."""


# Arrays longer than this are stepped over: only their length is kept. Per-layer arrays
# (head counts of some architectures) are far shorter and are read whole.
_LONG_ARRAY = 1024


class _Reader(gguf.GGUFReader):
    """GGUFReader that steps over long arrays (the tokenizer's) instead of viewing each
    element; their field keeps its element count in `parts[1]` and no data."""

    def _get_field_parts(
        self, orig_offs: int, raw_type: int
    ) -> tuple[int, list[Any], list[int], list[gguf.GGUFValueType]]:
        if raw_type != gguf.GGUFValueType.ARRAY:
            return super()._get_field_parts(orig_offs, raw_type)
        item_type = self._get(orig_offs, np.uint32)
        length = self._get(orig_offs + 4, np.uint64)
        count = int(length[0])
        kind = gguf.GGUFValueType(int(item_type[0]))
        if count <= _LONG_ARRAY:
            return super()._get_field_parts(orig_offs, raw_type)
        offs = orig_offs + 12
        if kind == gguf.GGUFValueType.STRING:
            raw = memoryview(self.data)  # type: ignore[arg-type]  # numpy's memmap is a buffer
            from_bytes = int.from_bytes
            host_order = self.byte_order == "I"
            little = host_order == (sys.byteorder == "little")
            order: Literal["little", "big"] = "little" if little else "big"
            end = len(raw)
            for _ in range(count):
                offs += 8 + from_bytes(raw[offs : offs + 8], order)
                if offs > end:  # a corrupt count or length: stop at the file's end
                    raise ValueError("an array runs past the end of the file")
        elif kind in self.gguf_scalar_to_np:
            offs += count * np.dtype(self.gguf_scalar_to_np[kind]).itemsize
        else:  # arrays of arrays: the package's own walk
            return super()._get_field_parts(orig_offs, raw_type)
        return offs - orig_offs, [item_type, length], [], [gguf.GGUFValueType.ARRAY, kind]


def _value(reader: gguf.GGUFReader, key: str) -> Any:
    field = reader.fields.get(key)
    if field is None:
        return None
    if field.types and field.types[0] == gguf.GGUFValueType.ARRAY:
        if not field.data:  # a long array, stepped over
            return None
        return [field.parts[i].tolist()[0] for i in field.data]
    value = field.contents()
    return value.item() if isinstance(value, np.generic) else value


def _int(value: Any, default: int = 0) -> int:
    """A count from the header; per-layer arrays give their largest value (an upper bound)."""
    if isinstance(value, list):
        value = max((v for v in value if isinstance(v, (int, float))), default=None)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return default
    return int(value)


def _array_length(reader: gguf.GGUFReader, key: str) -> int:
    field = reader.fields.get(key)
    if field is None or not field.types or field.types[0] != gguf.GGUFValueType.ARRAY:
        return 0
    # parts: key length, key, value type, item type, length, items...
    return int(field.parts[4][0])


def _open(path: Path) -> gguf.GGUFReader:
    with open(path, "rb") as fh:
        magic = fh.read(4)
    if magic != b"GGUF":
        raise ValueError("not a GGUF file (it does not start with GGUF)")
    try:
        try:
            return _Reader(path)
        except (TypeError, AttributeError):
            # The step over long arrays leans on the reader's internals; should a new gguf
            # release change them, its own reader is slow but right.
            return gguf.GGUFReader(path)
    except OSError:
        raise
    except Exception as exc:  # whatever a corrupt header makes the reader raise
        # The reader's own words name an array or an index; what a user can act on is that
        # the file is damaged, most often a download cut short.
        size = path.stat().st_size
        raise ValueError(
            f"unreadable GGUF header: the file ({size:,} bytes) is damaged or cut short "
            f"({exc or type(exc).__name__})"
        ) from None


def read_facts(paths: Sequence[Path]) -> HeaderFacts:
    """The header facts of a model from its parts (one path for a whole file): the first
    part's key/values and every part's tensors. Raises OSError or ValueError for a file
    that cannot be read, NotAModel for a GGUF that is no language model."""
    first = _open(paths[0])
    arch = str(_value(first, "general.architecture") or "")
    kind = str(_value(first, "general.type") or "model")
    if kind in _NOT_MODEL_TYPES or arch in _NOT_MODEL_ARCHS:
        raise NotAModel(f"a {kind if kind != 'model' else arch} GGUF, not a language model")
    if not arch:
        raise ValueError("unreadable GGUF header (no general.architecture)")
    tensor_bytes = sum(t.n_bytes for t in first.tensors)
    for part in paths[1:]:
        tensor_bytes += sum(t.n_bytes for t in _open(part).tensors)
    n_embd = _int(_value(first, f"{arch}.embedding_length"))
    n_head = _int(_value(first, f"{arch}.attention.head_count"))
    head_size = n_embd // n_head if n_head else 0
    ftype = _value(first, "general.file_type")
    n_vocab = _int(_value(first, f"{arch}.vocab_size")) or _array_length(
        first, "tokenizer.ggml.tokens"
    )
    template = _value(first, "tokenizer.chat_template")
    return HeaderFacts(
        architecture=arch,
        n_layer=_int(_value(first, f"{arch}.block_count")),
        n_head_kv=_int(_value(first, f"{arch}.attention.head_count_kv"), n_head),
        key_length=_int(_value(first, f"{arch}.attention.key_length"), head_size),
        value_length=_int(_value(first, f"{arch}.attention.value_length"), head_size),
        n_embd=n_embd,
        context_length=_int(_value(first, f"{arch}.context_length")),
        file_type=ftype if isinstance(ftype, int) and not isinstance(ftype, bool) else None,
        tensor_bytes=tensor_bytes,
        has_chat_template="tokenizer.chat_template" in first.fields,
        n_vocab=n_vocab,
        n_ff=_int(_value(first, f"{arch}.feed_forward_length")),
        chat_template=template if isinstance(template, str) else None,
    )


def read_projector(path: Path) -> ProjectorFacts:
    """The facts of a multimodal projector file. Raises OSError or ValueError for a file that
    cannot be read or is no projector (a GGUF whose architecture is not `clip`)."""
    reader = _open(path)
    arch = str(_value(reader, "general.architecture") or "")
    if arch not in _NOT_MODEL_ARCHS:
        raise ValueError(f"not a projector: a {arch or 'unnamed'} GGUF, not a clip one")
    kind = _value(reader, "clip.projector_type") or _value(reader, "clip.vision.projector_type")
    return ProjectorFacts(
        projector_type=str(kind or ""),
        tensor_bytes=sum(t.n_bytes for t in reader.tensors),
        image_size=_int(_value(reader, "clip.vision.image_size")),
        patch_size=_int(_value(reader, "clip.vision.patch_size")),
        n_embd=_int(_value(reader, "clip.vision.embedding_length")),
        n_ff=_int(_value(reader, "clip.vision.feed_forward_length")),
    )


def _identity(path: Path) -> tuple[int, int, int, int]:
    st = os.stat(path)  # follows symlinks: a hub snapshot's link reads as its blob
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


class FactsCache:
    """Header facts by file identity (device, inode, size, mtime): a file changed in place
    is read again, and one file under several names (hard links, symlinks) is read once.
    A failure is cached too, as its message."""

    def __init__(self, limit: int = 4096) -> None:
        self._limit = limit
        self._lock = threading.Lock()
        self._facts: OrderedDict[tuple[Any, ...], HeaderFacts | Exception] = OrderedDict()
        self._projectors: OrderedDict[tuple[Any, ...], ProjectorFacts | Exception] = OrderedDict()

    def facts(self, paths: Sequence[Path]) -> HeaderFacts:
        """As read_facts, from the cache when no part changed."""
        key = tuple(_identity(p) for p in paths)
        with self._lock:
            found = self._facts.get(key)
            if found is not None:
                self._facts.move_to_end(key)
        if found is None:
            try:
                found = read_facts(paths)
            except (OSError, ValueError) as exc:
                found = exc
            with self._lock:
                self._facts[key] = found
                while len(self._facts) > self._limit:
                    self._facts.popitem(last=False)
        if isinstance(found, Exception):
            raise found
        return found

    def projector(self, path: Path) -> ProjectorFacts:
        """As read_projector, from the cache when the file did not change."""
        key = _identity(path)
        with self._lock:
            found = self._projectors.get(key)
        if found is None:
            try:
                found = read_projector(path)
            except (OSError, ValueError) as exc:
                found = exc
            with self._lock:
                self._projectors[key] = found
                while len(self._projectors) > self._limit:
                    self._projectors.popitem(last=False)
        if isinstance(found, Exception):
            raise found
        return found


#: One cache per process: every Catalog (and `batchyard models`) shares what it has read.
FACTS = FactsCache()
