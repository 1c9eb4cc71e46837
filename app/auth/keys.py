"""API keys and the owners they stand for: each key is its own owner, known by a stable id
derived from the key (never the key itself)."""

from __future__ import annotations

import hashlib
import hmac

from app.config import Settings


def owner_id(key: str) -> str:
    """The owner a key stands for: stable across restarts, and not the key itself."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()[:16]


def mask(key: str) -> str:
    """A key as OpenAI shows it in errors: enough to recognise, never the whole."""
    return key[:3] + "*" * 3 + key[-4:] if len(key) > 8 else "*" * len(key)


class Keys:
    """The configured keys, by owner id; empty means the server is open (local use)."""

    def __init__(self, settings: Settings) -> None:
        try:
            keys = settings.all_api_keys()
        except OSError as exc:
            raise ValueError(
                f"Cannot read the API keys file {settings.api_keys_file}: {exc.strerror}."
            ) from None
        self.by_owner = {owner_id(k): k for k in keys}

    @property
    def enabled(self) -> bool:
        return bool(self.by_owner)

    def owner_for(self, key: str) -> str | None:
        owner = owner_id(key)
        known = self.by_owner.get(owner)
        return owner if known is not None and hmac.compare_digest(known, key) else None

    def knows(self, owner: str) -> bool:
        return owner in self.by_owner


def keys_problem(settings: Settings) -> str | None:
    """Why the configured keys cannot be read, or None (checked before the server starts)."""
    try:
        Keys(settings)
    except ValueError as exc:
        return str(exc)
    return None
