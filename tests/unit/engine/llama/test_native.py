"""What the engine takes from llama.cpp and what config keeps apart from it."""

from __future__ import annotations

import struct
import subprocess
import sys
from pathlib import Path

import llama_cpp as lc
import pytest

from app import config
from app.config import default_model_path
from app.engine.llama import native
from app.model_files import describe, quantization, read_gguf_metadata


def test_importing_config_does_not_import_llama_cpp() -> None:
    code = "import sys, app.config; print('llama_cpp' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_every_kv_cache_type_config_accepts_has_a_ggml_type() -> None:
    assert set(config.KV_CACHE_TYPES) == set(native.KV_GGML_TYPES)
    assert [native.kv_needs_flash_attention(k) for k in ("f16", "bf16", "q8_0", "q4_0")] == [
        False,
        False,
        True,
        True,
    ]


def test_parallel_zero_means_32_slots_on_a_cpu() -> None:
    assert native.default_parallel(0) == 32


def test_the_engine_and_batchyard_models_name_the_default_model_alike() -> None:
    path = default_model_path()
    params = lc.llama_model_default_params()
    params.vocab_only = True  # the header and vocabulary, not the weights
    model = lc.llama_model_load_from_file(str(path).encode(), params)
    assert model
    try:
        ftype = native.file_type(model)  # what the engine's ModelInfo reads
    finally:
        lc.llama_model_free(model)
    assert ftype == read_gguf_metadata(path)["general.file_type"]  # what `models` reads
    assert quantization(ftype, path) == describe(path, "default").quantization == "Q4_1"


def gguf(path: Path, file_type: int | None = None) -> Path:
    """A GGUF header with no tensors and at most a `general.file_type`."""
    key = b"general.file_type"
    kvs = (
        b""
        if file_type is None
        else struct.pack("<Q", len(key)) + key + struct.pack("<II", 4, file_type)
    )
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 0 if file_type is None else 1) + kvs)
    return path


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
    tmp_path: Path, name: str, file_type: int | None, expected: str
) -> None:
    path = gguf(tmp_path / name, file_type)
    assert read_gguf_metadata(path).get("general.file_type") == file_type
    assert quantization(file_type, path) == describe(path, "data-dir").quantization == expected
