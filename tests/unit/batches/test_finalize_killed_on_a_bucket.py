"""A node killed while it writes a batch's output to the bucket: what the bucket then holds,
and another node finalizing the batch. Two nodes as Services in this process on one
PostgreSQL database and one SeaweedFS bucket, as in test_nodes_share_one_queue.py.

The kill is simulated where it matters: the output's commit never happens and nothing is
discarded, as when the process is gone with parts of its multipart upload already sent.
"""

from __future__ import annotations

import secrets
from pathlib import Path

import pytest

from app.config import Settings
from app.files import bucket_writes
from app.files.storage import PartialWrite
from app.services import Services, build_services
from app.tables import BatchStatus
from harness.seaweed import Seaweed, aws_env
from tests.factories import batch_line, jsonl_texts
from tests.fakes import FakeEngine
from tests.unit.helpers import batch, make_batch
from tests.waiting import until

LINES = 30


class Killed(BaseException):
    """The node's process ends here (nothing after it runs, no cleanup)."""


def node(data_dir: Path, url: str, name: str, files_url: str, seaweed: Seaweed) -> Services:
    settings = Settings(
        data_dir=str(data_dir),
        database_url=url,
        node_name=name,
        lease_seconds=1,
        files_url=files_url,
        s3_endpoint=seaweed.endpoint,
    )
    return build_services(settings, FakeEngine(n_slots=8))


def test_a_node_killed_writing_the_output_leaves_no_file_and_another_finalizes(
    tmp_path: Path, postgres_url: str, seaweed: Seaweed, monkeypatch: pytest.MonkeyPatch
) -> None:
    files_url = f"s3://{seaweed.bucket}/killed-{secrets.token_hex(4)}"
    with aws_env(seaweed):
        a = node(tmp_path / "a", postgres_url, "a", files_url, seaweed)
        batch_id = make_batch(a, [batch_line(f"k{i}", f"line {i}") for i in range(LINES)])
        input_file = batch(a, batch_id).input_file_id

        # Node A's output goes out in parts of 4 KiB (a few of them are sent), and its
        # process ends before the upload is completed.
        monkeypatch.setattr(bucket_writes, "PART_BYTES", 4096)
        begin_write = a.storage.begin_write

        def dying(limit: int) -> PartialWrite:
            write = begin_write(limit)
            assert isinstance(write, bucket_writes.ObjectWrite)

            def killed(file_id: str) -> None:
                for sent in write._sends:  # the parts sent so far are in the bucket
                    sent.result()
                raise Killed

            monkeypatch.setattr(write, "commit", killed)
            monkeypatch.setattr(write, "discard", lambda: None)
            return write

        monkeypatch.setattr(a.storage, "begin_write", dying)
        with pytest.raises(Killed):
            until(lambda: a.runner.step(), 30, "node A to reach its output's commit")
        assert batch(a, batch_id).status == BatchStatus.FINALIZING
        monkeypatch.setattr(bucket_writes, "PART_BYTES", 8 * 1024 * 1024)

        client, prefix = a.storage.client, f"{files_url.split('/', 3)[3]}/"

        def unfinished() -> list[str]:
            found = client._list_multipart_uploads(seaweed.bucket, prefix=prefix)
            return [u.object_name or "" for u in found.uploads]

        # No half file: the unfinished upload is in the bucket, and no object but the input.
        assert len(unfinished()) == 1
        assert [name for name, _ in a.storage.stored_files()] == [input_file]

        # Node B takes the batch over once A's finalize lease has lapsed, and finishes it.
        b = node(tmp_path / "b", postgres_url, "b", files_url, seaweed)

        def finished() -> bool:
            b.runner.step()
            return batch(b, batch_id).status in BatchStatus.FINISHED

        until(finished, 30, "node B to finalize the batch", poll=0.2)
        done = batch(b, batch_id)
        assert (done.status, done.completed, done.failed) == (BatchStatus.COMPLETED, LINES, 0)
        assert done.output_file_id is not None
        with b.storage.open_file(done.output_file_id) as fh:
            out = jsonl_texts(fh.read())
        assert len(out) == LINES
        assert sorted(name for name, _ in b.storage.stored_files()) == sorted(
            [input_file, done.output_file_id]
        )
        # A's unfinished upload is what a start's (or the day-old) sweep aborts.
        assert unfinished() and b.storage.sweep_tmp(min_age=0) >= 1
        assert unfinished() == []
