"""What the engine takes from llama.cpp and what config keeps apart from it."""

from __future__ import annotations

import subprocess
import sys

import llama_cpp as lc

from app import config
from app.catalog import quantization
from app.catalog.header import read_facts
from app.config import bundled_model_path
from app.engine.llama.binding import native


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
    path = bundled_model_path()
    params = lc.llama_model_default_params()
    params.vocab_only = True  # the header and vocabulary, not the weights
    model = lc.llama_model_load_from_file(str(path).encode(), params)
    assert model
    try:
        ftype = native.file_type(model)  # what the engine's ModelInfo reads
    finally:
        lc.llama_model_free(model)
    assert ftype == read_facts([path]).file_type  # what the catalog reads
    assert quantization(ftype, path) == "Q4_1"
