"""The `batchyard` command's shared flags: the engine's, upstreams', images' and the catalog's,
each a Settings field, and the Settings they make."""

from __future__ import annotations

import argparse
from dataclasses import fields
from typing import Any

from app.config import Settings, parse_gpu_layers

#: serve's flags: (flag, Settings field, type, help).
SERVE_FLAGS: list[tuple[str, str, Any, str]] = [
    ("--host", "host", str, "address to bind"),
    ("--port", "port", int, "port to listen on"),
    (
        "--model",
        "model",
        str,
        "path to a .gguf model (default: the embedded SmolLM2-135M-Instruct)",
    ),
    (
        "--data-dir",
        "data_dir",
        str,
        "where the database and files live (default: the platform's user data dir)",
    ),
    (
        "--n-gpu-layers",
        "n_gpu_layers",
        parse_gpu_layers,
        "layers to offload to the GPU: a number, -1 (all) or auto (default: as many as the "
        "free VRAM holds, none without a GPU)",
    ),
    ("--parallel", "parallel", int, "sequences decoded together (0: 32 on CPU, 64 on GPU)"),
    ("--ctx-size", "ctx_size", int, "context per slot, in tokens"),
    ("--kv-cache-type", "kv_cache_type", str, "KV cache type: q8_0, f16, bf16 or q4_0"),
    (
        "--shared-prefix-cells",
        "shared_prefix_cells",
        int,
        "KV cells for batch lines that share a long block, forked from it in one stream "
        "(-1: 4 x ctx-size; 0: none)",
    ),
    ("--threads", "threads", int, "CPU threads for llama.cpp (0: every core)"),
    (
        "--engine-priority",
        "engine_priority",
        str,
        "the engine's CPU priority: low (the API and other programs go first), normal, or "
        "auto (low on a CPU, normal on a GPU)",
    ),
    (
        "--cpu-extra-buffers",
        "cpu_extra_buffers",
        str,
        "llama.cpp's extra CPU buffer types (AMX, repacked weights): auto (check once), on or off",
    ),
    (
        "--cache-dir",
        "cache_dir",
        str,
        "where the CPU check keeps its verdicts (default: the platform's user cache dir)",
    ),
    (
        "--api-keys-file",
        "api_keys_file",
        str,
        "file with one API key per line (optionally: KEY webhook_url=URL webhook_secret=whsec_...)",
    ),
    ("--webhook-url", "webhook_url", str, "where batch events are sent (Standard Webhooks)"),
    ("--webhook-secret", "webhook_secret", str, "the secret that signs webhooks (whsec_...)"),
    ("--log-level", "log_level", str, "debug, info, warning or error"),
    (
        "--database-url",
        "database_url",
        str,
        "SQLAlchemy URL: postgresql+psycopg://USER@HOST/DB shares one queue between nodes "
        "(default: SQLite in the data dir, one process)",
    ),
    (
        "--files-url",
        "files_url",
        str,
        "s3://BUCKET/PREFIX keeps file bytes in object storage every node reaches (credentials "
        "from the AWS environment, profile or role; default: the data dir)",
    ),
    (
        "--s3-endpoint",
        "s3_endpoint",
        str,
        "the S3-compatible store's URL when it is not AWS (MinIO, SeaweedFS, R2, Ceph)",
    ),
    (
        "--models-config",
        "models_config",
        str,
        "models.toml: per-model ctx_size, parallel, n_gpu_layers, kv_cache_type, chat_template "
        "and aliases (default: the data dir's models.toml, if any)",
    ),
    (
        "--default-model",
        "default_model",
        str,
        "the model of lines whose model names nothing known (default: the embedded SmolLM2)",
    ),
    (
        "--max-loaded-models",
        "max_loaded_models",
        int,
        "most models loaded at once (0: as many as the memory budget holds)",
    ),
    (
        "--models-memory",
        "models_memory",
        str,
        "memory for loaded models, as 8GiB (default: the free RAM less a margin, or the "
        "free VRAM on a GPU build)",
    ),
    ("--model-ttl", "model_ttl", str, "unload a model idle this long (10m, 1h; 0: never)"),
    (
        "--model-switch-after",
        "model_switch_after",
        str,
        "the longest another model's lines wait for the loaded model's queue to drain",
    ),
    (
        "--reasoning-field",
        "reasoning_field",
        str,
        "the field chat answers carry a model's thought in: reasoning_content (llama-server's, "
        "SGLang's), reasoning (vLLM's, Ollama's) or both",
    ),
    (
        "--reasoning-budget",
        "reasoning_budget",
        int,
        "the thinking budget in tokens of a request to the embedded engine that names none "
        "(thinking_token_budget; -1: none)",
    ),
    (
        "--completion-windows",
        "completion_windows",
        str,
        "the completion windows a batch may ask for besides OpenAI's 24h, comma-separated, "
        "each from 1 hour to 7 days (90m, 1h, 48h, 7d)",
    ),
    ("--node-name", "node_name", str, "this node's name in claims, /health and /metrics"),
    (
        "--max-image-bytes",
        "max_image_bytes",
        int,
        "the largest image a line may hold, by data URL, file id or fetched URL, in bytes",
    ),
    (
        "--image-fetch-timeout",
        "image_fetch_timeout",
        float,
        "seconds an image URL's fetch may take, redirects included",
    ),
    (
        "--lease-seconds",
        "lease_seconds",
        int,
        "how long a claimed line may go unrenewed before another node takes it over",
    ),
]
#: What `batchyard worker` takes: a node runs lines; it serves no HTTP.
WORKER_FLAGS = (
    "model", "data_dir", "n_gpu_layers", "parallel", "ctx_size", "kv_cache_type",
    "shared_prefix_cells", "threads", "engine_priority", "cpu_extra_buffers", "cache_dir", "log_level", "database_url", "node_name",
    "lease_seconds", "files_url", "s3_endpoint", "models_config", "default_model",
    "max_loaded_models", "models_memory", "model_ttl", "model_switch_after",
    "max_image_bytes", "image_fetch_timeout", "reasoning_field", "reasoning_budget",
    # A batch that ends on a worker queues its webhook there: the same endpoints as serve's.
    "api_keys_file", "webhook_url", "webhook_secret",
)  # fmt: skip


def _defaults() -> dict[str, Any]:
    return {f.name: f.default for f in fields(Settings) if not callable(f.default_factory)}


def add_engine_flags(p: argparse.ArgumentParser, names: tuple[str, ...]) -> None:
    defaults = _defaults()
    for flag, name, typ, text in SERVE_FLAGS:
        if name in names:
            shown = defaults.get(name)
            p.add_argument(
                flag,
                dest=name,
                type=typ,
                default=None,
                help=f"{text} [env {Settings.env_name(name)}; default: {shown!r}]",
            )


def add_upstream_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--engine",
        dest="engine",
        action="append",
        default=None,
        metavar="NAME=KIND:URL[,key=K,models=a|b,concurrency=N]",
        help="an upstream OpenAI-compatible server that serves the models it lists, or the ones "
        "named in models= (repeatable); KIND is openai, or the server's own: vllm, sglang, "
        "llama-server, ollama, batchyard (its reasoning controls written its way) "
        f"[env {Settings.env_name('engine')}, ';'-separated; default: none]",
    )
    p.add_argument(
        "--no-embedded",
        dest="no_embedded",
        action="store_true",
        default=None,
        help="do not load the embedded model: serve the --engine upstreams only, and answer "
        f"404 for other models [env {Settings.env_name('no_embedded')}=1; default: load it]",
    )


def add_image_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--allow-private-image-urls",
        dest="allow_private_image_urls",
        action="store_true",
        default=None,
        help="fetch image URLs on loopback, private and link-local addresses too "
        f"[env {Settings.env_name('allow_private_image_urls')}=1; default: public addresses only]",
    )


#: The catalog's settings (app/catalog/): where models are found and what a name means.
CATALOG_FLAGS = ("model", "data_dir", "models_config", "default_model")


def add_catalog_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--models-dir",
        dest="models_dir",
        action="append",
        default=None,
        metavar="DIR",
        help="a folder of GGUF models (repeatable) "
        f"[env {Settings.env_name('models_dir')}, ':'-separated; default: DATA_DIR/models]",
    )
    p.add_argument(
        "--no-discover",
        dest="no_discover",
        action="store_true",
        default=None,
        help="do not read the home stores (Ollama, LM Studio, the Hugging Face cache) "
        f"[env {Settings.env_name('no_discover')}=1; default: read them]",
    )


def settings_of(args: argparse.Namespace) -> Settings:
    names = {f.name for f in fields(Settings)}
    try:
        return Settings.load({k: v for k, v in vars(args).items() if k in names})
    except ValueError as exc:
        raise SystemExit(f"batchyard: {exc}") from None
