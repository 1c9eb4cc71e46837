"""The webhook secret's format: `whsec_` and base64, as OpenAI issues them, or any raw text;
checked when settings load, so a secret that cannot sign stops the server at start."""

from __future__ import annotations

import base64
import binascii

SECRET_PREFIX = "whsec_"


def secret_key(secret: str) -> bytes:
    """The HMAC key a secret stands for."""
    if secret.startswith(SECRET_PREFIX):
        return base64.b64decode(secret[len(SECRET_PREFIX) :], validate=True)
    return secret.encode()


def secret_problem(secret: str, where: str) -> str | None:
    """Why `secret` cannot sign, or None."""
    if not secret:
        return f"{where} is empty."
    try:
        key = secret_key(secret)
    except (binascii.Error, ValueError):
        return f"{where} starts with 'whsec_' but the rest is not base64."
    if len(key) < 16:
        return f"{where} is too short: a webhook secret needs at least 16 bytes of key."
    return None
