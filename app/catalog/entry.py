"""A catalog entry: one model file the user has, by the names they use, and what loading it
would take. Entries are fixed facts read from disk; nothing here loads a model.

The contract between the catalog (which finds entries), the engine pool (which loads them
within a memory budget) and whatever lists them (`/v1/models`, `batchyard models`, the
dashboard's Models page).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

#: Where an entry was found.
SOURCES = ("default", "model", "models-dir", "ollama", "lmstudio", "hf")


@dataclass(frozen=True)
class LoadProfile:
    """How a model is loaded: its per-model settings (models.toml) over the server's flags.
    Engines are keyed by (file, profile), so two names for one file share one engine and
    a line's options never force a reload."""

    ctx_size: int  # context per sequence, in tokens
    parallel: int  # sequences decoded together; 0: the engine decides
    n_gpu_layers: int  # -1 all, 0 none; the pool resolves "auto" before loading
    kv_cache_type: str  # f16, bf16, q8_0, q4_0
    chat_template: str | None = None  # a Jinja chat template in place of the GGUF's own
    #: KV cells of the shared-prefix context (--shared-prefix-cells): -1 four times
    #: ctx_size, 0 none (and none without the prefix cache).
    shared_prefix_cells: int = 0

    @property
    def shared_cells(self) -> int:
        """The shared-prefix context's cells this profile loads (0: none)."""
        if self.shared_prefix_cells < 0:
            return 4 * self.ctx_size
        return self.shared_prefix_cells


@dataclass(frozen=True)
class HeaderFacts:
    """What the GGUF header says, as far as listing and the memory estimate need it."""

    architecture: str
    n_layer: int
    n_head_kv: int
    key_length: int  # per head
    value_length: int  # per head
    n_embd: int
    context_length: int  # trained context
    file_type: int | None
    tensor_bytes: int  # all tensors' data, every shard
    has_chat_template: bool
    n_vocab: int = 0  # tokens; sizes the logits in the compute estimate
    n_ff: int = 0  # feed-forward width (the largest layer's)
    #: `tokenizer.chat_template`, the Jinja source (None without one): whether the model
    #: writes a thought is read from it (`app.engine.reasoning.detect`).
    chat_template: str | None = None


@dataclass(frozen=True)
class ProjectorFacts:
    """What a multimodal projector's header (a `clip` GGUF, llama.cpp's mmproj) says, as far
    as the memory estimate needs it. Zeros where the header does not say."""

    projector_type: str  # clip.projector_type: gemma3, idefics3, qwen2.5vl_merger, ...
    tensor_bytes: int
    image_size: int  # clip.vision.image_size, in pixels a side
    patch_size: int  # clip.vision.patch_size
    n_embd: int  # clip.vision.embedding_length
    n_ff: int  # clip.vision.feed_forward_length


@dataclass(frozen=True)
class Estimate:
    """Bytes a loaded model is expected to hold, before it is loaded."""

    weights: int
    kv_cache: int
    compute: int
    #: Its multimodal projector's weights and image-encoding buffer (0 without one): the
    #: pool's budget counts it, the Models page shows it apart.
    projector: int = 0

    @property
    def total(self) -> int:
        return self.weights + self.kv_cache + self.compute + self.projector


@dataclass(frozen=True)
class Entry:
    """One model: its id, every name that means it, its file and how it is loaded."""

    id: str  # the name answers carry in `model`: gemma3:270m, ORG/REPO:Q4_K_M, a file's stem
    names: frozenset[str]  # every spelling that resolves here: the id, aliases, `:latest` forms
    source: str  # one of SOURCES
    path: Path  # the file llama.cpp opens (a split model's first part)
    size_bytes: int  # every part together
    mtime: float
    quantization: str  # Q4_K_M, Q4_1, F16, ... or "unknown"
    profile: LoadProfile
    facts: HeaderFacts | None = None  # None when the header could not be read (see error)
    estimate: Estimate | None = None  # None when facts is
    paths: tuple[Path, ...] = field(default=())  # every part of a split model, in order
    error: str = ""  # why the file cannot be used, as a user should read it
    is_default: bool = False  # the model of lines whose `model` names nothing known
    #: Its multimodal projector (an mmproj GGUF): the model takes images when it has one.
    #: Found beside the model by its store, or named by models.toml's `mmproj`.
    projector: Path | None = None
    projector_facts: ProjectorFacts | None = None  # None when projector is

    @property
    def takes_images(self) -> bool:
        return self.projector is not None

    @property
    def key(self) -> tuple[str, LoadProfile]:
        """What a loaded engine is keyed by: the file itself (symlinks and Ollama's blobs
        resolved) and the load profile; never the name."""
        return (str(self.path.resolve()), self.profile)

    @property
    def architecture(self) -> str:
        return self.facts.architecture if self.facts else ""

    @property
    def context_length(self) -> int:
        return self.facts.context_length if self.facts else 0

    @property
    def chat_template(self) -> str | None:
        """The chat template it loads with: models.toml's, else its GGUF's (as the engine
        takes them)."""
        return self.profile.chat_template or (self.facts.chat_template if self.facts else None)
