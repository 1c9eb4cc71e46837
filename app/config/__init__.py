"""Settings: command-line flags over BATCHYARD_* environment variables over defaults."""

from __future__ import annotations

from app.config.settings import KV_CACHE_TYPES, Settings, default_model_path

__all__ = ["KV_CACHE_TYPES", "Settings", "default_model_path"]
