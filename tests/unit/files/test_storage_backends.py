"""The storage contract on both backends: the directory and a real SeaweedFS bucket."""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.files import bucket_writes, s3
from app.files.bucket import Location, bucket_problem, make_client
from app.files.s3 import S3Storage
from app.files.storage import Storage, TooLarge
from harness.seaweed import Seaweed, aws_env


@pytest.fixture(params=["directory", "s3"])
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Storage]:
    if request.param == "directory":
        yield Storage(tmp_path)
        return
    server: Seaweed = request.getfixturevalue("seaweed")
    with aws_env(server):
        location = Location.parse(f"s3://{server.bucket}/t-{secrets.token_hex(4)}")
        yield S3Storage(tmp_path, make_client(server.endpoint), location)


def _write(storage: Storage, file_id: str, chunks: list[bytes]) -> None:
    partial = storage.begin_write(10**9)
    for chunk in chunks:
        partial.write(chunk)
    partial.commit(file_id)


def test_a_file_reads_back_whole_by_range_and_by_spans(storage: Storage) -> None:
    lines = [f'{{"custom_id": "l{i}"}}\n'.encode() * (1 + i % 3) for i in range(50)]
    _write(storage, "file-lines", lines)
    data = b"".join(lines)
    with storage.open_file("file-lines") as fh:
        assert fh.read() == data
    assert storage.read_range("file-lines", 5, 10) == data[5:15]
    offsets = [sum(len(x) for x in lines[:i]) for i in range(50)]
    order = (7, 3, 4, 40, 5, 0)
    spans = [(offsets[i], len(lines[i])) for i in order]
    assert storage.read_spans("file-lines", spans) == [lines[i] for i in order]
    assert [name for name, _ in storage.stored_files()] == ["file-lines"]
    storage.delete("file-lines")
    assert not storage.exists("file-lines")
    assert list(storage.stored_files()) == []


def test_an_empty_file_is_still_a_file(storage: Storage) -> None:
    storage.begin_write(10).commit("file-empty")
    assert storage.exists("file-empty")
    with storage.open_file("file-empty") as fh:
        assert fh.read() == b""


def test_a_refused_or_discarded_write_leaves_no_file(storage: Storage) -> None:
    partial = storage.begin_write(8)
    partial.write(b"1234")
    with pytest.raises(TooLarge):
        partial.write(b"56789")
    partial.discard()
    storage.begin_write(8).discard()
    assert list(storage.stored_files()) == []


def test_a_file_of_several_parts_streams_out_and_back(
    storage: Storage, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Parts of 5 MiB (S3's smallest) so three of them go out as a multipart upload.
    monkeypatch.setattr(bucket_writes, "PART_BYTES", 5 * 1024 * 1024)
    chunk = secrets.token_bytes(1024 * 1024)
    _write(storage, "file-big", [chunk] * 12)
    with storage.open_file("file-big") as fh:
        assert fh.read(len(chunk)) == chunk
        rest = fh.read()
    assert len(rest) == 11 * len(chunk)
    assert storage.read_range("file-big", 11 * len(chunk) - 3, 6) == chunk[-3:] + chunk[:3]
    # Under the id the write chose, a bucket completes the multipart upload in place.
    direct = storage.begin_write(10**9)
    for _ in range(11):
        direct.write(chunk)
    chosen = direct.file_id or "file-chosen"
    direct.commit(chosen)
    direct.discard()  # after a commit: nothing happens
    assert storage.read_range(chosen, 10 * len(chunk), len(chunk)) == chunk
    assert sorted(name for name, _ in storage.stored_files()) == sorted(["file-big", chosen])
    if isinstance(storage, S3Storage):
        client, bucket = storage.client, storage.location.bucket
        listed = client.list_objects(bucket, prefix=f"{storage.location.prefix}tmp/")
        assert [
            o.object_name for o in listed if not o.is_dir
        ] == []  # the multipart upload's own object was removed after the copy
    assert list(storage.tmp_dir.iterdir()) == []  # a bucket's spool files went with the parts


def test_a_write_discarded_after_its_first_parts_leaves_nothing(
    storage: Storage, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bucket_writes, "PART_BYTES", 5 * 1024 * 1024)
    partial = storage.begin_write(10**9)
    for _ in range(11):  # two parts sent, one filling
        partial.write(secrets.token_bytes(1024 * 1024))
    partial.discard()
    assert list(storage.stored_files()) == []
    assert list(storage.tmp_dir.iterdir()) == []
    if isinstance(storage, S3Storage):  # and the multipart upload was aborted
        prefix = storage.location.prefix
        found = storage.client._list_multipart_uploads(storage.location.bucket, prefix=prefix)
        assert [u.object_name for u in found.uploads] == []


def test_a_bucket_that_is_missing_or_unreachable_is_one_line(
    seaweed: Seaweed, tmp_path: Path
) -> None:
    with aws_env(seaweed):
        missing = S3Storage(tmp_path, make_client(seaweed.endpoint), Location("no-such-bkt", ""))
        assert bucket_problem(missing.bucket, seaweed.endpoint) == (
            f"The bucket 'no-such-bkt' does not exist at {seaweed.endpoint}: create it first."
        )
        ok = S3Storage(tmp_path, make_client(seaweed.endpoint), Location(seaweed.bucket, "p/"))
        assert bucket_problem(ok.bucket, seaweed.endpoint) is None
        gone = make_client("http://127.0.0.1:9")
        problem = bucket_problem(
            S3Storage(tmp_path, gone, Location("b-1", "")).bucket, "http://127.0.0.1:9"
        )
        assert problem is not None and problem.startswith("The object store for s3://b-1/ at ")
        assert "Check --s3-endpoint" in problem


def test_a_write_cut_off_mid_way_is_never_a_file_and_is_swept(
    seaweed: Seaweed, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a node killed while it writes (an output file at finalize) leaves in the bucket:
    an unfinished multipart upload, never an object, aborted by the next start's sweep."""
    monkeypatch.setattr(bucket_writes, "PART_BYTES", 5 * 1024 * 1024)
    with aws_env(seaweed):
        location = Location.parse(f"s3://{seaweed.bucket}/cut-{secrets.token_hex(4)}")
        dead = S3Storage(tmp_path / "dead", make_client(seaweed.endpoint), location)
        partial = dead.begin_write(10**9)
        for _ in range(11):  # two parts sent, then the node is gone: no commit, no discard
            partial.write(secrets.token_bytes(1024 * 1024))
        assert isinstance(partial, bucket_writes.ObjectWrite)
        for sent in partial._sends:  # both parts are stored before the node goes
            sent.result()
        file_id = partial.file_id
        assert file_id is not None

        def unfinished() -> list[str]:
            found = dead.client._list_multipart_uploads(seaweed.bucket, prefix=location.prefix)
            return [u.object_name or "" for u in found.uploads]

        assert unfinished() == [dead.key(file_id)]
        node = S3Storage(tmp_path / "node", make_client(seaweed.endpoint), location)
        assert not node.exists(file_id) and list(node.stored_files()) == []
        assert node.sweep_tmp(min_age=3600) == 0  # young: it may be another node's write
        assert unfinished() == [dead.key(file_id)]
        assert node.sweep_tmp(min_age=0) == 1
        assert unfinished() == []


def test_parts_of_5_mib_or_more_are_joined_by_the_store(storage: Storage) -> None:
    first, last = secrets.token_bytes(5 * 1024 * 1024), b"the end\n"
    for part_id, data in (("part_a", first), ("part_b", last)):
        partial = storage.begin_part_write(10**9, "upload_j")
        partial.write(data)
        path = storage.part_path("upload_j", part_id)
        path.parent.mkdir(exist_ok=True)
        partial.commit_to(path)
    joined = storage.begin_join("upload_j", [("part_a", len(first)), ("part_b", len(last))], 10**9)
    if not isinstance(storage, S3Storage):
        assert joined is None  # the directory streams the parts into a new file
        return
    # Smaller parts but the last: streamed, as UploadPartCopy refuses them.
    assert (
        storage.begin_join("upload_j", [("part_b", len(last)), ("part_a", len(first))], 1) is None
    )
    assert isinstance(joined, bucket_writes.JoinedWrite) and joined.file_id
    for data in (first, last):  # the caller hashes the bytes it reads; nothing is sent
        joined.write(data)
    assert not storage.exists(joined.file_id)
    joined.commit(joined.file_id)
    storage.delete_parts("upload_j")
    with storage.open_file(joined.file_id) as fh:
        assert fh.read() == first + last
    assert joined.size == len(first + last)
    assert joined.sha256 == hashlib.sha256(first + last).hexdigest()


def test_lines_claimed_a_few_at_a_time_are_read_in_few_requests(
    storage: Storage, monkeypatch: pytest.MonkeyPatch
) -> None:
    lines = [f'{{"custom_id": "r{i}", "body": {{}}}}\n'.encode() for i in range(3000)]
    _write(storage, "file-claims", lines)
    offsets = [sum(len(x) for x in lines[:i]) for i in range(len(lines))]
    requests: list[tuple[int, int]] = []
    read_range = storage.read_range

    def counted(file_id: str, offset: int, length: int) -> bytes:
        requests.append((offset, length))
        return read_range(file_id, offset, length)

    monkeypatch.setattr(storage, "read_range", counted)
    got: list[bytes] = []
    for first in range(0, len(lines), 10):  # the runner's claims, in line order
        spans = [(offsets[i], len(lines[i])) for i in range(first, first + 10)]
        got += storage.read_spans("file-claims", spans)
    assert got == lines
    if isinstance(storage, S3Storage):  # 300 claims, 3 ranged GETs of READ_AHEAD_BYTES
        total = sum(len(x) for x in lines)
        assert len(requests) == -(-total // s3.READ_AHEAD_BYTES) < 5
    storage.delete("file-claims")  # and what was kept of it goes with it
    with pytest.raises(FileNotFoundError):
        storage.read_spans("file-claims", [(0, 5)])


def test_a_store_that_does_not_answer_is_an_os_error(
    seaweed: Seaweed, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As a failing disk is: uploads answer 500 and finalize retries, then fails the batch."""
    monkeypatch.setattr(bucket_writes, "PART_BYTES", 5 * 1024 * 1024)
    with aws_env(seaweed):
        gone = S3Storage(tmp_path, make_client("http://127.0.0.1:9"), Location("b-1", "p/"))
        partial = gone.begin_write(10**9)
        with pytest.raises(OSError, match="the object store did not answer while trying to"):
            for _ in range(6):  # the first part goes out at 5 MiB
                partial.write(secrets.token_bytes(1024 * 1024))
        partial.discard()
        small = gone.begin_write(10**9)
        small.write(b"a line\n")
        with pytest.raises(OSError, match="did not answer while trying to store a file"):
            small.commit(small.file_id or "file-x")
        with pytest.raises(OSError, match="did not answer while trying to read a file"):
            gone.read_spans("file-x", [(0, 5)])
        assert list(gone.tmp_dir.iterdir()) == []


def test_a_part_streams_to_its_own_key_in_the_bucket(
    seaweed: Seaweed, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its multipart upload goes to uploads/<upload id>/<part id> from the first byte, so
    keeping it is completing that upload: no server-side copy of up to 64 MB inside the
    write transaction that takes the part."""
    monkeypatch.setattr(bucket_writes, "PART_BYTES", 5 * 1024 * 1024)
    with aws_env(seaweed):
        location = Location.parse(f"s3://{seaweed.bucket}/parts-{secrets.token_hex(4)}")
        storage = S3Storage(tmp_path, make_client(seaweed.endpoint), location)
        partial = storage.begin_part_write(10**9, "upload_p")
        assert partial.part_id and partial.file_id is None
        data = secrets.token_bytes(6 * 1024 * 1024)
        partial.write(data)
        key = storage.part_key("upload_p", partial.part_id)
        found = storage.client._list_multipart_uploads(seaweed.bucket, prefix=location.prefix)
        assert [u.object_name for u in found.uploads] == [key]
        copies: list[str] = []
        monkeypatch.setattr(storage.bucket, "copy", lambda source, key, size: copies.append(key))
        partial.commit_to(storage.part_path("upload_p", partial.part_id))
        assert copies == []
        with storage.open_part("upload_p", partial.part_id) as fh:
            assert fh.read() == data
        assert list(storage.stored_files()) == []
