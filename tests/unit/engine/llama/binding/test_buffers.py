"""What a load took, from the buffers llama.cpp logs allocating (app/engine/llama/binding/buffers.py):
the lines it reads, and real SmolLM2 loads measured by what llama.cpp itself printed, at
every log level, each load alone even while another runs beside it."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from pathlib import Path

import llama_cpp as lc
import pytest
from llama_cpp import _logger

from app.config import Settings
from app.engine.llama.binding import buffers
from app.engine.llama.engine import LlamaEngine
from app.engine.llama.loading import load_engine
from tests.vision import vision_model  # noqa: F401  (the fixture)

MiB = 1 << 20
SMALL = dict(parallel=2, ctx_size=256)


def test_the_buffer_lines_of_every_kind_are_read_and_the_others_are_not() -> None:
    taken = buffers.Buffers()
    for line in [
        "load_tensors:   CPU_Mapped model buffer size =    93.95 MiB\n",
        "load_tensors:  CPU_REPACK model buffer size =    10.50 MiB\n",
        "llama_context:  CUDA_Host  output buffer size =     1.00 MiB\n",
        "llama_kv_cache:      CUDA0 KV buffer size =    30.00 MiB\n",
        "llama_kv_cache_iswa:        CPU KV buffer size =     2.25 MiB\n",
        "sched_reserve:        CPU compute buffer size =    66.51 MiB\n",
        "reserve_compute_meta:        CPU compute buffer size =    21.00 MiB\n",
        "load_hparams: model size:         3.12 MiB\n",
        # Not buffers: a size checked against its expectation, a projector's metadata, a
        # size without its buffer.
        "sched_reserve:        CPU compute buffer size is  66.5100 MiB, matches expectation\n",
        "load_hparams: metadata size:      0.10 MiB\n",
        "llama_kv_cache: size =   30.00 MiB (   256 cells,  30 layers,  2/2 seqs)\n",
    ]:
        taken.read(line)
    assert [name for name, _ in taken.sizes] == [
        "CPU_Mapped",
        "CPU_REPACK",
        "CUDA_Host",
        "CUDA0",
        "CPU",
        "CPU",
        "CPU",
        "weights",
    ]
    mib = 93.95 + 10.5 + 1.0 + 30.0 + 2.25 + 66.51 + 21.0 + 3.12
    assert taken.total == pytest.approx(mib * MiB, abs=8)


def reported(printed: str) -> int:
    """The bytes of every buffer llama.cpp printed."""
    sizes = re.findall(r"buffer size = +([\d.]+) MiB", printed)
    assert sizes, "llama.cpp printed no buffer sizes"
    return round(sum(float(mib) for mib in sizes) * MiB)


@pytest.fixture
def verbose() -> Iterator[None]:
    """llama-cpp-python prints llama.cpp's lines to stderr (as at --log-level debug)."""
    _logger.set_verbose(True)
    yield
    _logger.set_verbose(False)


def test_a_load_measures_the_buffers_llama_cpp_printed_at_every_log_level(
    capsys: pytest.CaptureFixture[str], verbose: None
) -> None:
    loud = load_engine(Settings(**SMALL, log_level="debug"))
    try:
        printed = capsys.readouterr().err
        assert loud.measured_bytes == pytest.approx(reported(printed), abs=16)
        # The KV buffer as its shape says: 30 layers x 3 KV heads x 64 x (K and V), q8_0
        # (34 bytes a block of 32), 256 cells a sequence, 2 slots and the online sequence.
        kv = re.findall(r"KV buffer size = +([\d.]+) MiB", printed)
        assert float(kv[0]) * MiB == pytest.approx(
            30 * 3 * 64 * 2 * 34 / 32 * 256 * 3, abs=MiB / 100
        )
        # The weights at least: every tensor's bytes.
        assert loud.measured_bytes > lc.llama_model_size(loud._native.model)
    finally:
        loud.close()
    capsys.readouterr()
    quiet = load_engine(Settings(**SMALL))  # info: llama.cpp's lines go unprinted
    try:
        assert "buffer size" not in capsys.readouterr().err
        assert quiet.measured_bytes == loud.measured_bytes
    finally:
        quiet.close()


def test_a_projector_is_measured_by_its_weights_and_its_encoders_buffer(
    capsys: pytest.CaptureFixture[str],
    verbose: None,
    vision_model: Path,  # noqa: F811
) -> None:
    settings = Settings(model=str(vision_model / "model.gguf"), **SMALL, log_level="debug")
    engine = load_engine(settings, projector=vision_model / "mmproj.gguf")
    try:
        printed = capsys.readouterr().err
        # libmtmd's lines come after the text model's.
        text, eyes = printed.split("clip_model_loader", 1)
        weights = re.findall(r"model size: +([\d.]+) MiB", eyes)
        assert len(weights) == 1
        projector = round(float(weights[0]) * MiB) + reported(eyes)
        assert engine.projector_bytes == pytest.approx(projector, abs=16)
        assert engine.measured_bytes == pytest.approx(reported(text) + projector, abs=32)
    finally:
        engine.close()


def load_at_once(settings: list[Settings]) -> list[LlamaEngine]:
    """Load each in a thread of its own, all begun together."""
    engines: list[LlamaEngine | None] = [None] * len(settings)
    start = threading.Barrier(len(settings))

    def load(i: int) -> None:
        start.wait()
        engines[i] = load_engine(settings[i])

    threads = [threading.Thread(target=load, args=(i,)) for i in range(len(settings))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(engines)
    return [e for e in engines if e is not None]


def test_loads_side_by_side_are_each_measured_alone() -> None:
    small, large = Settings(**SMALL), Settings(parallel=4, ctx_size=1024)
    alone = []
    for settings in (small, large):
        engine = load_engine(settings)
        alone.append(engine.measured_bytes)
        engine.close()
    together = load_at_once([small, large])
    try:
        assert [e.measured_bytes for e in together] == alone
        assert alone[0] is not None and alone[1] is not None and alone[1] > alone[0]
    finally:
        for engine in together:
            engine.close()
