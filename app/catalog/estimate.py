"""What a model will hold once loaded, from its header and load profile, before loading it.

Three terms, each the size of a buffer llama.cpp allocates when the embedded engine loads
a model as `app/engine/llama/binding/native.py` does (one KV stream per sequence, n_ubatch 512):

- weights: every tensor's bytes, as the header lists them (all parts of a split model);
- KV cache: n_layer x n_head_kv x (key_length + value_length) x bytes per element of the
  cache type x ctx_size x sequences (parallel, plus one for online requests where
  parallel > 1). llama.cpp's `llama_kv_cache: size = ...` line. Models
  with sliding-window layers (Gemma 3) get the full-size cache for those layers too when
  each sequence has its own stream, so the same formula holds for them;
- compute: the scheduler's compute buffer plus the output buffer. On a CPU the compute
  buffer is dominated by one micro-batch's logits and feed-forward activations, in f32:
  n_ubatch x (n_vocab + n_ff) x 4; the output buffer holds one row of logits per
  sequence: sequences x n_vocab x 4;
- the shared-prefix context, where the profile has one (engine/llama/contexts/shared.py; 8 or more
  sequences): its f16 KV cells (4 x ctx_size by default), a second compute buffer, and an
  output buffer of at most 256 rows (llama.cpp's most sequences); and in host memory, the
  cells of up to 3 parked blocks, each at most ctx_size. SmolLM2 at ctx 2048: 180 MiB of
  KV and 135 MiB parked at most, 462 MiB in all estimated; the process measured 231 MiB
  more with the context than without (1,211 against 980 MiB, before blocks were parked),
  its compute buffer's pages untouched until a micro-batch needs them;
- the projector, where the model has one (a separate field, `Estimate.projector`): its
  tensors' bytes plus the image encoder's compute buffer. libmtmd reserves that buffer for
  one image of the projector's own input size, with flash attention (on by default where
  the backend has it), so it grows with the patches, not their square: n_patches x
  (4 x n_embd + n_ff) x 4 bytes, n_patches = (image_size / patch_size)^2 capped at
  MAX_PATCHES (projectors of dynamic resolution warm up on a bounded image too), or
  DEFAULT_PATCHES where the header gives no sizes. Checked against libmtmd 0.3.36's own
  `CPU compute buffer size` for random projectors of real widths (bench/vision_model.py's
  writer): Gemma 3's SigLIP (896 px, 14 px patches, 1152 wide, 4304 feed-forward)
  4096 x 8912 x 4 = 139.3 MiB against 121.25 measured; SmolVLM-like idefics3 (512 px, 16 px
  patches, 768 wide, 3072 feed-forward) 24.0 against 21.0 MiB. The buffer does not grow
  with the encoder's depth (121.25 MiB at 2 and at 6 layers): ggml reuses it layer after
  layer. Then the encoded images the engine keeps, IMAGE_CACHE_BYTES at most beside those
  of lines in flight. The pool's measure after a load replaces the estimate, as for the
  other terms.

Checked against llama.cpp 0.3.36's own figures (llama-cpp-python, CPU, flash attention):
SmolLM2-135M at ctx 2048 x 32: KV 765.0 MiB (formula 765.0), compute 99.4 + output 6.0 MiB
(formula 99.0 + 6.0); Gemma 3 270M: KV 612.0 MiB (612.0), compute 514.5 + output 32.0 MiB
(516.0 + 32.0). A GPU build adds its own buffers per device; what the pool measures after
a load replaces the estimate.

What a process then holds differs from what llama.cpp reserves, both ways. Measured on
this project's machine (RSS after the load, the context and one 512-token decode, q8_0,
ctx 2048 x 32): SmolLM2 holds 901.6 MiB anonymous + 93.9 MiB of its mapped file against
962.1 estimated (3.5% more: with llama.cpp's extra CPU buffer types the repacked layers are
an anonymous copy while the file stays mapped); Gemma 3 holds 930.6 + 236.9 MiB against
1395.2 (16% less: the compute buffer is reserved for a whole micro-batch of logits, and on
a CPU its pages are touched only when every row asks for logits). The estimate stays
llama.cpp's reservation: it is what a GPU allocates, and it never admits a load that the
worst micro-batch would not fit. So is the pool's measure, which adds up the buffers
llama.cpp logs as the model loads (engine/llama/binding/buffers.py): at the server's defaults
SmolLM2 measures 1,288.7 MiB against 1,424.1 estimated, Gemma 3 2,320.8 against 2,419.2,
the difference mostly the parked blocks' host memory (135 and 108 MiB), not taken at load.
"""

from __future__ import annotations

import gguf

from app.catalog.entry import Estimate, HeaderFacts, LoadProfile, ProjectorFacts

#: Micro-batch size of the generation context: prompt chunks and decode rows run in these
#: (native.py's loads read it here, as the estimate does).
N_UBATCH = 512
#: Sequences when a profile's parallel is 0, as the engine picks on a CPU
#: (native.default_parallel); a GPU build picks more, and the pool estimates again then.
DEFAULT_PARALLEL = 32
#: Sequences the main context holds besides the slots, for online requests: batch lines
#: never take them (the engine's slots.py and native.py read it here).
ONLINE_SEQUENCES = 1
#: The shared-prefix context's K/V type: the CPU's flash attention multiplies tiles (64 query
#: rows by 64 cells) only over f16 or f32 K/V; q8_0 takes its row-at-a-time kernel.
SHARED_KV = "f16"
#: llama.cpp's most sequences a context may have (LLAMA_MAX_SEQ).
LLAMA_MAX_SEQ = 256
#: Fewer slots than this, no shared-prefix context: a node run with a few slots (a test
#: node, a machine shared with other work) keeps to them.
MIN_SHARED_SLOTS = 8
#: Idle blocks the shared-prefix context keeps parked in host memory (shared.py's
#: KEEP_IDLE), each at most a line's context.
PARKED_BLOCKS = 3
#: Bytes per element of each KV cache type (blocks of 32 elements for the quantized ones).
KV_BYTES_PER_ELEMENT = {
    "f16": 2.0,
    "bf16": 2.0,
    "q8_0": gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType.Q8_0][1] / 32,
    "q4_0": gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType.Q4_0][1] / 32,
}
_F32 = 4
#: The most image patches the projector's compute buffer is estimated for, and the patches
#: of a projector whose header gives no image or patch size (see the module's note).
MAX_PATCHES = 4096
DEFAULT_PATCHES = 1024


def sequences(profile: LoadProfile) -> int:
    """The slots batch lines take (--parallel)."""
    return profile.parallel if profile.parallel > 0 else DEFAULT_PARALLEL


def context_sequences(n_slots: int) -> int:
    """The sequences of a main context with `n_slots` slots: ONLINE_SEQUENCES more, which
    batch lines never take, so an online request never waits for a batch line to finish
    while batch lines still decode as many at once as --parallel says (llama-server -np N's
    N; bench/models.py); except for a single slot, which every request shares. The engine
    makes its context with this many (native.load), and the estimate counts their KV."""
    return n_slots + ONLINE_SEQUENCES if n_slots > 1 else n_slots


def shared_cells(profile: LoadProfile) -> int:
    """The shared-prefix context's cells a load takes (0: none)."""
    return profile.shared_cells if sequences(profile) >= MIN_SHARED_SLOTS else 0


def kv_cache_bytes(facts: HeaderFacts, profile: LoadProfile) -> int:
    per_token = facts.n_layer * facts.n_head_kv * (facts.key_length + facts.value_length)
    cells = profile.ctx_size * context_sequences(sequences(profile))
    main = per_token * KV_BYTES_PER_ELEMENT[profile.kv_cache_type] * cells
    stream = shared_cells(profile)
    parked = PARKED_BLOCKS * min(profile.ctx_size, stream)
    shared = per_token * KV_BYTES_PER_ELEMENT[SHARED_KV] * (stream + parked)
    return int(main + shared)


def compute_bytes(facts: HeaderFacts, profile: LoadProfile) -> int:
    n_ff = facts.n_ff or 4 * facts.n_embd  # the usual width when a header does not say
    scratch = N_UBATCH * (facts.n_vocab + n_ff) * _F32
    output = context_sequences(sequences(profile)) * facts.n_vocab * _F32
    if shared_cells(profile):
        # The shared-prefix context has its own compute buffer, and a row of logits for
        # each of its sequences (at most llama.cpp's most).
        return 2 * scratch + output + LLAMA_MAX_SEQ * facts.n_vocab * _F32
    return scratch + output


#: Encoded images a loaded model keeps, in bytes of embedding rows, besides those pinned by
#: requests still queued or running (a 256-row image of a 2,560-wide model is 2.6 MB; one of
#: the test pair, 32 rows of 576, 74 KB): counted in a projector's estimate, and the engine's
#: bound (engine/llama/binding/vision.py).
IMAGE_CACHE_BYTES = 64 * 1024 * 1024


def projector_bytes(projector: ProjectorFacts) -> int:
    """A projector's weights, its image encoder's compute buffer and the encoded images kept
    (see the module's note)."""
    if projector.image_size > 0 and projector.patch_size > 0:
        side = projector.image_size // projector.patch_size
        patches = min(side * side, MAX_PATCHES)
    else:
        patches = DEFAULT_PATCHES
    n_ff = projector.n_ff or 4 * projector.n_embd
    buffer = patches * (4 * projector.n_embd + n_ff) * _F32
    return projector.tensor_bytes + buffer + IMAGE_CACHE_BYTES


def estimate(
    facts: HeaderFacts, profile: LoadProfile, projector: ProjectorFacts | None = None
) -> Estimate:
    """The bytes a model loaded with `profile` (and `projector`, where it has one) is
    expected to hold (see the module's note)."""
    return Estimate(
        weights=facts.tensor_bytes,
        kv_cache=kv_cache_bytes(facts, profile),
        compute=compute_bytes(facts, profile),
        projector=projector_bytes(projector) if projector is not None else 0,
    )


def human_size(n: int) -> str:
    """Bytes as a person reads them, in powers of 1024: 812.3 MiB, 1.4 GiB."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"  # pragma: no cover - the loop returns
