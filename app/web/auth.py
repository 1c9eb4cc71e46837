"""The dashboard's login: ask for an API key once, then keep a signed session cookie.

Only matters when the server has API keys; without them /login says so and sends the
visitor on. The cookie is HttpOnly and SameSite=Strict, and the auth middleware refuses
cross-site posts, so another site can neither read the session nor act with it.
"""

from __future__ import annotations

from typing import Any

from litestar import Request, get, post
from litestar.datastructures import Cookie
from litestar.response import Redirect, Template

from app.api.auth import SESSION_COOKIE, SESSION_SECONDS, Keys, Sessions


def _safe_next(value: Any) -> str:
    """Only a path on this server: never an open redirect to another site."""
    target = str(value or "/")
    if not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/"
    return target


def _auth(request: Request[Any, Any, Any]) -> tuple[Keys, Sessions]:
    settings = request.app.state.services.settings
    return Keys(settings), Sessions(settings.data_path)


def _page(request: Request[Any, Any, Any], status: int = 200, error: str | None = None) -> Template:
    keys, _ = _auth(request)
    return Template(
        template_name="login.html",
        context={
            "next": _safe_next(request.query_params.get("next")),
            "error": error,
            "keys_required": keys.enabled,
        },
        status_code=status,
    )


@get("/login", name="auth:login_page", include_in_schema=False)
async def login_page(request: Request[Any, Any, Any]) -> Template | Redirect:
    keys, _ = _auth(request)
    if not keys.enabled:
        return Redirect(path=_safe_next(request.query_params.get("next")), status_code=303)
    return _page(request)


@post("/login", name="auth:login", include_in_schema=False, status_code=303)
async def login(request: Request[Any, Any, Any]) -> Template | Redirect:
    form = await request.form()
    keys, sessions = _auth(request)
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
