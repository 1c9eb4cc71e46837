"""GGUF headers through the `gguf` package: the facts the catalog keeps, the quick reader
that steps over the tokenizer's arrays, and one rule for a file's quantization."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import gguf
import pytest

from app.catalog import FILE_TYPES, quantization
from app.catalog.entry import HeaderFacts
from app.catalog.header import (
    FactsCache,
    NotAModel,
    SplitName,
    quant_tag,
    read_facts,
    split_name,
)
from tests.models import gemma, header_model, smollm2, tensor_bytes


def test_the_facts_of_smollm2_and_gemma() -> None:
    smol = read_facts([smollm2()])
    assert smol.chat_template is not None and "<|im_start|>" in smol.chat_template
    assert replace(smol, chat_template=None) == HeaderFacts(
        architecture="llama",
        n_layer=30,
        n_head_kv=3,
        key_length=64,  # 576 / 9 heads: the header gives no key_length
        value_length=64,
        n_embd=576,
        context_length=8192,
        file_type=3,
        tensor_bytes=96_576_768,
        has_chat_template=True,
        n_vocab=49152,
        n_ff=1536,
    )
    g = read_facts([gemma()])
    assert (g.architecture, g.n_layer, g.n_head_kv, g.key_length, g.value_length) == (
        "gemma3",
        18,
        1,
        256,
        256,
    )
    assert (g.n_embd, g.context_length, FILE_TYPES[g.file_type or 0]) == (640, 32768, "Q4_K_M")
    assert (g.n_vocab, g.n_ff, g.tensor_bytes) == (262144, 2048, 246_587_904)
    assert g.has_chat_template is False and g.chat_template is None  # this GGUF carries none


def test_the_quick_reader_agrees_with_the_gguf_package_but_for_long_arrays(
    tmp_path: Path,
) -> None:
    [path] = header_model(tmp_path / "m.gguf", n_vocab=3000)
    facts = read_facts([path])
    theirs = gguf.GGUFReader(path)  # the package's own reader, every array read
    assert len(theirs.fields["tokenizer.ggml.tokens"].data) == facts.n_vocab == 3000
    assert (
        sum(t.n_bytes for t in theirs.tensors) == facts.tensor_bytes == tensor_bytes(n_vocab=3000)
    )
    assert theirs.fields["general.file_type"].contents() == facts.file_type == 15
    assert theirs.fields["llama.context_length"].contents() == facts.context_length


def test_a_split_model_counts_every_parts_tensors(tmp_path: Path) -> None:
    parts = header_model(tmp_path / "big.gguf", split_max_tensors=2)
    assert len(parts) == 3
    assert read_facts(parts).tensor_bytes == tensor_bytes()
    assert read_facts(parts[:1]).tensor_bytes < tensor_bytes()


def test_projectors_and_adapters_are_not_models(tmp_path: Path) -> None:
    for name, arch, kind in (
        ("p", "clip", None),
        ("q", "llama", "mmproj"),
        ("a", "llama", "adapter"),
    ):
        [path] = header_model(tmp_path / f"{name}.gguf", arch=arch, general_type=kind)
        with pytest.raises(NotAModel):
            read_facts([path])


def test_the_cache_reads_a_file_again_only_when_it_changes(tmp_path: Path) -> None:
    cache = FactsCache()
    [path] = header_model(tmp_path / "m.gguf", context_length=1024)
    assert cache.facts([path]).context_length == 1024
    link = tmp_path / "link.gguf"
    link.symlink_to(path)
    assert cache.facts([link]) is cache.facts([path])  # one file, read once
    header_model(tmp_path / "m.gguf", context_length=2048)
    assert cache.facts([path]).context_length == 2048
    path.write_bytes(b"GGUF garbage")
    with pytest.raises(ValueError, match="unreadable GGUF header"):
        cache.facts([path])


def test_split_names_and_quant_tags_as_llama_cpp_reads_them() -> None:
    assert split_name("Qwen3-8B-Q4_K_M-00002-of-00003.gguf") == SplitName("Qwen3-8B-Q4_K_M", 2, 3)
    assert split_name("gemma.gguf") == SplitName("gemma", 1, 1)
    assert quant_tag("Qwen3-8B-Q4_K_M-00001-of-00003.gguf") == "Q4_K_M"
    assert quant_tag("SmolLM2-135M-Instruct.Q4_1.gguf") == "Q4_1"
    assert quant_tag("gemma-3-270m-it-q8_0.gguf") == "Q8_0"
    assert quant_tag("model.gguf") == ""


@pytest.mark.parametrize(
    ("name", "file_type", "expected"),
    [
        ("m.Q8_0.gguf", None, "Q8_0"),
        ("model-q4_k_m.gguf", None, "Q4_K_M"),
        ("tiny.Q8.gguf", None, "Q8"),
        ("model-bf16.gguf", None, "BF16"),
        ("plain.gguf", None, "unknown"),
        ("FAQ8_0.gguf", None, "unknown"),  # a Q inside a word is no quantization
        ("x-Q8_0.gguf", 15, "Q4_K_M"),  # the header wins over the name
        ("new-IQ4_XS.gguf", 99, "IQ4_XS"),  # a type number we cannot name: the name says
        ("mystery.gguf", 99, "type 99"),
    ],
)
def test_one_rule_names_a_file_from_its_header_else_its_name(
    name: str, file_type: int | None, expected: str
) -> None:
    assert quantization(file_type, Path(name)) == expected


def test_a_corrupt_array_length_is_an_error_not_a_hang(tmp_path: Path) -> None:
    [path] = header_model(tmp_path / "m.gguf", n_vocab=2000)
    data = bytearray(path.read_bytes())
    key = b"tokenizer.ggml.tokens"
    at = data.index(key) + len(key) + 4 + 4  # past the value type (array) and item type
    assert int.from_bytes(data[at : at + 8], "little") == 2000
    data[at : at + 8] = (1 << 40).to_bytes(8, "little")
    path.write_bytes(data)
    with pytest.raises(ValueError, match="an array runs past the end of the file"):
        read_facts([path])
