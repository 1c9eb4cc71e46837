"""Signed dashboard sessions: after /login, a cookie names the owner the key stood for."""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

from app.auth.keys import Keys

SESSION_COOKIE = "batchyard_session"
SESSION_SECONDS = 7 * 24 * 3600


class Sessions:
    """Signed session cookies: `<owner>.<issued>.<hmac>`, keyed by a per-data-dir secret."""

    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / "session.key"
        self._secret: bytes | None = None

    def secret(self) -> bytes:
        if self._secret is None:
            try:
                self._secret = self.path.read_bytes()
            except FileNotFoundError:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                fresh = secrets.token_bytes(32)
                # O_EXCL: when two processes race, one secret wins and both use it.
                try:
                    fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                except FileExistsError:
                    self._secret = self.path.read_bytes()
                else:
                    with os.fdopen(fd, "wb") as fh:
                        fh.write(fresh)
                    self._secret = fresh
        return self._secret

    def _mac(self, payload: str) -> str:
        return hmac.new(self.secret(), payload.encode(), hashlib.sha256).hexdigest()

    def issue(self, owner: str, t: float | None = None) -> str:
        payload = f"{owner}.{int(time.time() if t is None else t)}"
        return f"{payload}.{self._mac(payload)}"

    def owner_of(self, value: str | None, t: float | None = None) -> str | None:
        """The owner a cookie value was issued to, or None if it is forged or stale."""
        if not value or value.count(".") != 2:
            return None
        owner, issued, mac = value.split(".")
        if not hmac.compare_digest(mac, self._mac(f"{owner}.{issued}")):
            return None
        if (
            not issued.isdigit()
            or (time.time() if t is None else t) - int(issued) > SESSION_SECONDS
        ):
            return None
        return owner


@dataclass
class Auth:
    """The app's keys and session signer, made once by create_app and kept on app.state."""

    keys: Keys
    sessions: Sessions
