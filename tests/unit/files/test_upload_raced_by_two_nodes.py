"""Two nodes racing on one upload (OpenAI's Uploads API) on one PostgreSQL database and one
files location: parts added from both at once, then complete and cancel from both at once.

Each "node" is its own Services (its own Database engine and connections), as two
`batchyard serve` processes would be. The upload's row lock must keep them honest: every part
kept, exactly one of complete or cancel wins, the File holds the listed parts in order, and
each loser gets the 400 the API answers for an upload that is no longer pending.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlmodel import select

from app.config import Settings
from app.errors import APIError
from app.services import Services, build_services
from app.tables import File, Upload, UploadPart
from tests.fakes import FakeEngine

OWNER = "k"
ROUNDS = 8
PARTS = 6


def node(data_dir: Path, url: str, name: str) -> Services:
    settings = Settings(data_dir=str(data_dir), database_url=url, node_name=name)
    return build_services(settings, FakeEngine())


def add(svc: Services, upload_id: str, data: bytes) -> str:
    partial = svc.storage.begin_write(len(data))
    partial.write(data)
    return svc.uploads.add_part(upload_id, OWNER, partial).id


def race(*calls: Callable[[], Any]) -> list[Any]:
    """Run the calls at once, one thread each; each one's result or the exception it raised."""
    start = threading.Barrier(len(calls))
    results: list[Any] = [None] * len(calls)

    def run(i: int) -> None:
        start.wait()
        try:
            results[i] = calls[i]()
        except Exception as exc:  # the test sorts the outcomes
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a call hung: a lock was never released"
    return results


def later(seconds: float, call: Callable[[], Any]) -> Callable[[], Any]:
    def run() -> Any:
        threading.Event().wait(seconds)
        return call()

    return run


def refused(outcome: Any) -> str:
    """The code of the OpenAI-shaped 400 `outcome` is (anything else fails the test)."""
    assert isinstance(outcome, APIError), f"not an API error (a 500): {outcome!r}"
    body = outcome.to_body()["error"]
    assert outcome.status_code == 400 and body["param"] in ("upload_id", "data"), body
    assert body["type"] == "invalid_request_error" and body["message"], body
    return str(body["code"])


def test_two_nodes_racing_on_one_upload_stay_correct(tmp_path: Path, postgres_url: str) -> None:
    a, b = node(tmp_path, postgres_url, "a"), node(tmp_path, postgres_url, "b")
    rng = random.Random(11)
    winners = [play_round(a, b, rng, r) for r in range(ROUNDS)]
    assert "completed" in winners  # the content of a completed file was checked
    left = list((tmp_path / "tmp").iterdir())
    assert left == [], left  # no half-written copy


def play_round(a: Services, b: Services, rng: random.Random, r: int) -> str:
    """One upload raced over by both nodes; what won it ("completed" or "cancelled")."""
    # Parts of different sizes, up to one and a half COPY_PIECEs, so a complete takes a while.
    parts = [rng.randbytes(rng.randint(1, 3 << 19)) for _ in range(PARTS)]
    up = a.uploads.create(
        OWNER,
        filename=f"round-{r}.bin",
        purpose="user_data",
        bytes=sum(map(len, parts)),
        mime_type="application/octet-stream",
    )
    # Every part at once, from both nodes: each one kept, none refused.
    ids = race(*(lambda i=i: add((a, b)[i % 2], up.id, parts[i]) for i in range(PARTS)))
    assert all(isinstance(x, str) for x in ids), ids
    with b.db.read() as s:
        kept = s.exec(select(UploadPart).where(UploadPart.upload_id == up.id)).all()
    assert sorted(p.id for p in kept) == sorted(ids)

    order = list(range(PARTS))
    rng.shuffle(order)  # not the order they were added in
    part_ids = [ids[i] for i in order]
    calls: list[Callable[[], Any]] = [
        lambda: a.uploads.complete(up.id, OWNER, part_ids),
        lambda: b.uploads.complete(up.id, OWNER, part_ids),
        lambda: b.uploads.cancel(up.id, OWNER),
        lambda: a.uploads.cancel(up.id, OWNER),
        lambda: add(b, up.id, b"one more line\n"),  # late: full, or no longer pending
        lambda: add(a, up.id, b"and another\n"),
    ]
    if r % 2:  # half the rounds race the completes alone
        del calls[2:4]
    else:  # and the others cancel at some point of the completes' copying
        calls[3] = later(rng.uniform(0, 0.3), calls[3])
    outcomes = race(*calls)

    won = [o for o in outcomes if not isinstance(o, Exception) and not isinstance(o, str)]
    assert len(won) == 1, outcomes
    final = a.uploads.get(up.id, OWNER)
    state = "completed" if isinstance(won[0], tuple) else "cancelled"
    assert final.status == state

    # Every other call was refused with the API's 400, naming what became of it.
    for o in outcomes:
        if o is won[0]:
            continue
        assert isinstance(o, Exception), f"a late part was kept: {o!r}"
        assert refused(o) in (f"upload_{state}", "upload_too_large"), o

    with a.db.read() as s:
        files = s.exec(select(File).where(File.filename == f"round-{r}.bin")).all()
        row = s.get(Upload, up.id)
    assert row is not None
    if state == "completed":
        assert [f.id for f in files] == [row.file_id]  # the loser's copy is gone
        data = b"".join(parts[i] for i in order)
        assert b.storage.path(row.file_id).read_bytes() == data
        assert files[0].bytes == len(data)
    else:
        assert files == [] and row.file_id is None
    assert not (a.storage.uploads_dir / up.id).exists()  # no part left behind
    return state
