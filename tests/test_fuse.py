"""The FUSE front-end, through real mounts: a ``loomfs mount`` process over a hub with posix
volumes, driven with ordinary file APIs and real tools (cat, ls, cp -a, rsync)."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
import json
import os
import selectors
import shutil
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

from loomfs.config import load_config
from loomfs.core.types import SYSTEM, Entry, EntryKind
from loomfs.hub.namespace import HubNamespace
from loomfs.protocols.fuse.files import WriteBuffer
from loomfs.protocols.fuse.follow import FOLLOWING_TIMEOUT
from loomfs.protocols.fuse.inodes import InodeTable
from loomfs.protocols.fuse.session import PollingSelector
from loomfs.rest.client import RestNamespace
from loomfs.service import HubService
from loomfs.testing.fixtures import tmpfs
from loomfs.testing.fuse import FUSE_MISSING, MountProcess, prepare_site
from loomfs.testing.hubproc import HubProcess, site_config
from loomfs.testing.private import PRIVATE, private_site
from loomfs.testing.sites import spoke_site

MIB = 1 << 20


@dataclass
class Site:
    config: Path
    vol: Path  # the posix directory behind /vol
    other: Path  # behind /other, a second volume
    mnt: Path
    mount: MountProcess


def _require_fuse() -> None:
    if not os.path.exists("/dev/fuse"):
        pytest.fail(FUSE_MISSING)
    for tool in ("fusermount3", "rsync", "setfattr"):
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} is missing: apt-get install -y fuse3 rsync attr")


def _make_site(root: Path) -> tuple[Path, Path, Path]:
    vol, other = root / "vol", root / "other"
    vol.mkdir()
    other.mkdir()
    (vol / "hello.txt").write_text("hello\n")
    (vol / "sub").mkdir()
    (vol / "sub" / "inner.bin").write_bytes(os.urandom(5000))
    return prepare_site(root, {"/vol": vol, "/other": other}), vol, other


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    _require_fuse()
    root = tmp_path_factory.mktemp("fuse")
    config, vol, other = _make_site(root)
    mount = MountProcess(config, root / "mnt")
    with mount:
        yield Site(config, vol, other, root / "mnt", mount)
    # the mount ends by SIGTERM; whatever it logged as unexpected fails the module
    assert "Traceback" not in mount.log(), mount.log()


@pytest.fixture
def work(site: Site) -> tuple[Path, Path, str]:
    """A fresh directory: (its path on the mount, on disk, in the namespace)."""
    name = uuid.uuid4().hex[:10]
    (site.vol / name).mkdir()
    _wait_for((site.mnt / "vol" / name).is_dir)
    return site.mnt / "vol" / name, site.vol / name, f"/vol/{name}"


@pytest.fixture
async def ns(site: Site) -> AsyncIterator[HubNamespace]:
    """The same hub, opened in the test process, to check what the mount did."""
    service = HubService(load_config(site.config))
    await service.catalog.open()
    await service.namespace.load_volumes()
    yield service.namespace
    await service.namespace.close()
    await service.catalog.close()


def _wait_for(check: Callable[[], bool], what: str = "condition", within: float = 60) -> None:
    """Changes behind loomfs's back arrive through inotify and the change feed; wait for
    them with a generous deadline (never a timing claim)."""
    deadline = time.monotonic() + within
    while True:
        try:
            if check():
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def _errno(call: Callable[[], object]) -> int:
    with pytest.raises(OSError) as info:
        call()
    return info.value.errno or 0


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(MIB):
            digest.update(block)
    return digest.hexdigest()


# -- reading --------------------------------------------------------------------------------


def test_ls_stat_cat_existing_files(site: Site) -> None:
    assert sorted(os.listdir(site.mnt)) == ["other", "vol"]
    assert {"hello.txt", "sub"} <= set(os.listdir(site.mnt / "vol"))
    out = subprocess.run(["cat", str(site.mnt / "vol/hello.txt")], capture_output=True, check=True)
    assert out.stdout == b"hello\n"
    st = os.stat(site.mnt / "vol/sub/inner.bin")
    disk = os.stat(site.vol / "sub/inner.bin")
    assert (st.st_size, st.st_mode, st.st_uid, st.st_mtime_ns) == (
        disk.st_size,
        disk.st_mode,
        disk.st_uid,
        disk.st_mtime_ns,
    )
    assert (site.mnt / "vol/sub/inner.bin").read_bytes() == (
        site.vol / "sub/inner.bin"
    ).read_bytes()
    listing = subprocess.run(["ls", "-la", str(site.mnt / "vol")], capture_output=True, check=True)
    assert b"hello.txt" in listing.stdout


def test_large_directory_listing(work: tuple[Path, Path, str]) -> None:
    mnt, disk, _ = work
    names = sorted(f"f{i:05d}" for i in range(2500))
    for name in names:
        (mnt / name).touch()
    assert sorted(os.listdir(mnt)) == names
    assert sorted(os.listdir(disk)) == names
    with os.scandir(mnt) as it:
        sizes = {e.name: e.stat().st_size for e in it}
    assert set(sizes) == set(names) and set(sizes.values()) == {0}


def test_large_file_sequential_read_equals_source(site: Site, work: tuple[Path, Path, str]) -> None:
    mnt, disk, _ = work
    source = disk / "big.bin"
    with source.open("wb") as f:
        for _ in range(64):
            f.write(os.urandom(MIB))
    _wait_for(lambda: (mnt / "big.bin").stat().st_size == 64 * MIB, "the hub to notice big.bin")
    assert _sha256(mnt / "big.bin") == _sha256(source)
    # and the other way: 64 MiB written through the mount lands on disk intact
    shutil.copyfile(source, mnt / "copy.bin")
    assert _sha256(disk / "copy.bin") == _sha256(source)
    assert _sha256(mnt / "copy.bin") == _sha256(source)


# -- writing --------------------------------------------------------------------------------


async def test_write_is_visible_in_namespace_and_on_disk(
    work: tuple[Path, Path, str], ns: HubNamespace
) -> None:
    mnt, disk, top = work
    (mnt / "new.txt").write_bytes(b"written on the mount")
    assert (mnt / "new.txt").read_bytes() == b"written on the mount"
    assert (disk / "new.txt").read_bytes() == b"written on the mount"
    assert await ns.read_bytes(SYSTEM, f"{top}/new.txt") == b"written on the mount"
    with (mnt / "new.txt").open("r+b") as f:
        f.seek(8)
        f.write(b"ON")
        f.flush()
        f.seek(0)
        assert f.read() == b"written ON the mount"  # a file open for writing reads its writes
    assert (disk / "new.txt").read_bytes() == b"written ON the mount"
    with (mnt / "new.txt").open("ab") as f:
        f.write(b"!")
    assert await ns.read_bytes(SYSTEM, f"{top}/new.txt") == b"written ON the mount!"
    assert (mnt / "new.txt").stat().st_size == len(b"written ON the mount!")


def test_truncate(work: tuple[Path, Path, str]) -> None:
    mnt, disk, _ = work
    (mnt / "t").write_bytes(b"0123456789")
    os.truncate(mnt / "t", 4)
    assert (disk / "t").read_bytes() == b"0123" and (mnt / "t").read_bytes() == b"0123"
    with (mnt / "t").open("r+b") as f:
        f.truncate(8)
    assert (disk / "t").read_bytes() == b"0123\0\0\0\0"
    with (mnt / "t").open("wb") as f:  # O_TRUNC
        f.write(b"z")
    assert (disk / "t").read_bytes() == b"z"


def _allocated(path: Path) -> int:
    return os.stat(path).st_blocks * 512


def _data_ranges(path: Path) -> list[tuple[int, int]]:
    """The file's data extents on disk, by SEEK_DATA/SEEK_HOLE."""
    fd = os.open(path, os.O_RDONLY)
    try:
        size, pos, found = os.fstat(fd).st_size, 0, []
        while pos < size:
            try:
                start = os.lseek(fd, pos, os.SEEK_DATA)
            except OSError as exc:
                assert exc.errno == errno.ENXIO
                break
            pos = os.lseek(fd, start, os.SEEK_HOLE)
            found.append((start, pos))
        return found
    finally:
        os.close(fd)


def test_holes_stay_holes(work: tuple[Path, Path, str]) -> None:
    """Truncating a file up through the mount writes no zeros, nor does a small write into
    it afterwards: the volume's file stays sparse, and reads give zeros in the holes."""
    mnt, disk, _ = work
    (mnt / "s").write_bytes(b"head")
    os.truncate(mnt / "s", 1 << 30)
    assert (disk / "s").stat().st_size == 1 << 30
    assert _allocated(disk / "s") < MIB
    middle = 600 * MIB + 7
    with (mnt / "s").open("r+b") as f:
        f.seek(middle)
        f.write(b"0123456789abcdef")
    assert (disk / "s").stat().st_size == 1 << 30
    assert _allocated(disk / "s") < MIB
    # the data sits where it was written, and nowhere else
    ranges = _data_ranges(disk / "s")
    assert ranges[0][0] == 0 and any(a <= middle < middle + 16 <= b for a, b in ranges)
    assert sum(b - a for a, b in ranges) < MIB
    for view in (mnt / "s", disk / "s"):
        with view.open("rb") as f:
            assert f.read(8) == b"head\0\0\0\0"
            f.seek(middle - 4)
            assert f.read(24) == b"\0" * 4 + b"0123456789abcdef" + b"\0" * 4
            f.seek((1 << 30) - 3)
            assert f.read() == b"\0" * 3


def test_rename(work: tuple[Path, Path, str]) -> None:
    mnt, disk, _ = work
    (mnt / "a").write_bytes(b"a")
    (mnt / "b").write_bytes(b"b")
    os.rename(mnt / "a", mnt / "b")  # replaces, as rename(2) does
    assert (mnt / "b").read_bytes() == b"a" and not (mnt / "a").exists()
    (mnt / "d1/d2").mkdir(parents=True)
    (mnt / "d1/d2/f").write_bytes(b"deep")
    (mnt / "empty").mkdir()
    os.rename(mnt / "d1", mnt / "empty")  # onto an empty directory
    assert (mnt / "empty/d2/f").read_bytes() == b"deep"
    assert (disk / "empty/d2/f").read_bytes() == b"deep"
    (mnt / "full").mkdir()
    (mnt / "full/x").touch()
    assert _errno(lambda: os.rename(mnt / "empty", mnt / "full")) == errno.ENOTEMPTY
    assert _errno(lambda: os.rename(mnt / "b", mnt / "full")) == errno.EISDIR


def test_rename_while_open_for_writing(work: tuple[Path, Path, str]) -> None:
    mnt, disk, _ = work
    with (mnt / "moving").open("wb") as f:
        f.write(b"first ")
        os.rename(mnt / "moving", mnt / "moved")
        f.write(b"second")
    assert (disk / "moved").read_bytes() == b"first second"
    assert not (disk / "moving").exists()


def test_unlink_while_open(work: tuple[Path, Path, str]) -> None:
    mnt, disk, _ = work
    (mnt / "gone").write_bytes(b"still readable")
    with (mnt / "gone").open("rb") as reader:
        os.unlink(mnt / "gone")
        assert not (mnt / "gone").exists() and not (disk / "gone").exists()
        assert reader.read() == b"still readable"
        assert os.fstat(reader.fileno()).st_size == len(b"still readable")
        assert os.fstat(reader.fileno()).st_nlink == 0
    with (mnt / "scratch").open("w+b") as f:
        os.unlink(mnt / "scratch")
        f.write(b"temp data")
        f.flush()
        f.seek(0)
        assert f.read() == b"temp data"
    assert not (disk / "scratch").exists()  # an unlinked file's data is not resurrected


def test_symlinks(work: tuple[Path, Path, str]) -> None:
    mnt, disk, _ = work
    (mnt / "target").write_bytes(b"pointed at")
    os.symlink("target", mnt / "link")
    assert os.readlink(mnt / "link") == "target" and os.readlink(disk / "link") == "target"
    assert stat.S_ISLNK(os.lstat(mnt / "link").st_mode)
    assert (mnt / "link").read_bytes() == b"pointed at"
    assert _errno(lambda: os.symlink("x", mnt / "link")) == errno.EEXIST
    os.unlink(mnt / "link")
    assert not (disk / "link").is_symlink() and (disk / "target").exists()


def test_mkdir_rmdir(work: tuple[Path, Path, str]) -> None:
    mnt, disk, _ = work
    os.mkdir(mnt / "d", 0o750)
    assert (disk / "d").is_dir()
    assert (mnt / "d").stat().st_mode & 0o7777 == 0o750
    (mnt / "d/f").touch()
    assert _errno(lambda: os.rmdir(mnt / "d")) == errno.ENOTEMPTY
    os.unlink(mnt / "d/f")
    os.rmdir(mnt / "d")
    assert not (disk / "d").exists() and not (mnt / "d").exists()


def test_directory_link_count(work: tuple[Path, Path, str]) -> None:
    """2 + the subdirectories (their '..'), as on a local file system; files don't count."""
    mnt, disk, _ = work
    for name in ("a", "b", "a/one", "a/two"):
        os.mkdir(mnt / name)
    (mnt / "a/file").touch()
    assert [os.stat(mnt / n).st_nlink for n in ("a", "b", "a/one")] == [4, 2, 2]
    os.rename(mnt / "a/one", mnt / "b/one")
    assert (os.stat(mnt / "a").st_nlink, os.stat(mnt / "b").st_nlink) == (3, 3)
    os.rmdir(mnt / "a/two")
    assert os.stat(mnt / "a").st_nlink == os.stat(disk / "a").st_nlink == 2


async def test_chmod_chown_utime(work: tuple[Path, Path, str], ns: HubNamespace) -> None:
    mnt, disk, top = work
    (mnt / "f").write_bytes(b"x")
    os.chmod(mnt / "f", 0o640)
    os.chown(mnt / "f", 1234, 5678)
    os.utime(mnt / "f", ns=(1_600_000_000_000_000_000, 1_500_000_000_123_456_789))
    for st in (os.stat(mnt / "f"), os.stat(disk / "f")):
        assert (st.st_mode & 0o7777, st.st_uid, st.st_gid) == (0o640, 1234, 5678)
        assert st.st_mtime_ns == 1_500_000_000_123_456_789
    # a directory's mtime set on purpose after changes in it stays (rsync, cp -a, tar)
    (mnt / "d").mkdir()
    (mnt / "d/x").touch()
    os.utime(mnt / "d", ns=(1_500_000_000_000_000_000, 1_500_000_000_000_000_000))
    assert os.stat(mnt / "d").st_mtime_ns == 1_500_000_000_000_000_000
    entry = await ns.stat(SYSTEM, f"{top}/f")
    assert (entry.mode & 0o7777, entry.uid, entry.mtime_ns) == (
        0o640,
        1234,
        1_500_000_000_123_456_789,
    )


async def test_attributes_set_on_a_file_open_for_writing_are_saved_with_it(
    work: tuple[Path, Path, str], ns: HubNamespace
) -> None:
    """What Samba does for each file a client puts (create, chmod, write, set the write
    time, close) is two changes in the namespace, not one per call: the create, and the
    content with the attributes (one version). Until the close the mount shows them
    already."""
    mnt, disk, top = work
    when, earlier = 1_500_000_000_123_456_789, 1_400_000_000_000_000_000
    before = await ns.catalog.head_seq()
    fd = os.open(mnt / "f", os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        os.fchmod(fd, 0o640)
        os.utime(fd, ns=(earlier, earlier))
        os.write(fd, b"written after a utime")  # moves the mtime, as on a local disk
        os.utime(fd, ns=(when, when))
        st = os.fstat(fd)
        assert (st.st_mode & 0o7777, st.st_mtime_ns, st.st_size) == (0o640, when, 21)
    finally:
        os.close(fd)
    # (and the directory's new times, in the create's commit)
    assert await ns.catalog.head_seq() - before == 3
    for st in (os.stat(mnt / "f"), os.stat(disk / "f")):
        assert (st.st_mode & 0o7777, st.st_mtime_ns, st.st_atime_ns) == (0o640, when, when)
    assert (disk / "f").read_bytes() == b"written after a utime"
    entry = await ns.stat(SYSTEM, f"{top}/f")
    assert (entry.mode & 0o7777, entry.mtime_ns, entry.size) == (0o640, when, 21)
    # a write after the last utime wins, as on a local disk; a chown is made at once, and
    # the writes around it land
    fd = os.open(mnt / "f", os.O_WRONLY)
    try:
        os.utime(fd, ns=(earlier, earlier))
        os.write(fd, b"W")
        os.fchown(fd, 1234, 5678)
        assert (os.stat(disk / "f").st_uid, os.stat(disk / "f").st_gid) == (1234, 5678)
        os.write(fd, b"X")
    finally:
        os.close(fd)
    assert os.stat(disk / "f").st_mtime_ns > when
    assert (disk / "f").read_bytes() == b"WXitten after a utime"


async def test_special_files(work: tuple[Path, Path, str], ns: HubNamespace) -> None:
    mnt, disk, top = work
    os.mkfifo(mnt / "fifo", 0o640)
    assert stat.S_ISFIFO(os.lstat(disk / "fifo").st_mode)
    assert stat.S_ISFIFO(os.lstat(mnt / "fifo").st_mode)
    assert os.lstat(mnt / "fifo").st_mode & 0o7777 == 0o640
    os.mknod(mnt / "null", stat.S_IFCHR | 0o600, os.makedev(1, 3))  # the tests run as root
    st = os.lstat(mnt / "null")
    assert stat.S_ISCHR(st.st_mode) and st.st_rdev == os.makedev(1, 3)
    assert os.lstat(disk / "null").st_rdev == os.makedev(1, 3)
    # FUSE mounts are nodev: a device node there is a name, it does not open the device
    assert _errno(lambda: open(mnt / "null", "wb")) == errno.EACCES  # noqa: SIM115
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(str(mnt / "sock"))
    assert stat.S_ISSOCK(os.lstat(mnt / "sock").st_mode)
    assert (await ns.stat(SYSTEM, f"{top}/sock")).kind is EntryKind.SOCKET
    os.chown(mnt / "fifo", 1234, 5678)
    os.rename(mnt / "fifo", mnt / "fifo2")
    assert (os.lstat(disk / "fifo2").st_uid, os.lstat(mnt / "fifo2").st_uid) == (1234, 1234)
    for name in ("fifo2", "null", "sock"):
        os.unlink(mnt / name)
        assert not os.path.lexists(disk / name)
    assert _errno(lambda: os.mkfifo(mnt / "no/such/fifo")) == errno.ENOENT


async def test_hard_links(work: tuple[Path, Path, str], ns: HubNamespace) -> None:
    mnt, disk, top = work
    (mnt / "one").write_bytes(b"shared")
    os.link(mnt / "one", mnt / "two")
    assert os.stat(disk / "one").st_ino == os.stat(disk / "two").st_ino
    assert os.stat(mnt / "one").st_nlink == os.stat(mnt / "two").st_nlink == 2
    # a change through one name shows through the other at once, content and attributes
    (mnt / "one").write_bytes(b"written through one")
    assert (mnt / "two").read_bytes() == b"written through one"
    assert os.stat(disk / "two").st_nlink == 2  # the write kept the link
    os.chmod(mnt / "two", 0o604)
    assert os.stat(mnt / "one").st_mode & 0o7777 == 0o604
    assert (await ns.stat(SYSTEM, f"{top}/one")).nlink == 2
    assert _errno(lambda: os.link(mnt / "one", mnt / "two")) == errno.EEXIST
    # one file, one inode number, through every name (tools compare st_ino)
    (mnt / "sub").mkdir()
    os.link(mnt / "two", mnt / "sub/three")
    numbers = {os.stat(mnt / name).st_ino for name in ("one", "two", "sub/three")}
    assert len(numbers) == 1
    assert os.stat(mnt / "sub/three").st_nlink == 3
    os.rename(mnt / "sub", mnt / "moved")
    assert os.stat(mnt / "moved/three").st_ino in numbers
    os.unlink(mnt / "one")
    # the number stays with the names left, which go on working
    assert os.stat(mnt / "two").st_ino in numbers
    assert os.stat(mnt / "two").st_nlink == 2
    (mnt / "moved/three").write_bytes(b"through three")
    assert (mnt / "two").read_bytes() == b"through three"
    os.unlink(mnt / "moved/three")
    assert os.stat(mnt / "two").st_nlink == 1
    assert (mnt / "two").read_bytes() == b"through three"
    assert os.stat(mnt / "two").st_ino != os.stat(mnt / "moved").st_ino


def test_unsaved_writes_outlive_another_name_of_the_file(work: tuple[Path, Path, str]) -> None:
    """Names of one file share a node: writes pending through one name must land when
    the name the node used is removed or replaced meanwhile, as on a local disk."""
    mnt, disk, _ = work
    (mnt / "one").write_bytes(b"base")
    os.link(mnt / "one", mnt / "two")
    os.link(mnt / "one", mnt / "three")
    assert os.stat(mnt / "one").st_ino == os.stat(mnt / "two").st_ino
    fd = os.open(mnt / "two", os.O_WRONLY)
    os.write(fd, b"NEW!")
    os.unlink(mnt / "one")
    os.close(fd)
    assert (disk / "two").read_bytes() == (mnt / "three").read_bytes() == b"NEW!"
    (mnt / "other").write_bytes(b"other")
    fd = os.open(mnt / "three", os.O_WRONLY | os.O_APPEND)
    os.write(fd, b" and more")
    os.rename(mnt / "other", mnt / "two")  # replaces a name of the open file
    os.close(fd)
    assert (disk / "three").read_bytes() == b"NEW! and more"
    assert (mnt / "two").read_bytes() == b"other"


def test_atime_and_ctime(work: tuple[Path, Path, str]) -> None:
    mnt, disk, _ = work
    (mnt / "f").write_bytes(b"x")
    os.utime(mnt / "f", ns=(1_400_000_000_000_000_001, 1_500_000_000_000_000_002))
    st = os.stat(mnt / "f")
    assert st.st_atime_ns == 1_400_000_000_000_000_001
    assert st.st_mtime_ns == 1_500_000_000_000_000_002
    assert os.stat(disk / "f").st_atime_ns == 1_400_000_000_000_000_001
    before = os.stat(mnt / "f").st_ctime_ns
    # the file system's clock is coarse (a jiffy): let it move past the last change
    _wait_for(lambda: time.time_ns() > before + 50_000_000, "the clock to move")
    os.chmod(mnt / "f", 0o600)
    assert os.stat(mnt / "f").st_ctime_ns > before
    assert os.stat(mnt / "f").st_ctime_ns == os.stat(disk / "f").st_ctime_ns


async def test_xattrs_are_tags(work: tuple[Path, Path, str], ns: HubNamespace) -> None:
    mnt, _, top = work
    (mnt / "f").write_bytes(b"x")
    os.setxattr(mnt / "f", "user.split", b"train")
    assert await ns.get_tags(SYSTEM, f"{top}/f") == {"split": "train"}
    await ns.set_tags(SYSTEM, f"{top}/f", {"owner": "ml"})
    assert os.getxattr(mnt / "f", "user.owner") == b"ml"
    assert sorted(os.listxattr(mnt / "f")) == ["user.owner", "user.split"]
    os.removexattr(mnt / "f", "user.split")
    assert await ns.get_tags(SYSTEM, f"{top}/f") == {"owner": "ml"}
    assert _errno(lambda: os.getxattr(mnt / "f", "user.split")) == errno.ENODATA
    assert _errno(lambda: os.setxattr(mnt / "f", "trusted.x", b"1")) in (
        errno.ENOTSUP,
        errno.EPERM,
    )
    out = subprocess.run(["getfattr", "-d", str(mnt / "f")], capture_output=True, check=True)
    assert b'user.owner="ml"' in out.stdout


async def test_a_listing_answers_the_extended_attributes_of_its_names(
    work: tuple[Path, Path, str], ns: HubNamespace
) -> None:
    """A listing asks once which names have tags (Samba then asks each name for its
    extended attributes); what each name shows is still its own tags."""
    mnt, _, top = work
    tagged = {"b": {"split": "train"}, "d": {"owner": "ml", "split": "test"}}
    for name in "abcde":
        (mnt / name).write_bytes(name.encode())
    for name, tags in tagged.items():
        await ns.set_tags(SYSTEM, f"{top}/{name}", tags)
    assert sorted(os.listdir(mnt)) == list("abcde")
    for name in "abcde":
        want = tagged.get(name, {})
        assert sorted(os.listxattr(mnt / name)) == sorted(f"user.{k}" for k in want)
        for key, value in want.items():
            assert os.getxattr(mnt / name, f"user.{key}") == value.encode()
    assert _errno(lambda: os.getxattr(mnt / "a", "user.split")) == errno.ENODATA
    # a name the listing found untagged shows a tag set through the mount at once
    os.setxattr(mnt / "a", "user.split", b"val")
    assert os.listxattr(mnt / "a") == ["user.split"]
    assert await ns.children_tags(SYSTEM, top) == {"a": {"split": "val"}, **tagged}


def test_cp_a_and_rsync(site: Site, work: tuple[Path, Path, str]) -> None:
    mnt, disk, _ = work
    tree = site.mnt.parent / f"tree-{uuid.uuid4().hex[:6]}"
    (tree / "a/b").mkdir(parents=True)
    for i in range(20):
        (tree / "a" / f"f{i}").write_bytes(os.urandom(1000 * i))
    (tree / "a/b/deep").write_text("deep")
    os.chmod(tree / "a/f3", 0o600)
    os.utime(tree / "a/f4", ns=(1_000_000_000_000_000_000, 1_000_000_000_000_000_000))
    subprocess.run(["cp", "-a", str(tree / "a"), str(mnt / "cp")], check=True)
    subprocess.run(["rsync", "-a", f"{tree / 'a'}/", f"{mnt / 'rs'}/"], check=True)
    for dest in ("cp", "rs"):
        subprocess.run(["diff", "-r", str(tree / "a"), str(mnt / dest)], check=True)
        subprocess.run(["diff", "-r", str(tree / "a"), str(disk / dest)], check=True)
        assert (mnt / dest / "f3").stat().st_mode & 0o777 == 0o600
        assert (mnt / dest / "f4").stat().st_mtime_ns == 1_000_000_000_000_000_000
    # attributes were kept exactly: a second rsync finds nothing to transfer
    again = subprocess.run(
        ["rsync", "-a", "--itemize-changes", f"{tree / 'a'}/", f"{mnt / 'rs'}/"],
        capture_output=True,
        check=True,
    )
    assert again.stdout.strip() == b""


# -- coherence ------------------------------------------------------------------------------


def test_change_behind_loomfs_shows_on_the_mount(work: tuple[Path, Path, str]) -> None:
    mnt, disk, _ = work
    (mnt / "f").write_bytes(b"version one")
    assert (mnt / "f").read_bytes() == b"version one"  # now in the kernel's page cache
    (disk / "f").write_bytes(b"version two, longer")
    _wait_for(lambda: (mnt / "f").read_bytes() == b"version two, longer", "the new version")
    (disk / "new-behind").write_bytes(b"x")
    _wait_for((mnt / "new-behind").exists, "a new file")
    os.unlink(disk / "new-behind")
    _wait_for(lambda: not (mnt / "new-behind").exists(), "a removed file")


async def test_hub_changes_reach_the_kernel_cache_at_once(
    work: tuple[Path, Path, str], ns: HubNamespace
) -> None:
    """The mount follows the hub's change feed and invalidates what the kernel caches, so
    a change shows in ``stat`` well inside the time the kernel may cache attributes."""
    mnt, _, top = work
    (mnt / "f").write_bytes(b"one")
    (mnt / "gone").write_bytes(b"x")
    assert os.stat(mnt / "f").st_size == 3 and (mnt / "gone").exists()  # now cached
    await ns.write_bytes(SYSTEM, f"{top}/f", b"changed at the hub")
    await ns.remove(SYSTEM, f"{top}/gone")
    within = FOLLOWING_TIMEOUT / 2  # the kernel's own timeout can't be what ends the wait
    _wait_for(lambda: os.stat(mnt / "f").st_size == 18, "the new size", within)
    _wait_for(lambda: not (mnt / "gone").exists(), "the removed name", within)
    assert (mnt / "f").read_bytes() == b"changed at the hub"


async def test_a_directory_changed_elsewhere_reaches_the_kernel_between_own_changes(
    work: tuple[Path, Path, str], ns: HubNamespace
) -> None:
    """The follower passes over the mount's own creations and removals (the kernel knows
    of them), and a directory's attributes are answered from the mount's own entry while
    the feed says nothing of it: a change made elsewhere still shows at once."""
    mnt, _, top = work
    for i in range(20):
        (mnt / f"n{i}").write_bytes(b"")
    os.unlink(mnt / "n0")
    assert sorted(os.listdir(mnt)) == sorted(f"n{i}" for i in range(1, 20))
    assert stat.S_IMODE(os.stat(mnt).st_mode) != 0o700  # now cached
    await ns.set_attrs(SYSTEM, top, mode=0o700)
    await ns.write_bytes(SYSTEM, f"{top}/n1", b"from the hub")
    within = FOLLOWING_TIMEOUT / 2  # the kernel's own timeout can't be what ends the wait
    _wait_for(lambda: stat.S_IMODE(os.stat(mnt).st_mode) == 0o700, "the new mode", within)
    _wait_for(lambda: os.stat(mnt / "n1").st_size == 12, "the new size", within)
    (mnt / "n20").write_bytes(b"")  # an own change after the foreign ones
    assert stat.S_IMODE(os.stat(mnt).st_mode) == 0o700


@dataclass
class RestMount:
    """A mount over a hub by REST, and a REST client of that hub: another protocol's
    changes, which the mount learns of only through the change feed."""

    mnt: Path  # the mount's /vol
    url: str


@pytest.fixture(scope="module")
def rest_mount(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RestMount]:
    _require_fuse()
    root = tmp_path_factory.mktemp("fuse-rest")
    config, _, _ = _make_site(root)
    with HubProcess(root / "data") as hub:
        with MountProcess(config, root / "mnt", "--hub", hub.url) as mount:
            yield RestMount(root / "mnt" / "vol", hub.url)
        assert "Traceback" not in mount.log(), mount.log()


#: the names the renames below shuffle, and the spare name a swap goes through
NAMES, SPARE = ("a", "b", "c"), "t"


async def _rest_view(rest: RestNamespace, top: str) -> dict[str, tuple[object, ...]]:
    """What REST says each name is: (kind, size or link target or listing)."""
    view: dict[str, tuple[object, ...]] = {}
    async for entry in rest.list(SYSTEM, top):
        if entry.kind is EntryKind.SYMLINK:
            view[entry.name] = ("link", entry.link_target)
        elif entry.is_dir:
            names = sorted([e.name async for e in rest.list(SYSTEM, entry.path)])
            view[entry.name] = ("dir", names)
        else:
            view[entry.name] = ("file", entry.size)
    return view


def _mount_view(
    mnt: Path, forbidden: tuple[int, ...] = (errno.EIO, errno.EINVAL)
) -> dict[str, tuple[object, ...]]:
    """The same through the mount. EIO is never a stale view but a bug; so is EINVAL
    (readlink of a name that is no link) while nothing changes the names."""
    view: dict[str, tuple[object, ...]] = {}
    try:
        # the names by path first: a listing would tell the kernel their new types
        for name in (*NAMES, SPARE, *os.listdir(mnt)):
            try:
                mode = os.lstat(mnt / name).st_mode
            except FileNotFoundError:
                continue
            if stat.S_ISLNK(mode):
                view[name] = ("link", os.readlink(mnt / name))
            elif stat.S_ISDIR(mode):
                view[name] = ("dir", sorted(os.listdir(mnt / name)))
            else:
                view[name] = ("file", os.lstat(mnt / name).st_size)
    except OSError as exc:
        if exc.errno in forbidden:
            raise AssertionError(f"the mount failed {exc!r} after renames elsewhere") from exc
        return {"(in flux)": (exc.errno,)}  # a name the feed has yet to bring: wait
    return view


async def _await_view(mnt: Path, rest: RestNamespace, top: str) -> None:
    """Once the feed is followed the mount shows what REST shows (a generous deadline
    inside the kernel's own cache timeout: never a timing claim)."""
    want = await _rest_view(rest, top)
    seen: list[dict[str, tuple[object, ...]]] = []

    def same() -> bool:
        seen.append(_mount_view(mnt))
        return seen[-1] == want

    try:
        _wait_for(same, "the mount to show REST's names", FOLLOWING_TIMEOUT / 2)
    except AssertionError as exc:
        raise AssertionError(f"REST: {want}, the mount: {seen[-1]}") from exc


@contextlib.contextmanager
def _looking(mnt: Path) -> Iterator[list[AssertionError]]:
    """Look at the names through the mount, over and over, while the block changes them
    elsewhere (the kernel's caches then go stale between its lookups): what failed.
    A name may change between the lstat and the readlink of it: EINVAL is no bug here."""
    failures: list[AssertionError] = []
    done = threading.Event()

    def look() -> None:
        while not done.is_set():
            try:
                _mount_view(mnt, forbidden=(errno.EIO,))
            except AssertionError as exc:
                failures.append(exc)

    # a few lookers: the window between a rename and the feed's word of it is short
    lookers = [threading.Thread(target=look) for _ in range(3)]
    for looker in lookers:
        looker.start()
    try:
        yield failures
    finally:
        done.set()
        for looker in lookers:
            looker.join()


async def _swap(rest: RestNamespace, top: str, x: str, y: str) -> None:
    await rest.rename(SYSTEM, f"{top}/{x}", f"{top}/{SPARE}")
    await rest.rename(SYSTEM, f"{top}/{y}", f"{top}/{x}")
    await rest.rename(SYSTEM, f"{top}/{SPARE}", f"{top}/{y}")


async def _fresh(rest: RestNamespace, mnt: Path) -> tuple[Path, str]:
    """A directory with a directory (a file inside), a symlink and a file, over REST,
    and seen (so cached) by the mount."""
    name = uuid.uuid4().hex[:10]
    top = f"/vol/{name}"
    await rest.mkdir(SYSTEM, top)
    await rest.mkdir(SYSTEM, f"{top}/a")
    await rest.write_bytes(SYSTEM, f"{top}/a/inside", b"data")
    await rest.symlink(SYSTEM, f"{top}/b", "somewhere")
    await rest.write_bytes(SYSTEM, f"{top}/c", b"a file of 22 bytes....")
    await _await_view(mnt / name, rest, top)
    return mnt / name, top


async def test_a_burst_of_swaps_of_a_directory_and_a_symlink_elsewhere(
    rest_mount: RestMount,
) -> None:
    """Renames elsewhere that swap a directory and a symlink, the kernel having both
    cached: the mount shows the result once the feed is followed, and no name fails with
    EIO (an inode number answered with another file type) or EINVAL (readlink of what is
    a directory now), also while the burst goes on."""
    rest = RestNamespace(rest_mount.url)
    try:
        mnt, top = await _fresh(rest, rest_mount.mnt)
        with _looking(mnt) as failures:
            for _ in range(21):  # odd: a and b end swapped
                await _swap(rest, top, "a", "b")
        assert not failures, failures
        await _await_view(mnt, rest, top)
        assert os.readlink(mnt / "a") == "somewhere" and os.listdir(mnt / "b") == ["inside"]
    finally:
        await rest.close()


@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    hs.lists(
        hs.tuples(hs.permutations(NAMES).map(lambda p: p[:2]), hs.booleans()),
        min_size=1,
        max_size=8,
    )
)
async def test_renames_elsewhere_show_on_the_mount_as_on_rest(
    rest_mount: RestMount, swaps: list[tuple[tuple[str, ...], bool]]
) -> None:
    """Any sequence of swaps (by renames over REST) of a directory, a symlink and a file,
    the mount looking at them between some: once the feed is followed every name's kind,
    size, link target and listing on the mount is REST's, and nothing fails EIO/EINVAL."""
    rest = RestNamespace(rest_mount.url)
    try:
        mnt, top = await _fresh(rest, rest_mount.mnt)
        for (x, y), look in swaps:
            await _swap(rest, top, x, y)
            if look:
                _mount_view(mnt)
        await _await_view(mnt, rest, top)
    finally:
        await rest.close()


def test_a_file_keeps_its_inode_number_after_the_kernel_forgets_it() -> None:
    """A name invalidated from the feed makes the kernel forget an inode; looked up again,
    the same file must have the same number (tools compare st_ino), another file not."""
    table = InodeTable()
    entry = Entry("/vol/f", EntryKind.FILE, 0, 0, 0o644, 0, 0, 1, inode=77)
    first = table.learn(entry).ino
    table.forget(first, 1)
    assert table.get(first) is None
    assert table.learn(entry).ino == first
    old = Entry("/vol/g", EntryKind.FILE, 0, 0, 0o644, 0, 0, 2, inode=78)
    old_ino = table.learn(old).ino
    table.forget(old_ino, 1)
    # another file at that path now (replaced behind the mount): a number of its own
    assert table.learn(replace(old, inode=79)).ino not in (first, old_ino)


def test_a_name_whose_kind_changed_gets_a_new_inode_number() -> None:
    """A directory and a symlink swapped elsewhere: looked up again, each name is a new
    node (the kernel takes an inode number coming back with another file type for a
    corrupt inode, EIO), and the old nodes live on, unlinked, until the kernel forgets."""
    table = InodeTable()
    directory = Entry("/vol/d", EntryKind.DIR, 0, 0, 0o755, 0, 0, 1, inode=5)
    link = Entry("/vol/l", EntryKind.SYMLINK, 9, 0, 0o777, 0, 0, 1, inode=6, link_target="x")
    old_dir, old_link = table.learn(directory), table.learn(link)
    new_link = table.learn(replace(link, path="/vol/d"))
    new_dir = table.learn(replace(directory, path="/vol/l"))
    assert {new_link.ino, new_dir.ino}.isdisjoint({old_dir.ino, old_link.ino})
    assert old_dir.unlinked and old_link.unlinked
    assert table.by_path("/vol/d") is new_link and table.by_path("/vol/l") is new_dir
    table.forget(old_dir.ino, 1)
    assert table.get(old_dir.ino) is None and table.by_path("/vol/d") is new_link
    # the same kind again at a name: the same node, as before
    assert table.learn(replace(link, path="/vol/d", version=2)) is new_link


def test_hard_links_share_one_node() -> None:
    """The names of one hard-linked file share a node (one st_ino), also after the kernel
    forgot it; a file that merely has the same volume inode number (on another volume)
    does not, nor does another file given one of the names."""
    table = InodeTable()
    one = Entry("/vol/one", EntryKind.FILE, 5, 10, 0o644, 0, 0, 1, inode=7, nlink=2)
    two = replace(one, path="/vol/two")
    node = table.learn(one)
    assert table.learn(two) is node and table.by_path("/vol/two") is node
    assert table.learn(replace(one, path="/other/one", mtime_ns=11)) is not node
    number = node.ino
    table.forget(number, 2)
    assert table.get(number) is None
    node = table.learn(two)
    assert node.ino == number and table.learn(one) is node
    table.unlinked("/vol/one")
    assert not node.unlinked and node.path == "/vol/two"  # it goes on under its other name
    assert table.learn(replace(two, nlink=1)) is node
    gone = table.unlinked("/vol/two")  # its last name: open handles still use it
    assert gone is node and gone.unlinked
    three = table.learn(replace(one, path="/vol/three", inode=9))
    assert table.learn(replace(one, path="/vol/four", inode=9)) is three
    replaced = table.learn(replace(one, path="/vol/four", inode=10, nlink=1))
    assert replaced is not three and three.aliases == set()
    assert table.by_path("/vol/three") is three


async def test_concurrent_change_fails_the_close(
    work: tuple[Path, Path, str], ns: HubNamespace
) -> None:
    mnt, _, top = work
    (mnt / "f").write_bytes(b"base")
    fd = os.open(mnt / "f", os.O_WRONLY)
    try:
        os.write(fd, b"mine")
        await ns.write_bytes(SYSTEM, f"{top}/f", b"theirs")
    finally:
        assert _errno(lambda: os.close(fd)) == errno.ESTALE
    assert await ns.read_bytes(SYSTEM, f"{top}/f") == b"theirs"  # never silently overwritten


# -- errors ---------------------------------------------------------------------------------


def test_errors_map_to_errno(site: Site, work: tuple[Path, Path, str]) -> None:
    mnt, _, _ = work
    (mnt / "file").write_bytes(b"x")
    (mnt / "dir").mkdir()
    assert _errno(lambda: os.stat(mnt / "missing")) == errno.ENOENT
    assert _errno(lambda: os.open(mnt / "missing", os.O_RDONLY)) == errno.ENOENT
    assert _errno(lambda: os.mkdir(mnt / "dir")) == errno.EEXIST
    assert _errno(lambda: os.open(mnt / "file", os.O_CREAT | os.O_EXCL | os.O_WRONLY)) == (
        errno.EEXIST
    )
    assert _errno(lambda: os.open(mnt / "dir", os.O_WRONLY)) == errno.EISDIR
    assert _errno(lambda: os.rmdir(mnt / "file")) == errno.ENOTDIR
    assert _errno(lambda: os.stat(mnt / "file/below")) == errno.ENOTDIR
    assert _errno(lambda: os.rename(mnt / "file", site.mnt / "other/file")) == errno.EXDEV
    assert _errno(lambda: os.mkdir(site.mnt / "outside-any-volume")) == errno.EACCES
    assert _errno(lambda: os.link(mnt / "file", site.mnt / "other/file")) == errno.EXDEV
    assert _errno(lambda: os.stat(mnt / ("n" * 256))) == errno.ENAMETOOLONG


def test_statfs(site: Site) -> None:
    st = os.statvfs(site.mnt)
    assert st.f_blocks > 0 and st.f_namemax == 255


# -- passthrough: the kernel reads a volume file itself ----------------------------------------


def test_an_open_for_reading_is_read_by_the_kernel_from_the_volume_file(
    work: tuple[Path, Path, str],
) -> None:
    """Passthrough is on by default: bytes changed in place behind loomfs's back show to
    a reader at once, since no byte passes through loomfs (the documented trade-off; with
    ``[fuse] passthrough = false`` such a read fails, see the next test)."""
    mnt, disk, _ = work
    (disk / "f").write_bytes(b"0123456789")
    _wait_for(lambda: (mnt / "f").stat().st_size == 10, "the hub to notice f")
    fd = os.open(mnt / "f", os.O_RDONLY)
    try:
        assert os.pread(fd, 10, 0) == b"0123456789"
        with (disk / "f").open("r+b") as f:
            f.write(b"AB")
        assert os.pread(fd, 10, 0) == b"AB23456789"
    finally:
        os.close(fd)


def test_without_passthrough_an_in_place_change_fails_the_read(tmp_path: Path) -> None:
    _require_fuse()
    config, vol, _ = _make_site(tmp_path)
    env = {"LOOMFS_FUSE__PASSTHROUGH": "false"}
    with MountProcess(config, tmp_path / "mnt", env=env):
        (vol / "f").write_bytes(b"0123456789")
        _wait_for((tmp_path / "mnt/vol/f").exists, "the hub to notice f")
        # O_DIRECT: each read reaches loomfs, not the kernel's page cache
        fd = os.open(tmp_path / "mnt/vol/f", os.O_RDONLY | os.O_DIRECT)
        try:
            with (vol / "f").open("r+b") as f:
                f.write(b"AB")
                os.utime(f.fileno(), ns=(1, 1))  # an mtime the first read did not see
            assert _errno(lambda: os.pread(fd, 10, 0)) == errno.ESTALE
        finally:
            os.close(fd)


def test_a_writer_and_a_newer_version_while_a_reader_is_open(work: tuple[Path, Path, str]) -> None:
    """The kernel serves an inode from one backing file while a passthrough reader is open:
    a writer, and then a reader of the version it wrote, are moved to a new inode for the
    name (an ESTALE that the kernel retries after a fresh lookup), as if the file had been
    replaced on a local disk; the first reader goes on with the version it opened."""
    mnt, disk, _ = work
    (mnt / "f").write_bytes(b"old content")
    with (mnt / "f").open("rb") as old:
        assert old.read(3) == b"old"
        with (mnt / "f").open("r+b") as writer:
            writer.write(b"NEW")
        assert (disk / "f").read_bytes() == b"NEW content"
        assert (mnt / "f").read_bytes() == b"NEW content"
        (disk / "f").write_bytes(b"newest, from the disk")
        _wait_for(lambda: (mnt / "f").read_bytes() == b"newest, from the disk", "the disk's")
        assert old.read() == b" content"
    assert (mnt / "f").read_bytes() == b"newest, from the disk"


def test_stale_mount_is_reported_and_sigterm_unmounts(tmp_path: Path) -> None:
    _require_fuse()
    config, _, _ = _make_site(tmp_path)
    mount = MountProcess(config, tmp_path / "mnt").start()
    try:
        mount.kill()
        assert _errno(lambda: os.listdir(tmp_path / "mnt")) == errno.ENOTCONN
        again = subprocess.run(
            [sys.executable, "-m", "loomfs.cli", "--config", str(config), "mount",
             str(tmp_path / "mnt")],
            capture_output=True, env=mount.env, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert again.returncode == 1
        assert f"fusermount3 -u {tmp_path / 'mnt'}" in " ".join(again.stderr.split())
        subprocess.run(["fusermount3", "-u", str(tmp_path / "mnt")], check=True)
        mount.start()
        assert (tmp_path / "mnt/vol/hello.txt").read_text() == "hello\n"
        assert mount.stop() == 0
        assert not os.path.ismount(tmp_path / "mnt")
        assert "unmounted" in mount.log()
    finally:
        mount.stop()


def test_ctrl_c_saves_files_open_for_writing(tmp_path: Path) -> None:
    _require_fuse()
    config, vol, _ = _make_site(tmp_path)
    mnt = tmp_path / "mnt"
    mount = MountProcess(config, mnt).start()
    try:
        kept = os.open(mnt / "vol/kept.txt", os.O_WRONLY | os.O_CREAT, 0o644)
        lost = os.open(mnt / "vol/hello.txt", os.O_WRONLY)
        os.write(kept, b"written before Ctrl-C")
        os.write(lost, b"mine")

        async def change_elsewhere() -> None:  # this writer can't be saved; the log says so
            service = HubService(load_config(config))
            await service.catalog.open()
            await service.namespace.load_volumes()
            try:
                await service.namespace.write_bytes(SYSTEM, "/vol/hello.txt", b"theirs")
            finally:
                await service.namespace.close()
                await service.catalog.close()

        asyncio.run(change_elsewhere())
        assert mount.stop(signal.SIGINT) == 0
        for fd in (kept, lost):
            with contextlib.suppress(OSError):  # the mount is gone under it
                os.close(fd)
    finally:
        mount.stop()
    assert not os.path.ismount(mnt)
    assert (vol / "kept.txt").read_bytes() == b"written before Ctrl-C"
    assert (vol / "hello.txt").read_bytes() == b"theirs"
    assert "could not save /vol/hello.txt at unmount" in mount.log()


def test_mount_over_a_hub_by_rest(tmp_path: Path) -> None:
    """``--hub``: the same front-end over RestNamespace, whose reads are streams (no local
    file region), so seeks reopen the stream pinned to the opened version."""
    _require_fuse()
    config, vol, _ = _make_site(tmp_path)
    data = os.urandom(8 * MIB + 123)
    with HubProcess(tmp_path / "data") as hub:
        (vol / "big.bin").write_bytes(data)  # the hub's inotify records it
        with MountProcess(config, tmp_path / "mnt", "--hub", hub.url) as mount:
            mnt = tmp_path / "mnt/vol"
            _wait_for(lambda: (mnt / "big.bin").stat().st_size == len(data), "big.bin")
            assert _sha256(mnt / "big.bin") == hashlib.sha256(data).hexdigest()
            with (mnt / "big.bin").open("rb", buffering=0) as f:
                for offset in (5 * MIB + 7, 17, 8 * MIB, 3 * MIB):
                    f.seek(offset)
                    assert f.read(100_000) == data[offset : offset + 100_000]
            (mnt / "sub/new.txt").write_bytes(b"over rest")
            assert (vol / "sub/new.txt").read_bytes() == b"over rest"
            os.rename(mnt / "sub/new.txt", mnt / "renamed.txt")
            os.chmod(mnt / "renamed.txt", 0o600)
            os.setxattr(mnt / "renamed.txt", "user.k", b"v")
            assert os.getxattr(mnt / "renamed.txt", "user.k") == b"v"
            assert (vol / "renamed.txt").stat().st_mode & 0o777 == 0o600
        assert "Traceback" not in mount.log(), mount.log()


def test_mount_over_an_https_hub_acts_as_the_clis_credentials(tmp_path: Path) -> None:
    """``mount --hub https://...`` checks the hub's certificate against ``[client]
    ca_cert`` and sends the CLI's credentials: the user's files read through it; a mount
    without credentials is the anonymous caller, refused (EACCES), not shown nothing."""
    _require_fuse()
    site = private_site(
        tmp_path / "site", {"model.bin": b"alice's weights"}, sections='tls = "on"\n'
    )
    cert = site.data_dir / "identity" / "https.pem"
    trust = f"ca_cert = {json.dumps(str(cert))}\n"
    alice = f'access_key = "{site.key}"\nsecret_key = "{site.secret}"\n'
    with HubProcess(site.data_dir, site.env) as hub:
        assert hub.url.startswith("https://")
        for who, client in (("alice", alice), ("anonymous", "")):
            config = site_config(
                tmp_path / f"{who}.toml", tmp_path / who, f"[client]\n{trust}{client}"
            )
            with MountProcess(config, tmp_path / f"mnt-{who}", "--hub", hub.url) as mount:
                private = tmp_path / f"mnt-{who}{PRIVATE}"
                if who == "alice":
                    assert (private / "model.bin").read_bytes() == b"alice's weights"
                else:
                    with pytest.raises(PermissionError):
                        (private / "model.bin").read_bytes()
                    with pytest.raises(PermissionError):
                        os.listdir(private)
            assert "Traceback" not in mount.log(), mount.log()


def test_mount_over_a_spoke(tmp_path: Path) -> None:
    """A spoke serves no change feed: its mount says so once and lets the kernel's caches
    expire on their own, instead of polling a feed that is not there every second."""
    _require_fuse()
    vol = tmp_path / "vol"
    vol.mkdir()
    (vol / "hello.txt").write_text("from the hub\n")
    with spoke_site(tmp_path / "sites", vol, "/vol") as site:
        (tmp_path / "client").mkdir()
        config = prepare_site(tmp_path / "client", {})
        with MountProcess(config, tmp_path / "mnt", "--hub", site.spoke.url) as mount:
            mnt = tmp_path / "mnt/vol"
            assert (mnt / "hello.txt").read_text() == "from the hub\n"
            (mnt / "new.txt").write_bytes(b"through the spoke")
            assert (mnt / "new.txt").read_bytes() == b"through the spoke"
            _wait_for((vol / "new.txt").exists, "the write at the hub's volume")
            assert (vol / "new.txt").read_bytes() == b"through the spoke"
    log = mount.log()
    assert "serves no change feed" in log, log
    assert "change feed failed" not in log and "Traceback" not in log, log


def test_mount_of_a_spoke_running_in_the_mount(tmp_path: Path) -> None:
    """A spoke's own config: the spoke runs in the mount's process, and what its cache
    holds whole is read by the kernel from the cache file (passthrough)."""
    _require_fuse()
    vol = tmp_path / "vol"
    vol.mkdir()
    data = os.urandom(3 * MIB + 5)
    (vol / "big.bin").write_bytes(data)
    with spoke_site(tmp_path / "sites", vol, "/vol", others=["gpu-east"]) as site:
        config = site.spoke_config("gpu-east")
        with MountProcess(config, tmp_path / "mnt") as mount:
            mnt = tmp_path / "mnt/vol"
            assert (mnt / "big.bin").read_bytes() == data  # cold: over the link
            with (mnt / "big.bin").open("rb") as f:  # warm: from the cache
                assert f.read() == data
            (mnt / "new.txt").write_bytes(b"written at the spoke")
            # made empty by the create, then written whole by the close
            _wait_for(
                lambda: (vol / "new.txt").read_bytes() == b"written at the spoke",
                "the write at the hub's volume",
            )
        cache = tmp_path / "sites/gpu-east/cache"
        assert sum(f.stat().st_size for f in cache.rglob("*") if f.is_file()) >= len(data)
    log = mount.log()
    assert "Traceback" not in log and "unanswered" not in log, log


def test_a_write_the_spool_has_no_room_for_leaves_the_volume_as_it_was(tmp_path: Path) -> None:
    """The mount's spool (in the site's data directory) fills up in the middle of a
    30 MB write: the write fails with ENOSPC, and no piece of it reaches the volume, over
    an existing file or in a new one; once the spool is released, writes work again."""
    _require_fuse()
    vol = tmp_path / "vol"
    vol.mkdir()
    old = os.urandom(MIB)
    (vol / "kept.bin").write_bytes(old)
    with tmpfs(tmp_path / "data", "12m"):
        config = prepare_site(tmp_path, {"/vol": vol})
        with MountProcess(config, tmp_path / "mnt") as mount:
            mnt = mount.mountpoint / "vol"
            for name in ("kept.bin", "new.bin"):
                with pytest.raises(OSError) as failed, (mnt / name).open("wb") as f:
                    for _ in range(30):
                        f.write(os.urandom(MIB))
                assert failed.value.errno == errno.ENOSPC, name
            assert (vol / "kept.bin").read_bytes() == old
            assert (vol / "new.bin").read_bytes() == b""  # made by the create, nothing more
            assert sorted(os.listdir(vol)) == ["kept.bin", "new.bin"]
            assert (mnt / "kept.bin").read_bytes() == old
            (mnt / "kept.bin").write_bytes(b"room again")
            assert (vol / "kept.bin").read_bytes() == b"room again"


def test_write_buffer_makes_its_spool_file_at_first_use(tmp_path: Path) -> None:
    """A file created and closed unwritten costs no spool file; one written gets one."""
    before = set(os.listdir("/proc/self/fd"))
    buffer = WriteBuffer(str(tmp_path), base_version=1)
    assert buffer.size() == 0
    assert set(os.listdir("/proc/self/fd")) == before
    os.pwrite(buffer.fd, b"now written", 0)
    assert buffer.size() == 11
    assert len(set(os.listdir("/proc/self/fd")) - before) == 1
    buffer.close()
    assert set(os.listdir("/proc/self/fd")) == before
    unused = WriteBuffer(str(tmp_path), base_version=1)
    unused.close()
    assert set(os.listdir("/proc/self/fd")) == before


def test_polling_selector_answers_as_epoll_does() -> None:
    """The mount's loop polls before it sleeps: what is ready then, or arrives while it
    polls, or only after, is reported all the same, and a short timeout still ends the
    wait with nothing."""
    ours, theirs = socket.socketpair()
    with ours, theirs, PollingSelector(0.05) as selector:
        selector.register(ours, selectors.EVENT_READ)
        assert selector.select(0.001) == []
        theirs.send(b"x")
        assert [key.fileobj for key, _ in selector.select(None)] == [ours]
        ours.recv(1)
        for delay in (0.01, 0.2):  # within the polling, and after it
            timer = threading.Timer(delay, theirs.send, [b"y"])
            timer.start()
            assert [key.fileobj for key, _ in selector.select(5)] == [ours]
            timer.join()
            ours.recv(1)
