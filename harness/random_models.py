"""Random-weight GGUF models of any llama shape, with SmolLM2's tokenizer: what speed and
memory depend on (shapes and tensor types), not what the weights say. bench/gpu_models.py
writes them for the GPU benchmark; tests/models.py's `random_model` for memory tests.

`extract_tokenizer` saves the embedded SmolLM2's tokenizer and chat template (the one step
that needs the model file and `app`); `write_model` needs only it and the `gguf` package:
Q4_1 layers, Q8_0 embeddings, tied output, random quantized blocks at about the scale of a
trained model's, so activations stay finite.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Shapes:
    name: str
    n_layer: int
    n_embd: int
    n_ff: int
    n_head: int
    n_head_kv: int
    rope_theta: float


TOKENIZER_KEYS = (
    "tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens",
    "tokenizer.ggml.token_type", "tokenizer.ggml.merges", "tokenizer.ggml.bos_token_id",
    "tokenizer.ggml.eos_token_id", "tokenizer.ggml.unknown_token_id",
    "tokenizer.ggml.padding_token_id", "tokenizer.ggml.add_bos_token",
    "tokenizer.ggml.add_space_prefix", "tokenizer.chat_template",
)  # fmt: skip


def extract_tokenizer(out: Path) -> None:
    """The embedded model's tokenizer and chat template, as gzipped JSON (about 1 MB)."""
    import gguf

    from app.config import bundled_model_path

    reader = gguf.GGUFReader(str(bundled_model_path()))
    data: dict[str, Any] = {}
    for key in TOKENIZER_KEYS:
        value = reader.fields[key].contents()
        data[key] = value.item() if isinstance(value, np.generic) else value
    out.write_bytes(gzip.compress(json.dumps(data).encode(), 9))


def _q4_1(rng: np.random.Generator, rows: int, cols: int) -> np.ndarray:
    """Random Q4_1 blocks (f16 scale, f16 min, 16 bytes of 4-bit values per 32 weights):
    weights of about 0.02 standard deviation, centred on 0."""
    blocks = rows * cols // 32
    out = np.empty((blocks, 20), dtype=np.uint8)
    scale = np.float16(0.02 / 4.6)  # uniform 0..15 has a standard deviation of about 4.6
    out[:, 0:2] = np.frombuffer(scale.tobytes(), dtype=np.uint8)
    out[:, 2:4] = np.frombuffer(np.float16(-7.5 * float(scale)).tobytes(), dtype=np.uint8)
    out[:, 4:] = rng.integers(0, 256, size=(blocks, 16), dtype=np.uint8)
    return out.reshape(rows, cols // 32 * 20)


def _q8_0(rng: np.random.Generator, rows: int, cols: int) -> np.ndarray:
    """Random Q8_0 blocks (f16 scale, 32 signed bytes per 32 weights), about 0.02 std."""
    blocks = rows * cols // 32
    out = np.empty((blocks, 34), dtype=np.uint8)
    out[:, 0:2] = np.frombuffer(np.float16(0.02 / 73.6).tobytes(), dtype=np.uint8)
    out[:, 2:] = rng.integers(0, 256, size=(blocks, 32), dtype=np.uint8)
    return out.reshape(rows, cols // 32 * 34)


def write_model(shapes: Shapes, tokenizer: dict[str, Any], path: Path) -> int:
    """Write one model; returns its parameter count."""
    import gguf

    q4_1, q8_0 = gguf.GGMLQuantizationType.Q4_1, gguf.GGMLQuantizationType.Q8_0
    rng = np.random.default_rng(0)
    s = shapes
    n_vocab = len(tokenizer["tokenizer.ggml.tokens"])
    head_dim = s.n_embd // s.n_head
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name(s.name)
    w.add_block_count(s.n_layer)
    w.add_context_length(8192)
    w.add_embedding_length(s.n_embd)
    w.add_feed_forward_length(s.n_ff)
    w.add_head_count(s.n_head)
    w.add_head_count_kv(s.n_head_kv)
    w.add_rope_freq_base(s.rope_theta)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_1)
    w.add_vocab_size(n_vocab)
    w.add_rope_dimension_count(head_dim)
    w.add_tokenizer_model(tokenizer["tokenizer.ggml.model"])
    w.add_tokenizer_pre(tokenizer["tokenizer.ggml.pre"])
    w.add_token_list(tokenizer["tokenizer.ggml.tokens"])
    w.add_token_types(tokenizer["tokenizer.ggml.token_type"])
    w.add_token_merges(tokenizer["tokenizer.ggml.merges"])
    w.add_bos_token_id(tokenizer["tokenizer.ggml.bos_token_id"])
    w.add_eos_token_id(tokenizer["tokenizer.ggml.eos_token_id"])
    w.add_unk_token_id(tokenizer["tokenizer.ggml.unknown_token_id"])
    w.add_pad_token_id(tokenizer["tokenizer.ggml.padding_token_id"])
    w.add_add_bos_token(tokenizer["tokenizer.ggml.add_bos_token"])
    w.add_add_space_prefix(tokenizer["tokenizer.ggml.add_space_prefix"])
    w.add_chat_template(tokenizer["tokenizer.chat_template"])
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)

    params = 0

    def add(name: str, rows: int, cols: int, kind: Any = q4_1) -> None:
        nonlocal params
        params += rows * cols
        data = _q8_0(rng, rows, cols) if kind == q8_0 else _q4_1(rng, rows, cols)
        w.add_tensor(name, data, raw_dtype=kind)

    def norm(name: str) -> None:
        nonlocal params
        params += s.n_embd
        w.add_tensor(name, np.ones(s.n_embd, dtype=np.float32))

    kv = s.n_head_kv * head_dim
    add("token_embd.weight", n_vocab, s.n_embd, q8_0)  # tied: no output.weight
    norm("output_norm.weight")
    for i in range(s.n_layer):
        norm(f"blk.{i}.attn_norm.weight")
        add(f"blk.{i}.attn_q.weight", s.n_embd, s.n_embd)
        add(f"blk.{i}.attn_k.weight", kv, s.n_embd)
        add(f"blk.{i}.attn_v.weight", kv, s.n_embd)
        add(f"blk.{i}.attn_output.weight", s.n_embd, s.n_embd)
        norm(f"blk.{i}.ffn_norm.weight")
        add(f"blk.{i}.ffn_gate.weight", s.n_ff, s.n_embd)
        add(f"blk.{i}.ffn_up.weight", s.n_ff, s.n_embd)
        add(f"blk.{i}.ffn_down.weight", s.n_embd, s.n_ff)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return params
