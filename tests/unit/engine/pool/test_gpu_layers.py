"""--n-gpu-layers auto: each model gets as many layers as the free VRAM holds when it loads,
as a stand-in `nvidia-smi` on PATH reports it (what a CUDA build on a GPU machine sees)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from app.catalog import Entry, Estimate, HeaderFacts, LoadProfile
from app.catalog.budget import MARGIN, gpu_layers
from app.config import AUTO_GPU_LAYERS, Settings, bundled_model_path, parse_gpu_layers
from app.engine.pool.pool import ModelPool
from app.toolchain import facts
from tests.catalogs import DictCatalog
from tests.fakes import FakeEngine

MiB = 1 << 20
#: Ten layers; each takes (600 + 60) / 11 = 60 MiB, after a 100 MiB compute buffer.
ESTIMATE = Estimate(weights=600 * MiB, kv_cache=60 * MiB, compute=100 * MiB)


def test_the_layers_that_fit_the_free_vram_less_the_margin() -> None:
    auto = AUTO_GPU_LAYERS
    assert gpu_layers(auto, 10, ESTIMATE, None, MARGIN) == 0  # no GPU
    assert gpu_layers(auto, 10, ESTIMATE, MARGIN + 100 * MiB + 300 * MiB, MARGIN) == 5
    assert gpu_layers(auto, 10, ESTIMATE, MARGIN + 100 * MiB + 659 * MiB, MARGIN) == 10
    assert gpu_layers(auto, 10, ESTIMATE, MARGIN + 100 * MiB + 660 * MiB, MARGIN) == -1  # all
    assert gpu_layers(auto, 10, ESTIMATE, MARGIN // 2, MARGIN) == 0
    # No estimate to go by (a model loaded alone): all on a GPU there is one.
    assert gpu_layers(auto, 0, None, 8 << 30, MARGIN) == -1
    # A number (the flag's, models.toml's) stays as it is, GPU or not.
    assert gpu_layers(3, 10, ESTIMATE, None, MARGIN) == 3
    assert gpu_layers(-1, 10, ESTIMATE, MARGIN // 2, MARGIN) == -1


def test_auto_is_the_default_and_a_flag_value() -> None:
    assert Settings().n_gpu_layers == AUTO_GPU_LAYERS
    assert Settings.load(environ={"BATCHYARD_N_GPU_LAYERS": "auto"}).n_gpu_layers == -2
    assert Settings.load(environ={"BATCHYARD_N_GPU_LAYERS": "12"}).n_gpu_layers == 12
    with pytest.raises(ValueError, match="-1 \\(all\\) or auto, not 'most'"):
        parse_gpu_layers("most")


def entry(id: str, n_gpu_layers: int) -> Entry:
    path = bundled_model_path()
    return Entry(
        id=id,
        names=frozenset({id}),
        source="models-dir",
        path=path,
        size_bytes=path.stat().st_size,
        mtime=0.0,
        quantization="Q4_1",
        profile=LoadProfile(
            ctx_size=256, parallel=1, n_gpu_layers=n_gpu_layers, kv_cache_type="q8_0"
        ),
        facts=HeaderFacts("llama", 10, 3, 64, 64, 576, 8192, 3, 600 * MiB, True),
        estimate=ESTIMATE,
        paths=(path,),
        is_default=id == "auto",
    )


def test_the_pool_loads_each_model_with_the_layers_the_stand_in_gpu_holds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bin_dir, lib = tmp_path / "bin", tmp_path / "lib"
    bin_dir.mkdir()
    lib.mkdir()
    (lib / "libggml-cuda.so").write_bytes(b"")  # a CUDA build
    smi = bin_dir / "nvidia-smi"
    free_mib = (MARGIN + 100 * MiB + 300 * MiB) >> 20  # five layers' room
    smi.write_text(f"#!/bin/sh\necho {free_mib}\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")

    loaded: dict[str, int] = {}

    def loader(settings: Settings, e: Entry) -> FakeEngine:
        loaded[e.id] = e.profile.n_gpu_layers
        engine = FakeEngine()
        engine.info.id = e.id
        return engine

    catalog = DictCatalog([entry("auto", AUTO_GPU_LAYERS), entry("three", 3)])
    pool = ModelPool(
        Settings(max_loaded_models=2),
        catalog,
        budget=8 << 30,
        loader=loader,
        free_vram=lambda: facts.free_vram_bytes(lib),
    )
    pool.start()
    try:
        body = {"model": "three", "messages": [{"role": "user", "content": "hi"}]}
        assert pool.submit("/v1/chat/completions", body).result(10)["model"] == "three"
        # auto became five layers; a number set for a model (models.toml) stays as it is.
        assert loaded == {"auto": 5, "three": 3}
        # The berth is still the catalog's entry (keyed by its own profile).
        assert {v.entry.id: v.state for v in pool.views()} == {"auto": "idle", "three": "idle"}
        # Without nvidia-smi (or on a CPU build), auto is no layer at all.
        monkeypatch.setenv("PATH", "/nonexistent")
        assert pool._loads._placed([catalog.default()])[0].profile.n_gpu_layers == 0
    finally:
        pool.close()
