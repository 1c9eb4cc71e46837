"""The dashboard's login: ask for an API key once, then keep a signed session cookie.

Only matters when the server has API keys; without them /login says so and sends the
visitor on. The cookie is HttpOnly and SameSite=Strict, and the auth middleware refuses
cross-site posts, so another site can neither read the session nor act with it.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from litestar import Request, get, post
from litestar.datastructures import Cookie, State
from litestar.response import Redirect, Template

if TYPE_CHECKING:
    from app.api.auth import Keys

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


def _safe_next(value: Any) -> str:
    """Only a path on this server: never an open redirect to another site."""
    target = str(value or "/")
    if not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/"
    return target


@get("/login", name="auth:login_page", include_in_schema=False)
async def login_page(request: Request[Any, Any, Any], state: State) -> Template | Redirect:
    target = _safe_next(request.query_params.get("next"))
    if not state.auth.keys.enabled:
        return Redirect(path=target, status_code=303)
    return Template(
        template_name="login.html",
        context={"next": target, "error": None, "keys_required": True},
    )


@post("/login", name="auth:login", include_in_schema=False, status_code=303)
async def login(request: Request[Any, Any, Any], state: State) -> Template | Redirect:
    form = await request.form()
    keys, sessions = state.auth.keys, state.auth.sessions
    target = _safe_next(form.get("next"))
    if not keys.enabled:
        return Redirect(path=target, status_code=303)
    owner = keys.owner_for(str(form.get("api_key") or "").strip())
    if owner is None:
        return Template(
            template_name="login.html",
            context={"next": target, "error": "That key is not valid here.", "keys_required": True},
            status_code=401,
        )
    cookie = Cookie(
        key=SESSION_COOKIE,
        value=sessions.issue(owner),
        max_age=SESSION_SECONDS,
        path="/",
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )
    return Redirect(path=target, status_code=303, cookies=[cookie])


@post("/logout", name="auth:logout", include_in_schema=False, status_code=303)
async def logout() -> Redirect:
    gone = Cookie(
        key=SESSION_COOKIE, value="", max_age=0, path="/", httponly=True, samesite="strict"
    )
    return Redirect(path="/login", status_code=303, cookies=[gone])


AUTH_ROUTES = [login_page, login, logout]
