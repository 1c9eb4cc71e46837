"""Settings: command-line flags over BATCHYARD_* environment variables over defaults."""

from __future__ import annotations

from app.config.settings import (
    AUTO_GPU_LAYERS,
    KV_CACHE_TYPES,
    REASONING_FIELDS,
    Settings,
    bundled_model_path,
    parse_gpu_layers,
)

__all__ = [
    "AUTO_GPU_LAYERS",
    "KV_CACHE_TYPES",
    "REASONING_FIELDS",
    "Settings",
    "bundled_model_path",
    "parse_gpu_layers",
]
