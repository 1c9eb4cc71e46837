"""The memory estimate against a hand computation from each model's shape, and the
fixtures' random-weight models against the shapes asked for."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from app.catalog import LoadProfile
from app.catalog.estimate import (
    DEFAULT_PARALLEL,
    ONLINE_SEQUENCES,
    context_sequences,
    estimate,
    human_size,
)
from app.catalog.header import read_facts
from app.engine.llama.binding import native
from app.engine.llama.contexts import shared, slots
from tests.models import gemma, random_model, smollm2

MiB = 1 << 20


def test_smollm2_at_the_servers_defaults() -> None:
    facts = read_facts([smollm2()])
    est = estimate(
        facts, LoadProfile(ctx_size=2048, parallel=0, n_gpu_layers=0, kv_cache_type="q8_0")
    )
    # 30 layers x 3 KV heads x (64 + 64) x 34/32 bytes (q8_0) x 2048 tokens x 33 sequences
    # (32 slots and the online one).
    assert est.kv_cache == 30 * 3 * 128 * 34 * 2048 * 33 // 32 == 827_228_160
    # One micro-batch's logits and FFN activations in f32, plus a row of logits a sequence.
    assert est.compute == 512 * (49152 + 1536) * 4 + 33 * 49152 * 4
    assert est.weights == 96_576_768  # the tensors; the file is 98,362,432 bytes
    assert est.total == 96_576_768 + 827_228_160 + 110_297_088


def test_gemma_3_at_ctx_4096_by_one_in_f16() -> None:
    facts = read_facts([gemma()])
    est = estimate(
        facts, LoadProfile(ctx_size=4096, parallel=1, n_gpu_layers=0, kv_cache_type="f16")
    )
    # 18 layers x 1 KV head x (256 + 256) x 2 bytes x 4096 tokens.
    assert est.kv_cache == 18 * 1 * 512 * 2 * 4096 == 72 * MiB
    assert est.compute == 512 * (262144 + 2048) * 4 + 1 * 262144 * 4
    assert est.weights == 246_587_904


def test_the_estimate_uses_the_engines_parallel() -> None:
    assert native.default_parallel(0) == DEFAULT_PARALLEL


def test_a_context_holds_the_online_sequence_besides_several_slots() -> None:
    assert ONLINE_SEQUENCES == 1
    assert [context_sequences(n) for n in (1, 2, 8, 32)] == [1, 3, 9, 33]
    # What a batch line may take of such a context: its slots (slots.py's batch_seqs).
    for n in (1, 2, 8, 32):
        assert slots.Scheduler(context_sequences(n)).batch_seqs == n


def test_sizes_read_as_a_person_reads_them() -> None:
    assert [human_size(n) for n in (0, 1023, 1536, 98_362_432, 3 << 30)] == [
        "0 B",
        "1023 B",
        "1.5 KiB",
        "93.8 MiB",
        "3.0 GiB",
    ]


def test_a_random_weight_model_has_the_shape_asked_for(tmp_path: Path) -> None:
    from harness.random_models import Shapes

    shapes = Shapes(
        "tiny-random", n_layer=2, n_embd=64, n_ff=128, n_head=4, n_head_kv=2, rope_theta=1e4
    )
    path = random_model(tmp_path / "tiny-random.gguf", shapes)
    facts = read_facts([path])
    assert (facts.architecture, facts.n_layer, facts.n_embd, facts.n_ff) == ("llama", 2, 64, 128)
    assert (facts.n_head_kv, facts.key_length, facts.n_vocab) == (2, 16, 49152)
    assert facts.has_chat_template  # SmolLM2's, so the model answers chat requests
    # Q8_0 embeddings (34 bytes a 32) and Q4_1 layers (20 bytes a 32), f32 norms.
    q8 = 49152 * 64 * 34 // 32
    q4 = 2 * (64 * 64 * 2 + 32 * 64 * 2 + 128 * 64 * 3) * 20 // 32
    assert facts.tensor_bytes == q8 + q4 + 4 * 64 * (1 + 2 * 2)


def test_the_shared_prefix_context_adds_its_f16_cells_and_buffers() -> None:
    facts = read_facts([smollm2()])
    plain = LoadProfile(ctx_size=2048, parallel=0, n_gpu_layers=0, kv_cache_type="q8_0")
    with_shared = LoadProfile(
        ctx_size=2048, parallel=0, n_gpu_layers=0, kv_cache_type="q8_0", shared_prefix_cells=-1
    )
    assert with_shared.shared_cells == 4 * 2048
    a, b = estimate(facts, plain), estimate(facts, with_shared)
    # 30 layers x 3 KV heads x (64 + 64) x 2 bytes (f16) x 8,192 cells, and 3 parked
    # blocks of at most 2,048 cells in host memory.
    assert b.kv_cache - a.kv_cache == 30 * 3 * 128 * 2 * (8192 + 3 * 2048) == 315 * MiB
    # A second micro-batch's scratch and 256 rows of logits.
    assert b.compute - a.compute == 512 * (49152 + 1536) * 4 + 256 * 49152 * 4


def test_the_estimate_uses_the_shared_contexts_parked_blocks() -> None:
    from app.catalog import estimate as est

    assert est.PARKED_BLOCKS == shared.KEEP_IDLE


def test_a_load_of_a_few_sequences_has_no_shared_prefix_context() -> None:
    facts = read_facts([smollm2()])
    few = LoadProfile(
        ctx_size=2048, parallel=4, n_gpu_layers=0, kv_cache_type="q8_0", shared_prefix_cells=-1
    )
    assert estimate(facts, few) == estimate(facts, replace(few, shared_prefix_cells=0))
