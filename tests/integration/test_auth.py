"""Owners: API keys on every /v1 route, each key its own files and batches, the dashboard login."""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest
from litestar.testing import TestClient

from app.auth.keys import Keys, owner_id
from app.auth.sessions import SESSION_COOKIE, Sessions
from app.config import Settings
from app.server import create_app, security_notes
from tests.factories import batch_line, jsonl
from tests.fakes import FakeEngine
from tests.http_helpers import (
    MakeClient,
    batch_getter,
    post_batch,
    post_file,
    upload,
    wait_for_status,
)

ALICE, BOB = "sk-alice-0123456789", "sk-bob-9876543210"


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture
def keys(tmp_path: Path) -> dict[str, Any]:
    """The settings of two owners: alice's key in the settings, bob's in a keys file."""
    keys_file = tmp_path / "keys.txt"
    keys_file.write_text(f"# one key per line\n{BOB}\n\n")
    return {"api_keys": [ALICE], "api_keys_file": str(keys_file)}


V1_ROUTES = [
    ("GET", "/v1/files"),
    ("POST", "/v1/files"),
    ("GET", "/v1/files/file-x"),
    ("DELETE", "/v1/files/file-x"),
    ("GET", "/v1/files/file-x/content"),
    ("GET", "/v1/batches"),
    ("POST", "/v1/batches"),
    ("GET", "/v1/batches/batch_x"),
    ("POST", "/v1/batches/batch_x/cancel"),
    ("POST", "/v1/chat/completions"),
    ("POST", "/v1/completions"),
    ("POST", "/v1/embeddings"),
    ("GET", "/v1/models"),
    ("GET", "/v1/models/some-model"),
]


@pytest.mark.parametrize(("method", "path"), V1_ROUTES)
def test_every_v1_route_needs_a_valid_key(
    make_client: MakeClient, keys: dict[str, Any], method: str, path: str
) -> None:
    client = make_client(**keys)
    for headers in (
        {},
        bearer("sk-wrong-key-000000"),
        {"Authorization": ALICE},
        {"Authorization": "Bearer "},
    ):
        r = client.request(method, path, headers=headers)
        assert r.status_code == 401, (headers, r.text)
        assert r.headers["www-authenticate"] == "Bearer"
        err = r.json()["error"]
        assert err["type"] == "invalid_request_error" and err["param"] is None
        assert err["code"] == "invalid_api_key"
    wrong = client.request(method, path, headers=bearer("sk-wrong-key-000000")).json()["error"]
    assert wrong["message"].startswith("Incorrect API key provided: sk-***0000")
    assert "sk-wrong-key-000000" not in wrong["message"]


def test_health_stays_open(make_client: MakeClient, keys: dict[str, Any]) -> None:
    client = make_client(**keys)
    assert client.get("/health").status_code == 200


def test_metrics_take_a_key_like_the_api(make_client: MakeClient, keys: dict[str, Any]) -> None:
    client = make_client(**keys)
    r = client.get("/metrics")
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    r = client.get("/metrics", headers=bearer(BOB))
    assert r.status_code == 200 and "batchyard_ready" in r.text


def test_each_key_sees_only_its_own(
    make_client: MakeClient, keys: dict[str, Any], settings: Settings
) -> None:
    client = make_client(**keys)
    f = upload(client, jsonl(batch_line("a1", "a1"), batch_line("a2", "a2")), headers=bearer(ALICE))
    b = post_batch(client, f["id"], headers=bearer(ALICE)).json()
    done = wait_for_status(batch_getter(client, bearer(ALICE)), b["id"], ("completed",))
    bob_file = upload(client, jsonl(batch_line("b1", "b1")), headers=bearer(BOB))

    for path in (
        f"/v1/files/{f['id']}",
        f"/v1/files/{f['id']}/content",
        f"/v1/files/{done['output_file_id']}/content",
        f"/v1/batches/{b['id']}",
    ):
        r = client.get(path, headers=bearer(BOB))
        assert r.status_code == 404, path
        assert r.json()["error"]["type"] == "invalid_request_error"
    assert client.delete(f"/v1/files/{f['id']}", headers=bearer(BOB)).status_code == 404
    assert client.post(f"/v1/batches/{b['id']}/cancel", headers=bearer(BOB)).status_code == 404
    r = post_batch(client, f["id"], headers=bearer(BOB))
    assert r.status_code == 400 and r.json()["error"]["code"] == "file_not_found"
    assert client.get(f"/v1/files?after={f['id']}", headers=bearer(BOB)).status_code == 404

    bob_files = client.get("/v1/files", headers=bearer(BOB)).json()["data"]
    assert [x["id"] for x in bob_files] == [bob_file["id"]]
    assert client.get("/v1/batches", headers=bearer(BOB)).json()["data"] == []
    alice_files = {x["id"] for x in client.get("/v1/files", headers=bearer(ALICE)).json()["data"]}
    assert alice_files == {f["id"], done["output_file_id"]}
    alice_batches = client.get("/v1/batches", headers=bearer(ALICE)).json()["data"]
    assert [x["id"] for x in alice_batches] == [b["id"]]
    # The alice file is still there after bob's attempts, and the owners are stable ids.
    assert client.get(f"/v1/files/{f['id']}", headers=bearer(ALICE)).status_code == 200
    con = sqlite3.connect(settings.data_path / "batchyard.db")
    owners = dict(con.execute("SELECT id, owner FROM file").fetchall())
    con.close()
    assert owners[f["id"]] == owners[done["output_file_id"]] == owner_id(ALICE)
    assert owners[bob_file["id"]] == owner_id(BOB)
    assert owner_id(ALICE) == owner_id(ALICE) and len(owner_id(ALICE)) == 16
    assert ALICE not in owners.values()


def test_dashboard_login_and_session(make_client: MakeClient, keys: dict[str, Any]) -> None:
    client = make_client(**keys)
    r = client.get("/", follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/login?next=%2F"
    r = client.get("/?x=1", follow_redirects=False, headers={"HX-Request": "true"})
    assert r.status_code == 401 and r.headers["hx-redirect"].startswith("/login?next=")
    page = client.get("/login")
    assert page.status_code == 200 and 'name="api_key"' in page.text

    r = client.post("/login", data={"api_key": "sk-nope", "next": "/"}, follow_redirects=False)
    assert r.status_code == 401 and "not valid" in r.text
    assert SESSION_COOKIE not in client.cookies

    r = client.post("/login", data={"api_key": ALICE, "next": "/?page=2"}, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/?page=2"
    set_cookie = r.headers["set-cookie"]
    assert set_cookie.startswith(f"{SESSION_COOKIE}=")
    lowered = set_cookie.lower()
    assert "httponly" in lowered and "samesite=strict" in lowered and "path=/" in lowered
    value = client.cookies[SESSION_COOKIE]
    assert ALICE not in value and value.startswith(owner_id(ALICE) + ".")
    home = client.get("/", follow_redirects=False)
    assert home.status_code == 200 and 'action="/logout"' in home.text
    # The session is the dashboard's, not an API key.
    assert client.get("/v1/files").status_code == 401

    # A forged cookie (another owner, same signature) is no session.
    forged = owner_id(BOB) + value[len(owner_id(ALICE)) :]
    client.cookies.clear()
    for bad in (forged, value + "0", value.rsplit(".", 1)[0], "", "a.b.c"):
        r = client.get("/", headers={"cookie": f"{SESSION_COOKIE}={bad}"}, follow_redirects=False)
        assert r.status_code == 303, bad
    r = client.get("/", headers={"cookie": f"{SESSION_COOKIE}={value}"}, follow_redirects=False)
    assert r.status_code == 200
    r = client.post("/logout", follow_redirects=False)
    assert r.status_code == 303 and "max-age=0" in r.headers["set-cookie"].lower()


def test_login_never_redirects_off_site(make_client: MakeClient, keys: dict[str, Any]) -> None:
    client = make_client(**keys)
    for target in ("//evil.example/x", "https://evil.example/", "\\\\evil", "javascript:alert(1)"):
        r = client.post("/login", data={"api_key": ALICE, "next": target}, follow_redirects=False)
        assert r.status_code == 303 and r.headers["location"] == "/", target


def test_session_of_a_removed_key_ends(
    make_client: MakeClient, keys: dict[str, Any], settings: Settings
) -> None:
    sessions = Sessions(settings.data_path)
    cookie = sessions.issue(owner_id(BOB))
    assert sessions.owner_of(cookie) == owner_id(BOB)
    assert sessions.owner_of(cookie, t=10**12) is None  # stale
    Path(keys["api_keys_file"]).write_text("")  # bob's key is gone
    c = make_client(**keys)
    r = c.get("/", headers={"cookie": f"{SESSION_COOKIE}={cookie}"}, follow_redirects=False)
    assert r.status_code == 303
    # A second process on the same data dir signs with the same secret.
    assert Sessions(settings.data_path).owner_of(cookie) == owner_id(BOB)
    assert (settings.data_path / "session.key").stat().st_mode & 0o077 == 0


def test_cross_site_posts_are_refused(make_client: MakeClient, keys: dict[str, Any]) -> None:
    client = make_client(**keys)
    evil = {"Origin": "http://evil.example"}
    r = client.post("/login", data={"api_key": ALICE}, headers=evil, follow_redirects=False)
    assert r.status_code == 403 and r.json()["error"]["code"] == "cross_site_request"
    for headers, status in (
        ({"Origin": "null"}, 403),
        ({"Referer": "http://evil.example/page"}, 403),
        ({"Origin": "http://testserver.local"}, 303),  # this site
    ):
        r = client.post("/login", data={"api_key": ALICE}, headers=headers, follow_redirects=False)
        assert r.status_code == status, headers


def test_without_keys_cross_site_posts_to_the_api_are_refused(make_client: MakeClient) -> None:
    c = make_client()
    data = jsonl(batch_line("a", "a"))
    r = post_file(c, data, name="a", headers={"Origin": "http://evil.example"})
    assert r.status_code == 403
    assert c.get("/v1/files").json()["data"] == []
    r = post_file(c, data, name="a")
    assert r.status_code == 200
    assert c.get("/login", follow_redirects=False).status_code == 303


def test_download_names_are_safe(make_client: MakeClient, keys: dict[str, Any]) -> None:
    client = make_client(**keys)
    evil_name = 'we"ird\r\nX-Injected: 1; ü名前.jsonl'
    f = upload(client, jsonl(batch_line("a", "a")), headers=bearer(ALICE), name=evil_name)
    r = client.get(f"/v1/files/{f['id']}/content", headers=bearer(ALICE))
    assert r.status_code == 200
    assert "x-injected" not in {k.lower() for k in r.headers}
    cd = r.headers["content-disposition"]
    assert "\r" not in cd and "\n" not in cd
    assert cd.startswith("attachment; ")
    _, _, encoded = cd.partition("filename*=utf-8''")
    shown = unquote(encoded) if encoded else cd.split('filename="', 1)[1].rstrip('"')
    assert '"' not in shown and "\r" not in shown and "\n" not in shown
    assert shown == f["filename"] and "ü名前.jsonl" in shown
    # The bytes on disk are named by id, never by the uploaded name.
    assert r.content == jsonl(batch_line("a", "a"))


def test_startup_notes(tmp_path: Path) -> None:
    local = Settings(data_dir=str(tmp_path))
    ((level, note),) = security_notes(local, Keys(local))
    assert level == logging.INFO and "127.0.0.1 only" in note
    exposed = Settings(data_dir=str(tmp_path), host="0.0.0.0")
    ((level, note),) = security_notes(exposed, Keys(exposed))
    assert level == logging.WARNING and "0.0.0.0" in note and "anyone" in note
    keyed = Settings(data_dir=str(tmp_path), host="0.0.0.0", api_keys=["k1", "k2"])
    ((level, note),) = security_notes(keyed, Keys(keyed))
    assert level == logging.INFO and "2 key(s)" in note
    # Litestar reconfigures the root logger at startup, so listen on batchyard's own.
    seen: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = seen.append  # type: ignore[method-assign]
    logging.getLogger("batchyard").addHandler(handler)
    try:
        with TestClient(create_app(exposed, engine=FakeEngine())):
            pass
    finally:
        logging.getLogger("batchyard").removeHandler(handler)
    assert any(
        r.levelno == logging.WARNING and "anyone who can reach" in r.getMessage() for r in seen
    )
    missing = Settings(data_dir=str(tmp_path), api_keys_file=str(tmp_path / "nope.txt"))
    with pytest.raises(ValueError, match=r"nope\.txt"):
        create_app(missing)


def test_dashboard_shows_only_the_logged_in_owners_files(
    make_client: MakeClient, keys: dict[str, Any]
) -> None:
    client = make_client(**keys)
    upload(client, jsonl(batch_line("a", "a")), headers=bearer(ALICE), name="alice-secret.jsonl")
    upload(client, jsonl(batch_line("b", "b")), headers=bearer(BOB), name="bob-private.jsonl")
    r = client.post("/login", data={"api_key": BOB, "next": "/files"}, follow_redirects=False)
    assert r.status_code == 303
    page = client.get("/files")
    assert page.status_code == 200
    assert "bob-private.jsonl" in page.text and "alice-secret.jsonl" not in page.text
