"""A volume on a local or NFS directory (core layer): ``posix:///abs/dir``.

Files stay plain files. Keys never reach outside the root: an operation opens the parent
directory, checks where that descriptor really is (``/proc/self/fd``) and then works on the
last component relative to it without following a symlink there; a read resolves the key,
opens it with ``O_NOFOLLOW`` and checks the descriptor the same way. So neither a symlink
nor a race that swaps one in leads out of the volume. Symlinks are reported as what they
are and never followed by a scan.
Writes go to a hidden temp file in the target's directory, are fsynced and swapped with
the target (RENAME_EXCHANGE), so readers see the old or the new file, never a partial one,
and the old one stays aside under the temp name until the writer's gate (the catalog's
commit) has succeeded; if it fails, the old file is put back (a new one removed), so a
failed write leaves the directory as it was. A file with hard links is the exception: a
rename would cut it off from its other names, so its old bytes are copied aside and the
staged bytes into it in place (readers of it may see a mix while that copy runs); a note
beside the copy aside names the file while it may be torn, so that a process killed in
that copy has the old bytes put back at its next start (``sweep``). A body
handed over as a local file (``LocalFile``) is copied by its data ranges: holes stay holes.
Special files (fifos, devices, sockets) are recorded and made with mknod, never opened.
"""

# This module works on str paths and descriptors with os calls on purpose: the scan's hot
# path can't afford a Path object per entry, and pathlib has no O_NOFOLLOW or fd variants.

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import dataclasses
import errno
import functools
import json
import logging
import os
import re
import secrets
import stat
from collections.abc import AsyncGenerator, AsyncIterable, Callable, Iterator, Sequence
from operator import attrgetter
from typing import ParamSpec, TypeVar
from urllib.parse import unquote, urlsplit

from ...errors import (
    AlreadyExists,
    Conflict,
    InvalidArgument,
    InvalidPath,
    IsADirectory,
    LoomError,
    NotADirectory,
    NotFound,
    NotSupported,
    PermissionDenied,
    from_oserror,
)
from ..streams import (
    ByteSource,
    LocalFile,
    LocalFileSource,
    clamp_range,
    copy_sparse,
    file_fingerprint,
)
from ..types import KIND_BITS, KIND_OF_BITS, EntryKind, ObjectInfo
from .base import Backend, Capability, Gate, Skipped, ungated
from .common import batches_from_thread, check_key, child_key, ordered_walk

#: names of loomfs's own in-flight files; hidden from scans and listings
TEMP_PREFIX = ".loomfs-tmp-"
#: the end of the note beside an in-place commit's copy aside (the name of the file whose
#: old bytes it holds, and their times), there while that file may be torn
_TORN_NOTE = ".of"
#: the longest path one system call takes (PATH_MAX less its NUL); a file deeper than that
#: below / is reached one directory at a time
_SYSCALL_PATH_MAX = 4095

_RENAME_NOREPLACE = 1
_RENAME_EXCHANGE = 2
_libc = ctypes.CDLL(None, use_errno=True)
_renameat2 = getattr(_libc, "renameat2", None)

_by_sort_key = attrgetter("sort_key")
log = logging.getLogger(__name__)

P = ParamSpec("P")
T = TypeVar("T")

#: file systems that answer a metadata call from this machine's memory and disks, in
#: microseconds (network ones, NFS, Lustre, FUSE..., may take a round trip, or stall)
_LOCAL_FS = frozenset(
    {"ext2", "ext3", "ext4", "xfs", "btrfs", "f2fs", "zfs", "bcachefs", "tmpfs", "overlay"}
)
_MOUNTINFO_ESCAPE = re.compile(r"\\([0-7]{3})")


def fs_type(path: str) -> str:
    """The type of the file system that real path ``path`` lies on ("" if unknown): that
    of the deepest mount point above it in /proc/self/mountinfo, the last one mounted
    there if several were."""
    found, kind = "", ""
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
            lines = f.readlines()
    except OSError:
        return ""
    for line in lines:
        fields, _, tail = line.partition(" - ")
        # mount point: the fifth field, with spaces and such written as octal escapes
        point = _MOUNTINFO_ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), fields.split()[4])
        below = path == point or path.startswith(point.rstrip("/") + "/")
        if below and len(point) >= len(found) and tail:
            found, kind = point, tail.split()[0]
    return kind


def posix_etag(st: os.stat_result) -> str:
    return _etag(*file_fingerprint(st))


def _etag(ino: int, size: int, mtime_ns: int) -> str:
    return f"{ino:x}-{size:x}-{mtime_ns:x}"


def _fsync_close(fd: int) -> None:
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _info(key: str, st: os.stat_result, name: str, dir_fd: int | None = None) -> ObjectInfo | None:
    """Facts of one entry from its lstat; None for a file type Linux does not have."""
    # the scan's hot path: the stat helpers are inlined
    mode = st.st_mode
    fmt = mode & 0o170000
    link_target = None
    rdev = None
    if fmt == stat.S_IFREG:
        kind = EntryKind.FILE
        size = st.st_size
    elif fmt == stat.S_IFDIR:
        kind = EntryKind.DIR
        size = 0
    elif fmt == stat.S_IFLNK:
        kind = EntryKind.SYMLINK
        size = st.st_size
        link_target = os.readlink(name, dir_fd=dir_fd)
    else:
        special = KIND_OF_BITS.get(fmt)
        if special is None:
            return None
        kind = special
        size = 0
        if fmt in (stat.S_IFCHR, stat.S_IFBLK):
            rdev = st.st_rdev
    ino = st.st_ino
    mtime_ns = st.st_mtime_ns
    return ObjectInfo(
        key,
        kind,
        size,
        mtime_ns,
        _etag(ino, st.st_size, mtime_ns),  # posix_etag(st), from the values at hand
        ino,
        mode & 0o7777,
        st.st_uid,
        st.st_gid,
        link_target,
        rdev,
        st.st_nlink,
        st.st_atime_ns,
        st.st_ctime_ns,
    )


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _rename_noreplace(src_fd: int, src: str, dst_fd: int, dst: str) -> None:
    """Rename without ever replacing ``dst``: atomically where the kernel and file
    system offer RENAME_NOREPLACE, else by a check just before the rename."""
    if _renameat2 is not None:
        if _renameat2(src_fd, os.fsencode(src), dst_fd, os.fsencode(dst), _RENAME_NOREPLACE) == 0:
            return
        err = ctypes.get_errno()
        if err not in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP):
            raise OSError(err, os.strerror(err), src)
    with contextlib.suppress(FileNotFoundError):
        os.lstat(dst, dir_fd=dst_fd)
        raise OSError(errno.EEXIST, os.strerror(errno.EEXIST), dst)
    os.rename(src, dst, src_dir_fd=src_fd, dst_dir_fd=dst_fd)


class PosixBackend(Backend):
    """A directory tree on a local (or NFS) file system."""

    capabilities = frozenset(
        {
            Capability.ATOMIC_RENAME,
            Capability.LOCAL_FILES,
            Capability.SYMLINKS,
            Capability.NOTIFY,
            Capability.POSIX_MODE,
        }
    )

    def __init__(self, root: str, url: str | None = None) -> None:
        if not os.path.isabs(root):
            raise InvalidArgument(f"a posix volume root must be an absolute path: {root!r}")
        self.url = url or f"posix://{root}"
        # Containment is judged against the real root, so a root that is itself a
        # symlink (e.g. /data -> /mnt/disk1) still works.
        self.root = os.path.realpath(root)

    @classmethod
    def from_url(cls, url: str) -> PosixBackend:
        parts = urlsplit(url)
        if parts.scheme != "posix":
            raise InvalidArgument(f"not a posix URL: {url!r}")
        if parts.netloc not in ("", "localhost") or parts.query or parts.fragment:
            raise InvalidArgument(
                f"a posix volume URL is posix:///absolute/dir, with no host or options: {url!r}"
            )
        root = unquote(parts.path)
        if not root.startswith("/") or "\x00" in root:
            raise InvalidArgument(f"a posix volume URL needs an absolute path: {url!r}")
        return cls(root, url)

    @functools.cached_property
    def _local(self) -> bool:
        return fs_type(self.root) in _LOCAL_FS

    async def _meta(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """A metadata call on a name or two that flushes nothing (a stat, a rename, an
        unlink, opening a write's directory). On a local file system it takes
        microseconds, and the hand-off to a thread and back several times that (each FUSE
        create and unlink paid it, and a durable hub's NFS create paid it three times:
        bench/ns_meta.py), so it is made right here, on the event loop. A network file
        system's round trips (or stalls) are waited for in a thread."""
        if self._local:
            return fn(*args, **kwargs)
        return await asyncio.to_thread(fn, *args, **kwargs)

    @property
    def _inline(self) -> bool:
        """Whether a commit (which fsyncs when ``durable``) is made right on the event
        loop: only where it flushes nothing."""
        return not self.durable and self._local

    # -- paths -----------------------------------------------------------------

    def _inside(self, real: str) -> bool:
        return real == self.root or real.startswith(self.root + "/")

    def _check_fd(self, fd: int, key: str) -> None:
        """Close ``fd`` and refuse if it lies outside the root.

        The descriptor tells where we really are, whatever symlinks the path went through
        or was swapped for between a check and the open."""
        if not self._inside(os.readlink(f"/proc/self/fd/{fd}")):
            os.close(fd)
            raise PermissionDenied(f"{key} lies behind a symlink out of the volume", path=key)

    def _open_dir(self, key: str, flags: int = 0) -> int:
        """A descriptor of directory ``key``, checked to be inside the root."""
        path = os.path.join(self.root, key) if key else self.root
        if _too_long(path):
            return self._open_dir_stepwise(key, flags)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | flags)
        except OSError as exc:
            raise from_oserror(exc, key) from exc
        self._check_fd(fd, key)
        return fd

    def _open_dir_stepwise(self, key: str, flags: int) -> int:
        """A directory whose path is too long for one system call: walked a name at a
        time from the root, never through a symlink, so it is inside the volume by
        construction (the /proc check cannot name so long a path)."""
        fd = self._open_dir("")
        try:
            for name in key.split("/"):
                step = os.open(
                    name,
                    os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC | flags,
                    dir_fd=fd,
                )
                os.close(fd)
                fd = step
        except OSError as exc:
            os.close(fd)
            raise from_oserror(exc, key) from exc
        return fd

    @contextlib.contextmanager
    def _parent(self, key: str) -> Iterator[tuple[int, str]]:
        """(descriptor of the parent directory, last component) of a non-root key."""
        parent, _, name = check_key(key).rpartition("/")
        fd = self._open_dir(parent)
        try:
            yield fd, name
        finally:
            os.close(fd)

    # -- Backend -----------------------------------------------------------------

    async def check(self) -> None:
        try:
            st = await asyncio.to_thread(os.stat, self.root)
        except FileNotFoundError as exc:
            raise NotFound(f"volume root {self.root} does not exist", path=self.root) from exc
        except OSError as exc:
            raise from_oserror(exc, self.root) from exc
        if not stat.S_ISDIR(st.st_mode):
            raise NotADirectory(f"volume root {self.root} is not a directory", path=self.root)

    def _stat(self, key: str) -> ObjectInfo:
        if not check_key(key):
            try:
                root = _info("", os.stat(self.root), self.root)
            except OSError as exc:
                raise from_oserror(exc, self.root) from exc
            assert root is not None
            return root
        with self._parent(key) as (parent, name):
            try:
                info = _info(key, os.lstat(name, dir_fd=parent), name, parent)
            except OSError as exc:
                raise from_oserror(exc, key) from exc
        if info is None:
            raise NotSupported(f"{key} is a special file: it has no content", path=key)
        return info

    async def stat(self, key: str) -> ObjectInfo:
        return await self._meta(self._stat, key)

    def _stat_many(self, keys: Sequence[str]) -> dict[str, ObjectInfo | None]:
        """Each key's facts (None: gone); a key that fails otherwise is left out, to a
        caller's own stat, which says why. Each directory is opened once for all of its
        keys: an inotify batch names many files of one directory."""
        found: dict[str, ObjectInfo | None] = {}
        by_parent: dict[str, list[str]] = {}
        for key in keys:
            try:
                if check_key(key):
                    by_parent.setdefault(key.rpartition("/")[0], []).append(key)
                else:
                    found[key] = self._stat(key)  # the root
            except NotFound:
                found[key] = None
            except LoomError:
                pass
        for parent_key, members in by_parent.items():
            try:
                parent = self._open_dir(parent_key)
            except NotFound:
                found.update(dict.fromkeys(members))
                continue
            except LoomError:
                continue
            try:
                for key in members:
                    name = key.rpartition("/")[2]
                    try:
                        info = _info(key, os.lstat(name, dir_fd=parent), name, parent)
                    except FileNotFoundError:
                        found[key] = None
                        continue
                    except OSError:
                        continue
                    if info is not None:  # a special file Linux lacks: left out as well
                        found[key] = info
            finally:
                os.close(parent)
        return found

    async def stat_many(self, keys: Sequence[str]) -> dict[str, ObjectInfo | None]:
        # one call for a whole batch (an inotify batch holds hundreds): on the loop where
        # a stat takes microseconds, else one thread hand-off
        return await self._meta(self._stat_many, keys)

    def _list_children(self, dir_key: str, skipped: Skipped | None = None) -> list[ObjectInfo]:
        try:
            # O_NOFOLLOW: a walk never enters a symlinked directory.
            fd = self._open_dir(dir_key, os.O_NOFOLLOW)
        except (NotFound, NotADirectory, InvalidPath):
            # Gone since its parent was listed, or not a directory (ELOOP for a symlink):
            # nothing below it.
            return []
        except LoomError as exc:  # say no permission: the scan goes on without it
            if skipped is None:
                raise
            skipped(dir_key, exc)
            return []
        base = child_key(dir_key, "")
        items: list[ObjectInfo] = []
        try:
            with os.scandir(fd) as entries:
                for entry in entries:
                    if entry.name.startswith(TEMP_PREFIX):
                        continue
                    try:
                        found = entry.stat(follow_symlinks=False)
                    except FileNotFoundError:  # gone since it was listed
                        continue
                    except OSError as exc:
                        if skipped is None:
                            raise
                        skipped(base + entry.name, from_oserror(exc, base + entry.name))
                        continue
                    info = _info(base + entry.name, found, entry.name, fd)
                    if info is not None:
                        items.append(info)
        except OSError as exc:
            err = from_oserror(exc, dir_key)
            if skipped is None:
                raise err from exc
            skipped(dir_key, err)  # nothing of it: a part of a listing is no listing
            return []
        finally:
            os.close(fd)
        items.sort(key=_by_sort_key)
        return items

    def scan(
        self, prefix: str = "", start_after: str | None = None, *, skipped: Skipped | None = None
    ) -> AsyncGenerator[list[ObjectInfo], None]:
        check_key(prefix)
        return batches_from_thread(
            lambda: ordered_walk(
                functools.partial(self._list_children, skipped=skipped), prefix, start_after
            ),
            name=f"loomfs-scan {self.root}",
        )

    async def list_dir(self, key: str) -> AsyncGenerator[list[ObjectInfo], None]:
        info = await self.stat(key)
        if info.kind is not EntryKind.DIR:
            raise NotADirectory(f"not a directory: {key}", path=key)
        items = await asyncio.to_thread(self._list_children, key)
        for pos in range(0, len(items), 1000):
            yield items[pos : pos + 1000]

    def _open_read(
        self, key: str, offset: int, length: int, expect: ObjectInfo | None
    ) -> ByteSource:
        fd = self._open_file(key)
        try:
            st = os.fstat(fd)
            if stat.S_ISDIR(st.st_mode):
                raise IsADirectory(f"is a directory: {key}", path=key)
            if not stat.S_ISREG(st.st_mode):
                raise NotSupported(f"{key} is a special file: it has no content", path=key)
            if expect is not None and expect.etag != posix_etag(st):
                raise Conflict(f"{key} changed since it was listed", path=key)
            start, count = clamp_range(st.st_size, offset, length)
            return LocalFileSource(fd, start, count, key)
        except BaseException:
            os.close(fd)
            raise

    def _open_file(self, key: str) -> int:
        """A read-only descriptor of the file at ``key``, checked to be inside the root."""
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
        full = os.path.join(self.root, check_key(key))
        if _too_long(full):
            # too deep to resolve in one call: a symlink there is not read through
            with self._parent(key) as (parent, name):
                try:
                    return os.open(name, flags, dir_fd=parent)
                except OSError as exc:
                    raise from_oserror(exc, key) from exc
        # Symlinks that stay inside the volume may be read. An O_PATH descriptor follows
        # them without opening the file itself (no device is opened, no fifo touched), so
        # nothing outside is opened before the check; then that very file is opened through
        # /proc. Cheaper than os.path.realpath, an lstat and string work per component of
        # the path in Python (profiled on small S3 GETs).
        try:
            handle = os.open(full, os.O_PATH | os.O_CLOEXEC)
        except OSError as exc:
            raise from_oserror(exc, key) from exc
        self._check_fd(handle, key)  # closes it on refusal
        try:
            return os.open(f"/proc/self/fd/{handle}", flags & ~os.O_NOFOLLOW)
        except OSError as exc:
            raise from_oserror(exc, key) from exc
        finally:
            os.close(handle)

    async def open_read(
        self, key: str, offset: int, length: int, expect: ObjectInfo | None = None
    ) -> ByteSource:
        return await asyncio.to_thread(self._open_read, key, offset, length, expect)

    def _stage(self, key: str, mode: int | None, *, temp: bool) -> _Staged:
        """Open the directory a write of ``key`` lands in and, with ``temp``, a new temp
        file beside it (an empty write makes its file in place at commit instead)."""
        if not check_key(key):
            raise IsADirectory("the volume root is a directory", path=key)
        parent_name, _, name = key.rpartition("/")
        staged = _Staged(key, self._open_dir(parent_name), name)
        if temp:
            try:
                self._make_temp(staged, mode)
            except BaseException:
                self._undo(staged)
                raise
        return staged

    def _make_temp(self, staged: _Staged, mode: int | None) -> None:
        parent, name = staged.parent, staged.name
        try:
            try:
                old: os.stat_result | None = os.lstat(name, dir_fd=parent)
            except FileNotFoundError:
                old = None
            staged.temp = TEMP_PREFIX + secrets.token_hex(8)
            # readable too: a commit into a hard-linked file copies from it
            flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
            staged.fd = os.open(staged.temp, flags, 0o666, dir_fd=parent)
            if old is not None and stat.S_ISREG(old.st_mode):
                # A replace keeps the file's owner and permissions: for the tools whose
                # data this is, loomfs rewriting a file must not also chown or chmod it.
                if os.geteuid() == 0:
                    os.fchown(staged.fd, old.st_uid, old.st_gid)
                if mode is None:
                    mode = stat.S_IMODE(old.st_mode)
            if mode is not None:
                os.fchmod(staged.fd, mode)  # after fchown, which clears set-id bits
        except OSError as exc:
            raise self._oserror(exc, staged.key) from exc

    def _oserror(self, exc: OSError, key: str) -> LoomError:
        return from_oserror(exc, key, disk=f"volume {self.root}")

    def _commit(
        self, staged: _Staged, mode: int | None, first: Callable[[], None] | None = None
    ) -> ObjectInfo:
        """Put the staged file at its name, keeping what it replaces aside (``_settle``
        removes that, ``_undo`` puts it back); ``first`` before anything (``Commit``)."""
        if first is not None:
            first()
        key, parent, name = staged.key, staged.parent, staged.name
        if staged.temp is None:
            made = self._create_empty(staged, mode)
            if made is not None:
                return made
            # something is there already: it is replaced whole, as any write replaces it
            self._make_temp(staged, mode)
        assert staged.temp is not None and staged.fd is not None
        try:
            old = os.lstat(name, dir_fd=parent)
        except FileNotFoundError:
            old = None
        if old is not None and stat.S_ISDIR(old.st_mode):
            raise IsADirectory(f"is a directory: {key}", path=key)
        if old is not None and stat.S_ISREG(old.st_mode) and old.st_nlink > 1:
            return self._commit_in_place(staged)
        if self.durable:
            os.fsync(staged.fd)
        placed = os.fstat(staged.fd).st_ino
        if old is None:
            os.rename(staged.temp, name, src_dir_fd=parent, dst_dir_fd=parent)
        else:
            staged.aside = _exchange(parent, staged.temp, name)
        staged.placed = placed
        if self.durable:
            os.fsync(parent)  # the rename itself, not only the file's bytes
        info = _info(key, os.fstat(staged.fd), name, parent)
        assert info is not None
        return info

    def _commit_in_place(self, staged: _Staged) -> ObjectInfo:
        """Copy the staged bytes into the existing file, which keeps every name it has;
        its old bytes are copied aside first (blocks shared where the file system can),
        to be copied back should the write fail after this."""
        assert staged.temp is not None and staged.fd is not None
        parent, name = staged.parent, staged.name
        flags = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC
        target = os.open(name, flags, dir_fd=parent)
        try:
            staged.aside = TEMP_PREFIX + secrets.token_hex(8)
            staged.in_place = True
            _copy_into(target, staged.aside, parent, create=True, durable=self.durable)
            staged.placed = os.fstat(target).st_ino
            with self._may_tear(staged, target):
                os.ftruncate(target, 0)
                copy_sparse(staged.fd, target, os.fstat(staged.fd).st_size)
                if self.durable:
                    os.fsync(target)
            st = os.fstat(target)
        finally:
            os.close(target)
        info = _info(staged.key, st, name, parent)
        assert info is not None
        return info

    @contextlib.contextmanager
    def _may_tear(self, staged: _Staged, target: int) -> Iterator[None]:
        """Inside, ``target`` (a hard-linked file written in place) may be torn: a note
        beside the copy of its old bytes says so until it is whole again, for ``sweep``
        to copy them back after a crash."""
        assert staged.aside is not None
        note = staged.aside + _TORN_NOTE
        st = os.fstat(target)
        text = json.dumps([staged.name, st.st_atime_ns, st.st_mtime_ns])
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
        try:
            fd = os.open(note, flags, 0o600, dir_fd=staged.parent)
        except FileExistsError:  # the note of the failed copy this undoes: its times stand
            fd = -1
        if fd >= 0:
            try:
                _write_all(fd, text.encode())
                if self.durable:
                    os.fsync(fd)
            finally:
                os.close(fd)
            if self.durable:
                os.fsync(staged.parent)
        yield
        os.unlink(note, dir_fd=staged.parent)  # whole again: the old bytes or the new

    def _settle(self, staged: _Staged) -> None:
        """A write's commit was recorded: drop what it replaced and its temp file."""
        for leftover in (staged.aside, staged.temp):
            if leftover is not None:
                with contextlib.suppress(OSError):
                    os.unlink(leftover, dir_fd=staged.parent)
        staged.close()

    @staticmethod
    def _still_placed(staged: _Staged) -> bool:
        """Whether the name still holds the file this write put there."""
        try:
            return os.lstat(staged.name, dir_fd=staged.parent).st_ino == staged.placed
        except FileNotFoundError:
            return False

    def _undo(self, staged: _Staged) -> None:
        """A write failed, at whatever step: leave the name as it was before it."""
        parent, name = staged.parent, staged.name
        try:
            if staged.in_place and staged.placed is not None and staged.aside is not None:
                flags = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC
                source = os.open(staged.aside, flags, dir_fd=parent)
                target = os.open(name, flags, dir_fd=parent)
                try:
                    with self._may_tear(staged, target):
                        _copy_into(source, name, parent, create=False)
                finally:
                    os.close(target)
                    os.close(source)
            elif staged.placed is None or not self._still_placed(staged):
                # Nothing placed; or the name holds another's file now, put there after
                # this write's rename (another gateway's write, this one's path lock lost
                # with its database session): that one stands, the old file goes.
                pass
            elif staged.aside is not None:
                # the old file back at its name, atomically; the new one goes with it
                os.rename(staged.aside, name, src_dir_fd=parent, dst_dir_fd=parent)
                staged.aside = None
            else:
                # a new file: removed
                os.unlink(name, dir_fd=parent)
            if self.durable and staged.placed is not None:
                os.fsync(parent)
        except OSError:
            log.exception("could not undo the failed write of %s", staged.key)
        finally:
            self._settle(staged)

    async def write(
        self,
        key: str,
        data: AsyncIterable[bytes],
        *,
        mode: int | None = None,
        gate: Gate = ungated,
    ) -> ObjectInfo:
        local = data if isinstance(data, LocalFile) else None
        chunks = aiter(data) if local is None else None
        first = await anext(chunks, None) if chunks is not None else None
        empty = first is None and (local is None or local.size == 0)
        if empty:
            # nothing to stream (a FUSE create): a new empty file is made in place at
            # commit, in one metadata call, instead of a temp file staged, then renamed
            staged = await self._meta(self._stage, key, mode, temp=False)
        else:
            # a cancel must not lose a temp file the thread goes on to create
            creating = asyncio.ensure_future(asyncio.to_thread(self._stage, key, mode, temp=True))
            try:
                staged = await asyncio.shield(creating)
            except asyncio.CancelledError:
                creating.add_done_callback(self._discard)
                raise
        committing: asyncio.Future[ObjectInfo] | None = None

        async def commit(first: Callable[[], None] | None = None) -> ObjectInfo:
            nonlocal committing
            if empty and self._inline:
                return self._commit(staged, mode, first)  # no await: a cancel can't split it
            # in a thread, which a cancel does not stop: the undo waits for it, here, so
            # that it is done before the caller goes on (a hub notes the change as over
            # then; a stopping process would otherwise exit before the undo ran)
            committing = asyncio.ensure_future(asyncio.to_thread(self._commit, staged, mode, first))
            try:
                return await asyncio.shield(committing)
            except asyncio.CancelledError:
                with contextlib.suppress(BaseException):  # its outcome is the undo's
                    await asyncio.wait([committing])
                raise

        try:
            if local is not None and not empty:
                await asyncio.to_thread(copy_sparse, local.fd, _fd(staged), local.size)
            elif first is not None and chunks is not None:
                await asyncio.to_thread(_write_all, _fd(staged), first)
                async for chunk in chunks:
                    await asyncio.to_thread(_write_all, _fd(staged), chunk)
            info = await gate(commit)
        except BaseException as exc:
            if committing is not None and not committing.done():
                # cancelled while the commit runs in its thread: undone once it is done
                committing.add_done_callback(lambda _: self._undo(staged))
            else:
                self._undo(staged)
            if isinstance(exc, LoomError):
                raise
            if isinstance(exc, OSError):
                raise self._oserror(exc, key) from exc
            raise
        # what it replaced is dropped (a cancel meanwhile leaves that to the thread)
        await self._meta(self._settle, staged)
        return info

    def _discard(self, creating: asyncio.Future[_Staged]) -> None:
        """Remove the temp file of a write cancelled while it was being created."""
        if not creating.cancelled() and creating.exception() is None:
            self._undo(creating.result())

    def _create_empty(self, staged: _Staged, mode: int | None) -> ObjectInfo | None:
        """Make a new empty file at ``key`` in place (None: the name is taken). An empty
        file is whole the moment it exists, so it needs no temp file and rename, which
        cost the file system a second journal update (half of a FUSE create's time)."""
        key, parent, name = staged.key, staged.parent, staged.name
        # read-only: nothing is written through it, and its close is no IN_CLOSE_WRITE
        # for the volume's watcher to take for a change (one event less per create)
        flags = os.O_RDONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(name, flags, 0o666 if mode is None else mode, dir_fd=parent)
        except FileExistsError:
            return None
        except OSError as exc:
            raise self._oserror(exc, key) from exc
        try:
            staged.placed = os.fstat(fd).st_ino
            if mode is not None and not _as_created(mode):
                os.fchmod(fd, mode)  # exactly that, whatever the umask took away
            if self.durable:
                # no bytes to flush: the directory's fsync commits the new name with its
                # inode (mode, owner), which the same metadata journal holds
                os.fsync(parent)
            info = _info(key, os.fstat(fd), name, parent)
        except OSError as exc:
            raise self._oserror(exc, key) from exc
        finally:
            os.close(fd)
        assert info is not None
        return info

    def _mkdir(self, key: str) -> ObjectInfo:
        if not check_key(key):
            raise AlreadyExists("the volume root exists", path=key)
        with self._parent(key) as (parent, name):
            try:
                os.mkdir(name, dir_fd=parent)
            except OSError as exc:
                raise from_oserror(exc, key) from exc
        return self._stat(key)

    async def mkdir(self, key: str) -> ObjectInfo:
        return await self._meta(self._mkdir, key)

    def _symlink(self, key: str, target: str) -> ObjectInfo:
        if not check_key(key):
            raise AlreadyExists("the volume root exists", path=key)
        with self._parent(key) as (parent, name):
            try:
                os.symlink(target, name, dir_fd=parent)
            except OSError as exc:
                raise from_oserror(exc, key) from exc
        return self._stat(key)

    async def symlink(self, key: str, target: str) -> ObjectInfo:
        return await self._meta(self._symlink, key, target)

    def _mknod(self, key: str, kind: EntryKind, mode: int, rdev: int) -> ObjectInfo:
        if not check_key(key):
            raise AlreadyExists("the volume root exists", path=key)
        with self._parent(key) as (parent, name):
            try:
                os.mknod(name, KIND_BITS[kind] | mode, rdev, dir_fd=parent)
                # exactly the mode asked for, whatever this process's umask took away
                _chmod_at(parent, name, mode)
            except OSError as exc:
                raise from_oserror(exc, key) from exc
        return self._stat(key)

    async def mknod(self, key: str, kind: EntryKind, mode: int, rdev: int = 0) -> ObjectInfo:
        return await self._meta(self._mknod, key, kind, mode, rdev)

    def _link(self, src: str, dst: str) -> ObjectInfo:
        if not check_key(src) or not check_key(dst):
            raise InvalidPath("the volume root can't be linked", path=src or dst)
        with (
            self._parent(src) as (src_parent, src_name),
            self._parent(dst) as (dst_parent, dst_name),
        ):
            try:
                os.link(
                    src_name,
                    dst_name,
                    src_dir_fd=src_parent,
                    dst_dir_fd=dst_parent,
                    follow_symlinks=False,
                )
            except OSError as exc:
                raise from_oserror(exc, f"{src} -> {dst}") from exc
        return self._stat(dst)

    async def link(self, src: str, dst: str) -> ObjectInfo:
        return await self._meta(self._link, src, dst)

    def _delete(self, key: str) -> None:
        if not check_key(key):
            raise InvalidPath("the volume root can't be deleted", path=key)
        with self._parent(key) as (parent, name):
            try:
                if stat.S_ISDIR(os.lstat(name, dir_fd=parent).st_mode):
                    os.rmdir(name, dir_fd=parent)
                else:
                    os.unlink(name, dir_fd=parent)
            except OSError as exc:
                raise from_oserror(exc, key) from exc

    async def delete(self, key: str) -> None:
        await self._meta(self._delete, key)

    async def sync(self, key: str) -> None:
        if not self.durable:
            await asyncio.to_thread(self._sync, key)

    async def sweep(self, key: str) -> list[str]:
        """Remove the temp files a stopped write of ``key`` left beside it (its staged
        bytes, or what it replaced kept aside): the names removed. Only while no write
        of this volume is under way (a hub's start)."""
        return await asyncio.to_thread(self._sweep, key)

    def _sweep(self, key: str) -> list[str]:
        try:
            parent_fd = self._open_dir(check_key(key).rpartition("/")[0])
        except (NotFound, NotADirectory):  # its directory went too: nothing left in it
            return []
        removed = []
        try:
            names = os.listdir(parent_fd)
            for note in names:
                if note.startswith(TEMP_PREFIX) and note.endswith(_TORN_NOTE):
                    self._untear(parent_fd, note, key)
            for name in names:
                if name.startswith(TEMP_PREFIX):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(name, dir_fd=parent_fd)
                        removed.append(name)
            if removed and self.durable:
                os.fsync(parent_fd)
        except OSError as exc:
            raise self._oserror(exc, key) from exc
        finally:
            os.close(parent_fd)
        return removed

    def _untear(self, parent: int, note: str, key: str) -> None:
        """Copy the old bytes an in-place commit kept aside back into the file it was
        writing when its process stopped (its ``_may_tear`` note): the file, under all
        its names, is as it was before that write, its times too."""
        aside = note.removesuffix(_TORN_NOTE)
        try:
            with open(os.open(note, os.O_RDONLY | os.O_CLOEXEC, dir_fd=parent), "rb") as f:
                name, atime_ns, mtime_ns = json.loads(f.read())
            source = os.open(aside, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
        except (OSError, ValueError):  # torn note, or no copy: the file was never torn
            return
        try:
            _copy_into(source, name, parent, create=False, durable=self.durable)
            os.utime(name, ns=(atime_ns, mtime_ns), dir_fd=parent, follow_symlinks=False)
        except OSError:
            log.exception("could not put back the old bytes of %s", name)
            return  # the copy and its note stay for the next start
        finally:
            os.close(source)
        log.warning("put back the old bytes of a write stopped in place", extra={"key": key})

    def _sync(self, key: str) -> None:
        """fsync the entry (a file's bytes, a directory's names) and the directory holding
        its name. Only files and directories are opened: opening a fifo or a device could
        block or act on it, and their names are flushed with their directory."""
        if not check_key(key):
            _fsync_close(self._open_dir(""))
            return
        with self._parent(key) as (parent, name):
            try:
                if stat.S_IFMT(os.lstat(name, dir_fd=parent).st_mode) in (
                    stat.S_IFREG,
                    stat.S_IFDIR,
                ):
                    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
                    _fsync_close(os.open(name, flags, dir_fd=parent))
                os.fsync(parent)
            except OSError as exc:
                raise from_oserror(exc, key) from exc

    def _rename(self, src: str, dst: str) -> None:
        if not check_key(src) or not check_key(dst):
            raise InvalidPath("the volume root can't be renamed or replaced", path=src or dst)
        if dst.startswith(src + "/"):
            raise InvalidArgument(f"can't move {src} into itself ({dst})", path=dst)
        with (
            self._parent(src) as (src_parent, src_name),
            self._parent(dst) as (dst_parent, dst_name),
        ):
            try:
                _rename_noreplace(src_parent, src_name, dst_parent, dst_name)
            except OSError as exc:
                raise from_oserror(exc, f"{src} -> {dst}") from exc

    async def rename(self, src: str, dst: str) -> None:
        await self._meta(self._rename, src, dst)

    def _set_attrs(
        self,
        key: str,
        mode: int | None,
        uid: int | None,
        gid: int | None,
        mtime_ns: int | None,
        atime_ns: int | None,
    ) -> ObjectInfo:
        if not check_key(key):
            raise InvalidPath("the volume root's attributes are not loomfs's to change")
        with self._parent(key) as (parent, name):
            try:
                st = os.lstat(name, dir_fd=parent)
                if uid is not None or gid is not None:
                    # before the chmod: a chown clears set-id bits the chmod may set
                    os.chown(
                        name,
                        -1 if uid is None else uid,
                        -1 if gid is None else gid,
                        dir_fd=parent,
                        follow_symlinks=False,
                    )
                if mode is not None:
                    if stat.S_ISLNK(st.st_mode):
                        # Linux has no lchmod; a symlink's own mode means nothing anyway.
                        raise NotSupported(f"a symlink has no mode of its own: {key}", path=key)
                    _chmod_at(parent, name, mode)
                if mtime_ns is not None or atime_ns is not None:
                    os.utime(
                        name,
                        ns=(
                            st.st_atime_ns if atime_ns is None else atime_ns,
                            st.st_mtime_ns if mtime_ns is None else mtime_ns,
                        ),
                        dir_fd=parent,
                        follow_symlinks=False,
                    )
            except OSError as exc:
                raise from_oserror(exc, key) from exc
        return self._stat(key)

    async def set_attrs(
        self,
        key: str,
        *,
        mode: int | None = None,
        uid: int | None = None,
        gid: int | None = None,
        mtime_ns: int | None = None,
        atime_ns: int | None = None,
    ) -> ObjectInfo:
        return await self._meta(self._set_attrs, key, mode, uid, gid, mtime_ns, atime_ns)


@functools.cache
def _umask() -> int:
    """This process's umask, read once (loomfs never changes it); from /proc, since
    ``os.umask`` can only be read by setting it, for every thread at once."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    return 0o777  # unknown (no /proc): assume every bit may be taken away


def _as_created(mode: int) -> bool:
    """Whether open(2) with ``mode`` makes a file of exactly that mode: only permission
    bits, none of them in the umask. Then no fchmod follows (one system call less per
    create, and one inotify event less for the volume's watcher)."""
    return not mode & ~0o777 and not mode & _umask()


def _chmod_at(parent: int, name: str, mode: int) -> None:
    """chmod of a non-symlink without following one swapped in and without opening the
    file itself (a fifo would block, a device would wake its driver): through an
    ``O_PATH`` descriptor, which Linux lets chmod by its /proc name."""
    fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
    try:
        os.chmod(f"/proc/self/fd/{fd}", mode)
    finally:
        os.close(fd)


def _too_long(path: str) -> bool:
    return len(os.fsencode(path)) > _SYSCALL_PATH_MAX


@dataclasses.dataclass(slots=True)
class _Staged:
    """One write in progress: its directory, its temp file, and what its commit did to the
    name, so that a failure after the commit (the catalog's, under the gate) can leave
    the name as it was. Owns the descriptors."""

    key: str
    parent: int
    name: str
    temp: str | None = None
    fd: int | None = None
    #: the inode the commit put at (or wrote through) ``name``; None: not committed
    placed: int | None = None
    #: a temp name holding what the commit replaced: the old file (or, ``in_place``, a
    #: copy of its old bytes); None: nothing to put back
    aside: str | None = None
    in_place: bool = False

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        if self.parent >= 0:
            os.close(self.parent)
            self.parent = -1


def _fd(staged: _Staged) -> int:
    assert staged.fd is not None
    return staged.fd


def _exchange(parent: int, temp: str, name: str) -> str | None:
    """Put ``temp`` at ``name`` and keep the file it replaces: the name that holds the old
    file now (None where the file system can keep nothing aside). One atomic
    RENAME_EXCHANGE where the kernel and file system have it, else a hard link aside and
    a rename over."""
    if _renameat2 is not None:
        if _renameat2(parent, os.fsencode(temp), parent, os.fsencode(name), _RENAME_EXCHANGE) == 0:
            return temp
        err = ctypes.get_errno()
        if err not in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP):
            raise OSError(err, os.strerror(err), name)
    aside = TEMP_PREFIX + secrets.token_hex(8)
    try:
        os.link(name, aside, src_dir_fd=parent, dst_dir_fd=parent, follow_symlinks=False)
    except OSError:
        os.rename(temp, name, src_dir_fd=parent, dst_dir_fd=parent)
        return None  # no hard links here: the replace cannot be undone
    os.rename(temp, name, src_dir_fd=parent, dst_dir_fd=parent)
    return aside


def _copy_into(source: int, name: str, parent: int, *, create: bool, durable: bool = False) -> None:
    """Make the file ``name`` in ``parent`` hold exactly the bytes of ``source``."""
    flags = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | (os.O_CREAT | os.O_EXCL if create else 0)
    target = os.open(name, flags, 0o600, dir_fd=parent)
    try:
        os.ftruncate(target, 0)
        copy_sparse(source, target, os.fstat(source).st_size)
        if durable:
            os.fsync(target)
    finally:
        os.close(target)
