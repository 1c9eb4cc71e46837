"""The dashboard's login: ask for an API key once, then keep a signed session cookie.

Only matters when the server has API keys; without them /login says so and sends the
visitor on. The cookie is HttpOnly and SameSite=Strict, and the auth middleware refuses
cross-site posts, so another site can neither read the session nor act with it.
"""

from __future__ import annotations

from typing import Any

from litestar import Request, get, post
from litestar.datastructures import Cookie, State
from litestar.response import Redirect, Template

from app.auth.sessions import SESSION_COOKIE, SESSION_SECONDS


def _safe_next(value: Any) -> str:
    """Only a path on this server: never an open redirect to another site."""
    target = str(value or "/")
    if not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/"
    return target


@get("/login", name="auth:login_page")
async def login_page(request: Request[Any, Any, Any], state: State) -> Template | Redirect:
    target = _safe_next(request.query_params.get("next"))
    if not state.auth.keys.enabled:
        return Redirect(path=target, status_code=303)
    return Template(
        template_name="login.html",
        context={"next": target, "error": None, "keys_required": True},
    )


@post("/login", name="auth:login", status_code=303)
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


@post("/logout", name="auth:logout", status_code=303)
async def logout() -> Redirect:
    gone = Cookie(
        key=SESSION_COOKIE, value="", max_age=0, path="/", httponly=True, samesite="strict"
    )
    return Redirect(path="/login", status_code=303, cookies=[gone])


AUTH_ROUTES = [login_page, login, logout]
